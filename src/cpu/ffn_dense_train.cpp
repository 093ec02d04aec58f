// Dense training baseline: forward and backward of ⟨y, dy⟩ + c·Σ|h|/M with dense GEMMs.
#include <cmath>
#include <vector>

#include "cpu/blas.hpp"
#include "twell/cpu/ffn_ops.hpp"

namespace twell::cpu {

FfnTrainScalars ffn_dense_train(CMatrixF x, CMatrixF dy, const FfnWeights& w, double l1_coeff, MatrixF y,
                                const FfnGrads& grads) {
  ffn_check_shapes(x, w);
  const std::int64_t M = x.rows, N = w.intermediate(), K = w.hidden();
  TWELL_CHECK(dy.rows == M && dy.cols == K, ErrorCode::shape_mismatch, "dy is [{}, {}], expected [{}, {}]", dy.rows, dy.cols, M, K);
  const auto sz = static_cast<std::size_t>(M * N);
  std::vector<float> a(sz), u(sz), h(sz);  // a: the ReLU input; u: the up product (gated only)
  const bool gated = w.gated();
  gemm(false, true, 1.0f, x, gated ? w.w_gate : w.w_up, 0.0f, MatrixF(a.data(), M, N));
  if (gated) gemm(false, true, 1.0f, x, w.w_up, 0.0f, MatrixF(u.data(), M, N));
  double l1 = 0, active = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : l1, active)
  for (std::size_t i = 0; i < sz; ++i) {
    const float g = a[i] > 0.0f ? a[i] : 0.0f;
    h[i] = gated ? g * u[i] : g;
    l1 += std::fabs(static_cast<double>(h[i]));
    active += a[i] > 0.0f ? 1.0 : 0.0;
  }
  gemm(false, true, 1.0f, MatrixF(h.data(), M, N), w.w_down, 0.0f, y);
  // dh = dy·Wd + (c/M)·sign(h), restricted to the active set (elsewhere every path to the loss is 0).
  std::vector<float> dh(sz);
  gemm(false, false, 1.0f, dy, w.w_down, 0.0f, MatrixF(dh.data(), M, N));
  const float c = static_cast<float>(l1_coeff / static_cast<double>(M));
  gemm(true, false, 1.0f, dy, MatrixF(h.data(), M, N), 0.0f, grads.dw_down);  // dWd = dyᵀ·h
  // Reuse buffers: a ← dA (gradient at the ReLU input), u ← dU.
#pragma omp parallel for simd schedule(static)
  for (std::size_t i = 0; i < sz; ++i) {
    const bool on = a[i] > 0.0f;
    const float s = h[i] > 0.0f ? 1.0f : (h[i] < 0.0f ? -1.0f : 0.0f);
    const float d = on ? dh[i] + c * s : 0.0f;
    const float g = on ? a[i] : 0.0f;
    if (gated) {
      a[i] = d * u[i];  // dA = dh ⊙ u ⊙ 1[a > 0]
      u[i] = d * g;     // dU = dh ⊙ g
    } else {
      a[i] = d;
    }
  }
  if (gated) {
    gemm(false, false, 1.0f, MatrixF(a.data(), M, N), w.w_gate, 0.0f, grads.dx);
    gemm(false, false, 1.0f, MatrixF(u.data(), M, N), w.w_up, 1.0f, grads.dx);
    gemm(true, false, 1.0f, MatrixF(a.data(), M, N), x, 0.0f, grads.dw_gate);
    gemm(true, false, 1.0f, MatrixF(u.data(), M, N), x, 0.0f, grads.dw_up);
  } else {
    gemm(false, false, 1.0f, MatrixF(a.data(), M, N), w.w_up, 0.0f, grads.dx);
    gemm(true, false, 1.0f, MatrixF(a.data(), M, N), x, 0.0f, grads.dw_up);
  }
  return {l1 / static_cast<double>(M), active / static_cast<double>(M)};
}

}  // namespace twell::cpu
