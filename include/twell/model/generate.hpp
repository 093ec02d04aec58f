#pragma once
// Text generation over a runtime (CPU or CUDA): batched prefill of several prompts, then decode steps
// over the sequences still running, each with its own seeded sampler; streaming through a callback.
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "twell/model/runtime.hpp"
#include "twell/model/sampler.hpp"

namespace twell::model {

struct GenerateOptions {
  std::int64_t max_new_tokens = 128;
  SamplingOptions sampling;               // sequence i samples with seed sampling.seed + i
  std::vector<std::int32_t> stop_ids;     // stop at any of these, besides the model's eos ids
  bool ignore_eos = false;                // do not stop at the model's eos ids
};

struct Generation {
  std::vector<std::int32_t> prompt;
  std::vector<std::int32_t> tokens;  // generated, the stop token included when one ended it
  std::string stop_reason;           // "eos", "stop token", "max tokens", "context full"
};

struct GenerateTimes {
  double prefill_seconds = 0, decode_seconds = 0;
  std::int64_t prefill_tokens = 0, decode_tokens = 0;  // decode: tokens produced by decode steps
  std::int64_t peak_kv_bytes = 0;
};

// Called with (sequence index, token) as each token is chosen.
using TokenCallback = std::function<void(std::size_t, std::int32_t)>;

// Each prompt must be non-empty and leave room for at least one token in the model's context.
std::vector<Generation> generate(Runtime& rt, const std::vector<std::vector<std::int32_t>>& prompts,
                                 const GenerateOptions& opt, const TokenCallback& on_token = {},
                                 GenerateTimes* times = nullptr);

// The prompt text of a single-turn chat (`system` may be empty) in the format of the model's chat
// template (tokenizer_config.json's "chat_template"), with the assistant turn opened. Supported:
// ChatML (<|im_start|>…, SmolLM2, Qwen; its default system message is kept when the template has
// one) and Llama-3 (<|start_header_id|>…). Other templates: ErrorCode::unsupported.
std::string chat_prompt(const std::string& model_dir, const std::string& user, const std::string& system = "");
// The same for a conversation: roles system (first only), user and assistant, in order.
struct ChatMessage {
  std::string role, content;
};
std::string chat_prompt(const std::string& model_dir, std::span<const ChatMessage> messages);

}  // namespace twell::model
