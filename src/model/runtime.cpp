// The Llama forward on the CPU (see twell/model/runtime.hpp). One layer loop; the projections are
// OpenBLAS GEMMs over every token row of the batch at once, attention runs per (row, head).
#include "twell/model/runtime.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <set>
#include <vector>

#include "cpu/blas.hpp"
#include "cpu/gemv_bf16.hpp"
#include "cpu/parallel.hpp"
#include "model/activation.hpp"
#include "model/kv_blocks.hpp"
#include "model/runtime_checks.hpp"
#include "twell/error.hpp"

namespace twell::model {
namespace {

using cpu::gemm;

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) ⊙ w   (mean in double)
void rmsnorm(const float* x, const float* w, std::int64_t rows, std::int64_t k, double eps, float* y) {
#pragma omp parallel for schedule(static) if (rows * k >= cpu::kParallelMinWork)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * k;
    double ss = 0;
    for (std::int64_t i = 0; i < k; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const auto inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(k) + eps));
    float* yr = y + r * k;
    for (std::int64_t i = 0; i < k; ++i) yr[i] = xr[i] * inv * w[i];
  }
}

// HF's RoPE (rotate_half, non-interleaved): for i < d/2, with a = pos · inv_freq[i] and c, s =
// cos a, sin a times the rope type's attention scaling (rope.hpp),
//   (v[i], v[i + d/2]) ← (v[i]·c − v[i + d/2]·s,  v[i + d/2]·c + v[i]·s).
void rope(float* v, std::int64_t heads, std::int64_t d, std::int64_t pos, const RopeFrequencies& f) {
  const std::int64_t half = d / 2;
  for (std::int64_t i = 0; i < half; ++i) {
    const double a = static_cast<double>(pos) * f.inv_freq[static_cast<std::size_t>(i)];
    const auto c = static_cast<float>(std::cos(a) * f.attention_scaling),
               s = static_cast<float>(std::sin(a) * f.attention_scaling);
    for (std::int64_t h = 0; h < heads; ++h) {
      float* p = v + h * d;
      const float x1 = p[i], x2 = p[i + half];
      p[i] = x1 * c - x2 * s;
      p[i + half] = x2 * c + x1 * s;
    }
  }
}

}  // namespace

std::vector<std::int32_t> Runtime::forward_argmax(std::span<const SeqStep> steps) {
  const std::vector<float> logits = forward(steps);
  const auto V = static_cast<std::size_t>(model().config.vocab_size);
  std::vector<std::int32_t> out(steps.size());
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const float* row = logits.data() + i * V;
    TWELL_CHECK(std::all_of(row, row + V, [](float v) { return std::isfinite(v); }), ErrorCode::non_finite,
                "forward: step {}'s logits hold NaN or infinity", i);
    out[i] = static_cast<std::int32_t>(std::max_element(row, row + V) - row);
  }
  return out;
}

std::vector<Candidate> Runtime::forward_top(std::span<const SeqStep> steps, std::int64_t k, double repetition_penalty,
                                            std::span<const std::span<const std::int32_t>> histories) {
  const std::int64_t V = model().config.vocab_size;
  TWELL_CHECK(k >= 1 && k <= V, ErrorCode::invalid_argument, "forward_top: k = {} outside 1 … {}", k, V);
  TWELL_CHECK(histories.size() == steps.size(), ErrorCode::invalid_argument,
              "forward_top: {} histories for {} steps", histories.size(), steps.size());
  const std::vector<float> logits = forward(steps);
  // Rows in parallel (each selection is independent); an error of any row (a non-finite logit) is
  // rethrown here, outside the parallel region.
  std::vector<Candidate> out(steps.size() * static_cast<std::size_t>(k));
  std::vector<std::exception_ptr> err(steps.size());
  const auto n = static_cast<std::int64_t>(steps.size());
#pragma omp parallel for schedule(dynamic) if (n > 1)
  for (std::int64_t i = 0; i < n; ++i) {
    const auto r = static_cast<std::size_t>(i);
    try {
      const auto top = top_candidates(
          std::span<const float>(logits.data() + r * static_cast<std::size_t>(V), static_cast<std::size_t>(V)),
          histories[r], k, repetition_penalty);
      std::copy(top.begin(), top.end(), out.begin() + static_cast<std::ptrdiff_t>(r * static_cast<std::size_t>(k)));
    } catch (...) {
      err[r] = std::current_exception();
    }
  }
  for (const auto& e : err)
    if (e) std::rethrow_exception(e);
  return out;
}

std::vector<std::int32_t> Runtime::forward_sample(std::span<const SeqStep> steps, const SamplingOptions& o,
                                                  std::span<const std::span<const std::int32_t>> histories,
                                                  std::span<const double> r) {
  TWELL_CHECK(histories.size() == steps.size() && r.size() == steps.size(), ErrorCode::invalid_argument,
              "forward_sample: {} histories and {} draws for {} steps", histories.size(), r.size(), steps.size());
  const std::vector<float> logits = forward(steps);
  const auto V = static_cast<std::size_t>(model().config.vocab_size);
  std::vector<std::int32_t> out(steps.size());
  for (std::size_t i = 0; i < steps.size(); ++i)
    out[i] = sample_fixed_point(std::span<const float>(logits.data() + i * V, V), histories[i], o, r[i]);
  return out;
}

double Runtime::copy_bandwidth() const {
  // 256 MiB copied into another 256 MiB, each thread its slice (the same slices touch the pages
  // first, so each lands near its thread); one copy of warm-up.
  constexpr std::size_t kBytes = std::size_t{256} << 20;
  const std::unique_ptr<std::byte[]> src(new std::byte[kBytes]), dst(new std::byte[kBytes]);
  const int parts = omp_get_max_threads();
  const auto each_slice = [&](auto&& f) {
#pragma omp parallel for schedule(static)
    for (int p = 0; p < parts; ++p) {
      const std::size_t a = kBytes / static_cast<std::size_t>(parts) * static_cast<std::size_t>(p);
      const std::size_t b = p + 1 == parts ? kBytes : a + kBytes / static_cast<std::size_t>(parts);
      f(a, b - a);
    }
  };
  each_slice([&](std::size_t a, std::size_t n) {
    std::memset(src.get() + a, 1, n);
    std::memset(dst.get() + a, 0, n);
  });
  const auto copy = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    each_slice([&](std::size_t a, std::size_t n) { std::memcpy(dst.get() + a, src.get() + a, n); });
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  copy();
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) t.push_back(copy());
  std::nth_element(t.begin(), t.begin() + 2, t.end());
  TWELL_CHECK(dst[kBytes - 1] == std::byte{1} && dst[0] == std::byte{1}, ErrorCode::internal,
              "copy_bandwidth: the copy did not arrive");
  return 2.0 * static_cast<double>(kBytes) / t[2];
}

std::shared_ptr<KvPool> Runtime::make_kv_pool(std::int64_t) {
  throw Error(ErrorCode::unsupported, fmt::format("the {} runtime gives no paged KV cache here", device()));
}

std::unique_ptr<Sequence> Runtime::new_paged_sequence(const std::shared_ptr<KvPool>&, std::span<const std::int32_t>) {
  throw Error(ErrorCode::unsupported, fmt::format("the {} runtime gives no paged KV cache here", device()));
}

const char* to_string(FfnPath p) noexcept {
  switch (p) {
    case FfnPath::automatic: return "automatic";
    case FfnPath::dense: return "dense";
    case FfnPath::sparse: return "sparse";
  }
  return "?";
}

double FfnLayerStats::active_per_token() const noexcept {
  return rows > 0 && active >= 0 && last_density >= 0 ? static_cast<double>(active) / static_cast<double>(rows) : -1;
}

namespace {

// A pool of KV blocks: keys and values [layers][blocks][kKvBlockTokens][kv_dim] each, fp32, and
// their free list.
class CpuKvPool final : public KvPool {
 public:
  CpuKvPool(const CpuRuntime* owner, const LlamaConfig& c, std::int64_t blocks, bool prefix_cache = true)
      : owner_(owner), layers_(c.num_layers), kv_dim_(c.kv_dim()), blocks_(blocks), list_(blocks, prefix_cache) {
    // Left uninitialized: a position is read only after it was written, and the pages of blocks
    // never taken are never touched (a large pool costs address space, not memory, until used).
    const auto n = static_cast<std::size_t>(layers_ * blocks_ * kKvBlockTokens * kv_dim_);
    k_.reset(new float[n]);
    v_.reset(new float[n]);
  }
  std::int64_t total_blocks() const noexcept override { return blocks_; }
  std::int64_t free_blocks() const noexcept override { return list_.free(); }
  std::int64_t cached_blocks() const noexcept override { return list_.cached(); }
  std::int64_t block_bytes() const noexcept override {
    return 2 * layers_ * kKvBlockTokens * kv_dim_ * static_cast<std::int64_t>(sizeof(float));
  }
  KvBlockList& list() noexcept { return list_; }
  // Row 0 of block b in layer l.
  float* k(std::int64_t l, std::int32_t b) noexcept { return k_.get() + (l * blocks_ + b) * kKvBlockTokens * kv_dim_; }
  float* v(std::int64_t l, std::int32_t b) noexcept { return v_.get() + (l * blocks_ + b) * kKvBlockTokens * kv_dim_; }
  const CpuRuntime* owner() const noexcept { return owner_; }

 private:
  const CpuRuntime* owner_;
  std::int64_t layers_, kv_dim_, blocks_;
  KvBlockList list_;
  std::unique_ptr<float[]> k_, v_;
};

// One sequence's keys and values: the blocks of its block table, position p in block table[p / B]
// at row p % B. A sequence of fixed capacity owns a pool of its own whose blocks it holds in order
// (so its keys are one contiguous run per layer); a paged one takes blocks from a shared pool as it
// grows (reserve), starting from the published blocks of its prompt's prefix (prefix sharing,
// kv_blocks.hpp), and gives them back when destroyed or cleared.
class CpuSequence final : public BlockSequence {
 public:
  // Fixed capacity: a private pool, every block taken.
  CpuSequence(const CpuRuntime* owner, const LlamaConfig& c, std::int64_t capacity)
      : BlockSequence(std::make_shared<CpuKvPool>(owner, c, KvPool::blocks_for(capacity)), capacity, c.max_position),
        kv_dim_(c.kv_dim()) {
    pool().list().take(pool_->total_blocks(), table_.ids);
  }
  // Paged: from `pool`, starting on the published blocks of prefix's first full blocks.
  CpuSequence(const std::shared_ptr<CpuKvPool>& pool, const LlamaConfig& c, std::span<const std::int32_t> prefix)
      : BlockSequence(pool, pool->list(), c.max_position, prefix), kv_dim_(c.kv_dim()) {}
  std::int64_t bytes() const noexcept override {
    return static_cast<std::int64_t>(table_.ids.size()) * pool_->block_bytes();
  }
  float* k_row(std::int64_t l, std::int64_t p) noexcept { return pool().k(l, block(p)) + (p % kKvBlockTokens) * kv_dim_; }
  float* v_row(std::int64_t l, std::int64_t p) noexcept { return pool().v(l, block(p)) + (p % kKvBlockTokens) * kv_dim_; }
  // Keys and values of positions [p0, p1) as runs within blocks: f(first position, its key row,
  // its value row, run length), in position order.
  template <class F>
  void for_each_run(std::int64_t l, std::int64_t p0, std::int64_t p1, F&& f) {
    for (std::int64_t p = p0; p < p1;) {
      const std::int64_t n = std::min(p1, (p / kKvBlockTokens + 1) * kKvBlockTokens) - p;
      f(p, k_row(l, p), v_row(l, p), n);
      p += n;
    }
  }
  // Keys and values of positions [0, n) of layer l as contiguous rows [n, kv_dim]: the blocks' own
  // memory when they lie in order (a fixed-capacity sequence's always do), else gathered into
  // kbuf / vbuf.
  std::pair<const float*, const float*> contiguous(std::int64_t l, std::int64_t n, std::vector<float>& kbuf,
                                                   std::vector<float>& vbuf) {
    const std::int64_t nb = KvPool::blocks_for(n);
    bool in_order = true;
    for (std::int64_t i = 1; i < nb && in_order; ++i) in_order = table_.ids[i] == table_.ids[i - 1] + 1;
    if (in_order) return {k_row(l, 0), v_row(l, 0)};
    kbuf.resize(static_cast<std::size_t>(n * kv_dim_));
    vbuf.resize(kbuf.size());
    for_each_run(l, 0, n, [&](std::int64_t p, const float* k, const float* v, std::int64_t m) {
      std::copy_n(k, m * kv_dim_, kbuf.data() + p * kv_dim_);
      std::copy_n(v, m * kv_dim_, vbuf.data() + p * kv_dim_);
    });
    return {kbuf.data(), vbuf.data()};
  }
  const CpuRuntime* owner() const noexcept { return static_cast<const CpuKvPool&>(*pool_).owner(); }
  // The step's tokens are written at positions length() … for good (a CPU step never runs again).
  void advance(std::span<const std::int32_t> tokens) {
    BlockSequence::advance(tokens);
    publish();
  }

 private:
  CpuKvPool& pool() noexcept { return static_cast<CpuKvPool&>(*pool_); }
  std::int32_t block(std::int64_t p) const noexcept { return table_.ids[static_cast<std::size_t>(p / kKvBlockTokens)]; }
  std::int64_t kv_dim_;
};

}  // namespace

void check_sequence_capacity(const LlamaConfig& c, std::int64_t capacity) {
  TWELL_CHECK(capacity > 0, ErrorCode::invalid_argument, "sequence capacity must be positive, got {}", capacity);
  TWELL_CHECK(capacity <= c.max_position, ErrorCode::invalid_argument,
              "sequence capacity {} exceeds the model's context of {} tokens (max_position_embeddings)", capacity,
              c.max_position);
}

void check_forward_steps(const LlamaConfig& c, std::span<const SeqStep> steps) {
  TWELL_CHECK(!steps.empty(), ErrorCode::invalid_argument, "forward: no sequences given");
  std::set<const Sequence*> seen;
  for (std::size_t s = 0; s < steps.size(); ++s) {
    const SeqStep& st = steps[s];
    TWELL_CHECK(st.seq != nullptr, ErrorCode::invalid_argument, "forward: step {} has no sequence", s);
    TWELL_CHECK(seen.insert(st.seq).second, ErrorCode::invalid_argument,
                "forward: step {}'s sequence also appears in an earlier step", s);
    TWELL_CHECK(!st.tokens.empty(), ErrorCode::invalid_argument, "forward: step {} has no tokens", s);
    TWELL_CHECK(st.seq->length() + static_cast<std::int64_t>(st.tokens.size()) <= st.seq->capacity(),
                ErrorCode::invalid_argument,
                "forward: sequence {} would hold {} tokens but its cache holds {} (context limit)", s,
                st.seq->length() + static_cast<std::int64_t>(st.tokens.size()), st.seq->capacity());
    for (auto id : st.tokens)
      TWELL_CHECK(id >= 0 && id < c.vocab_size, ErrorCode::invalid_argument,
                  "forward: token id {} is outside the vocabulary [0, {})", id, c.vocab_size);
  }
}

CpuRuntime::CpuRuntime(const Model& model, RuntimeOptions opt, const RuntimeTuning& tuning)
    : model_(&model),
      opt_(opt),
      bf16_wanted_(tuning.cpu_bf16_weights && !opt.ffn_input_hook),  // a hook may change the weights
      paged_kv_(tuning.paged_kv),
      prefix_cache_(tuning.prefix_cache),
      stats_(static_cast<std::size_t>(model.config.num_layers)) {
  TWELL_CHECK(opt.max_sparse_density >= 0 && opt.max_sparse_density <= 1, ErrorCode::invalid_argument,
              "max_sparse_density must lie in [0, 1], got {}", opt.max_sparse_density);
  TWELL_CHECK(opt.ffn_path != FfnPath::sparse || model.config.act == Activation::relu, ErrorCode::unsupported,
              "the sparse FFN path needs a ReLU model; this one uses {} (override with hidden_act relu only if "
              "the model was trained with ReLU)",
              to_string(model.config.act));
  TWELL_CHECK(!model.bf16_only, ErrorCode::invalid_argument,
              "{}: this model was loaded with bf16 weights only (for the GPU); the CPU runtime computes in fp32: "
              "load it without LoadOptions::bf16_only", model.dir.empty() ? std::string("model") : model.dir);
  // A matrix's bf16 copy: w's values as bf16 bits, if they are all bf16 (exact_bf16; a bf16
  // checkpoint's are); none otherwise. A copy of the runtime's own, not the bf16 file's bits viewed
  // in place: the runtime reads these at every decode step for as long as it lives, and a file
  // rewritten in place under a mapping faults on access.
  auto copy = [&](const std::vector<float>& w) {
    ++matrices_;
    std::vector<std::uint16_t> b = bf16_wanted_ ? cpu::exact_bf16(w) : std::vector<std::uint16_t>{};
    if (!b.empty()) ++bf16_matrices_;
    return b;
  };
  for (const LayerWeights& L : model.layers)
    bf16_.push_back({copy(L.wqkv), copy(L.wo), copy(L.w_gate), copy(L.w_up), copy(L.w_down)});
  if (model.config.act == Activation::relu && opt.ffn_path != FfnPath::dense) {
    const std::int64_t N = model.config.intermediate_size, K = model.config.hidden_size;
    for (const LayerWeights& L : model.layers)
      prepared_.push_back(cpu::prepare_ffn(ffn_weights(L.w_gate.data(), L.w_up.data(), L.w_down.data(), N, K)));
  }
  bf16_head_ = copy(model.lm_head.empty() ? model.embed : model.lm_head);
}

StepShape Runtime::decode_step_shape(std::int64_t rows) const {
  StepShape s;
  s.batch = rows;
  return s;
}

StepShape CpuRuntime::decode_step_shape(std::int64_t rows) const {
  StepShape s;
  s.batch = rows;
  s.weight_bytes = bf16_matrices_ == matrices_ && matrices_ > 0 && rows <= cpu::kGemvBf16MaxRows ? 2 : 4;
  s.kv_bytes = 4;
  s.sparse_row_bytes = 4;
  return s;
}

std::string CpuRuntime::weight_storage() const {
  if (bf16_matrices_ == 0)
    return bf16_wanted_ ? "fp32 (the weights are not bf16 values)" : "fp32";
  return fmt::format("fp32, and {} of {} matrices also as bf16 (their values exactly) for steps of ≤ {} rows", bf16_matrices_,
                     matrices_, cpu::kGemvBf16MaxRows);
}

void CpuRuntime::project(const float* x, std::int64_t rows, const std::vector<float>& w,
                         const std::vector<std::uint16_t>& w16, std::int64_t n, std::int64_t k, float* y) const {
  if (!w16.empty() && rows <= cpu::kGemvBf16MaxRows) {
    cpu::gemv_bf16(x, rows, w16.data(), n, k, y);
    return;
  }
  gemm(false, true, 1.0f, CMatrixF(x, rows, k), CMatrixF(w.data(), n, k), 0.0f, MatrixF(y, rows, n));
}

std::unique_ptr<Sequence> CpuRuntime::new_sequence(std::int64_t capacity) {
  check_sequence_capacity(model_->config, capacity);
  return std::make_unique<CpuSequence>(this, model_->config, capacity);
}

std::shared_ptr<KvPool> CpuRuntime::make_kv_pool(std::int64_t blocks) {
  if (!paged_kv_) return Runtime::make_kv_pool(blocks);  // TWELL_TUNING=no-paged-kv: refused as unsupported
  TWELL_CHECK(blocks > 0, ErrorCode::invalid_argument, "a KV pool needs at least one block, got {}", blocks);
  return std::make_shared<CpuKvPool>(this, model_->config, blocks, prefix_cache_);
}

std::unique_ptr<Sequence> CpuRuntime::new_paged_sequence(const std::shared_ptr<KvPool>& pool,
                                                         std::span<const std::int32_t> prefix) {
  auto p = std::dynamic_pointer_cast<CpuKvPool>(pool);
  TWELL_CHECK(p != nullptr && p->owner() == this, ErrorCode::invalid_argument,
              "new_paged_sequence: the pool was made by another runtime");
  return std::make_unique<CpuSequence>(p, model_->config, prefix);
}

void CpuRuntime::reset_stats() { stats_.assign(stats_.size(), FfnLayerStats{}); }

void CpuRuntime::ffn(std::int64_t layer, const float* x, std::int64_t rows, float* y) {
  const LlamaConfig& c = model_->config;
  const LayerWeights& L = model_->layers[static_cast<std::size_t>(layer)];
  FfnLayerStats& st = stats_[static_cast<std::size_t>(layer)];
  const std::int64_t K = c.hidden_size, N = c.intermediate_size;
  const bool relu = c.act == Activation::relu;
  bool sparse = false;
  if (relu) {
    if (opt_.ffn_path == FfnPath::sparse) sparse = true;
    else if (opt_.ffn_path == FfnPath::automatic)  // first call measures through the sparse path (exact at any density)
      sparse = st.last_density < 0 || st.last_density <= opt_.max_sparse_density;
  }
  st.rows += rows;
  const Bf16Layer& B = bf16_[static_cast<std::size_t>(layer)];
  if (sparse) {
    // A decode step's gate streams the whole first matrix for a few products: from its bf16 copy
    // where there is one (half the bytes; the same products summed in gemv_bf16's order), then the
    // TwELL packing and the sparse products as ffn_sparse runs them.
    const cpu::PreparedFfn& P = prepared_[static_cast<std::size_t>(layer)];
    const bool gated = P.w.gated();
    const std::vector<std::uint16_t>& first16 = gated ? B.w_gate : B.w_up;
    cpu::SparseInferenceInfo info;
    if (!first16.empty() && rows <= cpu::kGemvBf16MaxRows) {
      std::vector<float> pre(static_cast<std::size_t>(rows * N));
      cpu::gemv_bf16(x, rows, first16.data(), N, K, pre.data());
      info = cpu::ffn_sparse_from_gate(CMatrixF(x, rows, K), CMatrixF(pre.data(), rows, N), P, MatrixF(y, rows, K));
    } else {
      info = cpu::ffn_sparse(CMatrixF(x, rows, K), P, MatrixF(y, rows, K));
    }
    st.active += info.stats.nnz;
    st.sparse_rows += rows;
    st.overflow_rows += info.stats.overflow_rows;
    st.last_density = static_cast<double>(info.stats.nnz) / static_cast<double>(rows * N);
    return;
  }
  std::vector<float> g(static_cast<std::size_t>(rows * N)), u(g.size());
  project(x, rows, L.w_gate, B.w_gate, N, K, g.data());
  project(x, rows, L.w_up, B.w_up, N, K, u.data());
  std::int64_t active = 0;
  const Activation act = c.act;
#pragma omp parallel for reduction(+ : active) schedule(static) if (rows * N >= cpu::kParallelMinWork)
  for (std::int64_t i = 0; i < rows * N; ++i) {
    const auto j = static_cast<std::size_t>(i);
    if (g[j] > 0.0f) ++active;
    u[j] *= activate(act, g[j]);
  }
  project(u.data(), rows, L.w_down, B.w_down, K, N, y);
  if (relu) {
    st.active += active;
    st.last_density = static_cast<double>(active) / static_cast<double>(rows * N);
  }
}

namespace {

// o[0, d) += Σ_t p[t] · v[t · ld + 0 … d), the sums in t order after what o holds (so runs of keys
// block by block add up in the order one run of them would). With d a compile-time 64 or 128 the
// accumulators stay in registers (the loop over a runtime d loaded and stored o for every key).
template <int kD>
void weighted_sum(const float* p, const float* v, std::int64_t ld, std::int64_t n, float* o) {
  float acc[kD];
  std::copy_n(o, kD, acc);
  for (std::int64_t t = 0; t < n; ++t) {
    const float w = p[t];
    const float* vr = v + t * ld;
#pragma omp simd
    for (int i = 0; i < kD; ++i) acc[i] += w * vr[i];
  }
  std::copy_n(acc, kD, o);
}

void weighted_sum(const float* p, const float* v, std::int64_t ld, std::int64_t n, std::int64_t d, float* o) {
  if (d == 64) return weighted_sum<64>(p, v, ld, n, o);
  if (d == 128) return weighted_sum<128>(p, v, ld, n, o);
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int64_t i = 0; i < d; ++i) o[i] += p[t] * v[t * ld + i];
}

// A step of at least this many tokens runs its attention as two OpenBLAS GEMMs a head (scores, then
// probabilities times values) instead of the per-(row, head) loops, whose dot products over a long
// prompt's keys were most of a CPU prefill (SmolLM2, 900 tokens: see lab/notes/2026-11-runtime-log.md).
constexpr std::int64_t kGemmAttentionRows = 16;

// Causal attention of `rows` consecutive query rows (positions p0 …) of one head against its
// sequence's keys 0 … p0 + rows − 1: S = scale · Q · Kᵀ, each row's softmax over its visible keys (the
// loops' formula: fp32 exponentials, a double sum), the rest 0, then out = S · V. q / out: the first
// row's head slice, row strides ld_q / ld_out; k, v: key 0's head slice, row stride ld_kv.
void attention_gemm(const float* q, std::int64_t ld_q, std::int64_t rows, std::int64_t p0, const float* k, const float* v,
                    std::int64_t ld_kv, std::int64_t d, float scale, std::int64_t window, float* out, std::int64_t ld_out,
                    std::vector<float>& s) {
  const std::int64_t n = p0 + rows;
  s.resize(static_cast<std::size_t>(rows * n));
  gemm(false, true, scale, CMatrixF(q, rows, d, ld_q), CMatrixF(k, n, d, ld_kv), 0.0f, MatrixF(s.data(), rows, n));
#pragma omp parallel for schedule(static) if (rows * n >= cpu::kParallelMinWork)
  for (std::int64_t j = 0; j < rows; ++j) {
    float* row = s.data() + j * n;
    // Keys [first, seen): causal, and within the last `window` positions when window > 0.
    const std::int64_t seen = p0 + j + 1, first = window > 0 && seen > window ? seen - window : 0;
    float mx = -INFINITY;
    for (std::int64_t t = first; t < seen; ++t) mx = std::max(mx, row[t]);
    double sum = 0;
    for (std::int64_t t = first; t < seen; ++t) {
      const float e = std::exp(row[t] - mx);
      row[t] = e;
      sum += e;
    }
    const auto inv = static_cast<float>(1.0 / sum);
    for (std::int64_t t = first; t < seen; ++t) row[t] *= inv;
    std::fill(row, row + first, 0.0f);
    std::fill(row + seen, row + n, 0.0f);
  }
  gemm(false, false, 1.0f, CMatrixF(s.data(), rows, n), CMatrixF(v, n, d, ld_kv), 0.0f, MatrixF(out, rows, d, ld_out));
}

}  // namespace

std::vector<float> CpuRuntime::forward(std::span<const SeqStep> steps, bool all_positions) {
  const LlamaConfig& c = model_->config;
  const std::int64_t K = c.hidden_size, V = c.vocab_size, Q = c.q_dim(), KV = c.kv_dim(), D = c.head_dim;
  const std::int64_t H = c.num_heads, group = c.num_heads / c.num_kv_heads;
  // Check everything before touching any sequence.
  check_forward_steps(c, steps);
  std::vector<CpuSequence*> seqs;
  std::int64_t T = 0;
  for (std::size_t s = 0; s < steps.size(); ++s) {
    auto* cs = dynamic_cast<CpuSequence*>(steps[s].seq);
    TWELL_CHECK(cs != nullptr && cs->owner() == this, ErrorCode::invalid_argument,
                "forward: step {}'s sequence was made by another runtime", s);
    seqs.push_back(cs);
    T += static_cast<std::int64_t>(steps[s].tokens.size());
  }

  // Row r belongs to sequence seq[r] at position pos[r].
  std::vector<std::int64_t> seq(static_cast<std::size_t>(T)), pos(seq.size());
  std::vector<float> x(static_cast<std::size_t>(T * K));
  {
    std::int64_t r = 0;
    for (std::size_t s = 0; s < steps.size(); ++s)
      for (std::size_t j = 0; j < steps[s].tokens.size(); ++j, ++r) {
        seq[static_cast<std::size_t>(r)] = static_cast<std::int64_t>(s);
        pos[static_cast<std::size_t>(r)] = seqs[s]->length() + static_cast<std::int64_t>(j);
        std::copy_n(model_->embed.data() + steps[s].tokens[j] * K, K, x.data() + r * K);
      }
  }
  const std::int64_t max_pos = T > 0 ? *std::max_element(pos.begin(), pos.end()) : 0;
  std::vector<std::int64_t> row0(steps.size());  // each step's first row
  for (std::size_t s = 1; s < steps.size(); ++s) row0[s] = row0[s - 1] + static_cast<std::int64_t>(steps[s - 1].tokens.size());
  std::vector<float> scores, kbuf, vbuf;  // attention_gemm's scratch, and a paged sequence's gathered keys
  // Sequences end at most at max_position (check_forward_steps), where dynamic RoPE is still plain:
  // the frequencies at seq_len = max_position are every call's.
  const RopeFrequencies inv_freq = c.rope(c.max_position);

  std::vector<float> xn(x.size()), qkv(static_cast<std::size_t>(T * (Q + 2 * KV))), att(static_cast<std::size_t>(T * Q)),
      tmp(x.size());
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  for (std::int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& L = model_->layers[static_cast<std::size_t>(l)];
    rmsnorm(x.data(), L.attn_norm.data(), T, K, c.rms_eps, xn.data());
    const Bf16Layer& B = bf16_[static_cast<std::size_t>(l)];
    project(xn.data(), T, L.wqkv, B.wqkv, Q + 2 * KV, K, qkv.data());
    // RoPE on q and k; k and v into their sequence's cache at the row's position.
#pragma omp parallel for schedule(static) if (T * (Q + 2 * KV) >= cpu::kParallelMinWork)
    for (std::int64_t r = 0; r < T; ++r) {
      float* row = qkv.data() + r * (Q + 2 * KV);
      const std::int64_t p = pos[static_cast<std::size_t>(r)];
      rope(row, H, D, p, inv_freq);
      rope(row + Q, c.num_kv_heads, D, p, inv_freq);
      CpuSequence* cache = seqs[static_cast<std::size_t>(seq[static_cast<std::size_t>(r)])];
      std::copy_n(row + Q, KV, cache->k_row(l, p));
      std::copy_n(row + Q + KV, KV, cache->v_row(l, p));
    }
    // Causal attention: row r's query head h against its sequence's keys first_key(pos[r])…pos[r] of KV head
    // h / group (all keys 0…pos[r] without a sliding window).
    // Steps of ≥ kGemmAttentionRows tokens as GEMMs, a head at a time; the other rows in the loops.
    for (std::size_t s = 0; s < steps.size(); ++s) {
      const auto rows = static_cast<std::int64_t>(steps[s].tokens.size());
      if (rows < kGemmAttentionRows) continue;
      const std::int64_t r0 = row0[s];
      const auto [ks, vs] = seqs[s]->contiguous(l, pos[static_cast<std::size_t>(r0)] + rows, kbuf, vbuf);
      for (std::int64_t h = 0; h < H; ++h)
        attention_gemm(qkv.data() + r0 * (Q + 2 * KV) + h * D, Q + 2 * KV, rows, pos[static_cast<std::size_t>(r0)],
                       ks + (h / group) * D, vs + (h / group) * D, KV, D, scale, c.sliding_window,
                       att.data() + r0 * Q + h * D, Q, scores);
    }
#pragma omp parallel if (T * H * (max_pos + 1) * D >= cpu::kParallelMinWork)
    {
      std::vector<float> score;
#pragma omp for schedule(dynamic) collapse(2)
      for (std::int64_t r = 0; r < T; ++r)
        for (std::int64_t h = 0; h < H; ++h) {
          if (static_cast<std::int64_t>(steps[static_cast<std::size_t>(seq[static_cast<std::size_t>(r)])].tokens.size()) >=
              kGemmAttentionRows)
            continue;  // done above
          CpuSequence* cache = seqs[static_cast<std::size_t>(seq[static_cast<std::size_t>(r)])];
          // Keys first … pos (the sliding window's, else all): n of them, block run by block run.
          const std::int64_t first = c.first_key(pos[static_cast<std::size_t>(r)]);
          const std::int64_t end = pos[static_cast<std::size_t>(r)] + 1, n = end - first, kvh = h / group;
          const float* q = qkv.data() + r * (Q + 2 * KV) + h * D;
          score.resize(static_cast<std::size_t>(n));
          float mx = -INFINITY;
          cache->for_each_run(l, first, end, [&](std::int64_t p0, const float* kr, const float*, std::int64_t m) {
            const float* kc = kr + kvh * D;
            for (std::int64_t t = 0; t < m; ++t) {
              float s = 0;
              // A SIMD reduction (the lanes' partial sums, then their sum): without the pragma the
              // compiler keeps the sum's order and the loop scalar. Measured (SmolLM2, 900-token
              // prompt, 2 cores): prefill 339 → 431 tokens/s, decode after it 51 → 57 tokens/s.
#pragma omp simd reduction(+ : s)
              for (std::int64_t i = 0; i < D; ++i) s += q[i] * kc[t * KV + i];
              score[static_cast<std::size_t>(p0 - first + t)] = s * scale;
              mx = std::max(mx, s * scale);
            }
          });
          double sum = 0;
          for (std::int64_t t = 0; t < n; ++t) {
            const float e = std::exp(score[static_cast<std::size_t>(t)] - mx);
            score[static_cast<std::size_t>(t)] = e;
            sum += e;
          }
          const auto inv = static_cast<float>(1.0 / sum);
          for (std::int64_t t = 0; t < n; ++t) score[static_cast<std::size_t>(t)] *= inv;
          float* o = att.data() + r * Q + h * D;
          std::fill_n(o, D, 0.0f);
          cache->for_each_run(l, first, end, [&](std::int64_t p0, const float*, const float* vr, std::int64_t m) {
            weighted_sum(score.data() + (p0 - first), vr + kvh * D, KV, m, D, o);
          });
        }
    }
    project(att.data(), T, L.wo, B.wo, K, Q, tmp.data());
#pragma omp parallel for simd schedule(static) if (parallel : T * K >= cpu::kParallelMinWork)
    for (std::int64_t i = 0; i < T * K; ++i) x[static_cast<std::size_t>(i)] += tmp[static_cast<std::size_t>(i)];
    rmsnorm(x.data(), L.ffn_norm.data(), T, K, c.rms_eps, xn.data());
    if (opt_.ffn_input_hook) {
      opt_.ffn_input_hook(l, CMatrixF(xn.data(), T, K));
      // The hook may have changed the layer's weights: the sparse path's Wdᵀ follows them.
      if (!prepared_.empty())
        prepared_[static_cast<std::size_t>(l)] =
            cpu::prepare_ffn(ffn_weights(L.w_gate.data(), L.w_up.data(), L.w_down.data(), c.intermediate_size, K));
    }
    ffn(l, xn.data(), T, tmp.data());
#pragma omp parallel for simd schedule(static) if (parallel : T * K >= cpu::kParallelMinWork)
    for (std::int64_t i = 0; i < T * K; ++i) x[static_cast<std::size_t>(i)] += tmp[static_cast<std::size_t>(i)];
  }
  for (std::size_t s = 0; s < steps.size(); ++s) seqs[s]->advance(steps[s].tokens);

  // Final norm and LM head over the rows asked for.
  std::vector<std::int64_t> rows;
  if (all_positions) {
    for (std::int64_t r = 0; r < T; ++r) rows.push_back(r);
  } else {
    std::int64_t r = 0;
    for (const SeqStep& st : steps) rows.push_back((r += static_cast<std::int64_t>(st.tokens.size())) - 1);
  }
  const auto R = static_cast<std::int64_t>(rows.size());
  std::vector<float> sel(static_cast<std::size_t>(R * K));
  for (std::int64_t i = 0; i < R; ++i) std::copy_n(x.data() + rows[static_cast<std::size_t>(i)] * K, K, sel.data() + i * K);
  rmsnorm(sel.data(), model_->final_norm.data(), R, K, c.rms_eps, sel.data());
  std::vector<float> logits(static_cast<std::size_t>(R * V));
  project(sel.data(), R, model_->lm_head.empty() ? model_->embed : model_->lm_head, bf16_head_, V, K, logits.data());
  return logits;
}

}  // namespace twell::model
