#pragma once
// Decode-size products against bf16 weights on the CPU: y[r, j] = Σ_i x[r, i] · W[j, i] for a few rows
// x (fp32), W [n, k] held as bf16 bits (the top half of each fp32), fp32 sums. A decode step reads
// each weight once; in bf16 that is half the bytes of OpenBLAS's sgemv on the fp32 copy, and a CPU
// decode step is bound by those bytes. Rows of W are split over the OpenMP threads; each row is
// read once for all of x's rows (it stays in L1: k ≤ 8192). Do not call from a parallel region.
#include <cstdint>
#include <vector>

namespace twell::cpu {

inline constexpr std::int64_t kGemvBf16MaxRows = 8;  // more rows: the fp32 GEMM re-uses each weight better

// x [rows, k] (row stride k), w [n, k] bf16 bits, y [rows, n] (row stride n); rows ≤ kGemvBf16MaxRows.
void gemv_bf16(const float* x, std::int64_t rows, const std::uint16_t* w, std::int64_t n, std::int64_t k, float* y);

// The bf16 bits of w when every value is a bf16 exactly (a bf16 checkpoint read into fp32), so the
// copy loses nothing; empty otherwise.
std::vector<std::uint16_t> exact_bf16(const std::vector<float>& w);

}  // namespace twell::cpu
