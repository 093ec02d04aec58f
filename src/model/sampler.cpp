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
  // Candidates by decreasing logit (ties: lower id first), cut by top-k, then softmax, then top-p,
  // then u ~ U(0, kept mass) walks the kept ones in that order. Only the prefix of that order that
  // the top-p cut and the walk reach is sorted: chunks of doubling size are selected and sorted
  // one after another (a heap pass over contiguous (logit, id) pairs: most fail at the heap's top),
  // so a 50 k vocabulary costs a few O(V) passes rather than a full sort (5.7 ms → ≈ 0.3 ms a
  // token at V = 49152 with top-p alone, measured here; nth_element's partitioning took 0.43 ms alone).
  // Large vocabularies without a top-k cut find that prefix by mass buckets instead (below).
  // The softmax's normaliser sums in candidate order (the old full sort summed in logit order: the
  // same value to double rounding).
  struct Cand {
    double z;
    double w = 0;  // exp((z − max) / T), once the top-k cut is made
    std::int32_t id;
    std::int32_t bucket = 0;  // the mass buckets' index (below)
  };
  // Scratch kept per thread across calls: a 49 k vocabulary's 1.2 MB of candidates would otherwise
  // be mapped and faulted in afresh for every token (generate samples a batch's rows on several threads).
  thread_local std::vector<Cand> c;
  thread_local std::vector<char> seen;
  c.resize(static_cast<std::size_t>(V));
  for (std::int64_t i = 0; i < V; ++i) {
    const float v = logits[static_cast<std::size_t>(i)];
    TWELL_CHECK(std::isfinite(v), ErrorCode::non_finite, "sample: logit of token {} is {}", i, v);
    Cand& e = c[static_cast<std::size_t>(i)];
    e.z = v;
    e.id = static_cast<std::int32_t>(i);
  }
  if (o_.repetition_penalty != 1.0) {  // each token of the history once
    seen.assign(static_cast<std::size_t>(V), 0);
    for (auto id : history)
      if (id >= 0 && id < V && !seen[static_cast<std::size_t>(id)]) {
        seen[static_cast<std::size_t>(id)] = 1;
        double& v = c[static_cast<std::size_t>(id)].z;
        v = v > 0 ? v / o_.repetition_penalty : v * o_.repetition_penalty;
      }
  }
  if (o_.temperature == 0.0) {  // the first largest: the lowest id among ties
    std::int64_t best = 0;
    for (std::int64_t i = 1; i < V; ++i)
      if (c[static_cast<std::size_t>(i)].z > c[static_cast<std::size_t>(best)].z) best = i;
    return static_cast<std::int32_t>(best);
  }
  const auto before = [](const Cand& a, const Cand& b) { return a.z > b.z || (a.z == b.z && a.id < b.id); };
  const std::int64_t k = o_.top_k > 0 ? std::min(o_.top_k, V) : V;
  if (k < V) {  // the k best, in order (as the old full sort's first k)
    std::partial_sort(c.begin(), c.begin() + k, c.end(), before);
    c.resize(static_cast<std::size_t>(k));
  }
  const auto n = static_cast<std::int64_t>(c.size());
  double mx = c[0].z;
  for (const Cand& e : c) mx = std::max(mx, e.z);
  double sum = 0;
  for (Cand& e : c) sum += e.w = std::exp((e.z - mx) / o_.temperature);
  // c[0, sorted) is in final order; sort_more() extends it by the next chunk.
  std::int64_t sorted = k < V ? n : 0, chunk = 64;  // a top-k cut left its k in order
  const auto sort_more = [&] {
    const std::int64_t next = std::min(n, sorted + chunk);
    std::partial_sort(c.begin() + sorted, c.begin() + next, c.end(), before);
    sorted = next;
    chunk *= 2;
  };
  // Without a top-k cut on a large vocabulary, the prefix the cut and the draw will read is found
  // by mass instead (the heap passes above were ≈ 40 % of a 49 k-token sample): the weights'
  // buckets by log-weight (mx − z)/T in steps of 1/4, one pass; from the top, the buckets whose
  // mass reaches what the loops below will consume (top_p · sum, or the draw itself when nothing
  // is cut: the draw is then made here, its one call on the generator as below); those candidates
  // moved to the front and sorted. A bucket index falls as z rises, so they are exactly the first
  // of the full order (equal z share a bucket); if rounding makes the loops read past them,
  // sort_more() goes on from there as before.
  double u = -1;  // drawn early (no top-p cut, large n)
  if (k == V && n > 4096) {
    constexpr int kBuckets = 128;
    constexpr double kStep = 0.25;
    const double scale = 1.0 / (o_.temperature * kStep);  // monotone in z: all a bucket index needs
    double mass[kBuckets] = {};
    for (Cand& e : c) {
      const double t = (mx - e.z) * scale;
      e.bucket = t < kBuckets - 1 ? static_cast<std::int32_t>(t) : kBuckets - 1;
      mass[e.bucket] += e.w;
    }
    const double need = (o_.top_p < 1.0 ? o_.top_p * sum : (u = std::uniform_real_distribution<double>(0.0, sum)(rng_))) *
                        (1 + 1e-9);
    int last = 0;
    for (double acc = mass[0]; acc < need && last < kBuckets - 1;) acc += mass[++last];
    const auto front = std::partition(c.begin(), c.end(), [&](const Cand& e) { return e.bucket <= last; });
    std::sort(c.begin(), front, before);
    sorted = front - c.begin();
  }
  std::int64_t keep = n;
  if (o_.top_p < 1.0) {
    double acc = 0;
    for (std::int64_t i = 0; i < n && keep == n; ++i) {
      if (i == sorted) sort_more();
      acc += c[static_cast<std::size_t>(i)].w / sum;
      if (acc >= o_.top_p) keep = i + 1;
    }
  }
  double total = 0;
  if (keep == n) {
    total = sum;
  } else {
    for (std::int64_t i = 0; i < keep; ++i) total += c[static_cast<std::size_t>(i)].w;
  }
  if (u < 0) u = std::uniform_real_distribution<double>(0.0, total)(rng_);
  for (std::int64_t i = 0; i < keep; ++i) {
    if (i == sorted) sort_more();
    const double w = c[static_cast<std::size_t>(i)].w;
    if (u < w) return c[static_cast<std::size_t>(i)].id;
    u -= w;
  }
  while (sorted < keep) sort_more();  // u ran past the last weight by rounding: the last kept one
  return c[static_cast<std::size_t>(keep - 1)].id;
}

}  // namespace twell::model
