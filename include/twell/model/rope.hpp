#pragma once
// RoPE's frequencies, computed as Hugging Face transformers computes them for each rope type.
//
// Every type below changes only the per-pair inverse frequencies inv_freq[i] (i < d/2) and a factor
// that multiplies cos and sin (so q·k by its square); the rotation itself (rotate_half pairs
// (i, i + d/2), angle = pos · inv_freq[i]) is the same. The CPU runtime rotates with inv_freq, the
// CUDA runtime with cos/sin tables built from it: one owner of the formulas for both.
#include <cstdint>
#include <vector>

namespace twell::model {

enum class RopeType {
  plain,    // "default": inv_freq[i] = θ^(−2i/d)
  linear,   // inv_freq / factor
  dynamic,  // NTK-aware θ growth once the sequence passes max_position_embeddings
  llama3,   // Llama 3.1–3.3: low frequencies / factor, high ones kept, a smooth band between
  yarn,     // YaRN: a ramp between interpolated and extrapolated frequencies, cos/sin scaled
};
// transformers' rope_type names: "default", "linear", "dynamic", "llama3", "yarn".
const char* to_string(RopeType t) noexcept;

struct RopeScaling {
  RopeType type = RopeType::plain;
  double factor = 1.0;                      // linear, dynamic, llama3, yarn
  std::int64_t original_max_position = 0;  // llama3, yarn: the pre-training context
  double low_freq_factor = 1.0;             // llama3
  double high_freq_factor = 4.0;            // llama3 (> low_freq_factor)
  double beta_fast = 32.0;                  // yarn
  double beta_slow = 1.0;                   // yarn
  double attention_factor = 1.0;            // yarn: cos and sin are multiplied by it (resolved at parse time)
  bool truncate = true;                     // yarn: floor/ceil the correction range
};

struct RopeFrequencies {
  std::vector<double> inv_freq;   // [d/2]
  double attention_scaling = 1.0; // multiplies cos and sin
};

// The frequencies for head_dim d (even) and base θ. `seq_len` matters only for dynamic: transformers
// grows θ once seq_len > max_position (its max_position_embeddings); below that every type but the
// scaled ones is plain RoPE.
RopeFrequencies rope_frequencies(double theta, const RopeScaling& s, std::int64_t d, std::int64_t max_position,
                                 std::int64_t seq_len);

// YaRN's default attention factor: 0.1·ln(factor)·mscale + 1 (1 for factor ≤ 1), as a ratio
// get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) when both are given and non-zero.
double yarn_attention_factor(double factor, double mscale, double mscale_all_dim);

}  // namespace twell::model
