// twell._twell: the CPU FFN ops for Python (nanobind). Tensors cross as DLPack arrays (any framework's
// CPU float32 C-contiguous 2-D arrays; outputs are caller-allocated, so the caller's allocator owns
// every buffer); the training state returns as a uint8 tensor (train_state_bytes.hpp). No torch
// C++ ABI: the PyTorch integration (custom ops, autograd, fake tensors) is Python, twell/torch.py.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <algorithm>
#include <memory>
#include <optional>

#include "host_arrays.hpp"
#ifdef TWELL_PY_MODEL
#include "model_api.hpp"
#endif
#include "train_state_bytes.hpp"
#ifdef TWELL_HAVE_CUDA
#include "cuda_ffn.hpp"
#endif
#include "twell/cpu/ffn_ops.hpp"
#include "twell/error.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace twell::python {
namespace {

using Bytes = nb::ndarray<const std::uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

void ffn_infer(const In& x, const std::optional<In>& w_gate, const In& w_up, const In& w_down, Out& y) {
  const FfnWeights w = weights(w_gate, w_up, w_down);
  const CMatrixF xv = view(x);
  check_shape("x", x, xv.rows, w.hidden());
  check_shape("y", y, xv.rows, w.hidden());
  nb::gil_scoped_release release;
  const cpu::PreparedFfn prepared = cpu::prepare_ffn(w);
  cpu::ffn_sparse(xv, prepared, view(y));
}

using StateTensor = nb::ndarray<nb::pytorch, std::uint8_t, nb::ndim<1>>;

using Counts = nb::ndarray<std::int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

std::tuple<StateTensor, double, double> ffn_train_forward(const In& x, const std::optional<In>& w_gate, const In& w_up,
                                                          const In& w_down, Out& y, int ell_width,
                                                          std::optional<Counts> neuron_counts) {
  const FfnWeights w = weights(w_gate, w_up, w_down);
  const CMatrixF xv = view(x);
  check_shape("x", x, xv.rows, w.hidden());
  check_shape("y", y, xv.rows, w.hidden());
  if (neuron_counts)
    TWELL_CHECK(static_cast<std::int64_t>(neuron_counts->shape(0)) == w.intermediate(), ErrorCode::shape_mismatch,
                "neuron_counts has {} elements; it must have N = {}", neuron_counts->shape(0), w.intermediate());
  HybridConfig cfg;
  cfg.ell_width = ell_width;
  cfg.validate();
  std::unique_ptr<std::vector<std::uint8_t>> bytes;  // owned by the returned tensor's capsule
  double l1 = 0, l0 = 0;
  {
    nb::gil_scoped_release release;
    const cpu::PreparedFfn prepared = cpu::prepare_ffn(w);
    const cpu::TrainState st = cpu::ffn_train_forward(xv, prepared, view(y), cfg);
    bytes = std::make_unique<std::vector<std::uint8_t>>(state_to_bytes(st));
    if (neuron_counts) {  // rows in which each neuron fired (the pattern of p)
      std::int64_t* c = neuron_counts->data();
      std::fill_n(c, w.intermediate(), 0);
      for (std::int64_t r = 0; r < st.p.rows; ++r) hybrid_for_each(st.p, r, [&](std::int32_t col, float) { ++c[col]; });
    }
    l1 = st.scalars.l1;
    l0 = st.scalars.l0;
  }
  std::vector<std::uint8_t>* raw = bytes.get();
  nb::capsule owner(bytes.release(), [](void* p) noexcept { delete static_cast<std::vector<std::uint8_t>*>(p); });
  return {StateTensor(raw->data(), {raw->size()}, owner), l1, l0};
}

void ffn_train_backward(const In& x, const In& dy, const std::optional<In>& w_gate, const In& w_up, const In& w_down,
                        const Bytes& state, double l1_coeff, Out& dx, std::optional<Out> dw_gate, Out& dw_up,
                        Out& dw_down) {
  const FfnWeights w = weights(w_gate, w_up, w_down);
  const CMatrixF xv = view(x);
  const std::int64_t M = xv.rows, K = w.hidden(), N = w.intermediate();
  check_shape("x", x, M, K);
  check_shape("dy", dy, M, K);
  check_shape("dx", dx, M, K);
  check_shape("dw_up", dw_up, N, K);
  check_shape("dw_down", dw_down, K, N);
  TWELL_CHECK(w.gated() == dw_gate.has_value(), ErrorCode::invalid_argument,
              "dw_gate must be given exactly when w_gate is");
  if (dw_gate) check_shape("dw_gate", *dw_gate, N, K);
  nb::gil_scoped_release release;
  const cpu::TrainState st = state_from_bytes({state.data(), state.shape(0)});
  TWELL_CHECK(st.p.rows == M && st.p.cols == N, ErrorCode::shape_mismatch,
              "the training state is for [{}, {}] activations; these inputs make [{}, {}]", st.p.rows, st.p.cols, M, N);
  const cpu::PreparedFfn prepared = cpu::prepare_ffn(w);
  FfnGrads g;
  g.dx = view(dx);
  if (dw_gate) g.dw_gate = view(*dw_gate);
  g.dw_up = view(dw_up);
  g.dw_down = view(dw_down);
  cpu::ffn_train_backward(xv, view(dy), prepared, st, l1_coeff, g);
}

}  // namespace
}  // namespace twell::python

NB_MODULE(_twell, m) {
  using namespace twell::python;
  m.doc() = "twell's FFN ops: CPU functions (float32, C-contiguous, caller-allocated outputs) and, in a CUDA build,\n"
            "the per-layer CUDA classes CudaFfnInfer / CudaFfnTrain (bf16, the caller's stream)";
#ifdef TWELL_HAVE_CUDA
  bind_cuda(m);
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif
  // twell::Error → ValueError for bad arguments, RuntimeError otherwise (message kept).
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const twell::Error& e) {
      const auto c = e.code();
      const bool value = c == twell::ErrorCode::invalid_argument || c == twell::ErrorCode::shape_mismatch ||
                         c == twell::ErrorCode::dtype_mismatch || c == twell::ErrorCode::corrupt;
      PyErr_SetString(value ? PyExc_ValueError : PyExc_RuntimeError, e.what());
    }
  });
#ifdef TWELL_PY_MODEL
  bind_model(m);
#endif
  m.def("ffn_infer", &ffn_infer, "x"_a, "w_gate"_a.none(), "w_up"_a, "w_down"_a, "y"_a,
        "y = FFN(x) through TwELL (ReLU gate; exact at any density).");
  m.def("ffn_train_forward", &ffn_train_forward, "x"_a, "w_gate"_a.none(), "w_up"_a, "w_down"_a, "y"_a, "ell_width"_a,
        "neuron_counts"_a.none() = nb::none(),
        "y = FFN(x); returns (state, l1, l0): the sparse state as a uint8 tensor, l1 = Σ|h| / M, l0 = non-zeros / M;\n"
        "neuron_counts (int64 [N], optional) receives the rows in which each neuron fired.");
  m.def("ffn_train_backward", &ffn_train_backward, "x"_a, "dy"_a, "w_gate"_a.none(), "w_up"_a, "w_down"_a, "state"_a,
        "l1_coeff"_a, "dx"_a, "dw_gate"_a.none(), "dw_up"_a, "dw_down"_a,
        "Gradients of <y, dy> + l1_coeff · l1 into dx, dw_gate (None when non-gated), dw_up, dw_down.");
}
