// twell._twell's CUDA side: one FFN layer's inference context (CudaFfnInfer) and training context
// (CudaFfnTrain) on one device. Tensors cross as DLPack arrays on that device (bf16 activations
// and weights, fp32 weight gradients), outputs are caller-allocated (PyTorch's allocator owns
// them) and every call runs on the caller's stream, passed as an integer handle (a cudaStream_t).
// Nothing waits on the host except what the training forward needs (its non-zero count sizes the
// saved state); weights are copied device to device into the layouts the kernels read.
#include "cuda_ffn.hpp"

#include <cuda_runtime.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "host_arrays.hpp"
#include "twell/cuda/ffn_cuda.hpp"
#include "twell/cuda/ffn_layer.hpp"
#include "twell/error.hpp"

// Only twell's public headers: the binding is a framework integration like any other.

namespace nb = nanobind;
using namespace nb::literals;

namespace twell::python {
namespace {

using Dev = nb::ndarray<nb::device::cuda, nb::c_contig>;

enum class Kind { bf16, f32 };

const char* name_of(Kind k) { return k == Kind::bf16 ? "bfloat16" : "float32"; }

bool is(const nb::dlpack::dtype& t, Kind k) {
  if (t.lanes != 1) return false;
  switch (k) {
    case Kind::bf16: return t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat) && t.bits == 16;
    case Kind::f32: return t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float) && t.bits == 32;
  }
  return false;
}

// One argument's checks: on this layer's device, of this dtype, of this shape (rows, cols; cols < 0: 1-D).
template <typename T>
T* checked(const char* what, const Dev& a, int device, Kind kind, std::int64_t rows, std::int64_t cols) {
  TWELL_CHECK(a.device_id() == device, ErrorCode::invalid_argument, "{} is on cuda:{}; this layer lives on cuda:{}", what,
              a.device_id(), device);
  TWELL_CHECK(is(a.dtype(), kind), ErrorCode::dtype_mismatch, "{} must be {}", what, name_of(kind));
  if (cols < 0) {
    TWELL_CHECK(a.ndim() == 1 && static_cast<std::int64_t>(a.shape(0)) == rows, ErrorCode::shape_mismatch,
                "{} must be 1-D with {} elements", what, rows);
  } else {
    TWELL_CHECK(a.ndim() == 2, ErrorCode::shape_mismatch, "{} must be 2-D, got {} dimensions", what, a.ndim());
    const auto r = static_cast<std::int64_t>(a.shape(0)), c = static_cast<std::int64_t>(a.shape(1));
    TWELL_CHECK(r == rows && c == cols, ErrorCode::shape_mismatch, "{} is [{}, {}]; it must be [{}, {}]", what, r, c,
                rows, cols);
  }
  return static_cast<T*>(a.data());
}

cuda::Stream as_stream(std::uintptr_t s) { return reinterpret_cast<cuda::Stream>(s); }

cuda::Path path_of(const std::string& p) {
  if (p == "automatic") return cuda::Path::automatic;
  if (p == "sparse") return cuda::Path::sparse;
  if (p == "dense") return cuda::Path::dense;
  fail(ErrorCode::invalid_argument, "path must be 'automatic', 'sparse' or 'dense', got '{}'", p);
}

// The weights' shapes, device pointers and element type (w_up [N, K] gives the shape, w_up's dtype
// the type: bf16, or fp32 rounded to bf16 as the layer copies it in; all three alike).
cuda::DeviceWeights weights_of(const std::optional<Dev>& w_gate, const Dev& w_up, const Dev& w_down, int device) {
  TWELL_CHECK(w_up.ndim() == 2, ErrorCode::shape_mismatch, "w_up must be 2-D, got {} dimensions", w_up.ndim());
  cuda::DeviceWeights w;
  w.n = static_cast<std::int64_t>(w_up.shape(0));
  w.k = static_cast<std::int64_t>(w_up.shape(1));
  TWELL_CHECK(w.n >= 1 && w.k >= 1, ErrorCode::shape_mismatch, "w_up is [{}, {}]: an FFN needs N, K ≥ 1", w.n, w.k);
  const Kind kind = is(w_up.dtype(), Kind::f32) ? Kind::f32 : Kind::bf16;
  TWELL_CHECK(is(w_up.dtype(), kind), ErrorCode::dtype_mismatch, "w_up must be bfloat16 or float32");
  const auto alike = [&](const char* what, const Dev& a) {
    TWELL_CHECK(is(a.dtype(), kind), ErrorCode::dtype_mismatch,
                "the weights must share one dtype, bfloat16 or float32: w_up is {}, {} is not", name_of(kind), what);
  };
  alike("w_down", w_down);
  if (w_gate) alike("w_gate", *w_gate);
  w.type = kind == Kind::f32 ? cuda::WeightType::f32 : cuda::WeightType::bf16;
  w.w_up = checked<const void>("w_up", w_up, device, kind, w.n, w.k);
  w.w_down = checked<const void>("w_down", w_down, device, kind, w.k, w.n);
  if (w_gate) w.w_gate = checked<const void>("w_gate", *w_gate, device, kind, w.n, w.k);
  return w;
}

void check_device(int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  TWELL_CHECK(device >= 0 && device < count, ErrorCode::invalid_argument, "no CUDA device {} ({} present)", device,
              count);
}

// A cuda::DeviceAllocator over two Python callables: allocate(nbytes) -> int (a device pointer) and
// deallocate(ptr). twell's calls release the GIL; each call into Python takes it back. The
// references held here are invisible to Python's garbage collector: callables that reach the
// workspace's owner (a closure over the module that keeps it, say) would make a cycle no collector
// breaks. Once the interpreter is finalising, blocks are left to the process's end.
class PyAllocator final : public cuda::DeviceAllocator {
 public:
  PyAllocator(nb::object allocate, nb::object deallocate)
      : allocate_(std::move(allocate)), deallocate_(std::move(deallocate)) {}
  ~PyAllocator() override {
    if (Py_IsInitialized()) {
      nb::gil_scoped_acquire gil;
      allocate_.reset();
      deallocate_.reset();
    } else {
      allocate_.release();
      deallocate_.release();
    }
  }
  void* allocate(std::size_t bytes) override {
    nb::gil_scoped_acquire gil;
    return reinterpret_cast<void*>(nb::cast<std::uintptr_t>(allocate_(bytes)));
  }
  void deallocate(void* p, std::size_t) noexcept override {
    if (!Py_IsInitialized()) return;
    nb::gil_scoped_acquire gil;
    try {
      deallocate_(reinterpret_cast<std::uintptr_t>(p));
    } catch (nb::python_error& e) {
      e.discard_as_unraisable("twell: handing a workspace block back to its allocator");
    } catch (...) {
    }
  }

 private:
  nb::object allocate_, deallocate_;
};

// Workspaces that the layers of one device share (cuda::InferWorkspace for inference layers, as
// the model runtime's layers do; cuda::TrainWorkspace for training layers): layers that run one
// after another on one stream. Made with the device current (a workspace may hold a cuBLASLt handle).
template <typename W>
class DeviceWorkspace {
 public:
  DeviceWorkspace(int device, nb::object allocate, nb::object deallocate) : device_(device) {
    check_device(device);
    TWELL_CHECK(allocate.is_none() == deallocate.is_none(), ErrorCode::invalid_argument,
                "a workspace's allocate and deallocate come together (one of them is None)");
    std::shared_ptr<cuda::DeviceAllocator> mem;
    if (!allocate.is_none()) mem = std::make_shared<PyAllocator>(std::move(allocate), std::move(deallocate));
    from_allocator_ = mem != nullptr;
    cuda::DeviceScope on(device);
    ws_ = std::make_unique<W>(std::move(mem));
  }
  int device() const noexcept { return device_; }
  std::int64_t bytes() const noexcept { return ws_->bytes(); }
  bool from_allocator() const noexcept { return from_allocator_; }
  const W* get() const noexcept { return ws_.get(); }

 private:
  int device_;
  bool from_allocator_ = false;
  std::unique_ptr<W> ws_;
};
using CudaFfnWorkspace = DeviceWorkspace<cuda::InferWorkspace>;
using CudaTrainScratch = DeviceWorkspace<cuda::TrainWorkspace>;

// A layer on one device over one public layer type (cuda::FfnLayer or cuda::FfnTrainLayer, made on
// the first load with the device current).
template <typename L, typename Ws>
class Layer {
 public:
  Layer(int device, const Ws* workspace) : device_(device), workspace_(workspace) {
    check_device(device);
    TWELL_CHECK(!workspace || workspace->device() == device, ErrorCode::invalid_argument,
                "the workspace is on cuda:{}, the layer on cuda:{}", workspace ? workspace->device() : -1, device);
  }
  int device() const noexcept { return device_; }
  void load(const std::optional<Dev>& w_gate, const Dev& w_up, const Dev& w_down, std::uintptr_t stream) {
    const cuda::DeviceWeights w = weights_of(w_gate, w_up, w_down, device_);
    cuda::DeviceScope on(device_);
    nb::gil_scoped_release release;
    if (!layer_) layer_ = std::make_unique<L>(workspace_ ? workspace_->get() : nullptr);
    layer_->load_weights(w, as_stream(stream));
    n_ = w.n;
    k_ = w.k;
    gated_ = w.w_gate != nullptr;
  }

 protected:
  // x [m, K] bf16 on this device: its rows.
  std::int64_t rows_of(const Dev& x) const {
    TWELL_CHECK(layer_ != nullptr, ErrorCode::invalid_argument, "load the layer's weights first");
    TWELL_CHECK(x.ndim() == 2, ErrorCode::shape_mismatch, "x must be 2-D, got {} dimensions", x.ndim());
    const auto m = static_cast<std::int64_t>(x.shape(0));
    TWELL_CHECK(m >= 1, ErrorCode::shape_mismatch, "x has no rows");
    checked<const bf16>("x", x, device_, Kind::bf16, m, k_);
    return m;
  }
  int device_;
  const Ws* workspace_;  // the Python object keeps it alive (keep_alive in the bindings)
  std::unique_ptr<L> layer_;
  std::int64_t n_ = 0, k_ = 0;
  bool gated_ = false;
};

class CudaFfnInfer : public Layer<cuda::FfnLayer, CudaFfnWorkspace> {
 public:
  using Layer::Layer;
  // y = FFN(x); last_path() describes the call when asked.
  void forward(const Dev& x, const Dev& y, std::uintptr_t stream, const std::string& path) {
    const std::int64_t m = rows_of(x);
    bf16* yp = checked<bf16>("y", y, device_, Kind::bf16, m, k_);
    const cuda::Path p = path_of(path);
    cuda::DeviceScope on(device_);
    nb::gil_scoped_release release;
    layer_->forward(static_cast<const bf16*>(x.data()), m, yp, p, as_stream(stream));
  }
  std::string last_path() const { return layer_ ? layer_->last_path() : std::string(); }
  // The layer's dispatch statistics (cuda::LayerStats), read without waiting for the GPU.
  nb::dict stats() {
    cuda::DeviceScope on(device_);
    const cuda::LayerStats s = layer_ ? layer_->stats() : cuda::LayerStats{};  // before a load: nothing counted
    nb::dict d;
    d["calls"] = s.calls;
    d["sparse_calls"] = s.sparse_calls;
    d["hot_neurons"] = s.hot_neurons;
    d["density"] = s.density;
    d["active"] = s.active;
    d["counted_rows"] = s.counted_rows;
    d["nnz"] = s.nnz;
    d["overflow_tiles"] = s.overflow_tiles;
    d["overflow_rows"] = s.overflow_rows;
    d["path"] = s.path;
    return d;
  }
};

class CudaFfnTrain : public Layer<cuda::FfnTrainLayer, CudaTrainScratch> {
 public:
  using Layer::Layer;
  // y = FFN(x), the state for backward kept in the layer; l1 and l0 (float32, 0-dim) receive
  // Σ|h| / m and non-zeros / m on the stream. Returns what the forward knew on the host anyway (it
  // waited for the non-zero count): the path as dispatched, whether the sparse step ran, the
  // non-zeros its CSR holds (−1: a dense step that did not count), and the hot neurons and dense
  // rows split off the sparse step.
  nb::tuple forward(const Dev& x, const Dev& y, const Dev& l1, const Dev& l0, std::uintptr_t stream,
                    const std::string& path) {
    const std::int64_t m = rows_of(x);
    bf16* yp = checked<bf16>("y", y, device_, Kind::bf16, m, k_);
    float* l1p = scalar("l1", l1);
    float* l0p = scalar("l0", l0);
    const cuda::Path p = path_of(path);
    cuda::DeviceScope on(device_);
    const cuda::Stream s = as_stream(stream);
    cuda::TrainForwardInfo info;
    {
      nb::gil_scoped_release release;
      info = layer_->forward(static_cast<const bf16*>(x.data()), m, yp, p, s);
      layer_->write_scalars(l1p, l0p, s);
    }
    return nb::make_tuple(info.path, info.sparse, info.nnz, info.hot_neurons, info.dense_rows, info.overflow_tiles,
                          info.overflow_rows);
  }
  // Gradients of ⟨y, dy⟩ + l1_coeff · Σ|h| / m for the last forward (which must have been over
  // these x and weights): dx bf16 [m, K]; dw_gate, dw_up [N, K] and dw_down [K, N] in float32 or
  // bfloat16, each as the caller allocated it, written before this call returns to the stream's
  // order (so layers sharing a scratch set may run their backwards next).
  void backward(const Dev& x, const Dev& dy, const Dev& l1_coeff, const Dev& dx, const std::optional<Dev>& dw_gate, const Dev& dw_up,
                const Dev& dw_down, std::uintptr_t stream) {
    const std::int64_t m = rows_of(x);
    const auto* dyp = checked<const bf16>("dy", dy, device_, Kind::bf16, m, k_);
    const auto* cp = checked<const float>("l1_coeff", l1_coeff, device_, Kind::f32, 1, -1);
    bf16* dxp = checked<bf16>("dx", dx, device_, Kind::bf16, m, k_);
    TWELL_CHECK(dw_gate.has_value() == gated_, ErrorCode::invalid_argument, "dw_gate must be given exactly when the layer is gated");
    const cuda::GradOut dwg = dw_gate ? grad_out("dw_gate", *dw_gate, n_, k_) : cuda::GradOut{};
    const cuda::GradOut dwu = grad_out("dw_up", dw_up, n_, k_), dwd = grad_out("dw_down", dw_down, k_, n_);
    cuda::DeviceScope on(device_);
    nb::gil_scoped_release release;
    const cuda::Stream s = as_stream(stream);
    layer_->backward(static_cast<const bf16*>(x.data()), dyp, m, cp, dxp, s);
    layer_->gradients_to(dwg, dwu, dwd, s);
  }
  std::int64_t device_bytes() const noexcept { return layer_ ? layer_->device_bytes() : 0; }
  std::int64_t own_bytes() const noexcept { return layer_ ? layer_->own_bytes() : 0; }

 private:
  float* scalar(const char* what, const Dev& a) const {
    TWELL_CHECK(a.device_id() == device_ && is(a.dtype(), Kind::f32) && a.ndim() == 0, ErrorCode::invalid_argument,
                "{} must be a 0-dim float32 tensor on cuda:{}", what, device_);
    return static_cast<float*>(a.data());
  }
  cuda::GradOut grad_out(const char* what, const Dev& a, std::int64_t rows, std::int64_t cols) const {
    const bool half = is(a.dtype(), Kind::bf16);
    checked<void>(what, a, device_, half ? Kind::bf16 : Kind::f32, rows, cols);
    return {a.data(), half ? cuda::GradOut::Type::bf16 : cuda::GradOut::Type::f32};
  }
};

// PyTorch benchmark's "native" column: inference (sparse as dispatched and dense cuBLASLt) and the
// training step.
nb::dict bench_infer(const In& x, const std::optional<In>& w_gate, const In& w_up, const In& w_down, int warmup,
                     int reps) {
  const FfnWeights w = weights(w_gate, w_up, w_down);
  const CMatrixF xv = view(x);
  check_shape("x", x, xv.rows, w.hidden());
  cuda::BenchOptions o;
  o.warmup = warmup;
  o.reps = reps;
  cuda::BenchTimes t;
  {
    nb::gil_scoped_release release;
    t = cuda::bench_ffn_host(xv, w, o);
  }
  nb::dict d;
  d["sparse_ms"] = t.total_ms;
  d["dense_ms"] = t.dense_ms;
  d["path"] = t.path;
  d["nnz"] = t.nnz;
  return d;
}

nb::dict bench_train(const In& x, const In& dy, const std::optional<In>& w_gate, const In& w_up, const In& w_down,
                     double l1_coeff, int warmup, int reps) {
  const FfnWeights w = weights(w_gate, w_up, w_down);
  const CMatrixF xv = view(x);
  check_shape("x", x, xv.rows, w.hidden());
  check_shape("dy", dy, xv.rows, w.hidden());
  const CMatrixF dyv = view(dy);
  cuda::BenchOptions o;
  o.warmup = warmup;
  o.reps = reps;
  cuda::TrainBenchTimes t;
  {
    nb::gil_scoped_release release;
    t = cuda::bench_train_host(xv, dyv, w, l1_coeff, o);
  }
  nb::dict d;
  d["sparse_step_ms"] = t.sparse_step_ms;
  d["dense_step_ms"] = t.dense_step_ms;
  d["sparse_fwd_ms"] = t.sparse_fwd_ms;
  d["dense_fwd_ms"] = t.dense_fwd_ms;
  d["path"] = t.path;
  d["nnz"] = t.nnz;
  d["sparse_device_bytes"] = t.sparse_device_bytes;
  d["dense_device_bytes"] = t.dense_device_bytes;
  return d;
}

}  // namespace

void bind_cuda(nb::module_& m) {
  m.def("bench_infer", &bench_infer, "x"_a, "w_gate"_a.none(), "w_up"_a, "w_down"_a, "warmup"_a = 5, "reps"_a = 20,
        "twell's native inference benchmark of one layer (float32 host arrays in): sparse_ms, dense_ms, path, nnz.");
  m.def("bench_train", &bench_train, "x"_a, "dy"_a, "w_gate"_a.none(), "w_up"_a, "w_down"_a, "l1_coeff"_a,
        "warmup"_a = 5, "reps"_a = 20,
        "twell's native training-step benchmark of one layer: sparse_step_ms, dense_step_ms, ..., device bytes.");
  nb::class_<CudaFfnWorkspace>(m, "CudaFfnWorkspace",
                                "Per-call workspaces shared by the inference contexts of one device (layers run one after another on one stream).")
      .def(nb::init<int, nb::object, nb::object>(), "device"_a, "allocate"_a = nb::none(), "deallocate"_a = nb::none(),
           "allocate(nbytes) -> int (a device pointer, 256-byte aligned) and deallocate(ptr): where the memory "
           "comes from, stream-ordered on the stream of the calls (None: cudaMalloc)")
      .def_prop_ro("device", &CudaFfnWorkspace::device)
      .def_prop_ro("from_allocator", &CudaFfnWorkspace::from_allocator, "Whether the workspace's memory comes from the allocator given.")
      .def_prop_ro("bytes", &CudaFfnWorkspace::bytes, "Device memory the workspace holds now.");
  nb::class_<CudaFfnInfer>(m, "CudaFfnInfer", "One FFN layer's inference context on one CUDA device.")
      .def(nb::init<int, const CudaFfnWorkspace*>(), "device"_a, "workspace"_a.none() = nb::none(), nb::keep_alive<1, 3>(),
           "workspace: per-call workspaces shared with other layers of the device (None: its own).")
      .def_prop_ro("device", [](const CudaFfnInfer& l) { return l.device(); })
      .def("load", &CudaFfnInfer::load, "w_gate"_a.none(), "w_up"_a, "w_down"_a, "stream"_a,
           "Copy bf16 weights (w_gate None: non-gated) into the layer on `stream`.")
      .def("forward", &CudaFfnInfer::forward, "x"_a, "y"_a, "stream"_a, "path"_a = "automatic",
           "y = FFN(x) (bf16); path: 'automatic', 'sparse' or 'dense'. last_path() says what ran.")
      .def("last_path", &CudaFfnInfer::last_path,
           "The last forward's path as dispatched, human-readable ('' before one); formatted when asked.")
      .def("stats", &CudaFfnInfer::stats,
           "The layer's dispatch statistics, read without waiting for the GPU (twell::cuda::LayerStats): calls, "
           "sparse_calls, hot_neurons, density (what the automatic dispatch follows; -1: none yet), and the newest "
           "counted TwELL call's counted_rows, nnz, overflow_tiles, overflow_rows (-1: none came back yet), path.");
  nb::class_<CudaTrainScratch>(m, "CudaTrainScratch",
                                "Workspaces shared by the training contexts of one device (layers run one after another on one stream).")
      .def(nb::init<int, nb::object, nb::object>(), "device"_a, "allocate"_a = nb::none(), "deallocate"_a = nb::none(),
           "allocate(nbytes) -> int (a device pointer, 256-byte aligned) and deallocate(ptr): where the memory "
           "comes from, stream-ordered on the stream of the calls (None: cudaMalloc)")
      .def_prop_ro("device", &CudaTrainScratch::device)
      .def_prop_ro("from_allocator", &CudaTrainScratch::from_allocator, "Whether the set's memory comes from the allocator given.")
      .def_prop_ro("bytes", &CudaTrainScratch::bytes, "Device memory the set holds now.");
  nb::class_<CudaFfnTrain>(m, "CudaFfnTrain", "One FFN layer's training context (it keeps the last forward's sparse state).")
      .def(nb::init<int, const CudaTrainScratch*>(), "device"_a, "scratch"_a.none() = nb::none(), nb::keep_alive<1, 3>(),
           "scratch: workspaces shared with other layers of the device (None: its own). Gradients are read "
           "inside backward(), so sharing layers only need to run in one stream order.")
      .def_prop_ro("device", [](const CudaFfnTrain& l) { return l.device(); })
      .def_prop_ro("device_bytes", &CudaFfnTrain::device_bytes, "Device memory the context holds, its scratch set included.")
      .def_prop_ro("own_bytes", &CudaFfnTrain::own_bytes, "Device memory the context holds, without its scratch set.")
      .def("load", &CudaFfnTrain::load, "w_gate"_a.none(), "w_up"_a, "w_down"_a, "stream"_a,
           "Copy bf16 weights into the layer on `stream` (drops a saved forward).")
      .def("forward", &CudaFfnTrain::forward, "x"_a, "y"_a, "l1"_a, "l0"_a, "stream"_a, "path"_a = "automatic",
           "y = FFN(x); l1, l0 (0-dim float32) receive Σ|h| / rows and non-zeros / rows; returns (path, sparse, "
           "CSR non-zeros or -1, hot neurons, dense rows), host values the forward had anyway.")
      .def("backward", &CudaFfnTrain::backward, "x"_a, "dy"_a, "l1_coeff"_a, "dx"_a, "dw_gate"_a.none(), "dw_up"_a,
           "dw_down"_a, "stream"_a, "Gradients for the last forward: dx (bf16), dw_* (float32 or bfloat16, as given).");
}

}  // namespace twell::python
