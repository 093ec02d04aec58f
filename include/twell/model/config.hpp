#pragma once
// A Llama model's configuration, read from a Hugging Face `config.json` and checked.
//
// Supported: LlamaForCausalLM-shaped models (RMSNorm, RoPE with `rope_theta`, multi-head or
// grouped-query attention, gated FFN, no biases), tied or untied LM head. Anything else the file
// asks for (rope_scaling, attention or MLP biases, a head size that does not divide the hidden
// size without an explicit head_dim, ...) is refused with ErrorCode::unsupported naming the key,
// never ignored.
#include <cstdint>
#include <string>
#include <vector>

namespace twell::model {

// The FFN's gate activation: g = act(x·Wgᵀ), h = g ⊙ (x·Wuᵀ). Only ReLU makes h sparse; every
// other activation runs the dense path.
enum class Activation { relu, silu, gelu, gelu_tanh };
const char* to_string(Activation a) noexcept;
// "relu", "silu" (or "swish"), "gelu", "gelu_pytorch_tanh" (or "gelu_new"); anything else throws.
Activation parse_activation(const std::string& name);

struct LlamaConfig {
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;        // K
  std::int64_t intermediate_size = 0;  // N
  std::int64_t num_layers = 0;
  std::int64_t num_heads = 0;
  std::int64_t num_kv_heads = 0;       // num_heads / num_kv_heads query heads share one K/V head
  std::int64_t head_dim = 0;
  std::int64_t max_position = 0;       // max_position_embeddings (context limit)
  double rms_eps = 1e-6;
  double rope_theta = 10000.0;
  Activation act = Activation::silu;
  std::string act_name = "silu";       // as the file says (before any override)
  bool tied_embeddings = false;
  std::vector<std::int32_t> bos_ids;   // may be empty
  std::vector<std::int32_t> eos_ids;   // generation stops at any of these
  std::string dtype;                   // torch_dtype as written ("bfloat16", ...), informational

  std::int64_t q_dim() const noexcept { return num_heads * head_dim; }
  std::int64_t kv_dim() const noexcept { return num_kv_heads * head_dim; }
  std::int64_t parameters() const noexcept;  // weights, counting a tied head once
};

// Parses and checks config.json text; `what` names the source in messages.
LlamaConfig parse_llama_config(const std::string& json_text, const std::string& what = "config.json");
// Reads `dir/config.json` (or the file itself when `path` is a file).
LlamaConfig load_llama_config(const std::string& path);

}  // namespace twell::model
