#pragma once
// Helpers shared by the CUDA tests: a GPU check that skips cleanly, a controllable synthetic FFN,
// and device buffers with NaN poison and guard sentinels.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "twell/bf16.hpp"
#include "twell/cuda/ffn_cuda.hpp"
#include "twell/ffn.hpp"

namespace twell::cuda::test {

#define TWELL_REQUIRE_GPU()                                                         \
  do {                                                                              \
    const auto twell_dev_ = ::twell::cuda::query_device();                         \
    if (!twell_dev_.available) GTEST_SKIP() << "no CUDA device: " << twell_dev_.reason; \
  } while (0)

inline double inv_normal_cdf(double p) {
  // Bisection on Φ(z) = ½·erfc(−z/√2); plenty for picking biases.
  p = std::clamp(p, 1e-12, 1 - 1e-12);
  double lo = -10, hi = 10;
  for (int i = 0; i < 100; ++i) {
    const double mid = 0.5 * (lo + hi);
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

// A synthetic FFN whose activation pattern we control exactly enough for edge cases:
//   x[m,0] = 1, x[m,1] = s_m (row shift); A[n,0] = b_n, A[n,1] = 1; other entries Gaussian so the
//   rest of ⟨x, A[n]⟩ is ≈ N(0,1). With A the gate (or the up weight when non-gated),
//   P(active) = Φ(b_n + s_m). Every value is rounded to bf16 first, so the GPU's bf16 copies are
//   exact and the only difference to the float64 reference is accumulation and activation rounding.
struct FfnCase {
  std::string name;
  std::int64_t m = 64, n = 5632, k = 2048;
  double density = 0.01;
  bool gated = true;
  double hot_rows = 0.0, hot_density = 0.3;  // fraction of rows with a high density (tile overflow)
  int zero_rows = 0, full_rows = 0;          // rows forced all-inactive / all-active (first rows after 0)
  double hot_neurons = 0.0, hot_neuron_density = 0.3;  // fraction of neurons active in many tokens
  int full_cols = 0;                         // neurons active in every token (the last columns)
  // Put x and the activation weight on grids that bf16 represents exactly (x: multiples of 1/4,
  // |x| ≤ 16, row shift |s| ≤ 60; weight: multiples of 2⁻¹⁰, |w| ≤ 1/4 off the bias column, the bias
  // a bf16 value on the same grid) so that every product, and so every partial
  // sum of a ReLU input, is a multiple of 2⁻¹². The partial sums stay far below 2¹² (noise ~N(0, 1),
  // |bias| < 10, |row shift| ≤ 60), so they need < 24 significant bits: fp32 accumulation in any
  // order (cuBLAS, tensor cores, OpenBLAS) and float64 give the same value, and every backend
  // agrees on the ReLU pattern exactly.
  bool exact_preactivation = false;
  int compression = 8;
  std::uint64_t seed = 1;
};

// gtest prints a parameter in test listings; the case name says it all.
inline void PrintTo(const FfnCase& c, std::ostream* os) { *os << c.name; }

struct FfnData {
  std::vector<float> x, wg, wu, wd;
  std::int64_t m = 0, n = 0, k = 0;
  bool gated = true;
  std::vector<std::int64_t> special_rows;  // hot / zero / full rows
  CMatrixF xv() const { return {x.data(), m, k}; }
  FfnWeights weights() const { return ffn_weights(gated ? wg.data() : nullptr, wu.data(), wd.data(), n, k); }
};

inline float rb(double v) { return round_bf16(static_cast<float>(v)); }

// The bf16 bit patterns of v (round to nearest even), for upload as __nv_bfloat16.
inline std::vector<std::uint16_t> to_bf16_bits(const std::vector<float>& v) {
  std::vector<std::uint16_t> o(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) o[i] = to_bf16(v[i]).bits;
  return o;
}

// A case of the default generator settings at this shape and density.
inline FfnCase ffn_case(std::string name, std::int64_t m, std::int64_t n, std::int64_t k, bool gated, double density,
                        std::uint64_t seed) {
  FfnCase c;
  c.name = std::move(name);
  c.m = m;
  c.n = n;
  c.k = k;
  c.gated = gated;
  c.density = density;
  c.seed = seed;
  return c;
}

inline FfnData make_ffn(const FfnCase& c) {
  FfnData d;
  d.m = c.m;
  d.n = c.n;
  d.k = c.k;
  d.gated = c.gated;
  std::mt19937_64 rng(c.seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(c.m * 131 + c.n * 7 + c.k));
  std::normal_distribution<double> nd(0.0, 1.0);
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  const std::int64_t M = c.m, N = c.n, K = c.k;
  d.x.resize(static_cast<std::size_t>(M * K));
  const double base = c.density > 0 ? inv_normal_cdf(c.density) : -40.0;
  const double hot_shift = inv_normal_cdf(c.hot_density) - base;
  for (std::int64_t m = 0; m < M; ++m) {
    double s = 0;
    if (m >= 1 && m <= c.zero_rows) {
      s = -60.0;
    } else if (m > c.zero_rows && m <= c.zero_rows + c.full_rows) {
      s = 60.0;
    } else if (c.hot_rows > 0 && ud(rng) < c.hot_rows) {
      s = hot_shift;
      d.special_rows.push_back(m);
    }
    if (m >= 1 && m <= c.zero_rows + c.full_rows) d.special_rows.push_back(m);
    float* xr = d.x.data() + m * K;
    xr[0] = 1.0f;
    xr[1] = c.exact_preactivation ? static_cast<float>(std::round(s * 4) / 4) : rb(s);
    for (std::int64_t kk = 2; kk < K; ++kk)
      xr[kk] = c.exact_preactivation ? static_cast<float>(std::clamp(std::round(nd(rng) * 4) / 4, -16.0, 16.0)) : rb(nd(rng));
  }
  const double sc = 1.0 / std::sqrt(static_cast<double>(K - 2));
  auto act = [&](std::vector<float>& w) {
    w.resize(static_cast<std::size_t>(N * K));
    for (std::int64_t n = 0; n < N; ++n) {
      float* r = w.data() + n * K;
      double b = base + 0.3 * nd(rng);  // mild neuron-popularity spread
      if (n >= N - c.full_cols) b = 60.0;
      else if (c.hot_neurons > 0 && ud(rng) < c.hot_neurons) b = inv_normal_cdf(c.hot_neuron_density);
      // On the 2⁻¹⁰ grid and bf16-exact: rounding rb(b) to the grid keeps ≤ 8 significant bits.
      r[0] = c.exact_preactivation ? static_cast<float>(std::round(static_cast<double>(rb(b)) * 1024) / 1024) : rb(b);
      r[1] = 1.0f;
      for (std::int64_t kk = 2; kk < K; ++kk)
        r[kk] = c.exact_preactivation ? static_cast<float>(std::clamp(std::round(sc * nd(rng) * 1024) / 1024, -0.25, 0.25))
                                      : rb(sc * nd(rng));
    }
  };
  if (c.gated) {
    act(d.wg);
    d.wu.resize(static_cast<std::size_t>(N * K));
    for (auto& v : d.wu) v = rb(sc * nd(rng));
  } else {
    act(d.wu);
  }
  d.wd.resize(static_cast<std::size_t>(K * N));
  const double sd = 1.0 / std::sqrt(static_cast<double>(std::max<std::int64_t>(1, N / 50)));
  for (auto& v : d.wd) v = rb(sd * nd(rng));
  return d;
}

// Rows to compare with the reference: all of them for small M, else a sample that always includes
// the first, the last and the special rows.
inline std::vector<std::int64_t> sample_rows(const FfnData& d, std::int64_t max_rows, std::uint64_t seed) {
  std::vector<std::int64_t> rows;
  if (d.m <= max_rows) {
    for (std::int64_t m = 0; m < d.m; ++m) rows.push_back(m);
    return rows;
  }
  rows.push_back(0);
  rows.push_back(d.m - 1);
  for (std::size_t i = 0; i < d.special_rows.size() && rows.size() < static_cast<std::size_t>(max_rows / 2); ++i)
    rows.push_back(d.special_rows[i]);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int64_t> ui(0, d.m - 1);
  while (rows.size() < static_cast<std::size_t>(max_rows)) rows.push_back(ui(rng));
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

// An exact gate from 0/1 features for the hot-neuron calibration tests (M = 512, N = 100, K = 64):
//   feature 0 = 1 on every row, Wg[:, 0] = −0.5: a neuron fires only with one of its features;
//   feature 1 on rows 0..19 (hot tokens) fires neurons 0..59 (count 20);
//   feature 2 on every row fires neuron 90 (count 512);
//   feature 3 + r % 30 on row r fires neuron 60 + r % 30 (count 17 or 18; 16 or 17 without rows 0..9);
//   feature 33 on rows 0..9 fires neurons 91..99 (count 10: cold).
// Wu and Wd are bf16-exact normal values (seed 7). The expected choices are in each test.
struct CalibrationGate {
  static constexpr std::int64_t M = 512, N = 100, K = 64;
  std::vector<float> x, wg, wu, wd;
  FfnWeights weights() const { return ffn_weights(wg.data(), wu.data(), wd.data(), N, K); }
};
inline CalibrationGate make_calibration_gate() {
  constexpr std::int64_t M = CalibrationGate::M, N = CalibrationGate::N, K = CalibrationGate::K;
  CalibrationGate g{std::vector<float>(M * K, 0.0f), std::vector<float>(N * K, 0.0f), std::vector<float>(N * K),
                    std::vector<float>(K * N)};
  for (std::int64_t r = 0; r < M; ++r) {
    g.x[r * K + 0] = g.x[r * K + 2] = g.x[r * K + 3 + r % 30] = 1.0f;
    if (r < 20) g.x[r * K + 1] = 1.0f;
    if (r < 10) g.x[r * K + 33] = 1.0f;
  }
  for (std::int64_t n = 0; n < N; ++n) {
    g.wg[n * K + 0] = -0.5f;
    if (n < 60) g.wg[n * K + 1] = 1.0f;
    if (n >= 60 && n < 90) g.wg[n * K + 3 + (n - 60)] = 1.0f;
    if (n == 90) g.wg[n * K + 2] = 1.0f;
    if (n > 90) g.wg[n * K + 33] = 1.0f;
  }
  std::mt19937_64 rng(7);
  std::normal_distribution<double> nd(0.0, 1.0);
  for (auto& v : g.wu) v = rb(nd(rng));
  for (auto& v : g.wd) v = rb(nd(rng));
  return g;
}

}  // namespace twell::cuda::test
