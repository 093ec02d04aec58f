#pragma once
// CPU float32 arrays as twell's matrices, with the shape checks every binding shares (the CPU ops
// in twell_ext.cpp, the native benchmarks in cuda_ffn.cpp). Messages name the argument.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>

#include "twell/error.hpp"
#include "twell/ffn.hpp"

namespace twell::python {

using In = nanobind::ndarray<const float, nanobind::ndim<2>, nanobind::c_contig, nanobind::device::cpu>;
using Out = nanobind::ndarray<float, nanobind::ndim<2>, nanobind::c_contig, nanobind::device::cpu>;

inline CMatrixF view(const In& a) {
  return {a.data(), static_cast<std::int64_t>(a.shape(0)), static_cast<std::int64_t>(a.shape(1))};
}
inline MatrixF view(Out& a) {
  return {a.data(), static_cast<std::int64_t>(a.shape(0)), static_cast<std::int64_t>(a.shape(1))};
}

// A 2-D array's shape must be [rows, cols].
template <typename A>
void check_shape(const char* what, const A& a, std::int64_t rows, std::int64_t cols) {
  const auto r = static_cast<std::int64_t>(a.shape(0)), c = static_cast<std::int64_t>(a.shape(1));
  TWELL_CHECK(r == rows && c == cols, ErrorCode::shape_mismatch, "{} is [{}, {}]; it must be [{}, {}]", what, r, c, rows, cols);
}

// The FFN's weights after the shape checks every op shares (w_up [N, K] gives the shape).
inline FfnWeights weights(const std::optional<In>& w_gate, const In& w_up, const In& w_down) {
  const auto N = static_cast<std::int64_t>(w_up.shape(0)), K = static_cast<std::int64_t>(w_up.shape(1));
  TWELL_CHECK(N > 0 && K > 0, ErrorCode::shape_mismatch, "w_up is [{}, {}]: an FFN needs N, K ≥ 1", N, K);
  check_shape("w_down", w_down, K, N);
  if (w_gate) check_shape("w_gate", *w_gate, N, K);
  return ffn_weights(w_gate ? w_gate->data() : nullptr, w_up.data(), w_down.data(), N, K);
}

}  // namespace twell::python
