// Dense FFN baseline: the GEMMs through OpenBLAS, elementwise work with OpenMP.
#include <vector>

#include "cpu/blas.hpp"
#include "twell/cpu/ffn_ops.hpp"

namespace twell::cpu {

void ffn_dense(CMatrixF x, const FfnWeights& w, MatrixF y) {
  ffn_check_shapes(x, w);
  const std::int64_t M = x.rows, N = w.intermediate(), K = w.hidden();
  TWELL_CHECK(y.rows == M && y.cols == K, ErrorCode::shape_mismatch, "y is [{}, {}], expected [{}, {}]", y.rows, y.cols, M, K);
  std::vector<float> h(static_cast<std::size_t>(M * N));
  MatrixF hm(h.data(), M, N);
  gemm(false, true, 1.0f, x, w.w_up, 0.0f, hm);  // u = x·Wuᵀ
  if (w.gated()) {
    std::vector<float> g(static_cast<std::size_t>(M * N));
    gemm(false, true, 1.0f, x, w.w_gate, 0.0f, MatrixF(g.data(), M, N));
#pragma omp parallel for simd schedule(static)
    for (std::int64_t i = 0; i < M * N; ++i) h[static_cast<std::size_t>(i)] *= g[static_cast<std::size_t>(i)] > 0.0f ? g[static_cast<std::size_t>(i)] : 0.0f;
  } else {
#pragma omp parallel for simd schedule(static)
    for (std::int64_t i = 0; i < M * N; ++i) h[static_cast<std::size_t>(i)] = h[static_cast<std::size_t>(i)] > 0.0f ? h[static_cast<std::size_t>(i)] : 0.0f;
  }
  gemm(false, true, 1.0f, hm, w.w_down, 0.0f, y);  // y = h·Wdᵀ
}

}  // namespace twell::cpu
