// The serving engine's scheduler (see twell/serve/engine.hpp).
#include "twell/serve/engine.hpp"

#include <algorithm>

#include "twell/error.hpp"

namespace twell::serve {

using Clock = std::chrono::steady_clock;

bool Request::next(Event& e, std::chrono::milliseconds timeout) {
  std::unique_lock lk(m_);
  if (!cv_.wait_for(lk, timeout, [&] { return !events_.empty(); })) return false;
  e = std::move(events_.front());
  events_.pop_front();
  return true;
}

void Request::push(Event e) {
  {
    std::lock_guard lk(m_);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

// A request the scheduler owns: its cache, sampler, history and the text not yet sent.
struct Engine::Active {
  std::shared_ptr<Request> req;
  RequestParams p;
  std::int64_t capacity = 0;  // cache positions: prompt + max_tokens, within the context
  std::unique_ptr<model::Sequence> seq;
  model::Sampler sampler;
  std::vector<std::int32_t> history;  // prompt, then generated ids (the repetition penalty's)
  // The tokens to prefill: the prompt, or after a preemption the prompt and every generated token
  // but the last (which the next decode step feeds); a token is sampled after them only when none
  // was generated yet.
  std::vector<std::int32_t> feed;
  bool sample_after_feed = true;
  bool preempted = false;  // in this step: its blocks were freed, it goes back to the queue
  std::int64_t prefilled = 0, generated = 0;
  std::int32_t last = 0;
  model::StreamDecoder dec;
  std::string held;  // decoded text not yet sent: it may be the start of a stop string
  Clock::time_point submitted, last_token;
  bool done = false;

  Active(std::shared_ptr<Request> r, RequestParams params, std::int64_t cap, const model::Tokenizer& tok)
      : req(std::move(r)), p(std::move(params)), capacity(cap), sampler(p.sampling), history(p.prompt),
        feed(p.prompt), dec(tok, /*skip_special=*/true), submitted(Clock::now()) {}
};

Engine::Engine(model::Runtime& rt, const model::Tokenizer& tok, const EngineOptions& opt)
    : rt_(rt), tok_(tok), opt_(opt) {
  const std::int64_t ctx = rt_.model().config.max_position;
  TWELL_CHECK(opt_.max_running >= 1 && opt_.max_queue >= 0 && opt_.step_tokens >= 1 && opt_.kv_tokens >= 0 &&
                  opt_.kv_headroom >= 0,
              ErrorCode::invalid_argument,
              "serve: max_running ≥ 1, max_queue ≥ 0, step_tokens ≥ 1, kv_tokens ≥ 0 and kv_headroom ≥ 0");
  if (opt_.kv_tokens == 0) opt_.kv_tokens = opt_.max_running * ctx;
  try {
    pool_ = rt_.make_kv_pool(model::KvPool::blocks_for(opt_.kv_tokens));
  } catch (const Error& e) {
    if (e.code() != ErrorCode::unsupported) throw;  // no paged cache here: fixed caches
  }
  metrics_.kv_tokens_total = pool_ ? pool_->total_blocks() * model::kKvBlockTokens : opt_.kv_tokens;
  metrics_.kv_blocks_total = pool_ ? pool_->total_blocks() : 0;
  metrics_.ttft_seconds.assign(std::size(kLatencyBuckets), 0);
  metrics_.itl_seconds.assign(std::size(kLatencyBuckets), 0);
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  drain(true);
  {
    std::lock_guard lk(m_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<Request> Engine::submit(RequestParams p) {
  const auto& c = rt_.model().config;
  const auto n = static_cast<std::int64_t>(p.prompt.size());
  TWELL_CHECK(n > 0, ErrorCode::invalid_argument, "the prompt is empty");
  for (auto id : p.prompt)
    TWELL_CHECK(id >= 0 && id < c.vocab_size, ErrorCode::invalid_argument, "token id {} is outside the vocabulary ({})",
                id, c.vocab_size);
  TWELL_CHECK(p.max_tokens >= 1, ErrorCode::invalid_argument, "max_tokens must be at least 1, got {}", p.max_tokens);
  TWELL_CHECK(n + p.max_tokens <= c.max_position, ErrorCode::invalid_argument,
              "the prompt's {} tokens plus max_tokens {} exceed the model's context of {} tokens", n, p.max_tokens,
              c.max_position);
  TWELL_CHECK(n + p.max_tokens <= opt_.kv_tokens, ErrorCode::invalid_argument,
              "the prompt's {} tokens plus max_tokens {} exceed the server's KV budget of {} tokens", n, p.max_tokens,
              opt_.kv_tokens);
  model::check_sampling(p.sampling);
  auto req = std::make_shared<Request>();
  const std::int64_t cap = n + p.max_tokens;
  auto a = std::make_unique<Active>(req, std::move(p), cap, tok_);
  {
    std::lock_guard lk(m_);
    if (draining_ || stop_) {
      ++metrics_.requests_rejected;
      throw QueueFull("the server is shutting down");
    }
    if (static_cast<std::int64_t>(queue_.size()) >= opt_.max_queue) {
      ++metrics_.requests_rejected;
      throw QueueFull(fmt::format("the queue is full ({} requests waiting)", queue_.size()));
    }
    queue_.push_back(std::move(a));
    ++metrics_.requests_total;
    metrics_.queued = static_cast<std::int64_t>(queue_.size());
  }
  cv_.notify_all();
  return req;
}

void Engine::drain(bool cancel) {
  std::unique_lock lk(m_);
  draining_ = true;
  if (cancel)
    for (auto& a : queue_) a->req->cancel();
  cancel_all_ = cancel_all_ || cancel;
  cv_.notify_all();
  idle_cv_.wait(lk, [&] { return queue_.empty() && !busy_; });
}

Metrics Engine::metrics() const {
  std::lock_guard lk(m_);
  return metrics_;
}

void Engine::finish(Active& a, const std::string& reason) {
  if (a.done) return;
  a.done = true;
  if (reason == "cancelled") {
    a.req->push({Event::Kind::error, "the request was cancelled (client gone or server shutting down)", "", 0, 0});
    std::lock_guard lk(m_);
    ++metrics_.requests_cancelled;
    return;
  }
  // What the decoder and the stop-string guard held back is text of the answer (no stop string in it).
  std::string rest = a.held + a.dec.flush();
  a.held.clear();
  if (reason == "stop-string") rest.clear();
  if (!rest.empty()) a.req->push({Event::Kind::text, std::move(rest), "", 0, 0});
  Event e;
  e.kind = Event::Kind::done;
  e.finish_reason = reason == "length" ? "length" : "stop";
  e.prompt_tokens = static_cast<std::int64_t>(a.p.prompt.size());
  e.completion_tokens = a.generated;
  a.req->push(std::move(e));
  std::lock_guard lk(m_);
  ++metrics_.requests_finished;
}

namespace {

// The longest suffix of `s` that is a proper prefix of one of the stop strings (its length).
std::size_t stop_prefix_len(const std::string& s, const std::vector<std::string>& stops) {
  std::size_t best = 0;
  for (const auto& st : stops)
    for (std::size_t k = std::min(st.size() - 1, s.size()); k > best; --k)
      if (s.compare(s.size() - k, k, st, 0, k) == 0) {
        best = k;
        break;
      }
  return best;
}

void observe(std::vector<double>& buckets, double& sum, std::int64_t& count, double v) {
  for (std::size_t i = 0; i < std::size(kLatencyBuckets); ++i)
    if (v <= kLatencyBuckets[i]) buckets[i] += 1;
  sum += v;
  ++count;
}

}  // namespace

void Engine::loop() {
  std::vector<std::unique_ptr<Active>> running;
  for (;;) {
    std::vector<Active*> fresh;
    {
      std::unique_lock lk(m_);
      // Admission: in arrival order while a running slot and the KV budget allow (a request that
      // does not fit waits; the ones behind it wait too, so a large request is not starved).
      while (!queue_.empty() && static_cast<std::int64_t>(running.size()) < opt_.max_running &&
             fits(*queue_.front(), running)) {
        running.push_back(std::move(queue_.front()));
        queue_.pop_front();
        if (!pool_) kv_used_ += running.back()->capacity;
        fresh.push_back(running.back().get());
      }
      metrics_.running = static_cast<std::int64_t>(running.size());
      metrics_.queued = static_cast<std::int64_t>(queue_.size());
      if (pool_) {
        metrics_.kv_blocks_used = pool_->total_blocks() - pool_->free_blocks();
        metrics_.kv_blocks_cached = pool_->cached_blocks();
        metrics_.kv_tokens_used = metrics_.kv_blocks_used * model::kKvBlockTokens;
      } else {
        metrics_.kv_tokens_used = kv_used_;
      }
      if (running.empty()) {
        busy_ = false;
        idle_cv_.notify_all();
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        continue;
      }
      busy_ = true;
    }
    std::int64_t cached = 0;
    for (Active* a : fresh) {
      try {
        // Paged: the sequence starts on the published blocks of the feed's prefix (a running or
        // finished request's identical start, e.g. a system prompt; kv_blocks.hpp), which need no prefill.
        a->seq = pool_ ? rt_.new_paged_sequence(pool_, a->feed) : rt_.new_sequence(a->capacity);
        a->prefilled = a->seq->length();
        cached += a->prefilled;
      } catch (const std::exception& e) {
        a->req->push({Event::Kind::error, e.what(), "", 0, 0});
        a->done = true;
      }
    }
    if (cached > 0) {
      std::lock_guard lk(m_);
      metrics_.prompt_tokens_cached_total += cached;
    }
    if (cancel_all_)
      for (auto& a : running) a->req->cancel();
    for (auto& a : running)
      if (!a->done && a->req->cancelled()) finish(*a, "cancelled");
    try {
      step(running);
    } catch (const std::exception& e) {
      // Nothing in a step should throw past its own handlers; if something does, the step's requests
      // end with the error and the server goes on (a dead scheduler would hang every reader).
      for (auto& a : running)
        if (!a->done) {
          a->req->push({Event::Kind::error, fmt::format("internal error: {}", e.what()), "", 0, 0});
          a->done = true;
        }
    }
    // Leave: free the caches of the requests that ended; the preempted go back to the head of the
    // queue in their admission order (their blocks are already free).
    std::int64_t freed = 0;
    std::vector<std::unique_ptr<Active>> back;
    std::erase_if(running, [&](std::unique_ptr<Active>& a) {
      if (a->done) {
        if (!pool_) freed += a->capacity;
        return true;
      }
      if (a->preempted) {
        a->preempted = false;
        back.push_back(std::move(a));
        return true;
      }
      return false;
    });
    std::lock_guard lk(m_);
    kv_used_ -= freed;
    for (auto it = back.rbegin(); it != back.rend(); ++it) queue_.push_front(std::move(*it));
    metrics_.preemptions_total += static_cast<std::int64_t>(back.size());
  }
}

// Whether a waiting request may start now. Fixed caches: its prompt + max_tokens positions within
// the budget. Paged: blocks for its feed plus one token, beyond the blocks the running requests
// still prefilling will take for theirs (so an admission does not just preempt the one before it)
// and kv_headroom blocks for each running request to grow into (so that requests admitted on their
// prompts alone do not all outgrow the pool at once and preempt each other in turn).
bool Engine::fits(const Active& a, const std::vector<std::unique_ptr<Active>>& running) const {
  if (!pool_) return kv_used_ + a.capacity <= opt_.kv_tokens;
  std::int64_t promised = 0;
  for (const auto& r : running) {
    if (r->done) continue;
    const std::int64_t want = model::KvPool::blocks_for(static_cast<std::int64_t>(r->feed.size()) + 1);
    promised += std::max<std::int64_t>(0, want - (r->seq ? r->seq->blocks() : 0)) + opt_.kv_headroom;
  }
  return pool_->free_blocks() - promised >= model::KvPool::blocks_for(static_cast<std::int64_t>(a.feed.size()) + 1);
}

// Frees a request's blocks and makes it start again from its prompt and what it generated: the
// tokens it sent stay sent, its sampler, history, decoder and stop state stay as they are.
void Engine::preempt(Active& a) {
  a.seq.reset();
  a.preempted = true;
  a.prefilled = 0;
  if (a.generated > 0) {
    a.feed.assign(a.history.begin(), a.history.end() - 1);  // the last generated token is fed by decode
    a.sample_after_feed = false;
  } else {
    a.feed = a.p.prompt;
    a.sample_after_feed = true;
  }
}

void Engine::step(std::vector<std::unique_ptr<Active>>& running) {
  const auto& c = rt_.model().config;
  std::vector<model::SeqStep> steps;
  std::vector<Active*> who;
  std::vector<bool> samples;  // whether the step's last row gives the request its next token
  // Decode tokens first (one a request), then prompt chunks within the step's token budget.
  for (auto& a : running)
    if (!a->done && a->prefilled == static_cast<std::int64_t>(a->feed.size())) {
      steps.push_back({a->seq.get(), std::span<const std::int32_t>(&a->last, 1)});
      who.push_back(a.get());
      samples.push_back(true);
    }
  std::int64_t budget = opt_.step_tokens;
  for (auto& a : running) {
    const auto n = static_cast<std::int64_t>(a->feed.size());
    if (a->done || a->prefilled == n || budget == 0) continue;
    const std::int64_t take = std::min(n - a->prefilled, budget);
    steps.push_back({a->seq.get(), std::span<const std::int32_t>(a->feed.data() + a->prefilled, static_cast<std::size_t>(take))});
    who.push_back(a.get());
    samples.push_back(a->prefilled + take == n && a->sample_after_feed);
    budget -= take;
  }
  if (pool_) {
    // Blocks for the step's tokens, in admission order; where the pool runs out, the most recently
    // admitted request still running gives its blocks back (possibly the one asking) and leaves the step.
    for (std::size_t j = 0; j < who.size(); ++j) {
      if (who[j]->preempted) continue;
      while (!who[j]->seq->reserve(static_cast<std::int64_t>(steps[j].tokens.size()))) {
        Active* victim = nullptr;
        for (auto it = running.rbegin(); it != running.rend() && !victim; ++it)
          if (!(*it)->done && !(*it)->preempted && (*it)->seq) victim = it->get();
        if (victim == nullptr) break;  // cannot happen: submit() bounds a request by the whole pool
        preempt(*victim);
        if (victim == who[j]) break;
      }
    }
    std::size_t k = 0;
    for (std::size_t j = 0; j < who.size(); ++j)
      if (!who[j]->preempted) {
        steps[k] = steps[j];
        who[k] = who[j];
        samples[k] = samples[j];
        ++k;
      }
    steps.resize(k);
    who.resize(k);
    samples.resize(k);
  }
  if (steps.empty()) return;
  // Greedy picks without a penalty need no logits on the host: the runtime's argmax (on the GPU, one
  // id a row comes back instead of a row of logits). Its rule is the sampler's (the lowest id of equal maxima).
  bool argmax_only = true;
  for (std::size_t j = 0; j < who.size(); ++j)
    if (samples[j] && !(who[j]->p.sampling.temperature == 0 && who[j]->p.sampling.repetition_penalty == 1.0))
      argmax_only = false;
  std::vector<float> logits;
  std::vector<std::int32_t> argmax;
  try {
    if (argmax_only)
      argmax = rt_.forward_argmax(steps);
    else
      logits = rt_.forward(steps);
  } catch (const std::exception& e) {
    // The runtime refused or failed the step: its requests end with the error; the others go on.
    for (Active* a : who) {
      a->req->push({Event::Kind::error, e.what(), "", 0, 0});
      a->done = true;
    }
    return;
  }
  const auto now = Clock::now();
  std::int64_t prompt_tokens = 0, new_tokens = 0;
  std::vector<double> ttft, itl;
  for (std::size_t j = 0; j < who.size(); ++j) {
    Active& a = *who[j];
    const auto n = static_cast<std::int64_t>(steps[j].tokens.size());
    if (a.prefilled < static_cast<std::int64_t>(a.feed.size())) {
      a.prefilled += n;
      prompt_tokens += n;
    }
    if (!samples[j]) continue;
    std::int32_t id = 0;
    try {
      if (argmax_only) {
        id = argmax[j];
        if (id < 0) throw Error(ErrorCode::non_finite, "the step's logits hold NaN or infinity");
      } else {
        id = a.sampler.sample(std::span<const float>(logits.data() + j * static_cast<std::size_t>(c.vocab_size),
                                                   static_cast<std::size_t>(c.vocab_size)),
                            a.history);
      }
    } catch (const std::exception& e) {
      a.req->push({Event::Kind::error, e.what(), "", 0, 0});
      a.done = true;
      continue;
    }
    ++new_tokens;
    (a.generated == 0 ? ttft : itl).push_back(std::chrono::duration<double>(now - (a.generated == 0 ? a.submitted : a.last_token)).count());
    a.last_token = now;
    ++a.generated;
    a.history.push_back(id);
    a.last = id;
    const bool eos = !a.p.ignore_eos && std::find(c.eos_ids.begin(), c.eos_ids.end(), id) != c.eos_ids.end();
    if (eos) {
      finish(a, "stop");
      continue;
    }
    a.held += a.dec.push(id);
    bool stopped = false;
    for (const auto& st : a.p.stop) {
      const auto pos = a.held.find(st);
      if (pos == std::string::npos) continue;
      a.held.resize(pos);
      if (!a.held.empty()) a.req->push({Event::Kind::text, std::move(a.held), "", 0, 0});
      a.held.clear();
      finish(a, "stop-string");
      stopped = true;
      break;
    }
    if (stopped) continue;
    const std::size_t keep = stop_prefix_len(a.held, a.p.stop);
    if (a.held.size() > keep) {
      a.req->push({Event::Kind::text, a.held.substr(0, a.held.size() - keep), "", 0, 0});
      a.held.erase(0, a.held.size() - keep);
    }
    if (a.generated >= a.p.max_tokens || a.seq->length() + 1 > a.capacity) finish(a, "length");
  }
  std::int64_t sparse = 0, total = 0;
  for (const auto& s : rt_.ffn_stats()) {
    sparse += s.sparse_rows;
    total += s.rows;
  }
  std::lock_guard lk(m_);
  ++metrics_.steps_total;
  metrics_.prompt_tokens_total += prompt_tokens;
  metrics_.generation_tokens_total += new_tokens;
  for (double v : ttft) observe(metrics_.ttft_seconds, metrics_.ttft_sum, metrics_.ttft_count, v);
  for (double v : itl) observe(metrics_.itl_seconds, metrics_.itl_sum, metrics_.itl_count, v);
  metrics_.ffn_rows_sparse = sparse;
  metrics_.ffn_rows_total = total;
}

}  // namespace twell::serve
