// Next-token sampling (see twell/model/sampler.hpp).
#include "twell/model/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "twell/error.hpp"

namespace twell::model {

void check_sampling(const SamplingOptions& o) {
  TWELL_CHECK(std::isfinite(o.temperature) && o.temperature >= 0, ErrorCode::invalid_argument,
              "temperature must be ≥ 0 (0: greedy), got {}", o.temperature);
  TWELL_CHECK(o.top_k >= 0, ErrorCode::invalid_argument, "top-k must be ≥ 0 (0: off), got {}", o.top_k);
  TWELL_CHECK(o.top_p > 0 && o.top_p <= 1, ErrorCode::invalid_argument, "top-p must lie in (0, 1], got {}", o.top_p);
  TWELL_CHECK(std::isfinite(o.repetition_penalty) && o.repetition_penalty > 0, ErrorCode::invalid_argument,
              "repetition penalty must be > 0 (1: off), got {}", o.repetition_penalty);
}

Sampler::Sampler(const SamplingOptions& o) : o_(o), rng_(o.seed) { check_sampling(o); }

std::int32_t Sampler::sample(std::span<const float> logits, std::span<const std::int32_t> history) {
  const auto V = static_cast<std::int64_t>(logits.size());
  TWELL_CHECK(V > 0, ErrorCode::invalid_argument, "sample: empty logits");
  std::vector<double> z(logits.begin(), logits.end());
  for (std::int64_t i = 0; i < V; ++i)
    TWELL_CHECK(std::isfinite(z[static_cast<std::size_t>(i)]), ErrorCode::non_finite,
                "sample: logit of token {} is {}", i, z[static_cast<std::size_t>(i)]);
  if (o_.repetition_penalty != 1.0) {
    std::vector<char> seen(static_cast<std::size_t>(V), 0);
    for (auto id : history)
      if (id >= 0 && id < V) seen[static_cast<std::size_t>(id)] = 1;
    for (std::int64_t i = 0; i < V; ++i) {
      auto& v = z[static_cast<std::size_t>(i)];
      if (seen[static_cast<std::size_t>(i)]) v = v > 0 ? v / o_.repetition_penalty : v * o_.repetition_penalty;
    }
  }
  if (o_.temperature == 0.0) return static_cast<std::int32_t>(std::max_element(z.begin(), z.end()) - z.begin());

  // Candidates by decreasing logit (ties: lower id first), cut by top-k, then softmax, then top-p.
  std::vector<std::int32_t> idx(static_cast<std::size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  const std::int64_t k = o_.top_k > 0 ? std::min(o_.top_k, V) : V;
  auto by_logit = [&](std::int32_t a, std::int32_t b) {
    return z[static_cast<std::size_t>(a)] > z[static_cast<std::size_t>(b)] ||
           (z[static_cast<std::size_t>(a)] == z[static_cast<std::size_t>(b)] && a < b);
  };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), by_logit);
  idx.resize(static_cast<std::size_t>(k));
  std::vector<double> p(idx.size());
  const double mx = z[static_cast<std::size_t>(idx[0])];
  double sum = 0;
  for (std::size_t i = 0; i < idx.size(); ++i) sum += p[i] = std::exp((z[static_cast<std::size_t>(idx[i])] - mx) / o_.temperature);
  std::size_t keep = idx.size();
  if (o_.top_p < 1.0) {
    double acc = 0;
    for (std::size_t i = 0; i < idx.size(); ++i) {
      acc += p[i] / sum;
      if (acc >= o_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double total = 0;
  for (std::size_t i = 0; i < keep; ++i) total += p[i];
  double u = std::uniform_real_distribution<double>(0.0, total)(rng_);
  for (std::size_t i = 0; i < keep; ++i) {
    if (u < p[i]) return idx[i];
    u -= p[i];
  }
  return idx[keep - 1];
}

}  // namespace twell::model
