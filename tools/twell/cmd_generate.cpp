// twell generate: text from a Hugging Face Llama checkpoint, printed as it comes.
#include <cstdio>
#include <fstream>
#include <future>
#include <memory>
#include <sstream>

#include "common.hpp"
#include "runtime_flags.hpp"
#include "twell/model/generate.hpp"
#include "twell/model/tokenizer.hpp"

namespace twell::cli {
namespace {

struct GenerateArgs {
  std::string model;
  std::vector<std::string> prompts;
  std::string prompt_file;
  bool chat = false;
  std::string system;
  std::string device;
  std::string hidden_act;
  model::RuntimeOptions runtime;  // the FFN path (--ffn); the A/B switches come from TWELL_TUNING
  model::GenerateOptions g;
  std::vector<std::string> stop_tokens;
  std::string json;
  bool quiet = false;
};

int run_generate(GenerateArgs& a) {
  if (!a.json.empty()) check_writable(a.json, "--json");
  model::RuntimeTuning::from_env();  // a malformed TWELL_TUNING is refused before the checkpoint loads
  std::string why;
  const std::string device = resolve_device(a.device, &why) == DeviceKind::cuda ? "cuda" : "cpu";
  if (!a.prompt_file.empty()) a.prompts.push_back(read_text_file(a.prompt_file, "--prompt-file"));
  if (a.prompts.empty()) fail(ErrorCode::invalid_argument, "give a prompt with --prompt TEXT or --prompt-file FILE");

  model::LoadOptions lo;
  if (!a.hidden_act.empty()) lo.hidden_act = a.hidden_act;
  lo.bf16_only = device == "cuda";  // the GPU holds bf16: no fp32 copy on the host
  const double t0 = now_seconds();
  // The tokenizer (≈ 0.1 s of JSON and merges at a 49 k vocabulary) is read beside the checkpoint.
  auto tok_read = std::async(std::launch::async, [&] { return model::Tokenizer::from_file(a.model + "/tokenizer.json"); });
  const model::Model m = model::Model::load(a.model, lo);
  if (const auto w = model::unknown_keys_warning(m.config); !w.empty()) fmt::print(stderr, "warning: {}\n", w);
  const model::Tokenizer tok = tok_read.get();
  const double t_load = now_seconds() - t0;
  const auto& c = m.config;
  TWELL_CHECK(tok.vocab_size() <= c.vocab_size, ErrorCode::corrupt,
              "tokenizer.json has {} tokens but the model's vocabulary holds {}", tok.vocab_size(), c.vocab_size);
  if (!a.quiet)
    note(fmt::format("{}: {} layers, hidden {}, FFN {} ({}), {} heads / {} KV heads, {:.1f} M parameters, "
                     "loaded in {:.2f} s",
                     a.model, c.num_layers, c.hidden_size, c.intermediate_size, model::to_string(c.act), c.num_heads,
                     c.num_kv_heads, static_cast<double>(c.parameters()) / 1e6, t_load));

  for (const auto& s : a.stop_tokens) {
    auto id = tok.token_id(s);
    if (!id) fail(ErrorCode::invalid_argument, "--stop-token '{}' is not a token of this tokenizer", s);
    a.g.stop_ids.push_back(*id);
  }
  std::vector<std::vector<std::int32_t>> ids;
  for (const auto& p : a.prompts) {
    std::string text = p;
    if (a.chat) {
      try {
        text = model::chat_prompt(a.model, p, a.system);
      } catch (const Error& e) {
        fail(e.code(), "--chat: {} (drop --chat, or pass the formatted prompt)", e.what());
      }
    }
    ids.push_back(tok.encode(text, /*add_special=*/!a.chat));
    if (ids.back().empty()) fail(ErrorCode::invalid_argument, "a prompt encodes to no tokens");
  }

  const double t1 = now_seconds();
  auto rt_ptr = model::make_runtime(m, device, a.runtime);
  const double t_runtime = now_seconds() - t1;  // the weights onto the device, the workspaces
  model::Runtime& rt = *rt_ptr;
  if (!a.quiet) {
    note(fmt::format("device: {} ({}), runtime ready in {:.2f} s", rt.device(), why, t_runtime));
    if (device == "cuda")
      note(fmt::format("prefill attention: {}{}{}{}", rt.prefill_attention(),
                       rt.programmatic_launch() ? "; programmatic launches on" : "",
                       rt.fused_decode() ? "; fused one-row decode on" : "",
                       rt.fixed_point_decode() ? " (fixed-point FFN output)" : ""));
    if (!rt.weight_storage().empty()) note(fmt::format("weights: {}", rt.weight_storage()));
  }

  // One prompt streams to stdout; several are printed when all are done.
  const bool stream = ids.size() == 1;
  model::StreamDecoder dec(tok, /*skip_special=*/true);
  if (stream && !a.chat) {
    std::fputs(a.prompts[0].c_str(), stdout);
    std::fflush(stdout);
  }
  model::GenerateTimes t;
  const auto out = model::generate(
      rt, ids, a.g,
      [&](std::size_t, std::int32_t id) {
        if (!stream) return;
        std::fputs(dec.push(id).c_str(), stdout);
        std::fflush(stdout);
      },
      &t);
  if (stream) {
    std::fputs((dec.flush() + "\n").c_str(), stdout);
    std::fflush(stdout);
  }
  for (std::size_t i = 0; !stream && i < out.size(); ++i)
    fmt::print("--- [{}] {}\n{}{}\n", i, out[i].stop_reason, a.chat ? "" : a.prompts[i], tok.decode(out[i].tokens, true));

  // Per layer: whether it ran the sparse FFN, and its active neurons (CPU: summed over every call;
  // GPU: the newest count the engine read back).
  std::int64_t sparse_layers = 0, counted = 0, rows = 0, sparse_rows = 0, measured = 0;
  double per_token = 0, density_sum = 0;  // measured, density_sum: the GPU engine's newest counts
  for (const auto& s : rt.ffn_stats()) {
    if (s.last_density >= 0) {
      ++measured;
      density_sum += s.last_density;
    }
    sparse_layers += s.sparse_rows > 0;
    rows += s.rows;
    sparse_rows += s.sparse_rows;
    if (s.active_per_token() >= 0) {
      ++counted;
      per_token += s.active_per_token();
    }
  }
  if (!a.quiet) {
    note(fmt::format("prefill: {} tokens in {:.3f} s ({:.1f} tokens/s); decode: {} tokens in {:.3f} s ({:.1f} tokens/s)",
                     t.prefill_tokens, t.prefill_seconds, t.prefill_tokens / std::max(t.prefill_seconds, 1e-9),
                     t.decode_tokens, t.decode_seconds, t.decode_tokens / std::max(t.decode_seconds, 1e-9)));
    if (c.act != model::Activation::relu)
      note(fmt::format("FFN: {} activation, dense path (only ReLU FFNs are sparse)", model::to_string(c.act)));
    else if (counted > 0)
      note(fmt::format("FFN: the sparse path ran {:.0f} % of the ReLU layers' token rows ({} of {} layers at least once; "
                       "a layer measured denser than {:.0f} % runs dense); {:.1f} active neurons per token per layer "
                       "(of {}, {:.2f} %)",
                       100.0 * static_cast<double>(sparse_rows) / static_cast<double>(std::max<std::int64_t>(rows, 1)),
                       sparse_layers, c.num_layers, 100.0 * model::kCpuMaxSparseDensity, per_token / counted,
                       c.intermediate_size, 100.0 * per_token / counted / static_cast<double>(c.intermediate_size)));
    else if (measured > 0)
      note(fmt::format("FFN: {} of {} ReLU layers ran the sparse path; the engine's newest counts read {:.1f} active "
                       "neurons per token per layer (of {}, {:.2f} %; {} of {} layers counted)",
                       sparse_layers, c.num_layers, density_sum / measured * static_cast<double>(c.intermediate_size),
                       c.intermediate_size, 100.0 * density_sum / measured, measured, c.num_layers));
    else
      note(fmt::format("FFN: {} of {} ReLU layers ran the sparse path (no count has come back yet)", sparse_layers,
                       c.num_layers));
  }
  if (!a.json.empty()) {
    nlohmann::json j;
    j["model"] = a.model;
    j["device"] = rt.device();
    j["commit"] = git_commit();
    j["date"] = iso_time_utc();
    j["activation"] = model::to_string(c.act);
    j["load_seconds"] = t_load;        // checkpoint and tokenizer read into host memory
    j["runtime_seconds"] = t_runtime;  // the runtime built over them (a GPU's upload included)
    j["prefill"] = {{"tokens", t.prefill_tokens}, {"seconds", t.prefill_seconds}};
    j["decode"] = {{"tokens", t.decode_tokens}, {"seconds", t.decode_seconds}};
    for (const auto& g : out)
      j["generations"].push_back({{"prompt_tokens", g.prompt}, {"tokens", g.tokens}, {"text", tok.decode(g.tokens, true)},
                                  {"stop_reason", g.stop_reason}});
    for (const auto& s : rt.ffn_stats())
      j["ffn_layers"].push_back({{"rows", s.rows}, {"active", s.active}, {"sparse_rows", s.sparse_rows},
                                 {"overflow_rows", s.overflow_rows}, {"last_density", s.last_density}});
    write_json_file(a.json, j);
  }
  return 0;
}

}  // namespace

void add_generate_command(CLI::App& root, std::vector<Command>& out) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* sub = root.add_subcommand("generate", "Generate text with a Hugging Face Llama checkpoint");
  sub->footer(
      "Loads DIR/config.json, DIR/model.safetensors (or its shards) and DIR/tokenizer.json, encodes the prompt,\n"
      "and prints the continuation as it is generated, then the prefill and decode speeds (stderr).\n"
      "ReLU-gated FFNs run through twell's sparse path when a layer measures sparse enough; other\n"
      "activations run the dense path. Several --prompt flags generate as one batch.\n"
      "Example: twell generate --model assets/smollm2-135m-instruct --chat --prompt 'What is the capital of France?'\n" +
      std::string(kTuningHelp));
  sub->add_option("--model", a->model, "Checkpoint directory (Hugging Face layout)")->required();
  sub->add_option("--prompt", a->prompts, "Prompt text (repeat for a batch)");
  sub->add_option("--prompt-file", a->prompt_file, "Read one prompt from this file");
  sub->add_flag("--chat", a->chat, "Wrap the prompt in the model's chat template (ChatML, Llama-3)");
  sub->add_option("--system", a->system, "System message for --chat (default: the template's own, if any)");
  sub->add_option("--max-new-tokens,-n", a->g.max_new_tokens, "Tokens to generate at most")->check(CLI::Range(1, 1 << 20));
  sub->add_option("--temperature", a->g.sampling.temperature, "0: greedy")->check(CLI::Range(0.0, 100.0));
  sub->add_option("--top-k", a->g.sampling.top_k, "Sample among the k most likely tokens (0: all)")->check(CLI::NonNegativeNumber);
  sub->add_option("--top-p", a->g.sampling.top_p, "Nucleus sampling mass (1: off)");
  sub->add_option("--repetition-penalty", a->g.sampling.repetition_penalty, "> 1 discourages repeats (1: off)");
  sub->add_option("--seed", a->g.sampling.seed, "Sampling seed");
  sub->add_option("--stop-token", a->stop_tokens, "Also stop at this token (its text, e.g. '<|im_end|>'; repeatable)");
  sub->add_flag("--ignore-eos", a->g.ignore_eos, "Do not stop at the model's end-of-sequence tokens");
  sub->add_option("--hidden-act", a->hidden_act, "Override config.json's hidden_act (relu, silu, gelu, gelu_pytorch_tanh)");
  add_ffn_path_option(sub, a->runtime.ffn_path);
  sub->add_option("--device", a->device, "cpu or cuda (default: cuda when a GPU is usable, else cpu)");
  sub->add_option("--json", a->json, "Write tokens, text, speeds and per-layer FFN counts here");
  sub->add_flag("--quiet,-q", a->quiet, "Print only the generated text");
  out.push_back({sub, [a] { return run_generate(*a); }});
}

}  // namespace twell::cli
