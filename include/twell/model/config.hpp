#pragma once
// A Llama model's configuration, read from a Hugging Face `config.json` and checked.
//
// Supported: LlamaForCausalLM and MistralForCausalLM (RMSNorm, RoPE of type default, linear,
// dynamic, llama3 or yarn, multi-head or grouped-query attention, Mistral's sliding window, gated
// FFN, no biases), tied or untied LM head. RoPE's settings are read from transformers ≥ 5's
// `rope_parameters` and from the legacy top-level `rope_theta` / `rope_scaling`; where both layouts
// give a value and they disagree, the file is refused. Every other key that changes the network
// and is not implemented (biases, partial rotary, soft-capping, other rope types, ...) is refused
// with ErrorCode::unsupported naming the key; keys the reader does not know are listed in
// LlamaConfig::unknown_keys for the caller to report. docs/model-config.md has the table.
#include <cstdint>
#include <string>
#include <vector>

#include "twell/model/rope.hpp"

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
  RopeScaling rope_scaling;            // type plain: no scaling
  std::int64_t sliding_window = 0;     // Mistral: a query sees its last `sliding_window` keys; 0: all
  std::string architecture = "LlamaForCausalLM";
  Activation act = Activation::silu;
  std::string act_name = "silu";       // as the file says (before any override)
  bool tied_embeddings = false;
  std::vector<std::int32_t> bos_ids;   // may be empty
  std::vector<std::int32_t> eos_ids;   // generation stops at any of these
  std::string dtype;                   // dtype / torch_dtype as written ("bfloat16", ...), informational
  std::vector<std::string> unknown_keys;  // keys the reader does not know (not read; sorted)

  std::int64_t q_dim() const noexcept { return num_heads * head_dim; }
  std::int64_t kv_dim() const noexcept { return num_kv_heads * head_dim; }
  std::int64_t parameters() const noexcept;  // weights, counting a tied head once
  // RoPE's frequencies for a call whose longest sequence ends at seq_len (only dynamic reads it).
  RopeFrequencies rope(std::int64_t seq_len) const;
  // The first key a query at position pos attends to (causal, within the sliding window).
  std::int64_t first_key(std::int64_t pos) const noexcept {
    return sliding_window > 0 && pos >= sliding_window ? pos - sliding_window + 1 : 0;
  }
};

// Parses and checks config.json text; `what` names the source in messages.
LlamaConfig parse_llama_config(const std::string& json_text, const std::string& what = "config.json");
// Reads `dir/config.json` (or the file itself when `path` is a file).
LlamaConfig load_llama_config(const std::string& path);
// "" when every key was read, else a one-line warning listing unknown_keys (tools print it once).
std::string unknown_keys_warning(const LlamaConfig& c, const std::string& what = "config.json");
// config.json's "rope_parameters" object for c, as transformers ≥ 5 writes it (writers use it).
std::string rope_parameters_json(const LlamaConfig& c);

}  // namespace twell::model
