// The OpenAI-compatible HTTP front end (see twell/serve/http.hpp).
#include "twell/serve/http.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <random>
#include <set>

#include <fmt/format.h>
#include <httplib.h>
#include <sys/socket.h>
#include <nlohmann/json.hpp>

#include "twell/error.hpp"
#include "twell/model/generate.hpp"

namespace twell::serve {
namespace {

using nlohmann::json;

// An error answered as OpenAI answers it: {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int status;
  std::string message;
  std::string param;
};

[[noreturn]] void bad(const std::string& msg, const std::string& param = "", int status = 400) {
  throw ApiError{status, msg, param};
}

void send_error(httplib::Response& res, int status, const std::string& msg, const std::string& param = "") {
  const char* type = status == 401 ? "authentication_error"
                     : status == 404 ? "not_found_error"
                     : status == 429 || status == 503 ? "server_busy"
                     : status >= 500 ? "server_error" : "invalid_request_error";
  json e = {{"message", msg}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)}, {"code", nullptr}};
  res.status = status;
  res.set_content(json{{"error", e}}.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

// Distinct values for request ids and unseeded requests' seeds: a Weyl sequence from a random start
// (thread-safe, never the same value twice in 2⁶⁴ calls).
std::uint64_t next_random() {
  static std::atomic<std::uint64_t> n{static_cast<std::uint64_t>(std::random_device{}()) << 32 | std::random_device{}()};
  return n.fetch_add(0x9E3779B97F4A7C15ull);
}

double number(const json& b, const char* key, double fallback, double lo, double hi) {
  if (!b.contains(key) || b[key].is_null()) return fallback;
  if (!b[key].is_number()) bad(fmt::format("'{}' must be a number", key), key);
  const double v = b[key].get<double>();
  if (!(v >= lo && v <= hi)) bad(fmt::format("'{}' must lie in [{}, {}], got {}", key, lo, hi, v), key);
  return v;
}

std::int64_t integer(const json& b, const char* key, std::int64_t fallback, std::int64_t lo, std::int64_t hi) {
  if (!b.contains(key) || b[key].is_null()) return fallback;
  if (!b[key].is_number_integer()) bad(fmt::format("'{}' must be an integer", key), key);
  const auto v = b[key].get<std::int64_t>();
  if (v < lo || v > hi) bad(fmt::format("'{}' must lie in [{}, {}], got {}", key, lo, hi, v), key);
  return v;
}

bool boolean(const json& b, const char* key, bool fallback) {
  if (!b.contains(key) || b[key].is_null()) return fallback;
  if (!b[key].is_boolean()) bad(fmt::format("'{}' must be true or false", key), key);
  return b[key].get<bool>();
}

// Parameters OpenAI defines that twell does not implement: accepted only at their no-op values.
void refuse_unless_default(const json& b) {
  auto zero = [&](const char* k) {
    if (b.contains(k) && !b[k].is_null() && !(b[k].is_number() && b[k].get<double>() == 0))
      bad(fmt::format("'{}' is not supported by twell (use repetition_penalty)", k), k);
  };
  zero("frequency_penalty");
  zero("presence_penalty");
  if (b.contains("n") && !b["n"].is_null() && b["n"] != 1) bad("'n' must be 1: twell returns one choice a request", "n");
  if (b.contains("best_of") && !b["best_of"].is_null() && b["best_of"] != 1) bad("'best_of' is not supported", "best_of");
  if (b.contains("echo") && !b["echo"].is_null() && b["echo"] != false) bad("'echo' is not supported", "echo");
  for (const char* k : {"logprobs", "top_logprobs"})
    if (b.contains(k) && !b[k].is_null() && b[k] != false && b[k] != 0)
      bad(fmt::format("'{}' is not supported by twell", k), k);
  if (b.contains("logit_bias") && !b["logit_bias"].is_null() && !(b["logit_bias"].is_object() && b["logit_bias"].empty()))
    bad("'logit_bias' is not supported by twell", "logit_bias");
  if (b.contains("suffix") && !b["suffix"].is_null()) bad("'suffix' is not supported by twell", "suffix");
  if (b.contains("tools") && !b["tools"].is_null()) bad("'tools' is not supported by twell", "tools");
  if (b.contains("response_format") && !b["response_format"].is_null() &&
      !(b["response_format"].is_object() && b["response_format"].value("type", "") == "text"))
    bad("'response_format' other than text is not supported by twell", "response_format");
}

const std::set<std::string> kCommonKeys = {
    "model", "max_tokens", "temperature", "top_p", "top_k", "repetition_penalty", "seed", "stop", "stream",
    "stream_options", "n", "user", "logprobs", "top_logprobs", "frequency_penalty", "presence_penalty", "logit_bias",
    "ignore_eos", "response_format", "tools", "tool_choice", "max_completion_tokens", "parallel_tool_calls"};

struct Parsed {
  RequestParams params;
  bool stream = false, include_usage = false;
};

// The sampling, stop and streaming parameters both endpoints share.
void common(const json& b, Parsed& out, std::int64_t max_tokens_default, std::int64_t room) {
  refuse_unless_default(b);
  const char* mt = b.contains("max_completion_tokens") && !b["max_completion_tokens"].is_null() ? "max_completion_tokens"
                                                                                              : "max_tokens";
  out.params.max_tokens = integer(b, mt, std::min(max_tokens_default, room), 1, 1ll << 31);
  if (out.params.max_tokens > room)
    bad(fmt::format("'{}' {} leaves no room: the prompt's tokens and it must fit the context ({} tokens left)", mt,
                    out.params.max_tokens, room),
        mt);
  auto& s = out.params.sampling;
  s.temperature = number(b, "temperature", 1.0, 0.0, 100.0);
  s.top_p = number(b, "top_p", 1.0, 1e-9, 1.0);
  s.top_k = integer(b, "top_k", 0, -1, 1ll << 31);
  if (s.top_k < 0) s.top_k = 0;  // vLLM's -1: no cut
  s.repetition_penalty = number(b, "repetition_penalty", 1.0, 1e-3, 100.0);
  if (b.contains("seed") && !b["seed"].is_null()) {
    if (!b["seed"].is_number_integer()) bad("'seed' must be an integer", "seed");
    s.seed = static_cast<std::uint64_t>(b["seed"].get<std::int64_t>());
  } else {
    s.seed = next_random();
  }
  if (b.contains("stop") && !b["stop"].is_null()) {
    const json& st = b["stop"];
    if (st.is_string()) {
      out.params.stop.push_back(st.get<std::string>());
    } else if (st.is_array() && st.size() <= 4) {
      for (const auto& x : st) {
        if (!x.is_string()) bad("'stop' must be a string or a list of up to 4 strings", "stop");
        out.params.stop.push_back(x.get<std::string>());
      }
    } else {
      bad("'stop' must be a string or a list of up to 4 strings", "stop");
    }
    for (const auto& x : out.params.stop)
      if (x.empty()) bad("'stop' strings must not be empty", "stop");
  }
  out.params.ignore_eos = boolean(b, "ignore_eos", false);
  out.stream = boolean(b, "stream", false);
  if (b.contains("stream_options") && !b["stream_options"].is_null()) {
    if (!b["stream_options"].is_object()) bad("'stream_options' must be an object", "stream_options");
    out.include_usage = boolean(b["stream_options"], "include_usage", false);
  }
}

std::string random_id(const char* prefix) { return fmt::format("{}-{:016x}", prefix, next_random()); }

}  // namespace

// Connections waiting to be accepted (cpp-httplib's own is 5).
constexpr int kListenBacklog = 1024;

struct HttpServer::Impl {
  ServerOptions opt;
  httplib::Server svr;
  std::atomic<Engine*> engine{nullptr};
  const model::Tokenizer* tok = nullptr;
  const model::LlamaConfig* config = nullptr;
  int listen_fd = -1;  // the socket bind() bound last (set by the socket options below)

  explicit Impl(const ServerOptions& o) : opt(o) {
    // SO_REUSEADDR only: cpp-httplib's default adds SO_REUSEPORT, which lets a second server bind
    // the same port and silently take half its connections; here that second bind fails.
    svr.set_socket_options([this](socket_t s) {
      int yes = 1;
      setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
      listen_fd = s;
    });
  }

  void check_model(const json& b) const {
    if (b.contains("model") && !b["model"].is_null()) {
      if (!b["model"].is_string()) bad("'model' must be a string", "model");
      const auto m = b["model"].get<std::string>();
      if (m != opt.model_name) bad(fmt::format("the model '{}' does not exist; this server serves '{}'", m, opt.model_name), "model", 404);
    }
  }

  json parse_body(const httplib::Request& req) const {
    json b;
    try {
      b = json::parse(req.body);
    } catch (const json::exception& e) {
      bad(fmt::format("the body is not valid JSON (UTF-8): {}", e.what()));
    }
    if (!b.is_object()) bad("the body must be a JSON object");
    return b;
  }

  // Runs a parsed request: streams server-sent events, or answers one JSON body at the end. Both
  // through a chunked provider that notices a client gone (a failed write) and cancels the request.
  void run(const Parsed& p, bool chat, httplib::Response& res) {
    Engine* e = engine.load();
    std::shared_ptr<Request> r;
    try {
      r = e->submit(p.params);
    } catch (const QueueFull& q) {
      send_error(res, 503, q.what());
      return;
    } catch (const Error& err) {
      send_error(res, 400, err.what());
      return;
    }
    const std::string id = random_id(chat ? "chatcmpl" : "cmpl");
    const std::int64_t created = static_cast<std::int64_t>(std::time(nullptr));
    const std::string model = opt.model_name;
    const bool stream = p.stream, usage = p.include_usage;
    auto chunk = [=](const json& choice_delta, const json& finish) {
      json c = {{"index", 0}, {"finish_reason", finish}};
      if (chat)
        c["delta"] = choice_delta;
      else
        c["text"] = choice_delta, c["logprobs"] = nullptr;
      return json{{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
                  {"model", model}, {"choices", json::array({c})}};
    };
    struct State {
      std::string text;
      bool started = false, finished = false;
    };
    auto st = std::make_shared<State>();
    auto write = [](httplib::DataSink& sink, const std::string& s) { return sink.write(s.data(), s.size()); };
    auto sse = [&write](httplib::DataSink& sink, const json& j) { return write(sink, "data: " + j.dump() + "\n\n"); };
    res.set_chunked_content_provider(
        stream ? "text/event-stream" : "application/json",
        [=](std::size_t, httplib::DataSink& sink) {
          if (st->finished) return false;
          if (stream && chat && !st->started) {
            st->started = true;
            if (!sse(sink, chunk(json{{"role", "assistant"}, {"content", ""}}, nullptr))) return r->cancel(), false;
          }
          Event ev;
          while (!r->next(ev, std::chrono::milliseconds(100)))
            if (!sink.is_writable()) return r->cancel(), false;
          if (ev.kind == Event::Kind::text) {
            if (!stream) return st->text += ev.text, true;
            const json d = chat ? json{{"content", ev.text}} : json(ev.text);
            if (!sse(sink, chunk(d, nullptr))) return r->cancel(), false;
            return true;
          }
          st->finished = true;
          if (ev.kind == Event::Kind::error) {
            // Mid-stream the status is sent already: the error travels as an event (as vLLM does).
            const json err = {{"error", {{"message", ev.text}, {"type", "server_error"}, {"param", nullptr}, {"code", nullptr}}}};
            write(sink, stream ? "data: " + err.dump() + "\n\n" : err.dump());
            sink.done();
            return true;
          }
          const json u = {{"prompt_tokens", ev.prompt_tokens}, {"completion_tokens", ev.completion_tokens},
                          {"total_tokens", ev.prompt_tokens + ev.completion_tokens}};
          if (stream) {
            sse(sink, chunk(chat ? json::object() : json(""), ev.finish_reason));
            if (usage) {
              json last = chunk(nullptr, nullptr);
              last["choices"] = json::array();
              last["usage"] = u;
              sse(sink, last);
            }
            write(sink, "data: [DONE]\n\n");
          } else {
            json c = {{"index", 0}, {"finish_reason", ev.finish_reason}};
            if (chat)
              c["message"] = {{"role", "assistant"}, {"content", st->text}};
            else
              c["text"] = st->text, c["logprobs"] = nullptr;
            write(sink, json{{"id", id}, {"object", chat ? "chat.completion" : "text_completion"}, {"created", created},
                             {"model", model}, {"choices", json::array({c})}, {"usage", u}}
                            .dump());
          }
          sink.done();
          return true;
        },
        [r](bool success) {
          if (!success) r->cancel();
        });
  }

  void completions(const httplib::Request& req, httplib::Response& res) {
    const json b = parse_body(req);
    check_model(b);
    std::set<std::string> keys = kCommonKeys;
    keys.insert({"prompt", "echo", "best_of", "suffix"});
    for (const auto& [k, v] : b.items())
      if (!keys.count(k)) bad(fmt::format("unknown or unsupported parameter '{}'", k), k);
    if (!b.contains("prompt")) bad("'prompt' is required", "prompt");
    Parsed p;
    const json& pr = b["prompt"];
    if (pr.is_string()) {
      p.params.prompt = tok->encode(pr.get<std::string>(), /*add_special=*/true);
    } else if (pr.is_array() && !pr.empty() && pr[0].is_number_integer()) {
      for (const auto& t : pr) {
        if (!t.is_number_integer()) bad("'prompt' as token ids must hold integers only", "prompt");
        const auto v = t.get<std::int64_t>();
        if (v < 0 || v >= config->vocab_size) bad(fmt::format("token id {} is outside the vocabulary", v), "prompt");
        p.params.prompt.push_back(static_cast<std::int32_t>(v));
      }
    } else if (pr.is_array() && pr.size() == 1 && pr[0].is_string()) {
      p.params.prompt = tok->encode(pr[0].get<std::string>(), true);
    } else {
      bad("'prompt' must be a string, a list of one string or a list of token ids (one prompt a request)", "prompt");
    }
    room_check(p.params.prompt.size());
    common(b, p, 16, config->max_position - static_cast<std::int64_t>(p.params.prompt.size()));
    run(p, false, res);
  }

  void chat(const httplib::Request& req, httplib::Response& res) {
    const json b = parse_body(req);
    check_model(b);
    std::set<std::string> keys = kCommonKeys;
    keys.insert("messages");
    for (const auto& [k, v] : b.items())
      if (!keys.count(k)) bad(fmt::format("unknown or unsupported parameter '{}'", k), k);
    if (!b.contains("messages") || !b["messages"].is_array() || b["messages"].empty())
      bad("'messages' must be a non-empty list", "messages");
    std::vector<model::ChatMessage> msgs;
    for (const auto& m : b["messages"]) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        bad("each message needs a 'role' string", "messages");
      std::string content;
      if (m.contains("content") && m["content"].is_string()) {
        content = m["content"].get<std::string>();
      } else if (m.contains("content") && m["content"].is_array()) {  // [{"type": "text", "text": ...}]
        for (const auto& part : m["content"]) {
          if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
            bad("message content parts must be {\"type\": \"text\", \"text\": ...}", "messages");
          content += part["text"].get<std::string>();
        }
      } else {
        bad("each message needs a 'content' string", "messages");
      }
      std::string role = m["role"].get<std::string>();
      if (role == "developer") role = "system";
      if (role != "system" && role != "user" && role != "assistant")
        bad(fmt::format("message role '{}' is not supported (system, user, assistant)", role), "messages");
      if (role == "system" && !msgs.empty()) bad("a system message must come first", "messages");
      msgs.push_back({role, content});
    }
    std::string text;
    try {
      text = model::chat_prompt(opt.model_dir, msgs);
    } catch (const Error& e) {
      bad(e.what());
    }
    Parsed p;
    p.params.prompt = tok->encode(text, /*add_special=*/false);  // the template wrote any BOS itself
    room_check(p.params.prompt.size());
    common(b, p, opt.max_tokens_default, config->max_position - static_cast<std::int64_t>(p.params.prompt.size()));
    run(p, true, res);
  }

  void room_check(std::size_t n) const {
    if (n == 0) bad("the prompt is empty", "prompt");
    if (static_cast<std::int64_t>(n) >= config->max_position)
      bad(fmt::format("the prompt has {} tokens; the model's context is {} tokens", n, config->max_position), "prompt", 413);
  }

  std::string metrics_text() const {
    Engine* e = engine.load();
    if (!e) return "# twell: loading\n";
    const Metrics m = e->metrics();
    std::string s;
    auto gauge = [&](const char* name, const char* help, double v, const char* type = "gauge") {
      s += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, v);
    };
    gauge("twell_requests_running", "Requests decoding or prefilling.", static_cast<double>(m.running));
    gauge("twell_requests_queued", "Requests waiting for admission.", static_cast<double>(m.queued));
    gauge("twell_requests_total", "Requests accepted.", static_cast<double>(m.requests_total), "counter");
    gauge("twell_requests_finished_total", "Requests that ended with stop or length.", static_cast<double>(m.requests_finished), "counter");
    gauge("twell_requests_cancelled_total", "Requests cancelled (client gone, shutdown).", static_cast<double>(m.requests_cancelled), "counter");
    gauge("twell_requests_rejected_total", "Requests refused with a full queue or while shutting down.", static_cast<double>(m.requests_rejected), "counter");
    gauge("twell_prompt_tokens_total", "Prompt tokens prefilled.", static_cast<double>(m.prompt_tokens_total), "counter");
    gauge("twell_prompt_tokens_cached_total",
          "Prompt tokens whose keys and values came from another request's shared KV blocks (not prefilled).",
          static_cast<double>(m.prompt_tokens_cached_total), "counter");
    gauge("twell_generation_tokens_total", "Tokens generated.", static_cast<double>(m.generation_tokens_total), "counter");
    gauge("twell_steps_total", "Scheduler steps (forward calls).", static_cast<double>(m.steps_total), "counter");
    gauge("twell_kv_tokens_used", "KV-cache positions held by running requests.", static_cast<double>(m.kv_tokens_used));
    gauge("twell_kv_tokens_total", "KV-cache positions the server may hold.", static_cast<double>(m.kv_tokens_total));
    gauge("twell_kv_blocks_used", "Paged KV-cache blocks held by running requests (0 without a paged cache).",
          static_cast<double>(m.kv_blocks_used));
    gauge("twell_kv_blocks_total", "Paged KV-cache blocks in the pool (0 without a paged cache).",
          static_cast<double>(m.kv_blocks_total));
    gauge("twell_kv_blocks_cached",
          "Paged KV-cache blocks no request holds, kept for the prompts that start with their tokens (free for reuse).",
          static_cast<double>(m.kv_blocks_cached));
    gauge("twell_preemptions_total", "Requests preempted for want of KV blocks (recomputed later).",
          static_cast<double>(m.preemptions_total), "counter");
    gauge("twell_ffn_sparse_row_share", "Share of FFN rows (ReLU layers) on the sparse path so far.",
          m.ffn_rows_total > 0 ? static_cast<double>(m.ffn_rows_sparse) / static_cast<double>(m.ffn_rows_total) : 0.0);
    auto hist = [&](const char* name, const char* help, const std::vector<double>& b, double sum, std::int64_t count) {
      s += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
      for (std::size_t i = 0; i < b.size(); ++i) s += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, kLatencyBuckets[i], b[i]);
      s += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count, name, sum, name, count);
    };
    hist("twell_time_to_first_token_seconds", "From a request's arrival to its first token.", m.ttft_seconds, m.ttft_sum, m.ttft_count);
    hist("twell_inter_token_latency_seconds", "Between a request's consecutive tokens.", m.itl_seconds, m.itl_sum, m.itl_count);
    return s;
  }
};

HttpServer::HttpServer(const ServerOptions& o) : impl_(std::make_unique<Impl>(o)) {
  Impl& I = *impl_;
  auto& svr = I.svr;
  svr.set_payload_max_length(o.max_body_bytes);
  const std::size_t threads = std::max<std::size_t>(o.threads, 4);
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_read_timeout(30, 0);
  svr.set_write_timeout(30, 0);
  // Authentication, and 503 while the model loads (for everything but /health, which says so itself).
  svr.set_pre_routing_handler([&I](const httplib::Request& req, httplib::Response& res) {
    if (req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    if (!I.opt.api_key.empty() && req.get_header_value("Authorization") != "Bearer " + I.opt.api_key) {
      send_error(res, 401, "a valid API key is required (Authorization: Bearer ...)");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!I.engine.load() && req.path != "/metrics") {
      send_error(res, 503, "the model is loading");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  auto guarded = [&I](void (Impl::*fn)(const httplib::Request&, httplib::Response&)) {
    return [&I, fn](const httplib::Request& req, httplib::Response& res) {
      try {
        (I.*fn)(req, res);
      } catch (const ApiError& e) {
        send_error(res, e.status, e.message, e.param);
      } catch (const std::exception& e) {
        send_error(res, 500, e.what());
      }
    };
  };
  svr.Post("/v1/completions", guarded(&Impl::completions));
  svr.Post("/v1/chat/completions", guarded(&Impl::chat));
  svr.Get("/v1/models", [&I](const httplib::Request&, httplib::Response& res) {
    res.set_content(json{{"object", "list"},
                         {"data", json::array({{{"id", I.opt.model_name}, {"object", "model"}, {"created", 0},
                                                {"owned_by", "twell"},
                                                {"max_model_len", I.config ? I.config->max_position : 0}}})}}
                        .dump(),
                    "application/json");
  });
  svr.Get("/health", [&I](const httplib::Request&, httplib::Response& res) {
    if (I.engine.load())
      res.set_content(R"({"status":"ok"})", "application/json");
    else
      send_error(res, 503, "the model is loading");
  });
  svr.Get("/metrics", [&I](const httplib::Request&, httplib::Response& res) {
    res.set_content(I.metrics_text(), "text/plain; version=0.0.4");
  });
  svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413 && req.get_header_value("Content-Type").starts_with("application/x-www-form-urlencoded"))
      // cpp-httplib parses such bodies as forms and caps them at 8 KB (CPPHTTPLIB_FORM_URL_ENCODED_PAYLOAD_MAX_LENGTH).
      send_error(res, 413, "a form-encoded body over 8 KB is refused: send the JSON with Content-Type: application/json");
    else if (res.status == 413)
      send_error(res, 413, "the request body is too large (--max-body)");
    else if (res.status == 404)
      send_error(res, 404, fmt::format("no endpoint {} {}", req.method, req.path));
    else if (res.status >= 400)
      send_error(res, res.status, fmt::format("HTTP {}", res.status));
  });
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::bind() {
  Impl& I = *impl_;
  int port = I.opt.port;
  if (port == 0) {
    port = I.svr.bind_to_any_port(I.opt.host);
  } else if (!I.svr.bind_to_port(I.opt.host, port)) {
    port = -1;
  }
  TWELL_CHECK(port > 0, ErrorCode::io, "serve: cannot listen on {}:{} (in use, or not an address of this machine)",
              I.opt.host, I.opt.port);
  // Debian's cpp-httplib is a compiled library that listens with a backlog of 5: a burst of clients
  // connecting at once (a benchmark's, a load balancer's after a restart) overflowed that accept
  // queue and some were reset after a second (measured: 2–6 of 128 at once on the GPU machine).
  // listen() again on the bound socket sets a deeper queue (the kernel caps it at somaxconn).
  TWELL_CHECK(I.listen_fd >= 0 && ::listen(I.listen_fd, kListenBacklog) == 0, ErrorCode::io,
              "serve: cannot set the listen backlog on {}:{}", I.opt.host, port);
  return port;
}

void HttpServer::ready(Engine* engine, const model::Tokenizer* tok, const model::LlamaConfig* config) {
  Impl& I = *impl_;
  I.tok = tok;
  I.config = config;
  I.engine.store(engine);
}

void HttpServer::listen() { impl_->svr.listen_after_bind(); }

void HttpServer::stop() {
  if (impl_->svr.is_running()) impl_->svr.stop();
}

}  // namespace twell::serve
