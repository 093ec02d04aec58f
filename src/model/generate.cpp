// Generation loop and chat prompts (see twell/model/generate.hpp).
#include "twell/model/generate.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "twell/error.hpp"

namespace twell::model {
namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

std::vector<Generation> generate(Runtime& rt, const std::vector<std::vector<std::int32_t>>& prompts,
                                 const GenerateOptions& opt, const TokenCallback& on_token, GenerateTimes* times) {
  const LlamaConfig& c = rt.model().config;
  TWELL_CHECK(!prompts.empty(), ErrorCode::invalid_argument, "generate: no prompts");
  TWELL_CHECK(opt.max_new_tokens >= 1, ErrorCode::invalid_argument, "max new tokens must be ≥ 1, got {}",
              opt.max_new_tokens);
  check_sampling(opt.sampling);
  std::vector<std::int32_t> stops = opt.stop_ids;
  if (!opt.ignore_eos) stops.insert(stops.end(), c.eos_ids.begin(), c.eos_ids.end());

  const std::size_t B = prompts.size();
  std::vector<Generation> out(B);
  std::vector<std::unique_ptr<Sequence>> caches;
  std::vector<Sampler> samplers;
  std::vector<std::vector<std::int32_t>> history(B);
  caches.reserve(B);
  for (std::size_t i = 0; i < B; ++i) {
    const auto len = static_cast<std::int64_t>(prompts[i].size());
    TWELL_CHECK(len > 0, ErrorCode::invalid_argument, "generate: prompt {} is empty", i);
    TWELL_CHECK(len < c.max_position, ErrorCode::invalid_argument,
                "generate: prompt {} has {} tokens; the model's context is {} tokens", i, len, c.max_position);
    caches.push_back(rt.new_sequence(std::min(c.max_position, len + opt.max_new_tokens)));
    SamplingOptions so = opt.sampling;
    so.seed += i;
    samplers.emplace_back(so);
    out[i].prompt = prompts[i];
    history[i] = prompts[i];
  }
  GenerateTimes t;
  std::vector<bool> running(B, true);
  std::vector<std::int32_t> last(B);
  // Greedy without a repetition penalty needs no logits on the host: the runtime picks the argmax;
  // top-k sampling (and greedy with a penalty) needs only each row's k best candidates, which the
  // runtime selects where the logits are (Sampler::sample_top picks what sample() would).
  const bool argmax_only = opt.sampling.temperature == 0.0 && opt.sampling.repetition_penalty == 1.0;
  const std::int64_t top_k = candidates_needed(opt.sampling, c.vocab_size);
  // Draws that read the whole row (temperature and top-p without a top-k cut) go where the logits
  // are on a runtime that can (the GPU): one id a row comes back, by sample_fixed_point's rule from
  // the sequence's own draw r — the pick sample() makes from the same draw, up to its weights'
  // rounding (2⁻⁴⁰ of the largest; the RNG is used alike). A top-k cut below V keeps forward_top:
  // the very picks of sample().
  const bool device_draw = opt.sampling.temperature > 0 && top_k == 0 && rt.samples_on_device();
  auto choose_id = [&](std::size_t i, std::int32_t id) {
    out[i].tokens.push_back(id);
    history[i].push_back(id);
    last[i] = id;
    if (on_token) on_token(i, id);
    if (std::find(stops.begin(), stops.end(), id) != stops.end()) {
      running[i] = false;
      out[i].stop_reason = std::find(opt.stop_ids.begin(), opt.stop_ids.end(), id) != opt.stop_ids.end() ? "stop token" : "eos";
    } else if (static_cast<std::int64_t>(out[i].tokens.size()) >= opt.max_new_tokens) {
      running[i] = false;
      out[i].stop_reason = "max tokens";
    } else if (caches[i]->length() >= caches[i]->capacity()) {
      running[i] = false;
      out[i].stop_reason = "context full";
    }
  };
  // Rows of logits [who.size(), V] → each sequence's pick. The samplers are independent (each its
  // own RNG and history), so several sequences sample at once (a 49 k vocabulary costs ≈ 0.4 ms a
  // row with top-p or a temperature: twell_probe_sampler); the picks are applied in order. An error of any row (a
  // non-finite logit) is rethrown here, outside the parallel region.
  auto choose_rows = [&](const std::vector<float>& logits, const std::vector<std::size_t>& who) {
    const auto n = static_cast<std::int64_t>(who.size());
    std::vector<std::int32_t> ids(who.size());
    std::vector<std::exception_ptr> err(who.size());
#pragma omp parallel for schedule(dynamic) if (n > 1)
    for (std::int64_t j = 0; j < n; ++j) {
      const auto u = static_cast<std::size_t>(j);
      try {
        ids[u] = samplers[who[u]].sample(
            std::span<const float>(logits.data() + j * c.vocab_size, static_cast<std::size_t>(c.vocab_size)), history[who[u]]);
      } catch (...) {
        err[u] = std::current_exception();
      }
    }
    for (const auto& e : err)
      if (e) std::rethrow_exception(e);
    for (std::size_t j = 0; j < who.size(); ++j) choose_id(who[j], ids[j]);
  };

  // The runtime's top-k candidates [who.size() × top_k] → each sequence's pick (cheap: in order).
  auto forward_top = [&](std::span<const SeqStep> steps, const std::vector<std::size_t>& who) {
    std::vector<std::span<const std::int32_t>> hist;
    for (std::size_t i : who) hist.emplace_back(history[i]);
    const std::vector<Candidate> top = rt.forward_top(steps, top_k, opt.sampling.repetition_penalty, hist);
    std::vector<std::int32_t> ids(who.size());
    for (std::size_t j = 0; j < who.size(); ++j)
      ids[j] = samplers[who[j]].sample_top(std::span<const Candidate>(top.data() + j * static_cast<std::size_t>(top_k),
                                                                      static_cast<std::size_t>(top_k)));
    for (std::size_t j = 0; j < who.size(); ++j) choose_id(who[j], ids[j]);
  };

  auto forward_draw = [&](std::span<const SeqStep> steps, const std::vector<std::size_t>& who) {
    std::vector<std::span<const std::int32_t>> hist;
    std::vector<double> r;
    for (std::size_t i : who) {
      hist.emplace_back(history[i]);
      r.push_back(samplers[i].next_draw());
    }
    const std::vector<std::int32_t> ids = rt.forward_sample(steps, opt.sampling, hist, r);
    for (std::size_t j = 0; j < who.size(); ++j) choose_id(who[j], ids[j]);
  };

  // Prefill: every prompt in one batch.
  {
    std::vector<SeqStep> steps(B);
    for (std::size_t i = 0; i < B; ++i) steps[i] = {caches[i].get(), prompts[i]};
    const double t0 = now();
    if (argmax_only) {
      const auto ids = rt.forward_argmax(steps);
      t.prefill_seconds = now() - t0;
      for (std::size_t i = 0; i < B; ++i) choose_id(i, ids[i]);
    } else {
      std::vector<std::size_t> all(B);
      std::iota(all.begin(), all.end(), std::size_t{0});
      if (device_draw) {
        forward_draw(steps, all);
        t.prefill_seconds = now() - t0;
      } else if (top_k > 0) {
        forward_top(steps, all);
        t.prefill_seconds = now() - t0;
      } else {
        const std::vector<float> logits = rt.forward(steps);
        t.prefill_seconds = now() - t0;
        choose_rows(logits, all);
      }
    }
    for (std::size_t i = 0; i < B; ++i) t.prefill_tokens += static_cast<std::int64_t>(prompts[i].size());
  }
  // Decode: one token per running sequence per step.
  const double t0 = now();
  for (;;) {
    std::vector<SeqStep> steps;
    std::vector<std::size_t> who;
    for (std::size_t i = 0; i < B; ++i)
      if (running[i]) {
        steps.push_back({caches[i].get(), std::span<const std::int32_t>(&last[i], 1)});
        who.push_back(i);
      }
    if (steps.empty()) break;
    if (argmax_only) {
      const auto ids = rt.forward_argmax(steps);
      for (std::size_t j = 0; j < who.size(); ++j) choose_id(who[j], ids[j]);
    } else if (device_draw) {
      forward_draw(steps, who);
    } else if (top_k > 0) {
      forward_top(steps, who);
    } else {
      choose_rows(rt.forward(steps), who);
    }
    t.decode_tokens += static_cast<std::int64_t>(who.size());
  }
  t.decode_seconds = now() - t0;
  for (const auto& kv : caches) t.peak_kv_bytes += kv->bytes();
  if (times) *times = t;
  return out;
}

std::string chat_prompt(const std::string& model_dir, std::span<const ChatMessage> messages) {
  namespace fs = std::filesystem;
  TWELL_CHECK(!messages.empty(), ErrorCode::invalid_argument, "a chat needs at least one message");
  for (const auto& m : messages)
    TWELL_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant", ErrorCode::invalid_argument,
                "chat message role \"{}\" is not supported (system, user, assistant)", m.role);
  const fs::path p = fs::path(model_dir) / "tokenizer_config.json";
  std::ifstream f(p);
  TWELL_CHECK(f.good(), ErrorCode::io, "a chat needs {} (with a chat_template); it cannot be opened", p.string());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorCode::corrupt, "{}: not valid JSON ({})", p.string(), e.what());
  }
  TWELL_CHECK(j.contains("chat_template") && j["chat_template"].is_string(), ErrorCode::unsupported,
              "{} has no chat_template: this model has no chat format", p.string());
  const std::string tpl = j["chat_template"].get<std::string>();
  const bool has_system = messages.front().role == "system";
  if (tpl.find("<|im_start|>") != std::string::npos) {
    std::string s;
    if (!has_system) {
      // A default system turn written literally in the template, e.g. SmolLM2's
      // '<|im_start|>system\nYou are a helpful AI assistant ...<|im_end|>\n'.
      // The newline may be a real one or a Jinja escape (\n) in the template's string literal.
      static const std::regex def(R"(<\|im_start\|>system(?:\\n|\n)([^'"{}]*?)<\|im_end\|>)");
      std::smatch m;
      if (std::regex_search(tpl, m, def))
        s += "<|im_start|>system\n" + std::regex_replace(m[1].str(), std::regex(R"(\\n)"), "\n") + "<|im_end|>\n";
    }
    for (const auto& m : messages) s += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    return s + "<|im_start|>assistant\n";
  }
  if (tpl.find("<|start_header_id|>") != std::string::npos) {
    std::string s = "<|begin_of_text|>";
    for (const auto& m : messages) s += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
    return s + "<|start_header_id|>assistant<|end_header_id|>\n\n";
  }
  fail(ErrorCode::unsupported, "{}: this chat template is not one twell knows (ChatML, Llama-3)", p.string());
}

std::string chat_prompt(const std::string& model_dir, const std::string& user, const std::string& system) {
  std::vector<ChatMessage> m;
  if (!system.empty()) m.push_back({"system", system});
  m.push_back({"user", user});
  return chat_prompt(model_dir, m);
}

}  // namespace twell::model
