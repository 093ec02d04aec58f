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
  // A model loaded with LoadOptions::bf16_only holds the five matrices as bf16 bits here instead
  // (the fp32 vectors above stay empty; the norms stay fp32).
  std::vector<std::uint16_t> wqkv16, wo16, w_gate16, w_up16, w_down16;

  LayerWeights() = default;
  LayerWeights(LayerWeights&&) = default;  // vectors move their buffers: views into them stay valid
  LayerWeights& operator=(LayerWeights&&) = default;
  LayerWeights(const LayerWeights&) = delete;
  LayerWeights& operator=(const LayerWeights&) = delete;
};

struct LoadOptions {
  // Overrides config.json's hidden_act (the paper's released ReLU models say "silu").
  std::optional<std::string> hidden_act;
  // Keep the weight matrices (embedding, head, projections, FFN) as bf16 only, rounded to nearest
  // even from an fp32 file as the GPU's upload rounds: the bits the CUDA runtime holds either way,
  // with 2 bytes a parameter on the host instead of 4 (plus the file's) and no conversions. The
  // CPU runtime refuses such a model (it computes in fp32).
  bool bf16_only = false;
};

struct Model {
  LlamaConfig config;
  std::string dir;
  std::vector<float> embed;       // [V, K]
  std::vector<float> final_norm;  // [K]
  std::vector<float> lm_head;     // [V, K]; empty when tied to embed
  std::vector<LayerWeights> layers;
  bool bf16_only = false;              // LoadOptions::bf16_only: the matrices are in the *16 fields
  std::vector<std::uint16_t> embed16;  // [V, K] bf16 bits (bf16_only)
  std::vector<std::uint16_t> lm_head16;  // [V, K]; empty when tied (bf16_only)

  // The fp32 head (an fp32 model's; null for a bf16_only one).
  const float* head() const noexcept { return lm_head.empty() ? embed.data() : lm_head.data(); }
  std::int64_t weight_bytes() const noexcept;  // host bytes of the weights held

  static Model load(const std::string& dir, const LoadOptions& opt = {});
};

}  // namespace twell::model
