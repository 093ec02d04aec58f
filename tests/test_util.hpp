#pragma once
// Shared helpers for the CPU tests: random inputs seeded from the test name (the same in every run
// unless TWELL_TEST_FRESH=1; every seed printed), adversarial patterns, and comparisons.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "twell/sparsity_gen.hpp"
#include "twell/tensor.hpp"

namespace twell::test {

// The largest vocabulary a test of the sampling ops takes: TWELL_TEST_MAX_VOCAB when set (the
// sanitizer runs of scripts/gpu-check, where racecheck instruments every shared-memory access and a
// 128 k vocabulary at every option takes minutes), else no limit. The kernels' code paths are the
// same from a few blocks' width on; the smaller vocabularies stay.
inline std::int64_t test_max_vocab() {
  static const std::int64_t v = [] {
    const char* s = std::getenv("TWELL_TEST_MAX_VOCAB");
    return s ? static_cast<std::int64_t>(std::stoll(s)) : std::numeric_limits<std::int64_t>::max();
  }();
  return v;
}

// A seed per call, printed and recorded in the test output. The base is TWELL_TEST_SEED when set;
// a fresh draw with TWELL_TEST_FRESH=1; else a hash of the running test's full name, so that a CI run
// draws the same inputs every time and one test name means one input (its k-th call gets the same
// seed in every run). A failure prints the base that repeats it.
inline std::uint64_t fresh_seed() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "";
  static std::string last_name;
  static std::uint64_t base = 0, counter = 0;
  if (counter == 0 || name != last_name) {
    last_name = name;
    counter = 0;
    if (const char* s = std::getenv("TWELL_TEST_SEED")) {
      base = static_cast<std::uint64_t>(std::stoull(s));
    } else if (const char* f = std::getenv("TWELL_TEST_FRESH"); f && std::string(f) == "1") {
      base = static_cast<std::uint64_t>(std::random_device{}()) << 32 | std::random_device{}();
    } else {
      base = 1469598103934665603ull;  // FNV-1a of the test's name
      for (unsigned char c : name) base = (base ^ c) * 1099511628211ull;
    }
  }
  const std::uint64_t seed = base + 0x9e3779b97f4a7c15ull * ++counter;
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  // Also in the log, so that a failure seen in a CI or device log can be repeated.
  std::fprintf(stderr, "[seed] %llu (base %llu, call %llu: TWELL_TEST_SEED=%llu repeats the run)\n",
               static_cast<unsigned long long>(seed), static_cast<unsigned long long>(base),
               static_cast<unsigned long long>(counter), static_cast<unsigned long long>(base));
  return seed;
}

struct Rng {
  std::mt19937_64 gen;
  explicit Rng(std::uint64_t seed) : gen(seed) {}
  float normal(float sd = 1.0f) { return std::normal_distribution<float>(0.0f, sd)(gen); }
  double uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(gen); }
  std::int64_t below(std::int64_t n) { return std::uniform_int_distribution<std::int64_t>(0, n - 1)(gen); }
};

inline std::vector<float> random_matrix(Rng& rng, std::int64_t rows, std::int64_t cols, float sd = 1.0f) {
  std::vector<float> v(static_cast<std::size_t>(rows * cols));
  for (auto& e : v) e = rng.normal(sd);
  return v;
}

// A sparse matrix with per-row density drawn from `densities` (cycled), values of random sign.
// Row kinds: density 0 → empty row, 1 → every entry non-zero.
inline std::vector<float> random_sparse(Rng& rng, std::int64_t rows, std::int64_t cols, const std::vector<double>& densities,
                                        bool positive_only = false) {
  std::vector<float> v(static_cast<std::size_t>(rows * cols), 0.0f);
  for (std::int64_t r = 0; r < rows; ++r) {
    const double d = densities[static_cast<std::size_t>(r) % densities.size()];
    for (std::int64_t c = 0; c < cols; ++c)
      if (d >= 1.0 || rng.uniform() < d) {
        float x = rng.normal();
        if (x == 0.0f) x = 1.0f;
        v[static_cast<std::size_t>(r * cols + c)] = positive_only ? std::fabs(x) : x;
      }
  }
  return v;
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) return std::numeric_limits<double>::infinity();
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return m;
}

inline double norm(const std::vector<double>& b) {
  double s = 0;
  for (double v : b) s += v * v;
  return std::sqrt(s);
}

// ‖a − b‖₂ / ‖b‖₂ over a whole tensor (0 when both are zero; ∞ on NaN).
inline double rel_err(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) return std::numeric_limits<double>::infinity();
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += b[i] * b[i];
  }
  if (den == 0) return num == 0 ? 0 : std::numeric_limits<double>::infinity();
  return std::sqrt(num / den);
}

// Generator parameters for a test shape (the seed is set by each test from fresh_seed()).
inline SparsityParams sparsity(std::int64_t m, std::int64_t k, std::int64_t n, double density, bool gated, double hot_rows,
                               double hot_density, double neuron_skew = 1.0) {
  return {.m = m, .k = k, .n = n, .density = density, .hot_rows = hot_rows, .hot_density = hot_density,
          .neuron_skew = neuron_skew, .gated = gated};
}

inline std::vector<float> poisoned(std::size_t n) { return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()); }

}  // namespace twell::test
