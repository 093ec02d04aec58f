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

 private:
  SamplingOptions o_;
  std::mt19937_64 rng_;
};

}  // namespace twell::model
