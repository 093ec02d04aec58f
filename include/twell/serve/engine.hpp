#pragma once
// The serving engine: one scheduler thread owns the runtime and runs iteration-level continuous
// batching. Each step runs one forward over the decode token of every running request plus chunks
// of prompts still being prefilled (chunked prefill: at most step_tokens prompt tokens a step, so a
// long prompt never stalls the others); requests join and leave between steps. HTTP threads only
// submit requests and read their events.
//
// KV memory, paged (both runtimes; the GPU's pool is allocated whole at start): one pool of
// kv_tokens positions in blocks of model::kKvBlockTokens; a request holds only the blocks of the
// tokens written so far, starting on the shared blocks of a running request's identical prompt
// start. It is admitted when the pool has blocks for its prompt plus one token beyond what the
// requests still prefilling will take, and kv_headroom blocks for each running request to grow
// into. When a step's tokens find the pool empty, the most recently admitted request is preempted:
// its blocks are freed and it goes back to the head of the queue, to be recomputed (prompt and the
// tokens it generated, prefilled again) when it is admitted again, its stream going on where it
// stopped. Where the runtime refuses a pool (TWELL_TUNING=no-paged-kv; a GPU context longer than its
// decode attention takes) each admitted request holds a cache of prompt + max_tokens positions and
// the sum over the running requests stays within kv_tokens. Either way a request that does not fit
// waits in the queue, a full queue is refused at once, and a request's cache is freed when it ends,
// is cancelled or its client goes away.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <stdexcept>
#include <thread>
#include <vector>

#include "twell/model/runtime.hpp"
#include "twell/model/sampler.hpp"
#include "twell/model/tokenizer.hpp"

namespace twell::serve {

struct RequestParams {
  std::vector<std::int32_t> prompt;  // non-empty
  std::int64_t max_tokens = 16;      // ≥ 1
  model::SamplingOptions sampling;
  std::vector<std::string> stop;     // stop strings, matched in the text across token boundaries
  bool ignore_eos = false;
};

// What a request's reader receives, in order: text pieces (complete UTF-8), then one final event.
struct Event {
  enum class Kind { text, done, error };
  Kind kind = Kind::text;
  std::string text;           // text: the new piece; error: the message
  std::string finish_reason;  // done: "stop" (eos or a stop string) or "length"
  std::int64_t prompt_tokens = 0, completion_tokens = 0;  // done
};

class Request {
 public:
  // Waits up to `timeout` for the next event; false when none came.
  bool next(Event& e, std::chrono::milliseconds timeout);
  // Asks the scheduler to drop the request (its cache is freed before the next step).
  void cancel() noexcept { cancelled_ = true; }
  bool cancelled() const noexcept { return cancelled_; }

 private:
  friend class Engine;
  void push(Event e);
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<Event> events_;
  std::atomic<bool> cancelled_{false};
};

struct EngineOptions {
  std::int64_t max_running = 16;   // requests decoding or prefilling at once
  std::int64_t max_queue = 64;     // requests waiting for admission; beyond: refused (HTTP 503)
  std::int64_t step_tokens = 256;  // prompt tokens a step may prefill (beside the decode tokens)
  std::int64_t kv_tokens = 0;      // cache positions over all running requests (0: max_running × context)
  // Paged cache: KV blocks kept free per running request when admitting another, room for each to
  // grow (a block is 16 tokens) before the pool runs out and a request is preempted and recomputed.
  // 0 by default: on the CPU 1 and 4 cut preemptions (25 → 18 → 13) without raising tokens/s
  // (docs/serving.md "What paging buys").
  std::int64_t kv_headroom = 0;
};

// Counters for /metrics (read at any time).
struct Metrics {
  std::int64_t running = 0, queued = 0, kv_tokens_used = 0, kv_tokens_total = 0;
  std::int64_t kv_blocks_used = 0, kv_blocks_total = 0;  // the paged cache's (0 without one)
  std::int64_t kv_blocks_cached = 0;  // of the free ones, published blocks kept for their prefix
  std::int64_t preemptions_total = 0;                     // requests preempted for want of KV blocks
  std::int64_t requests_total = 0, requests_finished = 0, requests_cancelled = 0, requests_rejected = 0;
  std::int64_t prompt_tokens_total = 0, generation_tokens_total = 0, steps_total = 0;
  std::int64_t prompt_tokens_cached_total = 0;  // prompt tokens taken from shared KV blocks (not prefilled)
  std::vector<double> ttft_seconds, itl_seconds;  // bucket counts for the histograms (see kLatencyBuckets)
  double ttft_sum = 0, itl_sum = 0;
  std::int64_t ttft_count = 0, itl_count = 0;
  std::int64_t ffn_rows_sparse = 0, ffn_rows_total = 0;  // FFN rows of ReLU layers, and those on the sparse path
};
inline constexpr double kLatencyBuckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};

class QueueFull : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Engine {
 public:
  // The runtime and tokenizer must outlive the engine; the scheduler thread starts here.
  Engine(model::Runtime& rt, const model::Tokenizer& tok, const EngineOptions& opt);
  ~Engine();  // cancels what runs and joins the scheduler
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. Throws Error(invalid_argument) for a request that can never run (empty
  // prompt, prompt + max_tokens beyond the context or the KV budget), QueueFull when the queue is full.
  std::shared_ptr<Request> submit(RequestParams p);
  // Stops admitting; cancels the running and queued requests when `cancel`, else lets them finish;
  // returns once the scheduler is idle.
  void drain(bool cancel);
  Metrics metrics() const;
  const EngineOptions& options() const noexcept { return opt_; }

 private:
  struct Active;
  void loop();
  void step(std::vector<std::unique_ptr<Active>>& running);
  void finish(Active& a, const std::string& reason);
  bool fits(const Active& a, const std::vector<std::unique_ptr<Active>>& running) const;
  void preempt(Active& a);

  model::Runtime& rt_;
  const model::Tokenizer& tok_;
  EngineOptions opt_;
  mutable std::mutex m_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::unique_ptr<Active>> queue_;
  bool stop_ = false, draining_ = false, busy_ = false;
  std::atomic<bool> cancel_all_{false};  // drain(true): the scheduler cancels what runs
  std::int64_t kv_used_ = 0;                 // without a paged cache: the running requests' positions
  std::shared_ptr<model::KvPool> pool_;      // the paged cache, or null
  Metrics metrics_;
  std::thread thread_;
};

}  // namespace twell::serve
