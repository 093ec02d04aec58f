// twell serve: an OpenAI-compatible HTTP server over the model runtime (src/serve).
#include <pthread.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <future>
#include <memory>
#include <thread>

#include "common.hpp"
#include "runtime_flags.hpp"
#include "twell/model/runtime.hpp"
#include "twell/serve/http.hpp"

namespace twell::cli {
namespace {

struct ServeArgs {
  std::string model, model_name, device, hidden_act;
  model::FfnPath ffn = model::FfnPath::automatic;
  serve::ServerOptions server;
  serve::EngineOptions engine;
  double drain_seconds = 30;
};

int run_serve(ServeArgs& a) {
  // SIGTERM / SIGINT are taken by one thread (sigwait) for an orderly shutdown: blocked here, before
  // any other thread exists, so that every thread inherits the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::promise<int> signalled;
  std::thread waiter([&] {
    int s = 0;
    sigwait(&sigs, &s);
    signalled.set_value(s);
  });
  struct Join {
    std::thread& t;
    ~Join() {
      if (t.joinable()) {
        pthread_kill(t.native_handle(), SIGTERM);  // wakes the sigwait if no signal came
        t.join();
      }
    }
  } join_waiter{waiter};

  model::RuntimeTuning::from_env();  // a malformed TWELL_TUNING is refused before the server starts
  std::string why;
  const std::string device = resolve_device(a.device, &why) == DeviceKind::cuda ? "cuda" : "cpu";
  namespace fs = std::filesystem;
  TWELL_CHECK(fs::is_directory(a.model), ErrorCode::io, "--model {}: not a directory", a.model);
  a.server.model_dir = a.model;
  a.server.model_name = a.model_name.empty() ? fs::path(a.model).lexically_normal().filename().string() : a.model_name;
  if (a.server.model_name.empty()) a.server.model_name = "twell";
  a.server.threads = static_cast<std::size_t>(a.engine.max_running + a.engine.max_queue + 8);
  serve::HttpServer http(a.server);
  const int port = http.bind();
  std::thread listener([&] { http.listen(); });
  struct Stop {
    serve::HttpServer& h;
    std::thread& t;
    ~Stop() {
      h.stop();
      if (t.joinable()) t.join();
    }
  } stop_http{http, listener};
  fmt::print("twell serve: listening on http://{}:{} (loading {} on {})\n", a.server.host, port, a.model, device);
  std::fflush(stdout);

  model::LoadOptions lo;
  if (!a.hidden_act.empty()) lo.hidden_act = a.hidden_act;
  lo.bf16_only = device == "cuda";
  const model::Model m = model::Model::load(a.model, lo);
  if (const auto w = model::unknown_keys_warning(m.config); !w.empty()) fmt::print(stderr, "warning: {}\n", w);
  const model::Tokenizer tok = model::Tokenizer::from_file(a.model + "/tokenizer.json");
  TWELL_CHECK(tok.vocab_size() <= m.config.vocab_size, ErrorCode::corrupt,
              "tokenizer.json has {} tokens but the model's vocabulary holds {}", tok.vocab_size(), m.config.vocab_size);
  model::RuntimeOptions ro;
  ro.ffn_path = a.ffn;
  auto rt = model::make_runtime(m, device, ro);
  {
    serve::Engine engine(*rt, tok, a.engine);
    http.ready(&engine, &tok, &m.config);
    const auto em = engine.metrics();
    fmt::print("twell serve: ready: model '{}' ({} layers, context {}), {} running / {} queued requests at most, "
               "KV budget {} tokens{}\n",
               a.server.model_name, m.config.num_layers, m.config.max_position, engine.options().max_running,
               engine.options().max_queue, em.kv_tokens_total,
               em.kv_blocks_total > 0 ? fmt::format(" (paged: {} blocks of {})", em.kv_blocks_total, model::kKvBlockTokens)
                                      : std::string(" (a cache of prompt + max_tokens per request)"));
    std::fflush(stdout);
    const int s = signalled.get_future().get();
    fmt::print("twell serve: {}: draining (up to {} s), then cancelling what still runs\n", s == SIGINT ? "SIGINT" : "SIGTERM",
               a.drain_seconds);
    std::fflush(stdout);
    auto drained = std::async(std::launch::async, [&] { engine.drain(false); });
    if (drained.wait_for(std::chrono::duration<double>(a.drain_seconds)) != std::future_status::ready) engine.drain(true);
    drained.get();
    // The requests' last events are queued; let their connections write them before closing.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    http.stop();
  }
  waiter.join();
  fmt::print("twell serve: stopped\n");
  return 0;
}

}  // namespace

void add_serve_command(CLI::App& root, std::vector<Command>& out) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* sub = root.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  sub->footer(
      "Endpoints: POST /v1/completions, POST /v1/chat/completions (\"stream\": true for server-sent events),\n"
      "GET /v1/models, GET /health (503 while loading), GET /metrics (Prometheus). Requests are batched\n"
      "continuously: each step runs every running request's next token plus chunks of waiting prompts.\n"
      "Parameters: max_tokens, temperature, top_p, top_k, repetition_penalty, seed, stop, stream,\n"
      "stream_options.include_usage; others are refused with a 400 that names them. SIGTERM drains.\n"
      "Example: twell serve --model assets/smollm2-135m-instruct --port 8080\n" +
      std::string(kTuningHelp));
  sub->add_option("--model", a->model, "Checkpoint directory (Hugging Face layout, with tokenizer.json)")->required();
  sub->add_option("--model-name", a->model_name, "The model id clients name (default: the directory's name)");
  sub->add_option("--host", a->server.host, "Address to bind (default loopback only; 0.0.0.0 for every interface)");
  sub->add_option("--port", a->server.port, "Port (0: any free one, printed)")->check(CLI::Range(0, 65535));
  sub->add_option("--api-key", a->server.api_key, "Require 'Authorization: Bearer KEY' on every endpoint but /health");
  sub->add_option("--device", a->device, "cpu or cuda (default: cuda when a GPU is usable, else cpu)");
  sub->add_option("--hidden-act", a->hidden_act, "Override config.json's hidden_act");
  add_ffn_path_option(sub, a->ffn);
  sub->add_option("--max-running", a->engine.max_running, "Requests batched at once")->check(CLI::Range(1, 4096));
  sub->add_option("--max-queue", a->engine.max_queue, "Requests waiting beyond those (more: HTTP 503)")->check(CLI::Range(0, 1 << 16));
  sub->add_option("--step-tokens", a->engine.step_tokens, "Prompt tokens prefilled a step (chunked prefill)")->check(CLI::Range(1, 1 << 20));
  sub->add_option("--kv-tokens", a->engine.kv_tokens, "KV-cache positions over all running requests (0: max-running x context)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--kv-headroom", a->engine.kv_headroom,
                  "Paged cache: KV blocks (16 tokens) kept free per running request when admitting another (fewer preemptions)")
      ->check(CLI::Range(0, 1 << 20));
  sub->add_option("--max-body", a->server.max_body_bytes, "Largest request body in bytes (more: HTTP 413)")->check(CLI::Range(1024, 1 << 30));
  sub->add_option("--max-tokens-default", a->server.max_tokens_default, "A chat request's max_tokens when it gives none")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--drain-seconds", a->drain_seconds, "On SIGTERM: let running requests finish this long, then cancel them")
      ->check(CLI::Range(0.0, 3600.0));
  out.push_back({sub, [a] { return run_serve(*a); }});
}

}  // namespace twell::cli
