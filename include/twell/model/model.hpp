#pragma once
// A Llama model's weights on the host, loaded from a Hugging Face checkpoint directory
// (config.json + model.safetensors, or shards listed by model.safetensors.index.json).
// Tensors may be bf16, fp16 or fp32; they are held as fp32. Every tensor's name and shape is
// checked against the config at load time: a missing, extra or misshaped tensor is an error
// naming it, never a silently wrong model.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "twell/cpu/ffn_ops.hpp"
#include "twell/model/config.hpp"

namespace twell::model {

struct LayerWeights {
  std::vector<float> attn_norm;  // [K]
  std::vector<float> wqkv;       // [q_dim + 2·kv_dim, K]: q_proj, k_proj, v_proj rows stacked (one GEMM)
  std::vector<float> wo;         // [K, q_dim]
  std::vector<float> ffn_norm;   // [K]
  std::vector<float> w_gate;     // [N, K]
  std::vector<float> w_up;       // [N, K]
  std::vector<float> w_down;     // [K, N]
  // (The CPU runtime's sparse path also needs Wdᵀ: it prepares its own, so a model bound for the
  // GPU never holds that copy.)

  LayerWeights() = default;
  LayerWeights(LayerWeights&&) = default;  // vectors move their buffers: views into them stay valid
  LayerWeights& operator=(LayerWeights&&) = default;
  LayerWeights(const LayerWeights&) = delete;
  LayerWeights& operator=(const LayerWeights&) = delete;
};

struct LoadOptions {
  // Overrides config.json's hidden_act (the paper's released ReLU models say "silu").
  std::optional<std::string> hidden_act;
};

struct Model {
  LlamaConfig config;
  std::string dir;
  std::vector<float> embed;       // [V, K]
  std::vector<float> final_norm;  // [K]
  std::vector<float> lm_head;     // [V, K]; empty when tied to embed
  std::vector<LayerWeights> layers;

  const float* head() const noexcept { return lm_head.empty() ? embed.data() : lm_head.data(); }
  std::int64_t weight_bytes() const noexcept;  // fp32 bytes held

  static Model load(const std::string& dir, const LoadOptions& opt = {});
};

}  // namespace twell::model
