#pragma once
// The probes' host-side checks against float64 (no CUDA: host probes include it too): a bf16's
// value, a dot product's exact sum and its fp32 bound, one bf16 step, and one query head's attention
// with the derived bounds of the library's attention kernels.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace twell::probe {

// The float a bf16's bits stand for (a host copy of device output).
inline float bf16_to_float(unsigned short b) {
  const unsigned u = static_cast<unsigned>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// An element's value: a bf16's raw bits, or a float (bf16 values already widened on the host).
inline float value_of(unsigned short b) { return bf16_to_float(b); }
inline float value_of(float f) { return f; }

// Σ x[i] · w[i] over k pairs (bf16 raw bits or floats) in float64, and Σ |x[i] · w[i]|.
struct ExactDot {
  double sum = 0, mag = 0;
};
template <class T>
ExactDot exact_dot(const T* x, const T* w, int k) {
  ExactDot e;
  for (int i = 0; i < k; ++i) {
    const double v = static_cast<double>(value_of(x[i])) * value_of(w[i]);
    e.sum += v;
    e.mag += std::abs(v);
  }
  return e;
}

// Whether y is within the bound of a k-term dot product summed in fp32: k · 2⁻²⁴ · Σ|x·w|, plus one
// bf16 rounding of the result (2⁻⁸ |sum|) where the output is bf16. False for a NaN.
inline bool within_dot_bound(double y, const ExactDot& e, int k, bool bf16_out) {
  const double bound = (bf16_out ? std::ldexp(std::abs(e.sum), -8) : 0.0) + k * std::ldexp(e.mag, -24) + 1e-30;
  return std::abs(y - e.sum) <= bound;
}

// One bf16 step (2^-7 of the leading power of two) at |v|: a bound of one bf16 rounding near v.
inline double bf16_step(double v) {
  int e = 0;
  std::frexp(std::max(std::fabs(v), 1e-30), &e);  // v = f · 2^e, f in [0.5, 1)
  return std::ldexp(1.0, e - 8);
}

// One query head's decode attention in float64 over keys [0, keys): q its d query values, k and v
// the keys' rows (kv_dim apart, this head's KV head from column kv_col), all bf16 bits. For each
// output: the value, Σ p|v| (mag), and its derived error bound for the library's kernels.
// bound (the per-head kernel, fp32 throughout): the output's bf16 rounding, 2⁻⁸ |o|; the fp32 sums
// over the keys, keys · 2⁻²⁴ Σ p|v|; the scores' fp32 error, which moves each probability by a
// factor e^(±(e_t + max e)), e_t = (d + 2) · 2⁻²⁴ · Σ_i |q_i k_i| / √d for key t, twice; __expf's
// (2 + 1.2 |s_t − max|) ulps, twice (a probability's error moves the normalised output through the
// numerator and the denominator; a probability below 2⁻¹²⁶ · z is flushed, its share below that).
// bound_tc (the grouped tensor-core kernel, attention.cu): its sums may truncate (2⁻²³ a step: the
// scores' term doubled, the keys' sum at 2⁻²³), P's two bf16 halves (2⁻¹⁶), and the online
// softmax's rescalings, each (2 + 1.2 |Δm|) ulps plus a rounding over tiles of 64 keys, the Δm
// adding up to the scores' range at most, twice (the tiles' and the warps' combination), and all of
// it twice again (numerator and denominator).
// A kernel that dropped one key of 2049 is off by ≈ 1 / 2049 of a value (≈ 5e-4).
struct AttentionF64 {
  std::vector<double> want, mag, bound, bound_tc;
};
inline AttentionF64 attention_f64_head(const unsigned short* q, const unsigned short* k, const unsigned short* v, int keys,
                                       int d, long long kv_dim, int kv_col) {
  std::vector<double> sc(static_cast<std::size_t>(keys));
  double mx = -1e300, e_score = 0;
  for (int t = 0; t < keys; ++t) {
    const ExactDot e = exact_dot(q, k + t * kv_dim + kv_col, d);
    sc[static_cast<std::size_t>(t)] = e.sum / std::sqrt(static_cast<double>(d));
    e_score = std::max(e_score, (d + 2) * std::ldexp(e.mag / std::sqrt(static_cast<double>(d)), -24));
    mx = std::max(mx, sc[static_cast<std::size_t>(t)]);
  }
  double z = 0, e_exp = 0, range = 0;
  for (double& s : sc) {
    range = std::max(range, mx - s);
    e_exp = std::max(e_exp, (2.0 + 1.2 * (mx - s)) * std::ldexp(1.0, -23));
    z += (s = std::exp(s - mx));
  }
  e_exp = std::min(e_exp, 1.0);
  const int tiles = (keys + 63) / 64;
  const double rel = keys * std::ldexp(1.0, -24) + 2 * e_score + 2 * e_exp;
  const double rel_tc = keys * std::ldexp(1.0, -23) + std::ldexp(1.0, -16) + 4 * e_score + 2 * e_exp +
                        2 * (3.0 * (tiles + 2) + 2.4 * range) * std::ldexp(1.0, -23);
  AttentionF64 out;
  for (int i = 0; i < d; ++i) {
    double want = 0, mag = 0;
    for (int t = 0; t < keys; ++t) {
      const double pv = sc[static_cast<std::size_t>(t)] / z * bf16_to_float(v[t * kv_dim + kv_col + i]);
      want += pv;
      mag += std::abs(pv);
    }
    out.want.push_back(want);
    out.mag.push_back(mag);
    out.bound.push_back(std::ldexp(std::abs(want), -8) + mag * rel + 1e-30);
    out.bound_tc.push_back(std::ldexp(std::abs(want), -8) + mag * rel_tc + 1e-30);
  }
  return out;
}

}  // namespace twell::probe
