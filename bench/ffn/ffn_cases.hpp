#pragma once
// The FFN's test cases as data, one table for every backend (issue 26's "one name per op"): each
// case names a shape, the generator's settings (density, hot rows, zero / all-active rows, hot
// neurons, exact pre-activations), TwELL's tile and compression, and the backends it runs on.
// Inference (ffn_cases): tests/test_cpu_ffn.cpp instantiates the CPU ops' suite from the cases
// with `cpu`, tests/cuda/test_cuda_ffn.cpp the CUDA one from those with `cuda`, and `twell bench
// ffn --cases` runs them as a check or timed. Training (ffn_train_cases): tests/test_cpu_train.cpp
// and tests/cuda/test_cuda_train.cpp likewise. Every op is checked against the float64 oracle
// (src/cpu/reference.cpp) on the same generated inputs. The layer sweep's points (ffn_sweep_cases:
// the 2B shape at the benchmark's generator) are named cases too: `twell bench ffn --cases sweep`
// checks or times them, and twell_bench_cuda runs its variant comparisons over them. Host code only,
// in bench/ rather than tests/ because the CLI runs it and includes nothing from tests/ (target
// twell_ffn_cases). The seeds are part of each case: a case's name means one input everywhere.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "twell/bf16.hpp"
#include "twell/ffn.hpp"
#include "twell/sparsity_gen.hpp"

namespace twell::test {

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
  // The generator: the tests' (above: rows and neurons under exact control) or, when model_like,
  // twell::generate_ffn's (DESIGN §7, the benchmarks': heavy-tailed row densities, log-normal neuron
  // popularity of σ = neuron_skew, 5 % dead neurons), which takes density, hot_rows, hot_density,
  // gated and seed from here and ignores the other generator fields.
  bool model_like = false;
  double neuron_skew = 1.0;
  int compression = 8;  // TwELL's C: S = tile / C words per block
  int tile = 256;        // TwELL's T (the CUDA kernels take 256 only)
  std::uint64_t seed = 1;
  bool cpu = true, cuda = true;  // where the case runs (the table's entries say why one is off)
};

// gtest prints a parameter in test listings; the case name says it all.
inline void PrintTo(const FfnCase& c, std::ostream* os) { *os << c.name; }

struct FfnData {
  std::vector<float> x, wg, wu, wd;
  std::vector<float> dy;  // model_like cases: the generator's upstream gradient (else make_dy's)
  std::int64_t m = 0, n = 0, k = 0;
  bool gated = true;
  std::vector<std::int64_t> special_rows;  // hot / zero / full rows
  CMatrixF xv() const { return {x.data(), m, k}; }
  FfnWeights weights() const { return ffn_weights(gated ? wg.data() : nullptr, wu.data(), wd.data(), n, k); }
};

inline float rb(double v) { return round_bf16(static_cast<float>(v)); }

// A density for a case name: 0.005 → "0p5", 0.01 → "1", 0.0133 → "1p33" (percent, '.' as 'p').
inline std::string fmt_density(double density) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", 100 * density);
  std::string t = buf;
  while (t.back() == '0') t.pop_back();
  if (t.back() == '.') t.pop_back();
  for (char& ch : t)
    if (ch == '.') ch = 'p';
  return t;
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

// A model_like case: twell::generate_ffn, every tensor rounded to bf16 (so the float64 oracle sees
// what a bf16 backend sees).
inline FfnData make_model_like_ffn(const FfnCase& c) {
  const GeneratedFfn g = generate_ffn({.m = c.m, .k = c.k, .n = c.n, .density = c.density, .hot_rows = c.hot_rows,
                                       .hot_density = c.hot_density, .neuron_skew = c.neuron_skew, .gated = c.gated,
                                       .seed = c.seed});
  auto rounded = [](const HostTensor& t) {
    std::vector<float> v(static_cast<std::size_t>(t.numel()));
    const float* p = t.data<float>();
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = round_bf16(p[i]);
    return v;
  };
  FfnData d;
  d.m = c.m;
  d.n = c.n;
  d.k = c.k;
  d.gated = c.gated;
  d.x = rounded(g.x);
  d.wu = rounded(g.w_up);
  d.wd = rounded(g.w_down);
  d.dy = rounded(g.dy);
  if (c.gated) d.wg = rounded(g.w_gate);
  return d;
}

inline FfnData make_ffn(const FfnCase& c) {
  if (c.model_like) return make_model_like_ffn(c);
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


// The table. Designated initializers: a positional list past `density` silently lands in the wrong
// field when FfnCase grows (the "c4" case once set hot_neurons = 4 instead of compression = 4).
// `cpu` is on where the float64 oracle over every row stays under ≈ 3·10⁸ multiply-adds (CI's two
// cores); the CPU-only edge shapes at the end have not been run through the CUDA suite yet.
inline std::vector<FfnCase> ffn_cases() {
  std::vector<FfnCase> v;
  auto add = [&](FfnCase c) {
    c.cpu = c.cpu && static_cast<double>(c.m) * static_cast<double>(c.n) * static_cast<double>(c.k) <= 3e8;
    v.push_back(std::move(c));
  };
  add({.name = "m1_n5632_k2048_d0p5", .m = 1, .n = 5632, .k = 2048, .density = 0.005});
  add({.name = "m7_n1000_k520_d5", .m = 7, .n = 1000, .k = 520, .density = 0.05});
  add({.name = "m64_n8192_k1024_d1", .m = 64, .n = 8192, .k = 1024, .density = 0.01});
  add({.name = "m255_n11008_k4096_d0p5", .m = 255, .n = 11008, .k = 4096, .density = 0.005});
  add({.name = "m256_n5632_k2048_d0", .m = 256, .n = 5632, .k = 2048, .density = 0.0});
  add({.name = "m257_n70000_k520_d2", .m = 257, .n = 70000, .k = 520, .density = 0.02, .hot_density = 0.3, .zero_rows = 2,
       .full_rows = 1});
  add({.name = "m1000_n1000_k1024_d20", .m = 1000, .n = 1000, .k = 1024, .density = 0.20});
  add({.name = "m1000_n5632_k2048_hot", .m = 1000, .n = 5632, .k = 2048, .density = 0.01, .hot_rows = 0.05,
       .hot_density = 0.3, .zero_rows = 3, .full_rows = 3});
  // Compression factors C = 4, 2, 64, 128: S = 64, 128, 4, 2 words per block (S = 2 and S ≥ 64
  // take other paths through the sm90 packers' row stage than S = 32).
  add({.name = "m300_n5632_k1024_hot_c4", .m = 300, .n = 5632, .k = 1024, .density = 0.01, .hot_rows = 0.1,
       .hot_density = 0.4, .zero_rows = 1, .full_rows = 1, .compression = 4});
  add({.name = "m130_n1000_k520_d3_c2", .m = 130, .n = 1000, .k = 520, .density = 0.03, .hot_rows = 0.1,
       .hot_density = 0.7, .full_rows = 1, .compression = 2});
  add({.name = "m97_n3000_k520_d1_c64", .m = 97, .n = 3000, .k = 520, .density = 0.01, .hot_rows = 0.1,
       .hot_density = 0.1, .zero_rows = 1, .full_rows = 1, .compression = 64});
  add({.name = "m70_n600_k264_d0p5_c128", .m = 70, .n = 600, .k = 264, .density = 0.005, .hot_rows = 0.1,
       .hot_density = 0.05, .full_rows = 1, .compression = 128});
  add({.name = "m16384_n5632_k2048_d0p5_hot", .m = 16384, .n = 5632, .k = 2048, .density = 0.005, .hot_rows = 0.03,
       .hot_density = 0.12});
  add({.name = "m4097_n5632_k1024_d1", .m = 4097, .n = 5632, .k = 1024, .density = 0.01});  // chunked gate: a ragged last chunk
  // Hot neurons (5 % of them active in 5 % of tokens) and three columns active in every token.
  add({.name = "m2048_n5632_k2048_d0p5_hotneurons", .m = 2048, .n = 5632, .k = 2048, .density = 0.005,
       .hot_neurons = 0.05, .hot_neuron_density = 0.05, .full_cols = 3});
  add({.name = "nongated_m5000_n1000_k520_d2_hot", .m = 5000, .n = 1000, .k = 520, .density = 0.02, .gated = false,
       .hot_rows = 0.02, .hot_density = 0.3});
  add({.name = "nongated_m257_n5632_k2048_d1", .m = 257, .n = 5632, .k = 2048, .density = 0.01, .gated = false});
  add({.name = "nongated_m1_n5632_k2048_d0p5", .m = 1, .n = 5632, .k = 2048, .density = 0.005, .gated = false});
  add({.name = "nongated_m64_n1000_k520_d20_full", .m = 64, .n = 1000, .k = 520, .density = 0.20, .gated = false,
       .hot_density = 0.3, .zero_rows = 2, .full_rows = 2});
  add({.name = "nongated_m1000_n8192_k4096_hot", .m = 1000, .n = 8192, .k = 4096, .density = 0.005, .gated = false,
       .hot_rows = 0.05, .hot_density = 0.25});
  // Edge shapes for the CPU ops: one row, ragged N (a partial last tile), tiny K, N over 65536,
  // other tiles (T = 32), dense rows that overflow TwELL.
  add({.name = "m1_n300_k64_d5", .m = 1, .n = 300, .k = 64, .density = 0.05, .cuda = false});
  add({.name = "m7_n1000_k40_d2", .m = 7, .n = 1000, .k = 40, .density = 0.02, .cuda = false});
  add({.name = "m33_n257_k48_d10", .m = 33, .n = 257, .k = 48, .density = 0.1, .cuda = false});
  add({.name = "m64_n600_k64_d8_hot", .m = 64, .n = 600, .k = 64, .density = 0.08, .hot_rows = 0.1, .hot_density = 0.3,
       .zero_rows = 1, .full_rows = 1, .cuda = false});
  add({.name = "nongated_m40_n520_k32_d5", .m = 40, .n = 520, .k = 32, .density = 0.05, .gated = false, .cuda = false});
  add({.name = "nongated_m64_n300_k24_d10_hot", .m = 64, .n = 300, .k = 24, .density = 0.1, .gated = false,
       .hot_rows = 0.2, .hot_density = 0.3, .cuda = false});
  add({.name = "m17_n700_k36_d20", .m = 17, .n = 700, .k = 36, .density = 0.2, .cuda = false});
  add({.name = "m3_n70000_k16_d0p3", .m = 3, .n = 70000, .k = 16, .density = 0.003, .cuda = false});
  add({.name = "m20_n200_k32_d10_t32_c4", .m = 20, .n = 200, .k = 32, .density = 0.1, .compression = 4, .tile = 32,
       .cuda = false});
  return v;
}


// A sweep point at the 2B FFN's shape (K = 2048, N = 5632) with the benchmark generator, seed
// seed0 + M; named PREFIX<M>_[nongated_](hot|d<density>). On the CPU where the float64 oracle over
// every row stays under ≈ 3·10⁸ multiply-adds, as the test table.
inline FfnCase sweep_case(const char* prefix, std::int64_t m, double density, bool gated, double hot_rows,
                          std::uint64_t seed0) {
  FfnCase c;
  c.name = prefix;
  c.name += std::to_string(m);
  c.name += gated ? "_" : "_nongated_";
  if (hot_rows > 0) {
    c.name += "hot";
  } else {
    c.name += 'd';
    c.name += fmt_density(density);
  }
  c.m = m;
  c.n = 5632;
  c.k = 2048;
  c.density = density;
  c.gated = gated;
  c.hot_rows = hot_rows;
  c.hot_density = 0.12;
  c.model_like = true;
  c.seed = seed0 + static_cast<std::uint64_t>(m);
  c.cpu = static_cast<double>(m) * 5632.0 * 2048.0 <= 3e8;
  return c;
}

// The layer sweep's points (twell_bench_cuda; `twell bench ffn --cases sweep|sweep-quick`): the 2B
// model's FFN (K = 2048, N = 5632) at the benchmark generator's statistics, seeds 1234 + M as the
// sweep has always drawn them (results stay comparable with bench/results/ across the move).
// quick: the points of the quick sweep (scripts/gpu-check). Not in the test suites: a float64
// check of M = 131072 needs sampled rows, which the driver's test mode does.
struct SweepCase {
  FfnCase f;
  bool quick = false;
  // The sweep's label (results match points by it): uni (one mean density for every row, the
  // default neuron skew), flat (uni with uniform neuron popularity), hot (hot rows), nongated.
  std::string mode;
};

inline std::vector<SweepCase> ffn_sweep_cases() {
  std::vector<SweepCase> v;
  auto add = [&](std::string mode, std::int64_t m, double density, bool quick, bool gated = true, double hot_rows = 0,
                 double neuron_skew = 1.0) {
    FfnCase c = sweep_case("sweep_m", m, density, gated, hot_rows, 1234);
    c.neuron_skew = neuron_skew;
    if (neuron_skew == 0) c.name += "_uniform";
    v.push_back({std::move(c), quick, std::move(mode)});
  };
  for (std::int64_t m : {16384, 131072}) {
    const bool q = m == 16384;
    for (double d : {0.005, 0.01, 0.03, 0.10}) add("uni", m, d, q);
    // The reference's hot mode: 1 % base with 3 % of tokens at ≈ 12 % (1.33 % mean; issue 3's
    // hot-row target is set there). Until the seventh session this point ran at 1.0 % mean.
    add("hot", m, 0.0133, q, true, 0.03);
    add("nongated", m, 0.005, q, false);
    add("nongated", m, 0.01, false, false);
  }
  // Uniform neuron popularity beside the skewed default (issue 26: the hot-neuron split draws much
  // of its gain from the skew, and real models' skew is not known).
  add("flat", 16384, 0.005, true, true, 0, 0.0);
  add("flat", 16384, 0.01, true, true, 0, 0.0);
  for (std::int64_t m : {1, 4, 8, 16, 64, 256, 1024, 4096}) add("uni", m, 0.005, true);
  // Decode: where the sparse path stops paying at one and a few tokens.
  for (std::int64_t m : {1, 4, 8, 16})
    for (double d : {0.01, 0.03}) add("uni", m, d, true);
  return v;
}

// ---- Training (forward + backward) ----

// A training case: the inference case's shape and generator (exact pre-activations for every case,
// so that fp32, bf16 tensor cores and float64 agree on the ReLU pattern), the L1 coefficient, and
// per backend what it is checked against. Each case's dy comes from make_dy.
struct FfnTrainCase {
  FfnCase f;
  double l1_coeff = 0.5;
  bool fp64_oracle = true;  // CUDA: against the float64 oracle; else against the CPU's fp32 sparse step (large shapes)
  int ell_width = 128;      // CPU: the hybrid format's ELL width (rows past it go to the tail)
};
inline void PrintTo(const FfnTrainCase& c, std::ostream* os) { *os << c.f.name; }

// dy of a training case: N(0, 1) rounded to bf16, from the case's seed (model_like cases: the
// generator's, FfnData::dy).
inline std::vector<float> make_dy(const FfnCase& c) {
  std::vector<float> dy(static_cast<std::size_t>(c.m * c.k));
  std::mt19937_64 rng(c.seed ^ 0xD1CEull);
  std::normal_distribution<double> nd(0.0, 1.0);
  for (auto& v : dy) v = rb(nd(rng));
  return dy;
}

// The training table. `cpu` is on where the float64 oracle of a whole step stays under ≈ 3·10⁸
// multiply-adds per matrix product; the CPU-only cases at the end exercise the CPU hybrid format's
// ELL width and tail, which the CUDA step does not have.
inline std::vector<FfnTrainCase> ffn_train_cases() {
  std::vector<FfnTrainCase> v;
  auto add = [&](FfnTrainCase c) {
    c.f.exact_preactivation = true;
    c.f.cpu = c.f.cpu && static_cast<double>(c.f.m) * static_cast<double>(c.f.n) * static_cast<double>(c.f.k) <= 3e8;
    v.push_back(std::move(c));
  };
  add({.f = {.name = "m1_n1000_k520", .m = 1, .n = 1000, .k = 520, .density = 0.05}});
  add({.f = {.name = "m7_n5632_k2048", .m = 7, .n = 5632, .k = 2048, .density = 0.01}});
  add({.f = {.name = "m64_n1003_k520_d20_edges", .m = 64, .n = 1003, .k = 520, .density = 0.20, .zero_rows = 3,
             .full_rows = 2}});
  add({.f = {.name = "m64_n1000_k520_d0", .m = 64, .n = 1000, .k = 520, .density = 0.0}});
  add({.f = {.name = "m48_n1000_k520_full_and_hot_neurons", .m = 48, .n = 1000, .k = 520, .density = 0.01,
             .hot_neurons = 0.02, .hot_neuron_density = 0.5, .full_cols = 3}});
  add({.f = {.name = "nongated_m300_n1000_k520_d3", .m = 300, .n = 1000, .k = 520, .density = 0.03, .gated = false}});
  add({.f = {.name = "m257_n5632_k2048_d05", .m = 257, .n = 5632, .k = 2048, .density = 0.005}, .fp64_oracle = false});
  add({.f = {.name = "m2048_n5632_k2048_hot_rows", .m = 2048, .n = 5632, .k = 2048, .density = 0.01, .hot_rows = 0.05,
             .hot_density = 0.3},
       .fp64_oracle = false});
  add({.f = {.name = "m1000_n70000_k520_d05", .m = 1000, .n = 70000, .k = 520, .density = 0.005}, .fp64_oracle = false});
  // All-active columns of 4096 entries: split into many weight-gradient items.
  add({.f = {.name = "m4096_n1000_k520_full_cols", .m = 4096, .n = 1000, .k = 520, .density = 0.01, .full_cols = 2},
       .fp64_oracle = false});
  add({.f = {.name = "nongated_m1000_n5632_k2048_edges", .m = 1000, .n = 5632, .k = 2048, .density = 0.005, .gated = false,
             .zero_rows = 4, .full_rows = 1},
       .fp64_oracle = false});
  add({.f = {.name = "m70000_n1000_k520_d1", .m = 70000, .n = 1000, .k = 520, .density = 0.01}, .fp64_oracle = false});
  add({.f = {.name = "m16384_n5632_k2048_d05", .m = 16384, .n = 5632, .k = 2048, .density = 0.005}, .fp64_oracle = false});
  // CPU only: the hybrid format's ELL width at its edges (rows spilling into the tail; every row
  // in it at width 1), hot rows and hot neurons, no L1.
  add({.f = {.name = "m50_n1000_k40_d2", .m = 50, .n = 1000, .k = 40, .density = 0.02, .cuda = false}});
  add({.f = {.name = "m80_n300_k24_d10_hot_rows_ell16", .m = 80, .n = 300, .k = 24, .density = 0.1, .hot_rows = 0.1,
             .hot_density = 0.5, .cuda = false},
       .ell_width = 16});
  add({.f = {.name = "m60_n256_k24_d5_hot_neurons_ell8", .m = 60, .n = 256, .k = 24, .density = 0.05, .hot_neurons = 0.1,
             .hot_neuron_density = 0.5, .cuda = false},
       .ell_width = 8});
  add({.f = {.name = "m20_n64_k16_d30_ell1", .m = 20, .n = 64, .k = 16, .density = 0.3, .cuda = false}, .ell_width = 1});
  add({.f = {.name = "nongated_m40_n128_k16_d20_hot_rows_ell4", .m = 40, .n = 128, .k = 16, .density = 0.2, .gated = false,
             .hot_rows = 0.2, .hot_density = 0.5, .cuda = false},
       .ell_width = 4});
  add({.f = {.name = "m30_n150_k20_d5_no_l1", .m = 30, .n = 150, .k = 20, .density = 0.05, .cuda = false}, .l1_coeff = 0.0});
  return v;
}

// The training sweep's points (twell_bench_cuda's training part; `twell bench ffn --op train
// --cases sweep|sweep-quick`): the 2B FFN at the benchmark generator, L1 1e-3, seeds 4321 + M as
// the sweep has drawn them. Checked against the CPU's fp32 sparse step on a sub-batch, as the
// large training cases above.
struct TrainSweepCase {
  FfnTrainCase t;
  bool quick = false;
  std::string mode;  // as SweepCase::mode
};

inline std::vector<TrainSweepCase> ffn_train_sweep_cases() {
  std::vector<TrainSweepCase> v;
  auto add = [&](std::string mode, std::int64_t m, double density, bool quick, bool gated = true, double hot_rows = 0) {
    FfnTrainCase t;
    t.f = sweep_case("sweep_train_m", m, density, gated, hot_rows, 4321);
    t.l1_coeff = 1e-3;
    t.fp64_oracle = false;
    v.push_back({std::move(t), quick, std::move(mode)});
  };
  for (double d : {0.005, 0.01, 0.03, 0.10}) add("uni", 16384, d, true);
  add("hot", 16384, 0.0133, true, true, 0.03);  // the reference's hot mode (1.33 % mean; 1.0 % until the seventh session)
  add("nongated", 16384, 0.005, true, false);
  for (std::int64_t m : {256, 2048, 4096}) add("uni", m, 0.005, false);
  return v;
}

}  // namespace twell::test
