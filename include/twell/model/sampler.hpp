#pragma once
// Next-token sampling: greedy, or temperature with top-k / top-p, and a repetition penalty,
// reproducible from a seed.
#include <cstdint>
#include <random>
#include <span>

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

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& o);
  // Picks the next token from logits [V]; `history` (prompt and generated tokens) feeds the
  // repetition penalty. Non-finite logits are an error.
  std::int32_t sample(std::span<const float> logits, std::span<const std::int32_t> history);

 private:
  SamplingOptions o_;
  std::mt19937_64 rng_;
};

}  // namespace twell::model
