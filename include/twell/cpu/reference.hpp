#pragma once
// The float64 oracle: plain loops, no BLAS, no threads beyond OpenMP over rows. Slow on purpose;
// tests and the benchmark's error column compare every backend against it.
#include <cstdint>
#include <vector>

#include "twell/ffn.hpp"

namespace twell::ref {

struct Options {
  // Round g (gated) or h (non-gated) to bf16 before using it, as TwELL storage does. The result is
  // then the exact function the TwELL path computes, up to fp32-vs-fp64 accumulation.
  bool round_activation_bf16 = false;
};

// y [M, K] in float64 for the given rows (all rows when `rows` is empty).
// bf16_bound (optional, one entry per returned row): an upper bound on ‖Δy_row‖₂ caused by storing
// the activation (g, or h when non-gated) in bf16: Σ_n 2⁻⁷·|h_n|·‖Wd[:, n]‖₂. Round-to-nearest to
// bf16 (8 significant bits) moves a value by ≤ 2⁻⁸ of itself; the factor 2 covers the fp32 gate
// value the kernels round, which itself differs from the float64 one by far less than 2⁻⁸.
std::vector<double> ffn_forward(CMatrixF x, const FfnWeights& w, const std::vector<std::int64_t>& rows = {},
                                Options opt = {}, std::vector<double>* bf16_bound = nullptr);

struct TrainResult {
  std::vector<double> y, dx, dw_gate, dw_up, dw_down;  // row-major, HF shapes
  double l1 = 0, l0 = 0;
  double loss = 0;  // ⟨y, dy⟩ + l1_coeff · l1
};
TrainResult ffn_train(CMatrixF x, CMatrixF dy, const FfnWeights& w, double l1_coeff);

// Relative errors used everywhere: ‖a − b‖₂ / max(‖b‖₂, tiny), and the worst row of it.
double rel_error(const float* a, const double* b, std::int64_t n);
double max_row_rel_error(const float* a, const double* b, std::int64_t rows, std::int64_t cols);

}  // namespace twell::ref
