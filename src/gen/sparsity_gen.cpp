#include "twell/sparsity_gen.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace twell {
namespace {

// Counter-based randomness: every value is a pure function of (seed, stream, index), so the
// output is the same whatever the thread count.
std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
double uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t i) {
  const std::uint64_t h = mix(mix(seed ^ mix(stream)) + i);
  return (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53;  // (0, 1)
}
double normal(std::uint64_t seed, std::uint64_t stream, std::uint64_t i) {
  const double u1 = uniform(seed, stream, 2 * i), u2 = uniform(seed, stream, 2 * i + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

double phi(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }
double phi_inv(double p) {  // bisection: monotone, plenty accurate for target setting
  double lo = -40, hi = 40;
  for (int it = 0; it < 100; ++it) {
    const double mid = 0.5 * (lo + hi);
    (phi(mid) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

enum Stream : std::uint64_t { kX = 1, kWg, kWu, kWd, kDy, kRow, kNeuron, kDead };

}  // namespace

void SparsityParams::validate() const {
  TWELL_CHECK(m >= 1 && n >= 1, ErrorCode::invalid_argument, "generator: M and N must be ≥ 1 (got M={}, N={})", m, n);
  TWELL_CHECK(k >= 3, ErrorCode::invalid_argument, "generator: K must be ≥ 3 (two columns carry the bias and row shift), got {}", k);
  TWELL_CHECK(density > 0 && density <= 1, ErrorCode::invalid_argument, "generator: density {} must be in (0, 1]", density);
  TWELL_CHECK(row_spread >= 0 && row_spread <= 3, ErrorCode::invalid_argument, "generator: row spread {} must be in [0, 3]", row_spread);
  TWELL_CHECK(neuron_skew >= 0 && neuron_skew <= 3, ErrorCode::invalid_argument, "generator: neuron skew {} must be in [0, 3]", neuron_skew);
  TWELL_CHECK(hot_rows >= 0 && hot_rows < 1, ErrorCode::invalid_argument, "generator: hot-row fraction {} must be in [0, 1)", hot_rows);
  TWELL_CHECK(hot_density > 0 && hot_density <= 1, ErrorCode::invalid_argument, "generator: hot density {} must be in (0, 1]", hot_density);
  TWELL_CHECK(dead_neurons >= 0 && dead_neurons < 1, ErrorCode::invalid_argument, "generator: dead fraction {} must be in [0, 1)", dead_neurons);
  TWELL_CHECK(hot_rows == 0 || hot_rows * hot_density < density, ErrorCode::invalid_argument,
              "generator: hot rows alone ({} × {}) exceed the mean density {}", hot_rows, hot_density, density);
}

GeneratedFfn generate_ffn(const SparsityParams& p) {
  p.validate();
  const std::int64_t M = p.m, K = p.k, N = p.n;
  const std::uint64_t seed = p.seed;

  // Neuron popularity π_n: log-normal, dead neurons 0, normalised to mean 1 over all N.
  std::vector<double> pop(static_cast<std::size_t>(N));
  for (std::int64_t n = 0; n < N; ++n)
    pop[static_cast<std::size_t>(n)] = std::exp(p.neuron_skew * normal(seed, kNeuron, static_cast<std::uint64_t>(n)));
  std::vector<std::int64_t> perm(static_cast<std::size_t>(N));
  std::iota(perm.begin(), perm.end(), 0);
  std::sort(perm.begin(), perm.end(), [&](auto a, auto b) {
    return uniform(seed, kDead, static_cast<std::uint64_t>(a)) < uniform(seed, kDead, static_cast<std::uint64_t>(b));
  });
  const auto dead = static_cast<std::int64_t>(std::llround(p.dead_neurons * static_cast<double>(N)));
  for (std::int64_t i = 0; i < dead; ++i) pop[static_cast<std::size_t>(perm[static_cast<std::size_t>(i)])] = 0;
  const double pop_mean = std::accumulate(pop.begin(), pop.end(), 0.0) / static_cast<double>(N);
  // Bias b_n so that P(active | row shift 0) = density · π_n.
  std::vector<double> bias(static_cast<std::size_t>(N));
  for (std::int64_t n = 0; n < N; ++n) {
    const double target = pop_mean > 0 ? p.density * pop[static_cast<std::size_t>(n)] / pop_mean : 0.0;
    bias[static_cast<std::size_t>(n)] = target <= 0 ? -60.0 : phi_inv(std::min(target, 0.999));
  }
  // F(s) = mean_n Φ(s + b_n), tabulated, to solve per-row shifts for per-row target densities.
  constexpr int kGrid = 1201;
  constexpr double kLo = -8, kHi = 10;
  std::vector<double> F(kGrid);
#pragma omp parallel for schedule(static)
  for (int i = 0; i < kGrid; ++i) {
    const double s = kLo + (kHi - kLo) * i / (kGrid - 1);
    double acc = 0;
    for (double b : bias) acc += phi(s + b);
    F[static_cast<std::size_t>(i)] = acc / static_cast<double>(N);
  }
  const auto shift_for = [&](double target) {
    if (target <= F.front()) return kLo;
    if (target >= F.back()) return kHi;
    const auto it = std::lower_bound(F.begin(), F.end(), target);
    const auto i = static_cast<std::size_t>(it - F.begin());
    const double f0 = F[i - 1], f1 = F[i];
    const double t = f1 > f0 ? (target - f0) / (f1 - f0) : 0.0;
    return kLo + (kHi - kLo) * (static_cast<double>(i - 1) + t) / (kGrid - 1);
  };
  // Row multipliers: log-normal spread normalised to mean 1; hot rows pinned to hot_density and the
  // other rows scaled so that the overall mean stays `density`.
  std::vector<double> row_target(static_cast<std::size_t>(M));
  std::vector<char> hot(static_cast<std::size_t>(M), 0);
  double spread_sum = 0;
  std::int64_t n_hot = 0;
  for (std::int64_t m = 0; m < M; ++m) {
    hot[static_cast<std::size_t>(m)] = uniform(seed, kRow, 2 * static_cast<std::uint64_t>(m)) < p.hot_rows;
    n_hot += hot[static_cast<std::size_t>(m)];
    const double sigma = p.row_spread;
    row_target[static_cast<std::size_t>(m)] = std::exp(sigma * normal(seed, kRow, 2 * static_cast<std::uint64_t>(m) + 1) - 0.5 * sigma * sigma);
    if (!hot[static_cast<std::size_t>(m)]) spread_sum += row_target[static_cast<std::size_t>(m)];
  }
  const double cold_mass = p.density * static_cast<double>(M) - p.hot_density * static_cast<double>(n_hot);
  const double scale = spread_sum > 0 ? std::max(cold_mass, 0.0) / spread_sum : 0.0;
  for (std::int64_t m = 0; m < M; ++m) {
    auto& t = row_target[static_cast<std::size_t>(m)];
    t = hot[static_cast<std::size_t>(m)] ? p.hot_density : std::min(t * scale, 1.0);
  }

  GeneratedFfn g;
  g.x = HostTensor(DType::f32, {M, K});
  g.w_up = HostTensor(DType::f32, {N, K});
  g.w_down = HostTensor(DType::f32, {K, N});
  g.dy = HostTensor(DType::f32, {M, K});
  if (p.gated) g.w_gate = HostTensor(DType::f32, {N, K});
  float* x = g.x.data<float>();
  float* dy = g.dy.data<float>();
#pragma omp parallel for schedule(static)
  for (std::int64_t m = 0; m < M; ++m) {
    float* xr = x + m * K;
    xr[0] = 1.0f;
    xr[1] = static_cast<float>(shift_for(row_target[static_cast<std::size_t>(m)]));
    for (std::int64_t k = 2; k < K; ++k) xr[k] = static_cast<float>(normal(seed, kX, static_cast<std::uint64_t>(m * K + k)));
    for (std::int64_t k = 0; k < K; ++k) dy[m * K + k] = static_cast<float>(normal(seed, kDy, static_cast<std::uint64_t>(m * K + k)));
  }
  // The weight that carries the sparsity: bias column 0, row-shift column 1, N(0, 1/(K−2)) elsewhere.
  const double wscale = 1.0 / std::sqrt(static_cast<double>(K - 2));
  float* ws = p.gated ? g.w_gate.data<float>() : g.w_up.data<float>();
  float* wu = g.w_up.data<float>();
#pragma omp parallel for schedule(static)
  for (std::int64_t n = 0; n < N; ++n) {
    float* row = ws + n * K;
    row[0] = static_cast<float>(bias[static_cast<std::size_t>(n)]);
    row[1] = 1.0f;
    for (std::int64_t k = 2; k < K; ++k) row[k] = static_cast<float>(wscale * normal(seed, kWg, static_cast<std::uint64_t>(n * K + k)));
    if (p.gated)
      for (std::int64_t k = 0; k < K; ++k)
        wu[n * K + k] = static_cast<float>(normal(seed, kWu, static_cast<std::uint64_t>(n * K + k)) / std::sqrt(static_cast<double>(K)));
  }
  float* wd = g.w_down.data<float>();
  const double dscale = 1.0 / std::sqrt(std::max(1.0, p.density * static_cast<double>(N)));
#pragma omp parallel for schedule(static)
  for (std::int64_t k = 0; k < K; ++k)
    for (std::int64_t n = 0; n < N; ++n)
      wd[k * N + n] = static_cast<float>(dscale * normal(seed, kWd, static_cast<std::uint64_t>(k * N + n)));
  return g;
}

}  // namespace twell
