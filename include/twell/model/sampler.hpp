#pragma once
// Next-token sampling: greedy, or temperature with top-k / top-p, and a repetition penalty,
// reproducible from a seed.
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace twell::model {

struct SamplingOptions {
  double temperature = 0.0;         // 0: greedy (argmax; the lowest id wins ties)
  std::int64_t top_k = 0;           // keep the k most likely tokens (0: all)
  double top_p = 1.0;               // keep the smallest set whose probability reaches top_p (1: all)
  double repetition_penalty = 1.0;  // > 1 discourages tokens already in the history (CTRL / HF rule)
  std::uint64_t seed = 0;
};

// Throws ErrorCode::invalid_argument for out-of-range options.
void check_sampling(const SamplingOptions& o);

// One token of a draw: its logit after the repetition penalty, z = l / p where l > 0 else l · p,
// each a correctly rounded fp32 operation (transformers' RepetitionPenaltyLogitsProcessor on fp32
// logits; PyTorch on CUDA divides as l · (1/p), up to 1 ulp away), −0 made 0: the host and the GPU
// (cuda::ops::top_candidates) agree bit for bit.
struct Candidate {
  float z;
  std::int32_t id;
};

// How many of a row's best candidates a draw under `o` reads, where that is fewer than the row
// (0: it needs the whole row): top_k < V, or 1 for greedy with a repetition penalty. Greedy without
// a penalty needs no candidates either (Runtime::forward_argmax); this returns 0 for it too.
std::int64_t candidates_needed(const SamplingOptions& o, std::int64_t vocab) noexcept;

// The k best candidates of one row of logits, by z descending, the lower id first among equal z:
// what Sampler::sample_top takes (the host's reference for the GPU's selection). 1 ≤ k ≤ V;
// a non-finite logit is an Error.
std::vector<Candidate> top_candidates(std::span<const float> logits, std::span<const std::int32_t> history,
                                      std::int64_t k, double repetition_penalty);

// Device sampling's rule (cuda::ops::sample_rows: one id a row comes back), written plainly: the
// reference its tests compare with. Candidates by z (Candidate's penalty) descending, the lower id
// first; the top-k cut (top_k 0: none); weights W = ⌊exp((z − z_max)/T) · 2⁴⁰⌋ as integers, so
// every sum is exact in any order (a token whose weight is below 2⁻⁴⁰ of the best one's is never
// drawn); the top-p cut keeps the shortest prefix whose W reach ⌈top_p · S⌉ (S: the cut's total,
// both in double as written); u = ⌊r · S_kept⌋ (r ∈ [0, 1), the sequence's one draw a token) picks
// the first token whose running W exceeds u. temperature > 0; r outside [0, 1) or a non-finite
// logit is an Error.
inline constexpr double kFixedPointWeight = 1099511627776.0;  // 2⁴⁰
std::int32_t sample_fixed_point(std::span<const float> logits, std::span<const std::int32_t> history,
                                const SamplingOptions& o, double r);

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& o);
  // Picks the next token from logits [V]; `history` (prompt and generated tokens) feeds the
  // repetition penalty. Non-finite logits are an error.
  std::int32_t sample(std::span<const float> logits, std::span<const std::int32_t> history);
  // The same pick from the row's candidates_needed() best (exactly that many, any order; the
  // penalty already in z), e.g. a GPU's selection: sample_top(top_candidates(l, h, k, p)) == sample(l, h),
  // RNG state included. Only for draws candidates_needed() serves (top-k < V, or greedy).
  std::int32_t sample_top(std::span<const Candidate> top);
  // The sequence's next draw r ∈ [0, 1) for sample_fixed_point's rule (one call on the generator,
  // as a sample() is).
  double next_draw();

 private:
  SamplingOptions o_;
  std::mt19937_64 rng_;
};

}  // namespace twell::model
