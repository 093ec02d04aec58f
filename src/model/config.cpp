// config.json → LlamaConfig, with every unsupported setting refused by name.
#include "twell/model/config.hpp"

#include <algorithm>
#include <filesystem>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
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

namespace {

// config.json keys that do not change the network's function (training, export or bookkeeping).
const std::set<std::string> kInert = {
    "_name_or_path", "transformers_version", "initializer_range", "use_cache", "attention_dropout", "pad_token_id",
    "output_attentions", "output_hidden_states", "return_dict", "torchscript", "tokenizer_class", "id2label",
    "label2id", "problem_type", "chunk_size_feed_forward", "is_encoder_decoder", "task_specific_params",
    "finetuning_task", "prefix", "sep_token_id", "decoder_start_token_id", "tie_encoder_decoder",
    "is_decoder", "add_cross_attention", "cross_attention_hidden_size", "pruned_heads", "num_labels",
    "tf_legacy_loss", "use_bfloat16", "_attn_implementation_autoset", "_attn_implementation", "output_scores",
    "max_length", "min_length", "do_sample", "temperature", "top_p", "top_k", "num_beams", "bad_words_ids",
    "num_return_sequences", "repetition_penalty", "length_penalty", "early_stopping", "no_repeat_ngram_size",
    "typical_p", "diversity_penalty", "num_beam_groups", "forced_bos_token_id", "forced_eos_token_id",
    "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
    "encoder_no_repeat_ngram_size", "return_dict_in_generate", "output_router_logits", "keys_to_ignore_at_inference"};

// Keys read below (network settings, implemented or refused by value).
const std::set<std::string> kRead = {
    "architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps",
    "rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor", "original_max_position_embeddings",
    "hidden_act", "tie_word_embeddings", "bos_token_id", "eos_token_id", "torch_dtype", "dtype", "attention_bias",
    "mlp_bias", "pretraining_tp", "sliding_window"};

// Keys of other architectures that change the network: refused whenever set (non-null, not false).
const std::set<std::string> kRefusedWhenSet = {
    "quantization_config", "final_logit_softcapping", "attn_logit_softcapping", "query_pre_attn_scalar",
    "logit_scale", "logits_scaling", "embedding_multiplier", "residual_multiplier", "attention_multiplier",
    "use_sliding_window", "layer_types", "no_rope_layers", "use_qk_norm", "qk_layernorm", "num_experts",
    "num_local_experts", "moe_intermediate_size", "use_parallel_residual", "rotary_pct", "parallel_attn",
    "scale_embedding", "mup_width_multiplier"};

// The RoPE keys of each type (beside rope_type and rope_theta); any other key in the dict is listed
// as unknown (transformers ignores it too).
bool rope_key_used(RopeType t, const std::string& k) {
  if (k == "rope_type" || k == "rope_theta" || k == "partial_rotary_factor") return true;
  switch (t) {
    case RopeType::plain: return false;
    case RopeType::linear:
    case RopeType::dynamic: return k == "factor";
    case RopeType::llama3:
      return k == "factor" || k == "original_max_position_embeddings" || k == "low_freq_factor" ||
             k == "high_freq_factor";
    case RopeType::yarn:
      return k == "factor" || k == "original_max_position_embeddings" || k == "beta_fast" || k == "beta_slow" ||
             k == "attention_factor" || k == "mscale" || k == "mscale_all_dim" || k == "truncate";
  }
  return false;
}

// RoPE's settings from both layouts: transformers ≥ 5's "rope_parameters" dict and the legacy
// top-level "rope_theta" / "rope_scaling" (its "type" is rope_type's old name), plus the top-level
// "partial_rotary_factor" and "original_max_position_embeddings" transformers moves into the dict.
// A key given twice with different values is refused: no layout silently wins.
json merged_rope(const json& j, const std::string& what) {
  json rope = json::object();
  std::map<std::string, std::string> from;  // key → where it came from, for the message
  auto put = [&](const std::string& key, const json& v, const std::string& where) {
    if (v.is_null()) return;
    const auto it = from.find(key);
    if (it != from.end()) {
      TWELL_CHECK(rope[key] == v, ErrorCode::unsupported, "{}: {} = {} disagrees with {} = {} (refused: which one applies is ambiguous)",
                  what, where, v.dump(), it->second, rope[key].dump());
      return;
    }
    rope[key] = v;
    from[key] = where;
  };
  for (const char* dict : {"rope_parameters", "rope_scaling"}) {
    if (!j.contains(dict) || j[dict].is_null()) continue;
    TWELL_CHECK(j[dict].is_object(), ErrorCode::corrupt, "{}: \"{}\" must be an object or null, got {}", what, dict,
                j[dict].dump());
    for (const auto& [k, v] : j[dict].items())
      put(k == "type" ? "rope_type" : k, v, fmt::format("{}.{}", dict, k));
  }
  for (const char* top : {"rope_theta", "partial_rotary_factor", "original_max_position_embeddings"})
    if (j.contains(top)) put(top, j[top], top);
  return rope;
}

double rope_number(const json& rope, const char* key, const std::string& what, double fallback, bool required,
                   const std::string& type) {
  if (!rope.contains(key) || rope[key].is_null()) {
    TWELL_CHECK(!required, ErrorCode::corrupt, "{}: rope_type \"{}\" needs \"{}\"", what, type, key);
    return fallback;
  }
  TWELL_CHECK(rope[key].is_number(), ErrorCode::corrupt, "{}: RoPE's \"{}\" must be a number, got {}", what, key,
              rope[key].dump());
  return rope[key].get<double>();
}

void read_rope(const json& j, LlamaConfig& c, const std::string& what) {
  const json rope = merged_rope(j, what);
  std::string type = "default";
  if (rope.contains("rope_type")) {
    TWELL_CHECK(rope["rope_type"].is_string(), ErrorCode::corrupt, "{}: rope_type must be a string, got {}", what,
                rope["rope_type"].dump());
    type = rope["rope_type"].get<std::string>();
  }
  RopeScaling& s = c.rope_scaling;
  if (type == "default") s.type = RopeType::plain;
  else if (type == "linear") s.type = RopeType::linear;
  else if (type == "dynamic") s.type = RopeType::dynamic;
  else if (type == "llama3") s.type = RopeType::llama3;
  else if (type == "yarn") s.type = RopeType::yarn;
  else
    fail(ErrorCode::unsupported, "{}: rope_type \"{}\" is not supported (default, linear, dynamic, llama3, yarn)", what,
         type);
  c.rope_theta = rope_number(rope, "rope_theta", what, 10000.0, false, type);
  TWELL_CHECK(c.rope_theta > 0, ErrorCode::corrupt, "{}: rope_theta must be positive, got {}", what, c.rope_theta);
  const double partial = rope_number(rope, "partial_rotary_factor", what, 1.0, false, type);
  TWELL_CHECK(partial == 1.0, ErrorCode::unsupported,
              "{}: partial_rotary_factor {} is not supported (RoPE over the whole head only)", what, partial);
  for (const auto& [k, v] : rope.items())
    if (!rope_key_used(s.type, k)) c.unknown_keys.push_back("rope_parameters." + k);
  if (s.type == RopeType::plain) return;

  const bool yarn = s.type == RopeType::yarn;
  if (s.type == RopeType::llama3 || yarn) {
    const double orig = rope_number(rope, "original_max_position_embeddings", what,
                                    static_cast<double>(c.max_position), false, type);
    TWELL_CHECK(orig >= 1 && orig == std::floor(orig), ErrorCode::corrupt,
                "{}: original_max_position_embeddings must be a positive integer, got {}", what, orig);
    s.original_max_position = static_cast<std::int64_t>(orig);
  }
  // yarn without a factor: transformers takes max_position_embeddings / original (DeepSeek-V3's files).
  const bool factor_given = rope.contains("factor") && !rope["factor"].is_null();
  s.factor = yarn && !factor_given ? static_cast<double>(c.max_position) / static_cast<double>(s.original_max_position)
                                   : rope_number(rope, "factor", what, 1.0, true, type);
  TWELL_CHECK(s.factor > 0, ErrorCode::corrupt, "{}: RoPE factor must be positive, got {}", what, s.factor);
  if (s.type == RopeType::llama3) {
    s.low_freq_factor = rope_number(rope, "low_freq_factor", what, 1.0, true, type);
    s.high_freq_factor = rope_number(rope, "high_freq_factor", what, 4.0, true, type);
    TWELL_CHECK(s.low_freq_factor > 0 && s.high_freq_factor != s.low_freq_factor, ErrorCode::corrupt,
                "{}: llama3 RoPE needs low_freq_factor > 0 and high_freq_factor ≠ low_freq_factor, got {} and {}",
                what, s.low_freq_factor, s.high_freq_factor);
  }
  if (yarn) {
    // transformers: `get("beta_fast") or 32`, so 0 means the default too.
    s.beta_fast = rope_number(rope, "beta_fast", what, 32.0, false, type);
    if (s.beta_fast == 0) s.beta_fast = 32.0;
    s.beta_slow = rope_number(rope, "beta_slow", what, 1.0, false, type);
    if (s.beta_slow == 0) s.beta_slow = 1.0;
    TWELL_CHECK(s.beta_fast > 0 && s.beta_slow > 0, ErrorCode::corrupt, "{}: yarn's beta_fast and beta_slow must be positive",
                what);
    if (rope.contains("attention_factor") && !rope["attention_factor"].is_null()) {
      s.attention_factor = rope_number(rope, "attention_factor", what, 1.0, false, type);
      TWELL_CHECK(s.attention_factor > 0, ErrorCode::corrupt, "{}: yarn's attention_factor must be positive", what);
    } else {
      s.attention_factor = yarn_attention_factor(s.factor, rope_number(rope, "mscale", what, 0.0, false, type),
                                                 rope_number(rope, "mscale_all_dim", what, 0.0, false, type));
    }
    if (rope.contains("truncate") && !rope["truncate"].is_null()) {
      TWELL_CHECK(rope["truncate"].is_boolean(), ErrorCode::corrupt, "{}: yarn's truncate must be true or false", what);
      s.truncate = rope["truncate"].get<bool>();
    }
  }
}

}  // namespace

RopeFrequencies LlamaConfig::rope(std::int64_t seq_len) const {
  return rope_frequencies(rope_theta, rope_scaling, head_dim, max_position, seq_len);
}

std::string unknown_keys_warning(const LlamaConfig& c, const std::string& what) {
  if (c.unknown_keys.empty()) return "";
  return fmt::format("{}: {} key(s) not known to twell, ignored (as transformers' {} ignores them): {}", what,
                     c.unknown_keys.size(), c.architecture, fmt::join(c.unknown_keys, ", "));
}

std::string rope_parameters_json(const LlamaConfig& c) {
  json r = {{"rope_type", to_string(c.rope_scaling.type)}, {"rope_theta", c.rope_theta}};
  const RopeScaling& s = c.rope_scaling;
  if (s.type != RopeType::plain) r["factor"] = s.factor;
  if (s.type == RopeType::llama3 || s.type == RopeType::yarn) r["original_max_position_embeddings"] = s.original_max_position;
  if (s.type == RopeType::llama3) {
    r["low_freq_factor"] = s.low_freq_factor;
    r["high_freq_factor"] = s.high_freq_factor;
  }
  if (s.type == RopeType::yarn) {
    r["beta_fast"] = s.beta_fast;
    r["beta_slow"] = s.beta_slow;
    r["attention_factor"] = s.attention_factor;
    r["truncate"] = s.truncate;
  }
  return r.dump();
}

LlamaConfig parse_llama_config(const std::string& text, const std::string& what) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(ErrorCode::corrupt, "{}: not valid JSON ({})", what, e.what());
  }
  TWELL_CHECK(j.is_object(), ErrorCode::corrupt, "{}: expected a JSON object", what);

  LlamaConfig c;
  // Architecture: Llama, or Mistral (Llama with a sliding attention window).
  std::string model_type = "llama";
  if (j.contains("model_type") && !j["model_type"].is_null()) {
    TWELL_CHECK(j["model_type"].is_string(), ErrorCode::corrupt, "{}: model_type must be a string", what);
    model_type = j["model_type"].get<std::string>();
    TWELL_CHECK(model_type == "llama" || model_type == "mistral", ErrorCode::unsupported,
                "{}: model_type \"{}\" is not supported (llama, mistral)", what, model_type);
  }
  c.architecture = model_type == "mistral" ? "MistralForCausalLM" : "LlamaForCausalLM";
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty()) {
    const auto arch = j["architectures"][0].is_string() ? j["architectures"][0].get<std::string>() : "";
    TWELL_CHECK(arch == "LlamaForCausalLM" || arch == "MistralForCausalLM", ErrorCode::unsupported,
                "{}: architecture \"{}\" is not supported (LlamaForCausalLM, MistralForCausalLM)", what, arch);
    c.architecture = arch;
  }
  const bool mistral = c.architecture == "MistralForCausalLM";

  for (const auto& [k, v] : j.items()) {
    if (kRead.count(k) || kInert.count(k)) continue;
    if (kRefusedWhenSet.count(k)) {
      const bool set = !(v.is_null() || (v.is_boolean() && !v.get<bool>()));
      TWELL_CHECK(!set, ErrorCode::unsupported, "{}: \"{}\" = {} is not supported by this runtime", what, k, v.dump());
      continue;
    }
    c.unknown_keys.push_back(k);
  }

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
  // transformers' defaults: LlamaConfig 2048, MistralConfig 4096 · 32.
  c.max_position = get_int(j, "max_position_embeddings", what, false, mistral ? 4096 * 32 : 2048);
  c.rms_eps = get_double(j, "rms_norm_eps", 1e-6, what);
  read_rope(j, c, what);
  c.act_name = j.contains("hidden_act") && j["hidden_act"].is_string() ? j["hidden_act"].get<std::string>() : "silu";
  c.act = parse_activation(c.act_name);
  c.tied_embeddings = get_bool(j, "tie_word_embeddings", false, what);
  c.bos_ids = get_ids(j, "bos_token_id", what);
  c.eos_ids = get_ids(j, "eos_token_id", what);
  for (const char* k : {"dtype", "torch_dtype"})
    if (c.dtype.empty() && j.contains(k) && j[k].is_string()) c.dtype = j[k].get<std::string>();

  TWELL_CHECK(!get_bool(j, "attention_bias", false, what), ErrorCode::unsupported,
              "{}: attention_bias = true is not supported", what);
  TWELL_CHECK(!get_bool(j, "mlp_bias", false, what), ErrorCode::unsupported, "{}: mlp_bias = true is not supported",
              what);
  // pretraining_tp: transformers ≥ 5 ignores it (4.x sliced the same products into tp pieces: the same
  // function), so any positive value reads as 1.
  if (j.contains("pretraining_tp") && !j["pretraining_tp"].is_null())
    get_int(j, "pretraining_tp", what);
  // sliding_window: MistralForCausalLM applies it; LlamaForCausalLM ignores it (as transformers does).
  if (j.contains("sliding_window") && !j["sliding_window"].is_null()) {
    if (mistral)
      c.sliding_window = get_int(j, "sliding_window", what);
    else
      c.unknown_keys.push_back("sliding_window");
  }
  std::sort(c.unknown_keys.begin(), c.unknown_keys.end());
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
