// Next-token sampling (see twell/model/sampler.hpp).
#include "twell/model/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "twell/error.hpp"

namespace twell::model {
namespace {

// A candidate as the draw holds it.
struct Cand {
  double z;
  double w = 0;  // exp((z − max) / T), once the top-k cut is made
  std::int32_t id;
  std::int32_t bucket = 0;  // the mass buckets' index (draw)
};

bool before(const Cand& a, const Cand& b) { return a.z > b.z || (a.z == b.z && a.id < b.id); }

// The repetition penalty of a token in the history (Candidate's rule, fp32); −0 becomes 0.
float penalised(float v, float p) {
  const float z = v > 0 ? v / p : v * p;
  return z == 0.0f ? 0.0f : z;
}

float logit_checked(std::span<const float> logits, std::size_t i) {
  const float v = logits[i];
  TWELL_CHECK(std::isfinite(v), ErrorCode::non_finite, "sample: logit of token {} is {}", i, v);
  return v;
}

// The weights' sum is taken over fixed blocks of kSumBlock in order. A row's O(V) passes run on the
// calling thread. Split over the cores in OpenMP regions (5078763) they made top-p decode on the
// H100 machine (16 vCPUs, synthetic 0.5B) run at 123–128 tokens/s with the default 16 threads
// against 590–719 with OMP_NUM_THREADS=1: a region's fork and barriers over ≈ 1 ms of work stall for
// far longer on those virtual CPUs. generate runs a batch's rows in parallel instead (one region a
// step), and on a GPU whole-row draws happen on the device (Runtime::forward_sample).
constexpr std::int64_t kSumBlock = 4096;

// Scratch kept per thread across calls: a 49 k vocabulary's 1.2 MB of candidates would otherwise
// be mapped and faulted in afresh for every token (generate samples a batch's rows on several threads).
thread_local std::vector<Cand> t_cands;
thread_local std::vector<char> t_seen;

// The row's candidates with the penalty applied to the tokens of the history (each once).
std::vector<Cand>& candidates(std::span<const float> logits, std::span<const std::int32_t> history, double penalty) {
  const auto V = static_cast<std::int64_t>(logits.size());
  TWELL_CHECK(V > 0, ErrorCode::invalid_argument, "sample: empty logits");
  std::vector<Cand>& c = t_cands;
  c.resize(static_cast<std::size_t>(V));
  std::int64_t bad = V;  // the first non-finite logit
  for (std::int64_t i = 0; i < V; ++i) {
    Cand& e = c[static_cast<std::size_t>(i)];
    const float v = logits[static_cast<std::size_t>(i)];
    if (!std::isfinite(v)) bad = std::min(bad, i);
    e.z = v;
    e.id = static_cast<std::int32_t>(i);
  }
  if (bad < V) logit_checked(logits, static_cast<std::size_t>(bad));
  if (penalty != 1.0) {
    const auto p = static_cast<float>(penalty);
    t_seen.assign(static_cast<std::size_t>(V), 0);
    for (auto id : history)
      if (id >= 0 && id < V && !t_seen[static_cast<std::size_t>(id)]) {
        t_seen[static_cast<std::size_t>(id)] = 1;
        Cand& e = c[static_cast<std::size_t>(id)];
        e.z = penalised(logits[static_cast<std::size_t>(id)], p);
      }
  }
  return c;
}

// Rows of more than this many candidates without a top-k cut are drawn by buckets (draw_by_buckets).
constexpr std::int64_t kBucketRows = 4096;

// The draw over a large row without a top-k cut, never sorting more than the buckets the top-p cut
// and the walk land in. Candidates fall into kBuckets buckets of log-weight (mx − z)/T, of equal
// width over the row's span (a bucket index falls as z rises; equal z share one), so the final
// order is bucket after bucket, each in `before` order. From the buckets' masses, the buckets the
// cut and the draw can reach (up to top_p · sum, or up to u, drawn first when nothing is cut) are
// moved to the front and counting-sorted by bucket (the rest only if rounding carries a loop past
// them); the cut and the walk add whole buckets' masses and sort and walk only the bucket where
// they cross. The same picks as walking every candidate in order, except that the sums run in
// another order (double rounding only, as the normaliser's already did: continuous logits never
// sit on a boundary); one call on the generator, as in draw. A peaked row reaches a few buckets;
// a flat row's nucleus (most of a 49 k vocabulary) is no longer sorted whole: 3.0 → 0.5 ms a row at
// σ = 0.3 with top-p 0.9 (twell_probe_sampler, lab/notes/2026-11-runtime-log.md).
std::int32_t draw_by_buckets(const SamplingOptions& o, std::mt19937_64& rng, std::vector<Cand>& c, double mx,
                             double zmin, double sum) {
  constexpr int kBuckets = 2048;
  thread_local std::vector<Cand> by_bucket;  // candidates of buckets [0, ready], bucket after bucket
  thread_local std::vector<std::int64_t> start, next;
  thread_local std::vector<double> mass;
  thread_local std::vector<char> in_order;
  const auto n = static_cast<std::int64_t>(c.size());
  const auto at = [](auto& v, auto i) -> auto& { return v[static_cast<std::size_t>(i)]; };
  // Log-weights run over [0, span]; past 750 every weight is 0 (exp underflows at −745), so a far
  // outlier only joins the last bucket instead of widening every bucket.
  const double span = std::min((mx - zmin) / o.temperature, 750.0);
  const double scale = span > 0 ? (kBuckets - 1) / span / o.temperature : 0.0;
  start.assign(kBuckets + 1, 0);
  mass.assign(kBuckets, 0.0);
  for (Cand& e : c) {
    const double t = (mx - e.z) * scale;
    e.bucket = t < kBuckets - 1 ? static_cast<std::int32_t>(t) : kBuckets - 1;
    ++at(start, e.bucket + 1);
    at(mass, e.bucket) += e.w;
  }
  for (int b = 0; b < kBuckets; ++b) at(start, b + 1) += at(start, b);
  double u = -1;  // drawn first where nothing is cut
  const double need = (o.top_p < 1.0 ? o.top_p * sum : (u = std::uniform_real_distribution<double>(0.0, sum)(rng))) *
                      (1 + 1e-9);
  int reach = 0;  // the buckets [0, reach] hold the mass the loops below consume
  for (double acc = mass[0]; acc < need && reach < kBuckets - 1;) acc += at(mass, ++reach);
  const auto front = std::partition(c.begin(), c.end(), [&](const Cand& e) { return e.bucket <= reach; });
  by_bucket.resize(c.size());
  next.assign(start.begin(), start.end() - 1);
  const auto place = [&](auto first, auto last) {
    for (auto it = first; it != last; ++it) at(by_bucket, at(next, it->bucket)++) = *it;
  };
  place(c.begin(), front);
  int ready = reach;  // buckets placed in by_bucket
  const auto reach_bucket = [&](int b) {  // rounding carried a loop past the front: place the rest
    if (b > ready) {
      place(front, c.end());
      ready = kBuckets - 1;
    }
  };
  in_order.assign(kBuckets, 0);
  const auto order = [&](int b) {  // bucket b in final order
    reach_bucket(b);
    if (!at(in_order, b)) {
      std::sort(by_bucket.begin() + at(start, b), by_bucket.begin() + at(start, b + 1), before);
      at(in_order, b) = 1;
    }
  };
  // The top-p cut: keep = the shortest prefix whose probability reaches top_p.
  std::int64_t keep = n;
  double total = sum;
  if (o.top_p < 1.0) {
    double acc = 0, kept = 0;
    for (int b = 0; b < kBuckets && keep == n; ++b) {
      const double m = at(mass, b);
      if (acc + m / sum < o.top_p) {
        acc += m / sum;
        kept += m;
        continue;
      }
      order(b);
      for (std::int64_t i = at(start, b); i < at(start, b + 1); ++i) {
        const double w = at(by_bucket, i).w;
        acc += w / sum;
        kept += w;
        if (acc >= o.top_p) {
          keep = i + 1;
          break;
        }
      }
    }
    if (keep < n) total = kept;
  }
  // The walk: u ~ U(0, kept mass) through the kept candidates in final order.
  if (u < 0) u = std::uniform_real_distribution<double>(0.0, total)(rng);
  for (int b = 0; b < kBuckets && at(start, b) < keep; ++b) {
    const std::int64_t end = std::min(at(start, b + 1), keep);
    double m = at(mass, b);
    if (end < at(start, b + 1)) {  // the cut's bucket: only its kept part (in order: the cut sorted it)
      m = 0;
      for (std::int64_t i = at(start, b); i < end; ++i) m += at(by_bucket, i).w;
    }
    if (u >= m) {
      u -= m;
      continue;
    }
    order(b);
    for (std::int64_t i = at(start, b); i < end; ++i) {
      const double w = at(by_bucket, i).w;
      if (u < w) return at(by_bucket, i).id;
      u -= w;
    }
    u = 0;  // the bucket's weights one by one summed below its mass by rounding: the next one takes it
  }
  // u ran past the last weight by rounding: the last kept one.
  const int last = static_cast<int>(std::upper_bound(start.begin(), start.end(), keep - 1) - start.begin()) - 1;
  order(last);
  return at(by_bucket, keep - 1).id;
}

// The draw over c: every candidate (cut false: in any order) or the top-k cut's k in final order
// (cut true). Softmax at temperature T, then top-p, then u ~ U(0, kept mass) walks the kept ones
// in the final order. Only the prefix of that order that the top-p cut and the walk reach is
// sorted: chunks of doubling size are selected and sorted one after another (a heap pass over
// contiguous candidates: most fail at the heap's top); large uncut rows go by buckets instead.
std::int32_t draw(const SamplingOptions& o, std::mt19937_64& rng, std::vector<Cand>& c, bool cut) {
  const auto n = static_cast<std::int64_t>(c.size());
  double mx = c[0].z, zmin = c[0].z;
  for (std::int64_t i = 0; i < n; ++i) {
    mx = std::max(mx, c[static_cast<std::size_t>(i)].z);
    zmin = std::min(zmin, c[static_cast<std::size_t>(i)].z);
  }
  thread_local std::vector<double> block_sum;
  std::vector<double>& part = block_sum;
  const std::int64_t blocks = (n + kSumBlock - 1) / kSumBlock;
  part.assign(static_cast<std::size_t>(blocks), 0.0);
  for (std::int64_t b = 0; b < blocks; ++b) {
    double s = 0;
    for (std::int64_t i = b * kSumBlock; i < std::min(n, (b + 1) * kSumBlock); ++i) {
      Cand& e = c[static_cast<std::size_t>(i)];
      s += e.w = std::exp((e.z - mx) / o.temperature);
    }
    part[static_cast<std::size_t>(b)] = s;
  }
  double sum = 0;
  for (const double s : part) sum += s;
  if (!cut && n > kBucketRows) return draw_by_buckets(o, rng, c, mx, zmin, sum);
  // c[0, sorted) is in final order; sort_more() extends it by the next chunk.
  std::int64_t sorted = cut ? n : 0, chunk = 64;  // a top-k cut left its k in order
  const auto sort_more = [&] {
    const std::int64_t next = std::min(n, sorted + chunk);
    std::partial_sort(c.begin() + sorted, c.begin() + next, c.end(), before);
    sorted = next;
    chunk *= 2;
  };
  std::int64_t keep = n;
  if (o.top_p < 1.0) {
    double acc = 0;
    for (std::int64_t i = 0; i < n && keep == n; ++i) {
      if (i == sorted) sort_more();
      acc += c[static_cast<std::size_t>(i)].w / sum;
      if (acc >= o.top_p) keep = i + 1;
    }
  }
  double total = 0;
  if (keep == n) {
    total = sum;
  } else {
    for (std::int64_t i = 0; i < keep; ++i) total += c[static_cast<std::size_t>(i)].w;
  }
  double u = std::uniform_real_distribution<double>(0.0, total)(rng);
  for (std::int64_t i = 0; i < keep; ++i) {
    if (i == sorted) sort_more();
    const double w = c[static_cast<std::size_t>(i)].w;
    if (u < w) return c[static_cast<std::size_t>(i)].id;
    u -= w;
  }
  while (sorted < keep) sort_more();  // u ran past the last weight by rounding: the last kept one
  return c[static_cast<std::size_t>(keep - 1)].id;
}

}  // namespace

void check_sampling(const SamplingOptions& o) {
  TWELL_CHECK(std::isfinite(o.temperature) && o.temperature >= 0, ErrorCode::invalid_argument,
              "temperature must be ≥ 0 (0: greedy), got {}", o.temperature);
  TWELL_CHECK(o.top_k >= 0, ErrorCode::invalid_argument, "top-k must be ≥ 0 (0: off), got {}", o.top_k);
  TWELL_CHECK(o.top_p > 0 && o.top_p <= 1, ErrorCode::invalid_argument, "top-p must lie in (0, 1], got {}", o.top_p);
  TWELL_CHECK(std::isfinite(o.repetition_penalty) && o.repetition_penalty > 0, ErrorCode::invalid_argument,
              "repetition penalty must be > 0 (1: off), got {}", o.repetition_penalty);
}

Sampler::Sampler(const SamplingOptions& o) : o_(o), rng_(o.seed) { check_sampling(o); }

std::int64_t candidates_needed(const SamplingOptions& o, std::int64_t vocab) noexcept {
  if (o.temperature == 0.0) return o.repetition_penalty != 1.0 ? 1 : 0;
  return o.top_k > 0 && o.top_k < vocab ? o.top_k : 0;
}

std::vector<Candidate> top_candidates(std::span<const float> logits, std::span<const std::int32_t> history,
                                      std::int64_t k, double repetition_penalty) {
  const auto V = static_cast<std::int64_t>(logits.size());
  TWELL_CHECK(k >= 1 && k <= V, ErrorCode::invalid_argument, "top_candidates: k = {} outside 1 … {}", k, V);
  std::vector<Cand>& c = candidates(logits, history, repetition_penalty);
  std::partial_sort(c.begin(), c.begin() + k, c.end(), before);
  std::vector<Candidate> out(static_cast<std::size_t>(k));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = {c[i].z == 0 ? 0.0f : static_cast<float>(c[i].z), c[i].id};
  return out;
}

std::int32_t Sampler::sample(std::span<const float> logits, std::span<const std::int32_t> history) {
  // Candidates by decreasing logit (ties: lower id first), cut by top-k, then softmax, then top-p,
  // then u ~ U(0, kept mass) walks the kept ones in that order. Only the prefix of that order that
  // the top-p cut and the walk reach is sorted: chunks of doubling size are selected and sorted
  // one after another (a heap pass over contiguous (logit, id) pairs: most fail at the heap's top),
  // so a 50 k vocabulary costs a few O(V) passes rather than a full sort (5.7 ms → ≈ 0.3 ms a
  // token at V = 49152 with top-p alone, measured here; nth_element's partitioning took 0.43 ms alone).
  // Large vocabularies without a top-k cut find that prefix by mass buckets instead (draw).
  // The softmax's normaliser sums in candidate order (the old full sort summed in logit order: the
  // same value to double rounding).
  std::vector<Cand>& c = candidates(logits, history, o_.repetition_penalty);
  const auto V = static_cast<std::int64_t>(c.size());
  if (o_.temperature == 0.0) {  // the first largest: the lowest id among ties
    std::int64_t best = 0;
    for (std::int64_t i = 1; i < V; ++i)
      if (c[static_cast<std::size_t>(i)].z > c[static_cast<std::size_t>(best)].z) best = i;
    return static_cast<std::int32_t>(best);
  }
  const std::int64_t k = o_.top_k > 0 ? std::min(o_.top_k, V) : V;
  if (k < V) {  // the k best, in order (as the old full sort's first k)
    std::partial_sort(c.begin(), c.begin() + k, c.end(), before);
    c.resize(static_cast<std::size_t>(k));
  }
  return draw(o_, rng_, c, k < V);
}

double Sampler::next_draw() {  // below 1 whatever the library (generate_canonical may return 1: LWG 2524)
  return std::min(std::uniform_real_distribution<double>(0.0, 1.0)(rng_), std::nextafter(1.0, 0.0));
}

std::int32_t Sampler::sample_top(std::span<const Candidate> top) {
  const std::int64_t want = o_.temperature == 0.0 ? 1 : o_.top_k;  // candidates_needed's k, whatever V
  TWELL_CHECK(static_cast<std::int64_t>(top.size()) == want && want > 0, ErrorCode::invalid_argument,
              "sample_top: {} candidates for a draw that reads {} (top-k {}, temperature {})", top.size(), want, o_.top_k,
              o_.temperature);
  std::vector<Cand>& c = t_cands;
  c.resize(top.size());
  for (std::size_t i = 0; i < top.size(); ++i) {
    TWELL_CHECK(std::isfinite(top[i].z), ErrorCode::non_finite, "sample: logit of token {} is {}", top[i].id, top[i].z);
    c[i] = Cand{top[i].z, 0, top[i].id};
  }
  std::sort(c.begin(), c.end(), before);  // as sample()'s cut leaves them: the same sums, the same walk
  if (o_.temperature == 0.0) return c[0].id;
  return draw(o_, rng_, c, true);
}

std::int32_t sample_fixed_point(std::span<const float> logits, std::span<const std::int32_t> history,
                                const SamplingOptions& o, double r) {
  check_sampling(o);
  TWELL_CHECK(o.temperature > 0, ErrorCode::invalid_argument, "sample_fixed_point: greedy is argmax, not this rule");
  TWELL_CHECK(r >= 0 && r < 1, ErrorCode::invalid_argument, "sample_fixed_point: r = {} outside [0, 1)", r);
  const auto V = static_cast<std::int64_t>(logits.size());
  std::vector<Candidate> c = top_candidates(logits, history, V, o.repetition_penalty);  // every token, in order
  for (const Candidate& e : c)  // a penalty < 1 can carry a finite logit past the float range
    TWELL_CHECK(std::isfinite(e.z), ErrorCode::non_finite, "sample: logit of token {} becomes {} with the penalty",
                e.id, e.z);
  const std::int64_t k = o.top_k > 0 ? std::min(o.top_k, V) : V;
  const double mx = c[0].z;
  std::vector<std::uint64_t> w(static_cast<std::size_t>(k));
  std::uint64_t S = 0;
  for (std::int64_t i = 0; i < k; ++i) {
    const double e = std::exp((static_cast<double>(c[static_cast<std::size_t>(i)].z) - mx) / o.temperature);
    S += w[static_cast<std::size_t>(i)] = static_cast<std::uint64_t>(std::floor(e * kFixedPointWeight));
  }
  std::int64_t keep = k;
  std::uint64_t kept = S;
  if (o.top_p < 1.0) {
    const auto need = std::min(S, static_cast<std::uint64_t>(std::ceil(o.top_p * static_cast<double>(S))));
    std::uint64_t acc = 0;
    for (std::int64_t i = 0; i < k; ++i)
      if ((acc += w[static_cast<std::size_t>(i)]) >= need) {
        keep = i + 1;
        kept = acc;
        break;
      }
  }
  auto u = static_cast<std::uint64_t>(std::floor(r * static_cast<double>(kept)));
  if (u >= kept) u = kept - 1;
  std::uint64_t acc = 0;
  for (std::int64_t i = 0; i < keep; ++i)
    if ((acc += w[static_cast<std::size_t>(i)]) > u) return c[static_cast<std::size_t>(i)].id;
  return c[static_cast<std::size_t>(keep - 1)].id;  // not reached: the kept W sum to kept > u
}

}  // namespace twell::model
