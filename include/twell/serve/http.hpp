#pragma once
// The OpenAI-compatible HTTP front end of `twell serve` (cpp-httplib): it parses, validates and
// streams; the Engine's scheduler thread does all model work. Endpoints: POST /v1/completions,
// POST /v1/chat/completions (streaming as server-sent events or one JSON body), GET /v1/models,
// GET /health (503 until a model is ready), GET /metrics (Prometheus text).
//
// Threads: cpp-httplib serves each connection on a pool thread for as long as it is open, so a
// streamed request holds one thread (8 MB of reserved, mostly untouched stack) for its whole life.
// The pool is sized to the engine's running + queued requests plus a few for /health and /metrics;
// connections beyond it wait in the accept queue (hundreds of open streams cost hundreds of threads:
// an event loop such as Boost.Beast's would not, at the price of a much larger front end).
#include <cstdint>
#include <memory>
#include <string>

#include "twell/model/config.hpp"
#include "twell/model/tokenizer.hpp"
#include "twell/serve/engine.hpp"

namespace twell::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                           // 0: any free port (printed when listening)
  std::string api_key;                       // non-empty: every endpoint but /health needs "Bearer <key>"
  std::string model_name = "twell";          // the id /v1/models lists and requests must name
  std::string model_dir;                     // its tokenizer_config.json's chat template
  std::size_t max_body_bytes = 1 << 20;      // larger bodies: 413
  std::int64_t max_tokens_default = 256;     // a chat request without max_tokens (completions: 16, as OpenAI)
  std::size_t threads = 16;                  // connection threads (the engine's running + queued + a few)
};

class HttpServer {
 public:
  explicit HttpServer(const ServerOptions& o);
  ~HttpServer();
  // Binds (before the model loads, so /health answers 503 meanwhile); returns the port.
  int bind();
  // The model is ready: requests are served from now on. All three must outlive the server.
  void ready(Engine* engine, const model::Tokenizer* tok, const model::LlamaConfig* config);
  // Serves until stop() (blocking).
  void listen();
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace twell::serve
