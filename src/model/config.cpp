// config.json → LlamaConfig, with every unsupported setting refused by name.
#include "twell/model/config.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "twell/error.hpp"

namespace twell::model {
namespace {

using nlohmann::json;

std::int64_t get_int(const json& j, const char* key, const std::string& what, bool required = true,
                     std::int64_t fallback = 0) {
  if (!j.contains(key) || j[key].is_null()) {
    TWELL_CHECK(!required, ErrorCode::corrupt, "{}: missing \"{}\"", what, key);
    return fallback;
  }
  TWELL_CHECK(j[key].is_number_integer(), ErrorCode::corrupt, "{}: \"{}\" must be an integer, got {}", what, key,
              j[key].dump());
  const auto v = j[key].get<std::int64_t>();
  TWELL_CHECK(v > 0, ErrorCode::corrupt, "{}: \"{}\" must be positive, got {}", what, key, v);
  return v;
}

double get_double(const json& j, const char* key, double fallback, const std::string& what) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  TWELL_CHECK(j[key].is_number(), ErrorCode::corrupt, "{}: \"{}\" must be a number, got {}", what, key, j[key].dump());
  const double v = j[key].get<double>();
  TWELL_CHECK(v > 0, ErrorCode::corrupt, "{}: \"{}\" must be positive, got {}", what, key, v);
  return v;
}

// bos/eos ids: an integer, a list of integers, or absent/null.
std::vector<std::int32_t> get_ids(const json& j, const char* key, const std::string& what) {
  std::vector<std::int32_t> ids;
  if (!j.contains(key) || j[key].is_null()) return ids;
  auto add = [&](const json& v) {
    TWELL_CHECK(v.is_number_integer() && v.get<std::int64_t>() >= 0 && v.get<std::int64_t>() < (1ll << 31),
                ErrorCode::corrupt, "{}: \"{}\" must hold token ids in [0, 2^31), got {}", what, key, v.dump());
    ids.push_back(static_cast<std::int32_t>(v.get<std::int64_t>()));
  };
  if (j[key].is_array())
    for (const auto& v : j[key]) add(v);
  else
    add(j[key]);
  return ids;
}

bool get_bool(const json& j, const char* key, bool fallback, const std::string& what) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  TWELL_CHECK(j[key].is_boolean(), ErrorCode::corrupt, "{}: \"{}\" must be true or false", what, key);
  return j[key].get<bool>();
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  TWELL_CHECK(f.good(), ErrorCode::io, "cannot open {}", path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

const char* to_string(Activation a) noexcept {
  switch (a) {
    case Activation::relu: return "relu";
    case Activation::silu: return "silu";
    case Activation::gelu: return "gelu";
    case Activation::gelu_tanh: return "gelu_pytorch_tanh";
  }
  return "?";
}

Activation parse_activation(const std::string& name) {
  if (name == "relu") return Activation::relu;
  if (name == "silu" || name == "swish") return Activation::silu;
  if (name == "gelu") return Activation::gelu;
  if (name == "gelu_pytorch_tanh" || name == "gelu_new") return Activation::gelu_tanh;
  fail(ErrorCode::unsupported, "activation \"{}\" is not supported (relu, silu, gelu, gelu_pytorch_tanh)", name);
}

std::int64_t LlamaConfig::parameters() const noexcept {
  const std::int64_t attn = hidden_size * (q_dim() + 2 * kv_dim()) + q_dim() * hidden_size;
  const std::int64_t ffn = 3 * hidden_size * intermediate_size;
  const std::int64_t per_layer = attn + ffn + 2 * hidden_size;
  return num_layers * per_layer + vocab_size * hidden_size * (tied_embeddings ? 1 : 2) + hidden_size;
}

LlamaConfig parse_llama_config(const std::string& text, const std::string& what) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(ErrorCode::corrupt, "{}: not valid JSON ({})", what, e.what());
  }
  TWELL_CHECK(j.is_object(), ErrorCode::corrupt, "{}: expected a JSON object", what);

  // Architecture: Llama (and Mistral without a sliding window, which is the same network).
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty()) {
    const auto arch = j["architectures"][0].is_string() ? j["architectures"][0].get<std::string>() : "";
    TWELL_CHECK(arch == "LlamaForCausalLM" || arch == "MistralForCausalLM", ErrorCode::unsupported,
                "{}: architecture \"{}\" is not supported (LlamaForCausalLM)", what, arch);
  }
  if (j.contains("model_type") && j["model_type"].is_string()) {
    const auto mt = j["model_type"].get<std::string>();
    TWELL_CHECK(mt == "llama" || mt == "mistral", ErrorCode::unsupported,
                "{}: model_type \"{}\" is not supported (llama)", what, mt);
  }

  LlamaConfig c;
  c.vocab_size = get_int(j, "vocab_size", what);
  c.hidden_size = get_int(j, "hidden_size", what);
  c.intermediate_size = get_int(j, "intermediate_size", what);
  c.num_layers = get_int(j, "num_hidden_layers", what);
  c.num_heads = get_int(j, "num_attention_heads", what);
  c.num_kv_heads = get_int(j, "num_key_value_heads", what, false, c.num_heads);
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    c.head_dim = get_int(j, "head_dim", what);
  } else {
    TWELL_CHECK(c.hidden_size % c.num_heads == 0, ErrorCode::corrupt,
                "{}: hidden_size {} is not a multiple of num_attention_heads {} and no head_dim is given", what,
                c.hidden_size, c.num_heads);
    c.head_dim = c.hidden_size / c.num_heads;
  }
  TWELL_CHECK(c.num_heads % c.num_kv_heads == 0, ErrorCode::corrupt,
              "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", what, c.num_heads,
              c.num_kv_heads);
  TWELL_CHECK(c.head_dim % 2 == 0, ErrorCode::unsupported, "{}: head_dim {} is odd (RoPE rotates pairs)", what,
              c.head_dim);
  c.max_position = get_int(j, "max_position_embeddings", what, false, 2048);
  c.rms_eps = get_double(j, "rms_norm_eps", 1e-6, what);
  c.rope_theta = get_double(j, "rope_theta", 10000.0, what);
  c.act_name = j.contains("hidden_act") && j["hidden_act"].is_string() ? j["hidden_act"].get<std::string>() : "silu";
  c.act = parse_activation(c.act_name);
  c.tied_embeddings = get_bool(j, "tie_word_embeddings", false, what);
  c.bos_ids = get_ids(j, "bos_token_id", what);
  c.eos_ids = get_ids(j, "eos_token_id", what);
  if (j.contains("torch_dtype") && j["torch_dtype"].is_string()) c.dtype = j["torch_dtype"].get<std::string>();

  // Settings that change the network and that this runtime does not implement: refuse by name.
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    fail(ErrorCode::unsupported, "{}: rope_scaling {} is not supported (only plain RoPE with rope_theta)", what,
         j["rope_scaling"].dump());
  TWELL_CHECK(!get_bool(j, "attention_bias", false, what), ErrorCode::unsupported,
              "{}: attention_bias = true is not supported", what);
  TWELL_CHECK(!get_bool(j, "mlp_bias", false, what), ErrorCode::unsupported, "{}: mlp_bias = true is not supported",
              what);
  if (j.contains("sliding_window") && !j["sliding_window"].is_null())
    fail(ErrorCode::unsupported, "{}: sliding_window {} is not supported", what, j["sliding_window"].dump());
  if (j.contains("pretraining_tp") && j["pretraining_tp"].is_number_integer())
    TWELL_CHECK(j["pretraining_tp"].get<std::int64_t>() == 1, ErrorCode::unsupported,
                "{}: pretraining_tp {} is not supported (1)", what, j["pretraining_tp"].get<std::int64_t>());
  for (const auto& id : c.bos_ids)
    TWELL_CHECK(id < c.vocab_size, ErrorCode::corrupt, "{}: bos_token_id {} is outside the vocabulary ({})", what, id,
                c.vocab_size);
  for (const auto& id : c.eos_ids)
    TWELL_CHECK(id < c.vocab_size, ErrorCode::corrupt, "{}: eos_token_id {} is outside the vocabulary ({})", what, id,
                c.vocab_size);
  return c;
}

LlamaConfig load_llama_config(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p = fs::is_directory(path) ? fs::path(path) / "config.json" : fs::path(path);
  LlamaConfig c = parse_llama_config(read_text(p.string()), p.string());
  // generation_config.json, when present, may name more stop tokens (chat models' end-of-turn).
  const fs::path gen = p.parent_path() / "generation_config.json";
  if (fs::exists(gen)) {
    json g;
    try {
      g = json::parse(read_text(gen.string()));
    } catch (const json::exception& e) {
      fail(ErrorCode::corrupt, "{}: not valid JSON ({})", gen.string(), e.what());
    }
    for (auto id : get_ids(g, "eos_token_id", gen.string())) {
      TWELL_CHECK(id < c.vocab_size, ErrorCode::corrupt, "{}: eos_token_id {} is outside the vocabulary ({})",
                  gen.string(), id, c.vocab_size);
      if (std::find(c.eos_ids.begin(), c.eos_ids.end(), id) == c.eos_ids.end()) c.eos_ids.push_back(id);
    }
  }
  return c;
}

}  // namespace twell::model
