#pragma once
// A tiny random Llama checkpoint written to a temporary directory (config.json + safetensors),
// for the runtime's tests. With `bias_channel`, hidden channel 0 of every embedding is a large
// constant and each gate row has a negative weight on it: after RMSNorm it acts as a per-neuron
// threshold, so ReLU(x·Wgᵀ) is sparse (DESIGN §5's "massive activation" trick).
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "test_util.hpp"
#include "twell/io/safetensors.hpp"

namespace twell::test {

struct TinySpec {
  std::int64_t layers = 2, hidden = 64, intermediate = 176, heads = 4, kv_heads = 2, vocab = 97, max_pos = 128;
  std::string act = "relu";
  bool tied = true;
  bool bias_channel = false;
  float gate_threshold = 0.0f;  // with bias_channel: gate rows' weight on channel 0 (negative: sparser)
  std::vector<float> layer_gate_threshold;  // per layer where given (else gate_threshold)
  bool bf16 = false;
  float down_scale = 1.0f;  // the FFN down projections' scale (large: outputs past a fixed-point range)
  std::uint64_t seed = 1;
};

inline std::filesystem::path tiny_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / fmt::format("twell_model_test_{}_{}", name, ::getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// Writes the checkpoint; `drop` / `extra` / `reshape` corrupt it for the loader's error tests.
inline std::filesystem::path write_tiny(const std::string& name, const TinySpec& s, const std::string& drop = "",
                                        const std::string& extra = "", const std::string& config_extra = "") {
  const auto dir = tiny_dir(name);
  Rng rng(s.seed);
  const std::int64_t D = s.hidden / s.heads;
  std::map<std::string, HostTensor> t;
  auto mat = [&](const std::string& n, std::int64_t r, std::int64_t c, float sd) {
    auto v = random_matrix(rng, r, c, sd);
    t[n] = HostTensor::from_f32({r, c}, v);
  };
  auto norm = [&](const std::string& n) {
    std::vector<float> v(static_cast<std::size_t>(s.hidden));
    for (auto& e : v) e = 1.0f + rng.normal(0.1f);
    t[n] = HostTensor::from_f32({s.hidden}, v);
  };
  const float sd = 1.0f / std::sqrt(static_cast<float>(s.hidden));
  mat("model.embed_tokens.weight", s.vocab, s.hidden, 1.0f);
  if (s.bias_channel)
    for (std::int64_t v = 0; v < s.vocab; ++v) t["model.embed_tokens.weight"].data<float>()[v * s.hidden] = 8.0f;
  norm("model.norm.weight");
  if (!s.tied) mat("lm_head.weight", s.vocab, s.hidden, sd);
  for (std::int64_t i = 0; i < s.layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    norm(p + "input_layernorm.weight");
    norm(p + "post_attention_layernorm.weight");
    mat(p + "self_attn.q_proj.weight", s.heads * D, s.hidden, sd);
    mat(p + "self_attn.k_proj.weight", s.kv_heads * D, s.hidden, sd);
    mat(p + "self_attn.v_proj.weight", s.kv_heads * D, s.hidden, sd);
    mat(p + "self_attn.o_proj.weight", s.hidden, s.heads * D, sd * 0.5f);
    mat(p + "mlp.gate_proj.weight", s.intermediate, s.hidden, sd);
    mat(p + "mlp.up_proj.weight", s.intermediate, s.hidden, sd);
    mat(p + "mlp.down_proj.weight", s.hidden, s.intermediate, s.down_scale * 0.5f / std::sqrt(static_cast<float>(s.intermediate)));
    // Channel 0 stays a large constant: attention and FFN outputs leave it alone.
    if (s.bias_channel) {
      float* o = t[p + "self_attn.o_proj.weight"].data<float>();
      float* d = t[p + "mlp.down_proj.weight"].data<float>();
      for (std::int64_t c = 0; c < s.heads * D; ++c) o[c] = 0.0f;
      for (std::int64_t c = 0; c < s.intermediate; ++c) d[c] = 0.0f;
      float* g = t[p + "mlp.gate_proj.weight"].data<float>();
      const float th = i < static_cast<std::int64_t>(s.layer_gate_threshold.size())
                           ? s.layer_gate_threshold[static_cast<std::size_t>(i)]
                           : s.gate_threshold;
      for (std::int64_t n = 0; n < s.intermediate; ++n) g[n * s.hidden] = th * (1.0f + 0.2f * rng.normal());
    }
  }
  if (!drop.empty()) t.erase(drop);
  if (!extra.empty()) t[extra] = HostTensor::from_f32({2}, std::vector<float>{1, 2});
  if (s.bf16)
    for (auto& [n, h] : t) {
      HostTensor b(DType::bf16, h.shape());
      for (std::int64_t i = 0; i < h.numel(); ++i) b.data<bf16>()[i] = to_bf16(h.data<float>()[i]);
      h = std::move(b);
    }
  std::vector<io::TensorRef> refs;
  for (auto& [n, h] : t) refs.push_back({n, &h});
  io::write_safetensors((dir / "model.safetensors").string(), refs);
  std::ofstream(dir / "config.json") << fmt::format(
      R"({{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": {}, "hidden_size": {},
  "intermediate_size": {}, "num_hidden_layers": {}, "num_attention_heads": {}, "num_key_value_heads": {},
  "max_position_embeddings": {}, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "{}",
  "tie_word_embeddings": {}, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "{}"{}}})",
      s.vocab, s.hidden, s.intermediate, s.layers, s.heads, s.kv_heads, s.max_pos, s.act, s.tied ? "true" : "false",
      s.bf16 ? "bfloat16" : "float32", config_extra);
  return dir;
}

}  // namespace twell::test
