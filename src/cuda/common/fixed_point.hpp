#pragma once
// The one-token FFN's output as a fixed-point sum (the decode step without a down kernel): each
// active neuron's warp adds round(h · Wdᵀ[n, c] · 2^kFixedShift) into an int64 accumulator per
// column with fire-and-forget reductions. Integer sums are exact in any order, so the result does
// not depend on scheduling (fp32 or fp64 atomics would). Its reader takes y = bf16(acc · 2^−32),
// rounded once from the double (exact while |acc| < 2^53; the same rounding on host and device),
// the precision the FFN's bf16 output has on every other path.
//
// Range: with N neurons every term stays below fixed_term_limit(N) (real units), so N terms sum
// below 2^63 and never wrap. A term at or past it, or not finite, is not added: the kernel raises
// the caller's overflow flag instead and the caller must recompute the step another way (the
// accumulator is then not the sum). Resolution 2^−32 ≈ 2.3e−10 a term.
#include <cmath>
#include <cstdint>

namespace twell::cuda {

inline constexpr int kFixedShift = 32;

// 2^(31 − ⌈log2 N⌉): N terms each below it sum below 2^31 (2^63 in fixed point).
inline float fixed_term_limit(std::int64_t n) {
  int bits = 0;
  while ((std::int64_t{1} << bits) < n) ++bits;
  return std::ldexp(1.0f, 31 - bits);
}

// The host's statement of the reader's conversion: bf16(acc · 2^−32) rounded to nearest even
// from the double nearest acc (what __double2bfloat16(__ll2double_rn(acc) · 2^−32) gives).
inline float fixed_to_float_bf16(std::int64_t acc) {
  const double d = std::ldexp(static_cast<double>(acc), -kFixedShift);
  if (d == 0) return 0.0f;
  int e = 0;
  const double m = std::frexp(d, &e);                       // d = m · 2^e, 0.5 ≤ |m| < 1
  const double r = std::nearbyint(std::ldexp(m, 8));        // 8 significant bits, ties to even
  return static_cast<float>(std::ldexp(r, e - 8));          // exact in float and in bf16
}

}  // namespace twell::cuda
