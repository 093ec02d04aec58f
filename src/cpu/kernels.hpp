#pragma once
// Small vectorised loops shared by the CPU ops (K-length rows, fp32, contiguous).
#include <cstdint>

namespace twell::cpu {

inline float dot(const float* __restrict a, const float* __restrict b, std::int64_t n) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (std::int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// y += alpha · x
inline void axpy(float alpha, const float* __restrict x, float* __restrict y, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// Rows processed per gate-GEMM block: large enough for BLAS efficiency, small enough that the
// dense [block, N] scratch stays a few MB (the CPU analogue of the GEMM's epilogue tile).
inline constexpr std::int64_t kGateBlockRows = 256;

}  // namespace twell::cpu
