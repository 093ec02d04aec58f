// The Llama forward on a CUDA GPU: one layer loop over the engine's ops. bf16 weights and GEMM
// operands (cuBLASLt, fp32 accumulation), an fp32 residual stream, bf16 KV caches; ReLU FFNs go
// through the FFN engine's public per-layer API (twell/cuda/ffn_layer.hpp: TwELL sparse or dense,
// dispatched per layer from counted non-zeros), other activations through cuBLASLt GEMMs and an elementwise gated activation.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "cuda/common/check.hpp"
#include "cuda/common/device_buffer.hpp"
#include "cuda/common/launch.hpp"
#include "cuda/common/stream.hpp"
#include "cuda/common/transfer.hpp"
#include "cuda/dense/lt_gemm.hpp"
#include "cuda/ops/gemv.hpp"
#include "cuda/ops/model_ops.hpp"
#include "model/cuda_runtime.hpp"
#include "model/kv_blocks.hpp"
#if TWELL_HAVE_CUDNN
#include "model/cudnn_attention.hpp"
#endif
#include "model/staged_upload.hpp"
#include "model/nvml_energy.hpp"
#include "model/runtime_checks.hpp"
#include "twell/cuda/ffn_layer.hpp"
#include "twell/bf16.hpp"
#include "twell/cuda/ffn_cuda.hpp"

namespace twell::model {
namespace {

using cuda::DeviceBuffer;
using bf16_t = __nv_bfloat16;
// The FFN layer's public API names device bf16 as twell::bf16 (the same 16 bits).
const twell::bf16* tw(const bf16_t* p) { return reinterpret_cast<const twell::bf16*>(p); }
twell::bf16* tw(bf16_t* p) { return reinterpret_cast<twell::bf16*>(p); }

DeviceBuffer<bf16_t> upload_bf16(const std::vector<float>& v, cudaStream_t stream) {
  return cuda::upload_bf16(CMatrixF(v.data(), 1, static_cast<std::int64_t>(v.size())), stream);
}

// Where a bf16-only model's matrices are read from, for errors: its mapped files, or its own memory.
std::string bits_source(const Model& m) {
  if (m.mapped_files.empty()) return "the model's weights";
  std::string s = m.mapped_files[0].path;
  for (std::size_t i = 1; i < m.mapped_files.size(); ++i) s += ", " + m.mapped_files[i].path;
  return s;
}

// bf16 bits as they are (a model loaded with LoadOptions::bf16_only), its pieces end to end (read
// straight from the checkpoint's mapped file where the model views it), through the pinned staging
// of `up` (queued on its stream: written once the stream gets there).
DeviceBuffer<bf16_t> upload_bits(const Bf16Matrix& v, StagedUpload& up, const std::string& source) {
  DeviceBuffer<bf16_t> d(v.size());
  std::size_t at = 0;
  for (const Bf16Matrix::Piece& p : v.pieces) {
    up.copy(d.get() + at, p.bits, p.size * sizeof(std::uint16_t), source);
    at += p.size;
  }
  return d;
}

// A weight matrix in the form the model holds it (fp32, rounded here; or, bf16_only, bf16 bits
// rounded alike at load), as bf16 on the device: the same bits either way.
DeviceBuffer<bf16_t> upload_matrix(const Model& m, const std::vector<float>& f32, const Bf16Matrix& b16,
                                   StagedUpload& up, const std::string& source, cudaStream_t stream) {
  return m.bf16_only ? upload_bits(b16, up, source) : upload_bf16(f32, stream);
}

template <class T>
std::vector<T> concat(const std::vector<T>& a, const std::vector<T>& b) {
  std::vector<T> v(a);
  v.insert(v.end(), b.begin(), b.end());
  return v;
}

DeviceBuffer<float> upload_f32(const std::vector<float>& src, cudaStream_t stream) {
  DeviceBuffer<float> d(src.size());
  TWELL_CUDA_CHECK(cudaMemcpyAsync(d.get(), src.data(), src.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
  TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
  return d;
}

// The current GPU's name; ErrorCode::unsupported where there is none to use.
std::string usable_device() {
  const cuda::DeviceInfo dev = cuda::query_device();
  TWELL_CHECK(dev.available, ErrorCode::unsupported, "no usable CUDA device: {}", dev.reason);
  return dev.name;
}

// The current GPU's PCI bus id, as NVML takes it.
std::string pci_bus_id() {
  int dev = 0;
  char id[32] = {};
  TWELL_CUDA_CHECK(cudaGetDevice(&dev));
  TWELL_CUDA_CHECK(cudaDeviceGetPCIBusId(id, sizeof id, dev));
  return id;
}

// The device memory the runtime's weights take (bf16 matrices; the FFN engine's layouts: [Wg; Wu],
// Wd and Wdᵀ for ReLU layers, [Wg; Wu] and Wd otherwise; fp32 norms and RoPE tables) plus the
// shared cuBLASLt workspace; refuses with a one-line error where the GPU has less free.
void check_device_memory(const LlamaConfig& c) {
  const double K = static_cast<double>(c.hidden_size), N = static_cast<double>(c.intermediate_size),
               V = static_cast<double>(c.vocab_size), L = static_cast<double>(c.num_layers);
  const double ffn = c.act == Activation::relu ? 4 * N * K : 3 * N * K;
  const double elems = V * K * (c.tied_embeddings ? 1 : 2) +
                       L * (static_cast<double>(c.q_dim() + 2 * c.kv_dim()) * K + K * static_cast<double>(c.q_dim()) + ffn);
  const double bytes = 2 * elems + 4 * (2 * L * K + K) + 4.0 * static_cast<double>(c.max_position * c.head_dim) +
                       64.0 * (1 << 20);
  std::size_t free = 0, total = 0;
  TWELL_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  TWELL_CHECK(bytes <= static_cast<double>(free), ErrorCode::unsupported,
              "the model needs about {:.2f} GB of GPU memory for its weights (bf16) before any KV cache or "
              "workspace; this GPU has {:.2f} GB free of {:.2f} GB",
              bytes / 1e9, static_cast<double>(free) / 1e9, static_cast<double>(total) / 1e9);
}

// Grows a buffer to at least n elements (contents lost).
template <typename T>
T* room(DeviceBuffer<T>& b, std::int64_t n) {
  b.reserve(static_cast<std::size_t>(n));
  return b.get();
}

}  // namespace

namespace {

static_assert(cuda::ops::kKvBlockRows == kKvBlockTokens, "the GPU ops' KV block is the runtime's");

// A pool of KV blocks on the GPU: keys and values [layers, blocks, kKvBlockTokens, kv_dim] bf16 each
// (the layout cuda::ops::RowKv addresses), allocated whole up front, and their free list.
class CudaKvPool final : public KvPool {
 public:
  CudaKvPool(const void* owner, const LlamaConfig& c, std::int64_t blocks, bool prefix_cache)
      : owner_(owner), layers_(c.num_layers), kv_dim_(c.kv_dim()), blocks_(blocks), list_(blocks, prefix_cache),
        k_(static_cast<std::size_t>(layers_ * blocks * kKvBlockTokens * kv_dim_)),
        v_(static_cast<std::size_t>(layers_ * blocks * kKvBlockTokens * kv_dim_)) {}
  std::int64_t total_blocks() const noexcept override { return blocks_; }
  std::int64_t free_blocks() const noexcept override { return list_.free(); }
  std::int64_t cached_blocks() const noexcept override { return list_.cached(); }
  std::int64_t block_bytes() const noexcept override { return bytes_per_block(layers_, kv_dim_); }
  // One block's keys and values, every layer (what make_kv_pool checks against free memory).
  static std::int64_t bytes_per_block(std::int64_t layers, std::int64_t kv_dim) noexcept {
    return 2 * layers * kKvBlockTokens * kv_dim * static_cast<std::int64_t>(sizeof(bf16_t));
  }
  KvBlockList& list() noexcept { return list_; }
  const void* owner() const noexcept { return owner_; }
  bf16_t* k() const noexcept { return k_.get(); }
  bf16_t* v() const noexcept { return v_.get(); }
  std::int64_t layer_stride() const noexcept { return blocks_ * kKvBlockTokens * kv_dim_; }

 private:
  const void* owner_;
  std::int64_t layers_, kv_dim_, blocks_;
  KvBlockList list_;
  DeviceBuffer<bf16_t> k_, v_;
};

// One sequence's KV cache on the GPU. Fixed capacity: its own keys and values [layers, capacity,
// kv_dim] bf16 each (blocks in order: no table). Paged: blocks of a CudaKvPool, starting from the
// published blocks of its prompt's prefix (prefix sharing, kv_blocks.hpp), taken as it grows
// (reserve) and given back when destroyed or cleared, and its block table on the device, which
// forward() brings up to date before a step reads it (upload_table).
class CudaSequence final : public BlockSequence {
 public:
  CudaSequence(const void* owner, const LlamaConfig& c, std::int64_t capacity)
      : BlockSequence(nullptr, capacity, c.max_position), owner_(owner), kv_dim_(c.kv_dim()),
        k_(static_cast<std::size_t>(c.num_layers * capacity * c.kv_dim())),
        v_(static_cast<std::size_t>(c.num_layers * capacity * c.kv_dim())) {}
  // Paged: starts on the published blocks of prefix's first full blocks that the pool has; the
  // table's device copy has room for the model's context (one int a block).
  CudaSequence(const std::shared_ptr<CudaKvPool>& pool, const LlamaConfig& c, std::span<const std::int32_t> prefix)
      : BlockSequence(pool, pool->list(), c.max_position, prefix), owner_(pool->owner()), kv_dim_(c.kv_dim()),
        d_table_(static_cast<std::size_t>(KvPool::blocks_for(c.max_position))) {}
  std::int64_t bytes() const noexcept override {
    return paged() ? static_cast<std::int64_t>(table_.ids.size()) * pool_->block_bytes()
                   : static_cast<std::int64_t>(k_.bytes() + v_.bytes());
  }
  // advance after a step's writes, rewind before the step runs again, publish once a call's writes
  // are final (after any step run again).
  using BlockSequence::advance;
  using BlockSequence::publish;
  using BlockSequence::rewind;
  const void* owner() const noexcept { return owner_; }
  // The table entries taken since the last upload, to the device (stream order: before the step
  // that reads them; from pageable memory, so the copy is staged before this returns).
  void upload_table(cudaStream_t stream) {
    const auto n = static_cast<std::int64_t>(table_.ids.size());
    if (!paged() || uploaded_ == n) return;
    TWELL_CUDA_CHECK(cudaMemcpyAsync(d_table_.get() + uploaded_, table_.ids.data() + uploaded_,
                                     static_cast<std::size_t>(n - uploaded_) * sizeof(std::int32_t),
                                     cudaMemcpyHostToDevice, stream));
    uploaded_ = n;
  }
  cuda::ops::RowKv row(std::int64_t pos) const noexcept {
    cuda::ops::RowKv r;
    const auto* pool = paged() ? static_cast<const CudaKvPool*>(pool_.get()) : nullptr;
    r.k = pool ? pool->k() : k_.get();
    r.v = pool ? pool->v() : v_.get();
    r.layer_stride = pool ? pool->layer_stride() : capacity_ * kv_dim_;
    r.table = pool ? d_table_.get() : nullptr;
    r.pos = static_cast<std::int32_t>(pos);
    return r;
  }

 private:
  void released() override { uploaded_ = 0; }
  const void* owner_;
  std::int64_t kv_dim_;
  DeviceBuffer<bf16_t> k_, v_;          // fixed capacity
  DeviceBuffer<std::int32_t> d_table_;  // paged: the block table on the device
  std::int64_t uploaded_ = 0;           // entries of table_.ids the device copy holds (a table only grows)
};

// The GPU runtime counts rows, not non-zeros (the engine's counts trail the calls and cover sampled
// rows): `active` says so, and ffn_stats() fills last_density from the engine.
FfnLayerStats unsummed_stats() {
  FfnLayerStats s;
  s.active = -1;
  return s;
}

}  // namespace

class CudaRuntime final : public Runtime {
  using StepPlan = cuda::FfnLayer::StepPlan;
  // Steps of at least this many tokens use the tensor-core attention (a 64-row block per 64
  // tokens); decode steps (one token) the plain kernel.
  static constexpr std::int64_t kFlashMinRows = 16;

 public:
  CudaRuntime(const Model& m, RuntimeOptions opt, const RuntimeTuning& tuning)
      : model_(&m), opt_(opt), tuning_(tuning), stats_(static_cast<std::size_t>(m.config.num_layers), unsummed_stats()), device_(usable_device()) {
    const LlamaConfig& c = m.config;
    check_device_memory(c);
    TWELL_CHECK(opt.ffn_path != FfnPath::sparse || c.act == Activation::relu, ErrorCode::unsupported,
                "the sparse FFN path needs a ReLU model; this one uses {}", to_string(c.act));
    TWELL_CHECK(tuning.cudnn_build_at >= 1, ErrorCode::invalid_argument, "cudnn_build_at must be at least 1, not {}",
                tuning.cudnn_build_at);
    TWELL_CHECK(tuning.gemm_autotune == 0 || (tuning.gemm_autotune >= 2 && tuning.gemm_autotune <= 16),
                ErrorCode::invalid_argument, "gemm_autotune must be 0 (off) or 2 to 16 candidates, not {}",
                tuning.gemm_autotune);
    if (tuning.gemm_autotune > 0) {
      // cuBLASLt's shapes of up to kAutotuneMaxRows rows (decode steps; a prefill meets a new m at
      // every prompt length) timed on first use outside a capture, the FFN's side stream's alike.
      constexpr std::int64_t kAutotuneMaxRows = 64;
      infer_ws_.set_gemm_autotune(tuning.gemm_autotune, kAutotuneMaxRows);
    }
    TWELL_CHECK(c.head_dim <= 256, ErrorCode::unsupported, "head_dim {} > 256 is not supported on the GPU", c.head_dim);
    max_keys_ = cuda::ops::attention_max_keys(c.head_dim);  // a device query: once, not per decode step
    // The GPU's FFN engine dispatches with its own measured thresholds; max_sparse_density is the
    // CPU runtime's. Still checked, so that a bad value is an error on every device.
    TWELL_CHECK(opt.max_sparse_density >= 0 && opt.max_sparse_density <= 1, ErrorCode::invalid_argument,
                "max_sparse_density must lie in [0, 1], got {}", opt.max_sparse_density);
    const std::int64_t K = c.hidden_size, N = c.intermediate_size;
    m.check_mapped_files();  // the bf16 matrices view those files: not if one changed in place
    StagedUpload up(stream_);  // (reads of a file truncated after the check are errors too)
    const std::string source = bits_source(m);
    embed_ = upload_matrix(m, m.embed, m.embed16, up, source, stream_);
    if (!m.lm_head.empty() || !m.lm_head16.empty())
      head_ = upload_matrix(m, m.lm_head, m.lm_head16, up, source, stream_);
    final_norm_ = upload_f32(m.final_norm, stream_);
    for (const LayerWeights& l : m.layers) {
      Layer d;
      d.attn_norm = upload_f32(l.attn_norm, stream_);
      d.ffn_norm = upload_f32(l.ffn_norm, stream_);
      d.wqkv = upload_matrix(m, l.wqkv, l.wqkv16, up, source, stream_);
      d.wo = upload_matrix(m, l.wo, l.wo16, up, source, stream_);
      if (c.act == Activation::relu) {
        d.ffn = std::make_unique<cuda::FfnLayer>(&infer_ws_);
        if (tuning_.decode_max_density >= 0) d.ffn->set_decode_max_density(tuning_.decode_max_density);
        if (tuning_.decode_max_rows >= 0) d.ffn->set_decode_max_rows(tuning_.decode_max_rows);
        if (tuning_.decode_gemv_max_rows >= 0) d.ffn->set_decode_gemv_max_rows(tuning_.decode_gemv_max_rows);
        if (tuning_.union_max_rows >= 0) d.ffn->set_union_max_rows(tuning_.union_max_rows);
        if (tuning_.union_min_rows >= 0) d.ffn->set_union_min_rows(tuning_.union_min_rows);
        cuda::FfnLayer::UnionKernels uk = d.ffn->union_kernels();
        if (tuning_.union_up_split >= 0) uk.up_split = tuning_.union_up_split;
        if (tuning_.union_down_split >= 0) uk.down_split = tuning_.union_down_split;
        if (tuning_.union_up_clusters >= 0) uk.up_clusters = tuning_.union_up_clusters;
        d.ffn->set_union_kernels(uk);
        if (!tuning_.decode_neuron_order) d.ffn->set_decode_reorder(false, stream_);
        if (tuning_.dense_fold_norm >= 0) d.ffn->set_dense_fold_norm(tuning_.dense_fold_norm == 1);
        if (m.bf16_only) {  // the bits on the device, then the layer's own layouts from them
          const DeviceBuffer<bf16_t> g = upload_bits(l.w_gate16, up, source), u = upload_bits(l.w_up16, up, source),
                                     dn = upload_bits(l.w_down16, up, source);
          d.ffn->load_weights({tw(g.get()), tw(u.get()), tw(dn.get()), N, K}, stream_);
          TWELL_CUDA_CHECK(cudaStreamSynchronize(stream_));  // before g, u, dn are freed
        } else {
          d.ffn->upload_weights(ffn_weights(l.w_gate.data(), l.w_up.data(), l.w_down.data(), N, K), stream_);
        }
      } else if (m.bf16_only) {
        d.w_gu = upload_bits(l.w_gate16.then(l.w_up16), up, source);
        d.w_down = upload_bits(l.w_down16, up, source);
      } else {
        d.w_gu = upload_bf16(concat(l.w_gate, l.w_up), stream_);
        d.w_down = upload_bf16(l.w_down, stream_);
      }
      layers_.push_back(std::move(d));
    }
    up.finish();
    // RoPE tables [max_pos, d/2], angles in double, times the rope type's attention scaling. Sequences
    // end at most at max_position, where dynamic RoPE is still plain: one table serves every call.
    const std::int64_t half = c.head_dim / 2;
    const RopeFrequencies freq = c.rope(c.max_position);
    std::vector<float> cs(static_cast<std::size_t>(c.max_position * half)), sn(cs.size());
    for (std::int64_t p = 0; p < c.max_position; ++p)
      for (std::int64_t i = 0; i < half; ++i) {
        const double a = static_cast<double>(p) * freq.inv_freq[static_cast<std::size_t>(i)];
        cs[static_cast<std::size_t>(p * half + i)] = static_cast<float>(std::cos(a) * freq.attention_scaling);
        sn[static_cast<std::size_t>(p * half + i)] = static_cast<float>(std::sin(a) * freq.attention_scaling);
      }
    cos_ = upload_f32(cs, stream_);
    sin_ = upload_f32(sn, stream_);
#if TWELL_HAVE_CUDNN
    if (tuning.cudnn_attention) cudnn_ = CudnnAttention::create(c.num_heads, c.num_kv_heads, c.head_dim, &cudnn_why_);
#else
    cudnn_why_ = "not in this build (no cuDNN or cudnn-frontend at configure time)";
#endif
    if (!tuning.cudnn_attention) cudnn_why_ = "off (TWELL_TUNING=no-cudnn-attention)";
    programmatic_ = tuning.programmatic_launch && cuda::programmatic_launch_supported();
    carveout_ = tuning.smem_carveout;
    fused_decode_ = tuning.fused_decode;
    // The one-token FFN's fixed-point output goes through the attention output projection's GEMV
    // (its residual add): Q within the GEMV's K. Zero once; every forward leaves it zero.
    fixed_decode_ = fused_decode_ && tuning.fixed_point_decode && c.act == Activation::relu && cuda::gemv_takes_k(c.q_dim());
    if (fixed_decode_) {
      ffn_fixed_ = DeviceBuffer<std::int64_t>(static_cast<std::size_t>(K));
      TWELL_CUDA_CHECK(cudaMemsetAsync(ffn_fixed_.get(), 0, ffn_fixed_.bytes(), stream_));
      fixed_overflow_ = cuda::PinnedBuffer<unsigned>(1);
      fixed_overflow_[0] = 0;
      TWELL_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&fixed_overflow_dev_), fixed_overflow_.get(), 0));
    }
    TWELL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  const Model& model() const noexcept override { return *model_; }
  std::string device() const override { return device_; }
  // last_density of a ReLU layer: the newest measure its FFN engine has read back (the count ring;
  // never waits), so it trails the calls and survives reset_stats. active stays 0 (not summed here).
  const std::vector<FfnLayerStats>& ffn_stats() const noexcept override {
    for (std::size_t l = 0; l < layers_.size() && l < stats_.size(); ++l) {
      if (!layers_[l].ffn) continue;
      try {
        stats_[l].last_density = layers_[l].ffn->stats().active;
      } catch (...) {  // a CUDA error in an event query: leave the last value (the next call reports it)
      }
    }
    return stats_;
  }
  void reset_stats() override { stats_.assign(stats_.size(), unsummed_stats()); }
  std::int64_t device_memory_in_use() const override {
    std::size_t free = 0, total = 0;
    TWELL_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return static_cast<std::int64_t>(total - free);
  }
  std::int64_t graph_launches() const noexcept override { return graph_launches_; }
  double device_energy_joules() const override { return energy_.joules(); }
  double copy_bandwidth() const override {
    // 1 GiB copied device to device on the runtime's stream, timed by events; the median of 9 after one.
    constexpr std::size_t kBytes = std::size_t{1} << 30;
    DeviceBuffer<std::byte> src(kBytes), dst(kBytes);
    TWELL_CUDA_CHECK(cudaMemsetAsync(src.get(), 1, kBytes, stream_));
    struct Events {  // destroyed on every way out
      cudaEvent_t a = nullptr, b = nullptr;
      ~Events() {
        if (a) cudaEventDestroy(a);
        if (b) cudaEventDestroy(b);
      }
    } ev;
    TWELL_CUDA_CHECK(cudaEventCreate(&ev.a));
    TWELL_CUDA_CHECK(cudaEventCreate(&ev.b));
    cudaEvent_t e0 = ev.a, e1 = ev.b;
    std::vector<float> ms;
    for (int i = 0; i < 10; ++i) {
      TWELL_CUDA_CHECK(cudaEventRecord(e0, stream_));
      TWELL_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), kBytes, cudaMemcpyDeviceToDevice, stream_));
      TWELL_CUDA_CHECK(cudaEventRecord(e1, stream_));
      TWELL_CUDA_CHECK(cudaEventSynchronize(e1));
      float t = 0;
      TWELL_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
      if (i > 0) ms.push_back(t);
    }
    std::nth_element(ms.begin(), ms.begin() + 4, ms.end());
    return 2.0 * static_cast<double>(kBytes) / (1e-3 * static_cast<double>(ms[4]));
  }
  bool programmatic_launch() const noexcept override { return programmatic_; }
  bool fused_decode() const noexcept override { return fused_decode_; }
  bool fixed_point_decode() const noexcept override { return fixed_decode_; }
  std::string prefill_attention() const override {
    const std::string own = "twell's tensor-core kernel";
#if TWELL_HAVE_CUDNN
    if (cudnn_) {
      const std::string refused = cudnn_->refusal();
      return fmt::format("cuDNN SDPA (cuDNN {}) for prefills from position 0 from a shape's call {} on ({} graphs built), "
                         "else {}{}",
                         cudnn_->version(), tuning_.cudnn_build_at, cudnn_->graphs(), own,
                         refused.empty() ? "" : "; cuDNN refused " + refused);
    }
#endif
    return fmt::format("{} (cuDNN: {})", own, cudnn_why_);
  }

  std::unique_ptr<Sequence> new_sequence(std::int64_t capacity) override {
    check_sequence_capacity(model_->config, capacity);
    // Decode attention keeps a row's scores in shared memory: refuse up front, not mid-generation.
    TWELL_CHECK(capacity <= max_keys_, ErrorCode::unsupported,
                "a sequence of {} tokens is longer than the GPU runtime's decode attention takes on this device ({} "
                "at head_dim {}); use a shorter context",
                capacity, max_keys_, model_->config.head_dim);
    return std::make_unique<CudaSequence>(this, model_->config, capacity);
  }

  std::shared_ptr<KvPool> make_kv_pool(std::int64_t blocks) override {
    if (!tuning_.paged_kv) return Runtime::make_kv_pool(blocks);  // TWELL_TUNING=no-paged-kv: refused as unsupported
    const LlamaConfig& c = model_->config;
    TWELL_CHECK(blocks > 0, ErrorCode::invalid_argument, "a KV pool needs at least one block, got {}", blocks);
    // A paged sequence may grow to the model's context; decode attention keeps a row's scores in
    // shared memory (then: sequences of fixed capacity, each refused up front if too long).
    TWELL_CHECK(c.max_position <= max_keys_, ErrorCode::unsupported,
                "no paged KV cache for a context of {} tokens: the GPU's decode attention takes {} keys at head_dim {}",
                c.max_position, max_keys_, c.head_dim);
    const double bytes = static_cast<double>(CudaKvPool::bytes_per_block(c.num_layers, c.kv_dim())) * static_cast<double>(blocks);
    std::size_t free = 0, total = 0;
    TWELL_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    TWELL_CHECK(bytes <= static_cast<double>(free), ErrorCode::invalid_argument,
                "a KV pool of {} blocks ({} positions) needs {:.2f} GB of GPU memory; {:.2f} GB of {:.2f} GB are free "
                "(ask for fewer positions, e.g. twell serve --kv-tokens)",
                blocks, blocks * kKvBlockTokens, bytes / 1e9, static_cast<double>(free) / 1e9,
                static_cast<double>(total) / 1e9);
    return std::make_shared<CudaKvPool>(this, c, blocks, tuning_.prefix_cache);
  }

  std::unique_ptr<Sequence> new_paged_sequence(const std::shared_ptr<KvPool>& pool,
                                               std::span<const std::int32_t> prefix = {}) override {
    auto p = std::dynamic_pointer_cast<CudaKvPool>(pool);
    TWELL_CHECK(p != nullptr && p->owner() == this, ErrorCode::invalid_argument,
                "new_paged_sequence: the pool was made by another runtime");
    return std::make_unique<CudaSequence>(p, model_->config, prefix);
  }

  std::vector<float> forward(std::span<const SeqStep> steps, bool all_positions) override {
    return unless_fixed_overflow(steps, [&] { return forward_once(steps, all_positions); });
  }
  std::vector<std::int32_t> forward_argmax(std::span<const SeqStep> steps) override {
    return unless_fixed_overflow(steps, [&] { return forward_argmax_once(steps); });
  }
  std::vector<Candidate> forward_top(std::span<const SeqStep> steps, std::int64_t k, double repetition_penalty,
                                     std::span<const std::span<const std::int32_t>> histories) override {
    return unless_fixed_overflow(steps, [&] { return forward_top_once(steps, k, repetition_penalty, histories); });
  }
  std::vector<std::int32_t> forward_sample(std::span<const SeqStep> steps, const SamplingOptions& o,
                                           std::span<const std::span<const std::int32_t>> histories,
                                           std::span<const double> r) override {
    return unless_fixed_overflow(steps, [&] { return forward_sample_once(steps, o, histories, r); });
  }

  bool samples_on_device() const noexcept override { return model_->config.vocab_size <= cuda::ops::kTopMaxVocab; }

 private:
  // The rows from which attention() takes its tensor-core kernel: 0 under no-grouped-attention,
  // else grouped-attention-min-rows=N or the kernel's default.
  std::int64_t attention_grouped_min_rows() const noexcept {
    if (!tuning_.grouped_attention) return 0;
    return tuning_.grouped_attention_min_rows >= 1 ? tuning_.grouped_attention_min_rows
                                                   : cuda::ops::kAttentionGroupedMinRows;
  }

  // Runs body (one forward and what reads its logits, synchronised); where a one-token FFN's
  // fixed-point output overflowed in it (a term past its range: fixed_point.hpp), the step again
  // with the fixed-point output off from now on (graphs captured again): the sequences rewound,
  // the statistics as before. body's own errors (e.g. non-finite logits) count only where nothing
  // overflowed. Then the steps' tokens are written for good: paged sequences publish the blocks
  // they filled (never before a step that may run again).
  template <class Body>
  auto unless_fixed_overflow(std::span<const SeqStep> steps, Body&& body) -> decltype(body()) {
    auto out = body_unless_fixed_overflow(steps, body);
    for (const SeqStep& st : steps) static_cast<CudaSequence*>(st.seq)->publish();
    return out;
  }
  template <class Body>
  auto body_unless_fixed_overflow(std::span<const SeqStep> steps, Body& body) -> decltype(body()) {
    if (!fixed_decode_) return body();
    const std::vector<FfnLayerStats> stats = stats_;
    const std::int64_t total = rows_total_, decode_steps = decode_steps_;
    try {
      auto out = body();
      if (!fixed_overflowed()) return out;
    } catch (...) {
      if (!fixed_overflowed()) throw;
    }
    fixed_overflow_[0] = 0;
    fixed_decode_ = false;
    // Graphs captured with the fixed point are captured again at their next planned step (the
    // map's entries stay: the same schedule of planned and counting steps as before).
    for (auto& [shape, g] : graphs_)
      if (g->exec) TWELL_CUDA_CHECK(cudaGraphExecDestroy(std::exchange(g->exec, nullptr)));
    fmt::print(stderr, "twell: a one-token FFN output left the fixed-point range; this step ran again, and decode "
                       "steps run the two-kernel FFN from now on\n");
    stats_ = stats;
    rows_total_ = total;
    decode_steps_ = decode_steps;  // the same planning schedule as a runtime that never used the fixed point
    for (const SeqStep& st : steps) static_cast<CudaSequence*>(st.seq)->rewind(static_cast<std::int64_t>(st.tokens.size()));
    return body();
  }
  bool fixed_overflowed() const { return *static_cast<volatile unsigned*>(fixed_overflow_.get()) != 0; }

  std::vector<float> forward_once(std::span<const SeqStep> steps, bool all_positions) {
    const float* logits = run(steps, all_positions);
    const std::int64_t R = all_positions ? rows_total_ : static_cast<std::int64_t>(steps.size());
    std::vector<float> out(static_cast<std::size_t>(R * model_->config.vocab_size));
    TWELL_CUDA_CHECK(cudaMemcpyAsync(out.data(), logits, out.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    TWELL_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return out;
  }

  std::vector<std::int32_t> forward_argmax_once(std::span<const SeqStep> steps) {
    const float* logits = run(steps, false);
    const auto R = static_cast<std::int64_t>(steps.size());
    std::int32_t* ids = room(argmax_, R);
    {
      const cuda::ProgrammaticLaunch programmatic(programmatic_);
      const cuda::LaunchCarveout carveout(carveout_);
      cuda::ops::argmax(logits, R, model_->config.vocab_size, ids, stream_);
    }
    std::vector<std::int32_t> out(static_cast<std::size_t>(R));
    TWELL_CUDA_CHECK(cudaMemcpyAsync(out.data(), ids, out.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost, stream_));
    TWELL_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (std::size_t i = 0; i < out.size(); ++i)
      TWELL_CHECK(out[i] >= 0, ErrorCode::non_finite, "forward: step {}'s logits hold NaN or infinity", i);
    return out;
  }

  std::vector<Candidate> forward_top_once(std::span<const SeqStep> steps, std::int64_t k, double repetition_penalty,
                                          std::span<const std::span<const std::int32_t>> histories) {
    const std::int64_t V = model_->config.vocab_size;
    if (V > cuda::ops::kTopMaxVocab) return Runtime::forward_top(steps, k, repetition_penalty, histories);
    TWELL_CHECK(k >= 1 && k <= V, ErrorCode::invalid_argument, "forward_top: k = {} outside 1 … {}", k, V);
    TWELL_CHECK(histories.size() == steps.size(), ErrorCode::invalid_argument,
                "forward_top: {} histories for {} steps", histories.size(), steps.size());
    const auto R = static_cast<std::int64_t>(steps.size());
    // The histories (with a penalty) go over before the forward is enqueued: a copy from pageable
    // memory waits for the stream, and here that is the previous step, long done.
    const auto [d_hist, d_off] = upload_histories(histories, repetition_penalty != 1.0);
    const float* logits = run(steps, false);
    float* z = room(top_z_, R * k);
    std::int32_t* id = room(top_id_, R * k);
    std::int32_t* bad = room(top_bad_, R);
    {
      const cuda::ProgrammaticLaunch programmatic(programmatic_);
      const cuda::LaunchCarveout carveout(carveout_);
      cuda::ops::top_candidates(logits, R, V, k, static_cast<float>(repetition_penalty), d_hist, d_off, z, id, bad,
                                stream_);
    }
    std::vector<float> hz(static_cast<std::size_t>(R * k));
    std::vector<std::int32_t> hid(hz.size()), hbad(static_cast<std::size_t>(R));
    TWELL_CUDA_CHECK(cudaMemcpyAsync(hz.data(), z, hz.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    TWELL_CUDA_CHECK(cudaMemcpyAsync(hid.data(), id, hid.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost, stream_));
    TWELL_CUDA_CHECK(cudaMemcpyAsync(hbad.data(), bad, hbad.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost, stream_));
    TWELL_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (std::size_t i = 0; i < hbad.size(); ++i)
      TWELL_CHECK(hbad[i] < 0, ErrorCode::non_finite, "forward: step {}'s logit of token {} is NaN or infinite", i, hbad[i]);
    std::vector<Candidate> out(hz.size());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = {hz[i], hid[i]};
    return out;
  }

  std::vector<std::int32_t> forward_sample_once(std::span<const SeqStep> steps, const SamplingOptions& o,
                                                std::span<const std::span<const std::int32_t>> histories,
                                                std::span<const double> r) {
    if (!samples_on_device()) return Runtime::forward_sample(steps, o, histories, r);
    TWELL_CHECK(histories.size() == steps.size() && r.size() == steps.size(), ErrorCode::invalid_argument,
                "forward_sample: {} histories and {} draws for {} steps", histories.size(), r.size(), steps.size());
    check_sampling(o);
    TWELL_CHECK(o.temperature > 0, ErrorCode::invalid_argument, "forward_sample: greedy is forward_argmax");
    for (const double x : r)
      TWELL_CHECK(x >= 0 && x < 1, ErrorCode::invalid_argument, "forward_sample: a draw r = {} outside [0, 1)", x);
    const auto R = static_cast<std::int64_t>(steps.size());
    // Inputs before the forward is enqueued (a copy from pageable memory waits for the stream).
    const auto [d_hist, d_off] = upload_histories(histories, o.repetition_penalty != 1.0);
    double* d_r = room(draws_, R);
    TWELL_CUDA_CHECK(cudaMemcpyAsync(d_r, r.data(), r.size() * sizeof(double), cudaMemcpyHostToDevice, stream_));
    const float* logits = run(steps, false);
    std::int32_t* ids = room(argmax_, R);
    std::int32_t* bad = room(top_bad_, R);
    {
      const cuda::ProgrammaticLaunch programmatic(programmatic_);
      const cuda::LaunchCarveout carveout(carveout_);
      cuda::ops::sample_rows(logits, R, model_->config.vocab_size,
                             {o.temperature, o.top_k, o.top_p, o.repetition_penalty}, d_hist, d_off, d_r, ids, bad,
                             stream_);
    }
    std::vector<std::int32_t> out(static_cast<std::size_t>(R)), hbad(out.size());
    TWELL_CUDA_CHECK(cudaMemcpyAsync(out.data(), ids, out.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost, stream_));
    TWELL_CUDA_CHECK(cudaMemcpyAsync(hbad.data(), bad, hbad.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost, stream_));
    TWELL_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const std::int64_t V = model_->config.vocab_size;
    for (std::size_t i = 0; i < hbad.size(); ++i) {
      TWELL_CHECK(hbad[i] != V, ErrorCode::internal, "forward_sample: step {}'s draw found no token", i);
      TWELL_CHECK(hbad[i] < 0, ErrorCode::non_finite, "forward: step {}'s logit of token {} is NaN or infinite (or becomes "
                  "so with the repetition penalty)", i, hbad[i]);
      TWELL_CHECK(out[i] >= 0 && out[i] < V, ErrorCode::internal, "forward_sample: step {} drew token {}", i, out[i]);
    }
    return out;
  }

  // The histories as one device array and its row offsets (both null without a penalty).
  std::pair<const std::int32_t*, const std::int64_t*> upload_histories(std::span<const std::span<const std::int32_t>> histories,
                                                                        bool penalty) {
    if (!penalty) return {nullptr, nullptr};
    const auto R = static_cast<std::int64_t>(histories.size());
    std::vector<std::int64_t> off(static_cast<std::size_t>(R) + 1, 0);
    for (std::size_t i = 0; i < histories.size(); ++i) off[i + 1] = off[i] + static_cast<std::int64_t>(histories[i].size());
    std::vector<std::int32_t> ids;
    ids.reserve(static_cast<std::size_t>(off.back()));
    for (const auto& h : histories) ids.insert(ids.end(), h.begin(), h.end());
    // The histories grow by a token a step: doubling keeps reallocations (a cudaFree waits for the
    // device) to a handful over a generation.
    if (static_cast<std::size_t>(off.back()) > top_hist_.size())
      top_hist_.reserve(std::max(static_cast<std::size_t>(off.back()), 2 * top_hist_.size()));
    std::int32_t* dh = room(top_hist_, std::max<std::int64_t>(1, off.back()));
    std::int64_t* doff = room(top_hist_off_, R + 1);
    if (!ids.empty())
      TWELL_CUDA_CHECK(cudaMemcpyAsync(dh, ids.data(), ids.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice, stream_));
    TWELL_CUDA_CHECK(cudaMemcpyAsync(doff, off.data(), off.size() * sizeof(std::int64_t), cudaMemcpyHostToDevice, stream_));
    return {dh, doff};
  }

  // Enqueues the forward of `steps` and returns the device logits [rows, V] (one row per step, or
  // per token with all_positions); advances the sequences (their caches are written in stream order).
  const float* run(std::span<const SeqStep> steps, bool all_positions) {
    const LlamaConfig& c = model_->config;
    check_forward_steps(c, steps);
    std::vector<CudaSequence*> seqs;
    std::int64_t T = 0, max_keys = 0;
    for (std::size_t s = 0; s < steps.size(); ++s) {
      auto* cs = dynamic_cast<CudaSequence*>(steps[s].seq);
      TWELL_CHECK(cs != nullptr && cs->owner() == this, ErrorCode::invalid_argument,
                  "forward: step {}'s sequence was made by another runtime", s);
      cs->upload_table(stream_);  // a paged sequence's blocks taken since its last step
      seqs.push_back(cs);
      T += static_cast<std::int64_t>(steps[s].tokens.size());
      max_keys = std::max(max_keys, cs->length() + static_cast<std::int64_t>(steps[s].tokens.size()));
    }
    // Host staging: ids, each row's cache and position, the rows whose logits are wanted, and the
    // tensor-core attention's blocks (64 consecutive rows of a sequence) when every step is a
    // prefill chunk of at least kFlashMinRows tokens (else the plain kernel, one block per row).
    std::vector<std::int32_t> ids, sel;
    std::vector<cuda::ops::RowKv> rows;
    std::vector<cuda::ops::FlashBlock> blocks;
    bool flash = cuda::ops::flash_attention_supported(c.head_dim);
    for (const SeqStep& st : steps) flash = flash && static_cast<std::int64_t>(st.tokens.size()) >= kFlashMinRows;
    // A sliding window that a row of this call passes: the plain kernel, which applies it (the
    // tensor-core kernels and cuDNN's attend to every key).
    if (c.sliding_window > 0 && max_keys > c.sliding_window) flash = false;
    for (std::size_t s = 0; s < steps.size(); ++s)
      for (std::size_t j = 0; j < steps[s].tokens.size(); ++j) {
        if (flash && j % 64 == 0)
          blocks.push_back({static_cast<std::int64_t>(ids.size()),
                            static_cast<std::int32_t>(std::min<std::size_t>(64, steps[s].tokens.size() - j)), 0});
        ids.push_back(steps[s].tokens[j]);
        rows.push_back(seqs[s]->row(seqs[s]->length() + static_cast<std::int64_t>(j)));
        if (all_positions || j + 1 == steps[s].tokens.size()) sel.push_back(static_cast<std::int32_t>(ids.size() - 1));
      }
    // cuDNN's attention (where built): every sequence of a tensor-core call starts empty, so the
    // call's own rows are all the keys.
    bool fresh = flash;
    for (CudaSequence* cs : seqs) fresh = fresh && cs->length() == 0;
    seq_row0_.clear();
    seq_len_.clear();
    if (fresh) {
      std::int64_t r0 = 0;
      for (const SeqStep& st : steps) {
        seq_row0_.push_back(r0);
        seq_len_.push_back(static_cast<std::int64_t>(st.tokens.size()));
        r0 += static_cast<std::int64_t>(st.tokens.size());
      }
    }
    const auto R = static_cast<std::int64_t>(sel.size());
    std::int32_t* d_ids = room(ids_, T);
    cuda::ops::RowKv* d_rows = room(rows_, T);
    std::int32_t* d_sel = room(sel_, R);
    cuda::ops::FlashBlock* d_blocks = flash ? room(blocks_, static_cast<std::int64_t>(blocks.size())) : nullptr;
    if (flash)
      TWELL_CUDA_CHECK(cudaMemcpyAsync(d_blocks, blocks.data(), blocks.size() * sizeof(cuda::ops::FlashBlock),
                                       cudaMemcpyHostToDevice, stream_));
    TWELL_CUDA_CHECK(cudaMemcpyAsync(d_ids, ids.data(), ids.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice, stream_));
    TWELL_CUDA_CHECK(cudaMemcpyAsync(d_rows, rows.data(), rows.size() * sizeof(cuda::ops::RowKv), cudaMemcpyHostToDevice, stream_));
    TWELL_CUDA_CHECK(cudaMemcpyAsync(d_sel, sel.data(), sel.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice, stream_));

    Shape sh;
    sh.T = T;
    sh.R = R;
    sh.max_keys = max_keys;
    sh.blocks = flash ? static_cast<std::int64_t>(blocks.size()) : 0;
    sh.one_token = T == static_cast<std::int64_t>(steps.size());
    // Every kernel the forward enqueues below (and a decode step's graph captures) through
    // launch_kernel is a programmatic dependent launch while this lives (RuntimeTuning::programmatic_launch),
    // with the carveout of RuntimeTuning::smem_carveout where one is set.
    const cuda::ProgrammaticLaunch programmatic(programmatic_);
    const cuda::LaunchCarveout carveout(carveout_);
    sh.cudnn = fresh && has_cudnn() && cudnn_wanted();
#if TWELL_HAVE_CUDNN
    if (sh.cudnn) sh.pad_rows = CudnnAttention::padded_rows(*std::max_element(seq_len_.begin(), seq_len_.end()));
#endif
    std::vector<char> ran_sparse;
    std::vector<StepPlan> plans;
    const bool decode = !all_positions && !flash && T == static_cast<std::int64_t>(steps.size());
    if (decode && plan_steps(T, plans))
      ran_sparse = run_decode(sh, plans);
    else if (sh.one_token)
      ran_sparse = enqueue_decode(sh, nullptr);  // counted by the engine (or every position's logits)
    else
      ran_sparse = enqueue_prefill(sh);
    for (std::size_t s = 0; s < steps.size(); ++s) seqs[s]->advance(steps[s].tokens);
    for (std::size_t l = 0; l < ran_sparse.size(); ++l) {
      stats_[l].rows += T;
      if (ran_sparse[l]) stats_[l].sparse_rows += T;
    }
    rows_total_ = T;
    return logits_.get();
  }

  // One call's geometry: token rows, logit rows, the longest sequence's keys, flash blocks (0: the
  // plain attention kernel).
  struct Shape {
    std::int64_t T = 0, R = 0, max_keys = 0, blocks = 0;
    bool cudnn = false;  // attention by cuDNN (sequences seq_row0_ / seq_len_), flash blocks the fallback
    std::int64_t pad_rows = 0;  // rows of qkv_ and att_ past T that cuDNN's padded extents may touch
    bool one_token = false;     // every step one token: each row's earlier keys come from earlier calls
  };

  // Grows every scratch buffer a call of shape `sh` writes (before a capture: none may grow inside).
  void reserve_scratch(const Shape& sh) {
    const LlamaConfig& c = model_->config;
    const std::int64_t K = c.hidden_size, N = c.intermediate_size, Q = c.q_dim(), KV = c.kv_dim();
    room(x_, sh.T * K);
    room(xn_, sh.T * K);
    // cuDNN's ragged attention declares each sequence padded to a bucket of rows: the buffers it
    // reads and writes get that many rows more, so no tile can reach past their ends.
    room(qkv_, (sh.T + sh.pad_rows) * (Q + 2 * KV));
    room(att_, (sh.T + sh.pad_rows) * Q);
    room(tmp_, sh.T * K);
    if (fuse_norms(sh.T)) room(ffn_out_, sh.T * K);
    room(xs_, sh.R * K);
    room(logits_, sh.R * c.vocab_size);
    if (c.act != Activation::relu) {
      room(gu_, sh.T * 2 * N);
      room(h_, sh.T * N);
    }
  }

  // ---- One loop per call shape ----
  // Both loops enqueue the forward from the staged ids/rows/sel/blocks to logits_ [R, V] and return
  // which layers ran sparse. A call is one or the other (run() decides by Shape::one_token):
  //   enqueue_prefill: some step has more than one token (prompts, prefill chunks, mixed calls). One
  //     unfused chain a layer; attention by cuDNN, the tensor-core kernel or the plain one; the FFN
  //     engine's own dispatch (automatic: counted).
  //   enqueue_decode: every step one token (a decode step of T sequences). The plain attention
  //     kernel; at one row the norms fused into the projections; each ReLU layer's planned step
  //     (plans: FfnLayer::plan_step / run_step, capturable into a CUDA graph) or, with plans null,
  //     the engine's counted dispatch; the one-token FFN's fixed-point chain.
  // Every residual add is fused with the norm after it (add_rmsnorm); the last layer's stands alone.

  std::vector<char> enqueue_prefill(const Shape& sh) {
    const LlamaConfig& c = model_->config;
    const std::int64_t T = sh.T, K = c.hidden_size, Q = c.q_dim(), KV = c.kv_dim();
    TWELL_CHECK(!sh.one_token, ErrorCode::internal, "enqueue_prefill: a call of one-token steps is a decode step");
    float* x = begin_forward(sh);
    bf16_t* xn = xn_.get();
    bf16_t* qkv = qkv_.get();
    bf16_t* att = att_.get();
    bf16_t* tmp = tmp_.get();
    const auto eps = static_cast<float>(c.rms_eps);
    std::vector<char> ran_sparse(static_cast<std::size_t>(c.num_layers), 0);
    const cuda::Path path = engine_path();
    cuda::ops::rmsnorm(x, nullptr, T, K, layers_[0].attn_norm.get(), eps, xn, stream_);
    for (std::int64_t l = 0; l < c.num_layers; ++l) {
      Layer& L = layers_[static_cast<std::size_t>(l)];
      project(L.wqkv.get(), xn, T, Q + 2 * KV, K, qkv);
      cuda::ops::rope_store_kv(qkv, T, c.num_heads, c.num_kv_heads, c.head_dim, cos_.get(), sin_.get(), rows_.get(), l,
                               stream_, sh.cudnn);
      if (sh.cudnn && run_cudnn(qkv, att)) {
        // done (a shape cuDNN refuses falls through to the tensor-core kernel, every layer alike)
      } else if (sh.blocks > 0)
        cuda::ops::flash_attention(qkv, sh.blocks, c.num_heads, c.num_kv_heads, c.head_dim, blocks_.get(), rows_.get(),
                                   l, att, stream_);
      else
        cuda::ops::attention(qkv, T, c.num_heads, c.num_kv_heads, c.head_dim, rows_.get(), l, sh.max_keys, att, stream_,
                             /*one_token=*/false, c.sliding_window, attention_grouped_min_rows());
      project(L.wo.get(), att, T, K, Q, tmp);
      cuda::ops::add_rmsnorm(x, tmp, T, K, L.ffn_norm.get(), eps, xn, stream_);
      if (L.ffn) {
        L.ffn->forward(tw(xn), T, tw(tmp), path, stream_);
        ran_sparse[static_cast<std::size_t>(l)] = L.ffn->last_sparse();
      } else {
        dense_ffn(L.w_gu.get(), L.w_down.get(), xn, T, tmp);
      }
      if (l + 1 < c.num_layers)
        cuda::ops::add_rmsnorm(x, tmp, T, K, layers_[static_cast<std::size_t>(l + 1)].attn_norm.get(), eps, xn, stream_);
      else
        cuda::ops::residual_add(x, tmp, T * K, stream_);
    }
    enqueue_head(sh.R);
    return ran_sparse;
  }

  std::vector<char> enqueue_decode(const Shape& sh, const std::vector<StepPlan>* plans) {
    const LlamaConfig& c = model_->config;
    const std::int64_t T = sh.T, K = c.hidden_size, Q = c.q_dim(), KV = c.kv_dim();
    TWELL_CHECK(sh.one_token && !sh.cudnn && sh.blocks == 0, ErrorCode::internal,
                "enqueue_decode: a decode step is one token a sequence, on the plain attention kernel");
    float* x = begin_forward(sh);
    bf16_t* xn = xn_.get();
    bf16_t* qkv = qkv_.get();
    bf16_t* att = att_.get();
    bf16_t* tmp = tmp_.get();
    const auto eps = static_cast<float>(c.rms_eps);
    std::vector<char> ran_sparse(static_cast<std::size_t>(c.num_layers), 0);
    const cuda::Path path = engine_path();
    // At one row (fuse_norms) the attention's norm runs inside its projection (rmsnorm_project),
    // which reads x + the FFN's output without storing it: that add is the next add_rmsnorm's
    // `first`, so the FFN writes to ffn_out_, which the attention output projection (into tmp)
    // leaves alone. On a planned step the norm before the FFN goes into the FFN's step too
    // (FfnLayer::run_step with a ResidualNorm). The same sums in the same order either way.
    // A planned one-token step whose layer runs the one-token FFN kernels may take the FFN's output
    // as a fixed-point sum (RuntimeTuning::fixed_point_decode; FfnLayer::FixedPointOut): no down
    // kernel. Then x is stored by the next layer's attention output projection (its GEMV's
    // residual add: x ← (x + y) + o, the same sums in the same order), the FFN normalises x as
    // stored, and the next QKV reads x + bf16(y) from the accumulator (the last layer:
    // residual_add_fixed). All or nothing: only on a step whose every layer's plan takes it (a
    // step of mixed plans runs the two-kernel FFN throughout), so the chain never switches kinds
    // mid-step.
    const bool fuse = fuse_norms(T);
    bf16_t* ffn_y = fuse ? ffn_out_.get() : tmp;
    const bf16_t* pending = nullptr;  // fused: an FFN output not yet added to x
    bool pending_fixed = false;       // ... that output as the fixed-point sum in ffn_fixed_
    bool fixed = fuse && plans && fixed_decode_;  // this step's FFNs give fixed-point sums
    for (std::size_t l = 0; fixed && l < layers_.size(); ++l)
      fixed = layers_[l].ffn && layers_[l].ffn->folds_fixed_point((*plans)[l]);
    if (!fuse) cuda::ops::rmsnorm(x, nullptr, T, K, layers_[0].attn_norm.get(), eps, xn, stream_);
    for (std::int64_t l = 0; l < c.num_layers; ++l) {
      Layer& L = layers_[static_cast<std::size_t>(l)];
      if (fuse) {  // norm, QKV, RoPE and the cache store in one kernel
        cuda::ops::RopeStore rope;
        rope.rows_kv = rows_.get();
        rope.layer = l;
        rope.heads = static_cast<int>(c.num_heads);
        rope.kv_heads = static_cast<int>(c.num_kv_heads);
        rope.d = static_cast<int>(c.head_dim);
        rope.cos = cos_.get();
        rope.sin = sin_.get();
        rope.k_in_place = false;
        if (pending_fixed)
          cuda::ops::rmsnorm_project(x, ffn_fixed_.get(), K, L.attn_norm.get(), eps, L.wqkv.get(), Q + 2 * KV, qkv, stream_,
                                     &rope);
        else
          cuda::ops::rmsnorm_project(x, pending, K, L.attn_norm.get(), eps, L.wqkv.get(), Q + 2 * KV, qkv, stream_, &rope);
      } else {
        project(L.wqkv.get(), xn, T, Q + 2 * KV, K, qkv);
        cuda::ops::rope_store_kv(qkv, T, c.num_heads, c.num_kv_heads, c.head_dim, cos_.get(), sin_.get(), rows_.get(), l,
                                 stream_, /*k_in_place=*/false);
      }
      cuda::ops::attention(qkv, T, c.num_heads, c.num_kv_heads, c.head_dim, rows_.get(), l, sh.max_keys, att, stream_,
                           /*one_token=*/true, c.sliding_window, attention_grouped_min_rows());
      const StepPlan* plan = L.ffn && plans ? &(*plans)[static_cast<std::size_t>(l)] : nullptr;
      if (fixed)  // the projection's GEMV adds the pending FFN output and o into x
        cuda::launch_twell_gemv_row_residual(att, L.wo.get(), K, Q, tmp, x, pending_fixed ? ffn_fixed_.get() : nullptr,
                                             stream_, /*w_before_wait=*/true);
      else
        project(L.wo.get(), att, T, K, Q, tmp);
      if (fixed) {
        cuda::FfnLayer::ResidualNorm in;  // x is current
        in.r = x;
        in.w = L.ffn_norm.get();
        in.eps = eps;
        L.ffn->run_step(in, cuda::FfnLayer::FixedPointOut{ffn_fixed_.get(), fixed_overflow_dev_}, *plan, stream_);
        ran_sparse[static_cast<std::size_t>(l)] = 1;
      } else if (fuse && plan) {
        // The add + norm before the FFN inside the layer's planned step: the one-token kernels fold
        // it in (each CTA normalises, the down kernel stores x); other plans run add_rmsnorm into
        // xn first. ffn_y may alias `pending` (it does: the same buffer every layer).
        cuda::FfnLayer::ResidualNorm in;
        in.r = x;
        in.first = tw(pending);
        in.delta = tw(tmp);
        in.w = L.ffn_norm.get();
        in.eps = eps;
        L.ffn->run_step(in, tw(xn), tw(ffn_y), *plan, stream_);
        ran_sparse[static_cast<std::size_t>(l)] = plan->sparse;
      } else {
        cuda::ops::add_rmsnorm(x, tmp, T, K, L.ffn_norm.get(), eps, xn, stream_, pending);
        if (plan) {  // the layer's planned step (FfnLayer::run_step: capturable)
          L.ffn->run_step(tw(xn), tw(ffn_y), *plan, stream_);
          ran_sparse[static_cast<std::size_t>(l)] = plan->sparse;
        } else if (L.ffn) {
          L.ffn->forward(tw(xn), T, tw(ffn_y), path, stream_);
          ran_sparse[static_cast<std::size_t>(l)] = L.ffn->last_sparse();
        } else {
          dense_ffn(L.w_gu.get(), L.w_down.get(), xn, T, ffn_y);
        }
      }
      pending = nullptr;
      pending_fixed = false;
      if (fixed && l + 1 < c.num_layers)
        pending_fixed = true;
      else if (fixed)
        cuda::ops::residual_add_fixed(x, ffn_fixed_.get(), K, stream_);
      else if (fuse && l + 1 < c.num_layers)
        pending = ffn_y;
      else if (l + 1 < c.num_layers)
        cuda::ops::add_rmsnorm(x, ffn_y, T, K, layers_[static_cast<std::size_t>(l + 1)].attn_norm.get(), eps, xn, stream_);
      else
        cuda::ops::residual_add(x, ffn_y, T * K, stream_);
    }
    enqueue_head(sh.R);
    return ran_sparse;
  }

  // What both loops do first: every scratch buffer sized for the call, the token embeddings into x.
  float* begin_forward(const Shape& sh) {
    const LlamaConfig& c = model_->config;
    reserve_scratch(sh);
    cuda::ops::embedding(ids_.get(), sh.T, embed_.get(), c.hidden_size, x_.get(), stream_);
    return x_.get();
  }

  // A non-ReLU layer's FFN (the runtime's own: no engine): [g | u] = x·[Wg; Wu]ᵀ (w_gu [2N, K]),
  // h = act(g) ⊙ u, y = h·Wdᵀ (w_down [K, N]), for T rows of xn. One row: both products on the
  // decode GEMV where their K fits it, h formed in the first one's epilogue (the ReLU engine's
  // dense path does the same, CallShape::token_gemv), else cuBLASLt and ops::gated_product.
  void dense_ffn(const bf16_t* w_gu, const bf16_t* w_down, const bf16_t* xn, std::int64_t T, bf16_t* y) {
    const LlamaConfig& c = model_->config;
    const std::int64_t K = c.hidden_size, N = c.intermediate_size;
    if (T == 1 && cuda::gemv_takes_k(K)) {
      // One row: [g | u] and h = act(g) ⊙ u from the one-token GEMV, its epilogue forming each
      // neuron's product once (TwellGemvParams::h: gated_product's bits, no kernel of its own).
      cuda::TwellGemvParams p = cuda::gemv_gated_row(xn, w_gu, N, N, K, gu_.get(), h_.get(), static_cast<int>(c.act));
      p.w_before_wait = true;  // the model's weights
      cuda::launch_twell_gemv(p, stream_);
    } else {
      gemm_.run({T, 2 * N, K, K, K, 2 * N}, w_gu, xn, gu_.get(), stream_);
      cuda::ops::gated_product(gu_.get(), gu_.get() + N, 2 * N, h_.get(), N, T, N, static_cast<int>(c.act), stream_);
    }
    if (T == 1)
      project(w_down, h_.get(), T, K, N, y);
    else
      gemm_.run({T, K, N, N, N, K}, w_down, h_.get(), y, stream_);
  }

  // The final norm of the R selected rows of x, then their logits [R, V] (fp32).
  void enqueue_head(std::int64_t R) {
    const LlamaConfig& c = model_->config;
    const std::int64_t K = c.hidden_size, V = c.vocab_size;
    cuda::ops::rmsnorm(x_.get(), sel_.get(), R, K, final_norm_.get(), static_cast<float>(c.rms_eps), xs_.get(), stream_);
    const bf16_t* head = head_.size() ? head_.get() : embed_.get();
    if (R == 1 && cuda::gemv_takes_k(K)) {
      // One row's logits: the GEMV streams the [V, K] head near the bandwidth (cuBLASLt's M = 1
      // tiles read it at ≈ 1.8 TB/s on an H100); fp32 sums, not rounded, as cuBLASLt's fp32 output.
      // From 2 rows cuBLASLt's tiles read the 2B head (131 MB) at 3.8–3.9 TB/s, the tensor-core
      // GEMV at 3.1–3.9 (H200, lab/probes/probe_gemv.cu, bench/results/2026-11-29-h200-probe-gemv-4b0c082.txt).
      cuda::launch_twell_gemv_f32(xs_.get(), R, head, V, K, logits_.get(), stream_);
      return;
    }
    cuda::MatmulShape ms;
    ms.trans_b = true;
    ms.m = R;
    ms.n = V;
    ms.k = K;
    ms.lda = K;
    ms.ldb = K;
    ms.ldc = V;
    ms.c_fp32 = true;
    gemm_.matmul(ms, xs_.get(), head, logits_.get(), stream_);
  }

  // Whether a forward of T rows runs each attention's norm inside its QKV projection
  // (RuntimeTuning::fused_decode, one row: the decode GEMV's condition, which rmsnorm_project shares).
  bool fuse_norms(std::int64_t T) const {
    const std::int64_t K = model_->config.hidden_size;
    return fused_decode_ && T == 1 && cuda::gemv_takes_k(K);
  }

  // Whether T rows' attention projections run on the decode GEMV (ops/gemv.hpp: one token on CUDA
  // cores, 2–16 on tensor cores) rather than cuBLASLt (RuntimeTuning::batched_gemv above one row).
  // At 2–8 rows it reads the 2B QKV at 2.9–3.0 TB/s against cuBLASLt's 2.7–2.8 and the attention
  // output at 2.0–2.2 against 1.4; at 16 the QKV 1.7 µs slower, the output 3.9 µs faster (H200,
  // bench/results/2026-11-29-h200-probe-gemv-4b0c082.txt).
  bool gemv_rows(std::int64_t T) const { return T == 1 || (T <= cuda::kGemvMaxRows && tuning_.batched_gemv); }

  // y[T, n] = x[T, k]·Wᵀ, W [n, k] bf16, all rows contiguous. Decode sizes: the decode GEMV
  // (cuBLASLt's M = 1 tiles read the 2B model's attention output projection, 8 MB, at 1.1 TB/s on
  // an H100 and its QKV at 2.0; its M = 8 tiles 1.4 and 2.8 TB/s on an H200); more rows: cuBLASLt.
  // Both accumulate in fp32 and round to bf16 once.
  void project(const bf16_t* w, const bf16_t* x, std::int64_t T, std::int64_t n, std::int64_t k, bf16_t* y) {
    if (gemv_rows(T) && cuda::gemv_takes_k(k)) {
      cuda::TwellGemvParams p = cuda::gemv_rows(x, T, w, n, k);
      p.g = y;
      p.w_before_wait = true;  // the model's weights
      cuda::launch_twell_gemv(p, stream_);
      return;
    }
    gemm_.run({T, n, k, k, k, n}, w, x, y, stream_);
  }

  // ---- Decode steps: planned, then replayed from CUDA graphs or launched eagerly ----
  // A decode step of T rows follows one schedule with graphs on or off, so that both give the same
  // logits bit for bit and a seeded run repeats: the first step of a (T, keys bucket) shape, and
  // one step in kReplanPeriod, run the engine's own dispatch (it counts non-zeros then, so that a
  // layer whose density moves past decode_max_density changes path; both paths are exact, a late
  // switch costs speed only); every other step runs each ReLU layer's path as planned from that
  // count (FfnLayer::plan_step: the decode kernels, or the dense FFN once measured dense; steps of
  // more rows than decode sizes, up to the engine's dispatch minimum, run the plain dense FFN). The count has come back by
  // then: every forward ends with the host reading its logits. With graphs, the step replays the
  // graph captured for its shape while every plan, weights (weights_epoch) and scratch address
  // are those it was captured with; otherwise it captures again. The attention kernel reads each
  // row's length from rows_; max_keys (a power of two ≥ 256) only sizes its shared memory.
  static constexpr std::int64_t kReplanPeriod = 64;
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    std::vector<StepPlan> plans;
    std::vector<const void*> addresses;
    std::vector<std::uint64_t> epochs;  // each ReLU layer's weights_epoch() at capture
    Graph() = default;
    Graph(const Graph&) = delete;
    Graph& operator=(const Graph&) = delete;
    ~Graph() {
      if (exec) cudaGraphExecDestroy(exec);
    }
  };

  // RuntimeOptions::ffn_path as the FFN engine names it.
  cuda::Path engine_path() const noexcept {
    return opt_.ffn_path == FfnPath::dense    ? cuda::Path::dense
           : opt_.ffn_path == FfnPath::sparse ? cuda::Path::sparse
                                              : cuda::Path::automatic;
  }

  // Each ReLU layer's step of T rows as FfnLayer::plan_step plans it now (SiLU layers: unused
  // entries); false where a layer's cannot be captured (a forced sparse path, or automatic at
  // prefill sizes: their dispatch reads the layer's statistics, which a replay would freeze).
  bool plan_steps(std::int64_t T, std::vector<StepPlan>& plans) {
    const cuda::Path path = engine_path();
    plans.assign(layers_.size(), StepPlan{});
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      if (!layers_[l].ffn) continue;
      plans[l] = layers_[l].ffn->plan_step(T, path);
      if (!plans[l].capturable) return false;
    }
    return true;
  }

  // The FFN engine moves a layer's weights when it splits hot neurons off (a call of ≥ 2048 rows,
  // e.g. a long prefill, calibrates them): a graph captured before must not replay after.
  std::vector<std::uint64_t> weight_epochs() const {
    std::vector<std::uint64_t> e;
    for (const Layer& L : layers_) e.push_back(L.ffn ? L.ffn->weights_epoch() : 0);
    return e;
  }

  std::vector<const void*> scratch_addresses() const {
    std::vector<const void*> a = {x_.get(), xn_.get(), qkv_.get(), att_.get(), tmp_.get(), ffn_out_.get(), xs_.get(),
                                  logits_.get(), gu_.get(), h_.get(), ids_.get(), rows_.get(), sel_.get()};
    const std::vector<const void*> ffn = infer_ws_.step_addresses();  // the layers' run_step scratch
    a.insert(a.end(), ffn.begin(), ffn.end());
    return a;
  }

  std::vector<char> run_decode(Shape sh, const std::vector<StepPlan>& plans) {
    const std::int64_t limit = max_keys_;
    std::int64_t bucket = 256;
    while (bucket < sh.max_keys) bucket *= 2;
    sh.max_keys = std::min(bucket, limit);
    const auto key = std::make_pair(sh.T, sh.max_keys);
    auto it = graphs_.find(key);
    if (it == graphs_.end() || ++decode_steps_ % kReplanPeriod == 0) {
      if (it == graphs_.end()) graphs_.emplace(key, std::make_unique<Graph>());  // next time: planned
      return enqueue_decode(sh, nullptr);
    }
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      if (!layers_[l].ffn) continue;
      // The one-token FFN kernels' neuron order, most active first, on the engine's schedule:
      // counted here, outside any graph (the counted steps above, forward()'s own, count themselves).
      // Only steps that run those kernels count, as in forward(): a layer planned dense counts no
      // activations, and its reorders (38 serial one-CTA kernels, ≈ 0.3 ms at the 2B's due steps)
      // would be spent on the same counts. A layer's new weights (a long prefill's hot split)
      // restart it.
      if (sh.T == 1 && plans[l].sparse) layers_[l].ffn->advance_decode_order(stream_);
      layers_[l].ffn->prepare_step(plans[l], stream_);
    }
    reserve_scratch(sh);
    if (!tuning_.cuda_graphs || graphs_failed_) return enqueue_decode(sh, &plans);
    Graph& g = *it->second;
    if (!g.exec || g.plans != plans || g.addresses != scratch_addresses() || g.epochs != weight_epochs()) {
      if (g.exec) TWELL_CUDA_CHECK(cudaGraphExecDestroy(std::exchange(g.exec, nullptr)));
      if (!capture(sh, plans, g)) return enqueue_decode(sh, &plans);
    }
    TWELL_CUDA_CHECK(cudaGraphLaunch(g.exec, stream_));
    ++graph_launches_;
    std::vector<char> ran_sparse(layers_.size(), 0);
    for (std::size_t l = 0; l < layers_.size(); ++l) ran_sparse[l] = layers_[l].ffn && plans[l].sparse;
    return ran_sparse;
  }

  // Captures the decode forward of `sh` under `plans` into g; false (graphs off from now on, with a
  // note on stderr) if the driver refuses the capture.
  bool capture(const Shape& sh, const std::vector<StepPlan>& plans, Graph& g) {
    cudaGraph_t graph = nullptr;
    TWELL_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      enqueue_decode(sh, &plans);
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    if (e == cudaSuccess) {
      e = cudaGraphInstantiate(&g.exec, graph, 0);
      cudaGraphDestroy(graph);
    }
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      graphs_failed_ = true;
      fmt::print(stderr, "twell: CUDA graph capture failed ({}); decode steps run without graphs\n",
                 cudaGetErrorString(e));
      return false;
    }
    g.plans = plans;
    g.addresses = scratch_addresses();
    g.epochs = weight_epochs();
    return true;
  }

  struct Layer {
    DeviceBuffer<float> attn_norm, ffn_norm;  // [K]
    DeviceBuffer<bf16_t> wqkv;                // [Q + 2·KV, K]
    DeviceBuffer<bf16_t> wo;                  // [K, Q]
    std::unique_ptr<cuda::FfnLayer> ffn;      // ReLU: the FFN engine's layer (the public API)
    DeviceBuffer<bf16_t> w_gu;                // other activations: [Wg; Wu] as [2N, K]
    DeviceBuffer<bf16_t> w_down;              // [K, N]
  };
  const Model* model_;
  RuntimeOptions opt_;
  RuntimeTuning tuning_;
  mutable std::vector<FfnLayerStats> stats_;  // ffn_stats() folds in the engine's newest measures
  std::string device_;  // initialised first of the GPU members: no stream or handle without a device
  NvmlEnergy energy_{pci_bus_id()};
  cuda::OwnedStream owned_stream_;  // non-blocking; outlives the layers' contexts declared below
  cudaStream_t stream_ = owned_stream_.get();
  // One scratch for every layer's FFN (sized by the largest call, not by the layer count); its
  // cuBLASLt handle and workspace serve the runtime's own GEMMs too (one stream: never concurrent).
  cuda::InferWorkspace infer_ws_;
  cuda::LtGemm& gemm_ = infer_ws_.gemm();
  DeviceBuffer<bf16_t> embed_, head_;
  DeviceBuffer<float> final_norm_, cos_, sin_;
  std::vector<Layer> layers_;
  // scratch, grown to the largest call
  DeviceBuffer<std::int32_t> ids_, sel_, argmax_;
  DeviceBuffer<std::int32_t> top_hist_, top_id_, top_bad_;  // forward_top's histories and candidates
  DeviceBuffer<std::int64_t> top_hist_off_;
  DeviceBuffer<float> top_z_;
  DeviceBuffer<double> draws_;  // forward_sample's r
  std::int64_t rows_total_ = 0;  // token rows of the last run
  DeviceBuffer<cuda::ops::RowKv> rows_;
  DeviceBuffer<cuda::ops::FlashBlock> blocks_;
  DeviceBuffer<float> x_, logits_;
  DeviceBuffer<bf16_t> xn_, qkv_, att_, tmp_, gu_, h_, xs_;
  DeviceBuffer<bf16_t> ffn_out_;  // one-row forwards: the FFN's output until the next layer adds it
  std::map<std::pair<std::int64_t, std::int64_t>, std::unique_ptr<Graph>> graphs_;  // (rows, keys bucket)
  std::int64_t decode_steps_ = 0, graph_launches_ = 0;
  std::int64_t max_keys_ = 0;  // keys the decode attention takes on this device at this head_dim
  bool graphs_failed_ = false;
  bool programmatic_ = false;  // RuntimeTuning::programmatic_launch, on a device that takes it
  int carveout_ = -1;          // RuntimeTuning::smem_carveout (< 0: none asked)
  bool fused_decode_ = false;  // RuntimeTuning::fused_decode
  // RuntimeTuning::fixed_point_decode where the model allows it; off for good once a step's sum
  // overflowed (unless_fixed_overflow).
  bool fixed_decode_ = false;
  DeviceBuffer<std::int64_t> ffn_fixed_;              // [K] the one-token FFN's fixed-point output, zero between uses
  cuda::PinnedBuffer<unsigned> fixed_overflow_;       // its overflow flag (the device raises it, the host reads it)
  unsigned* fixed_overflow_dev_ = nullptr;            // the flag's device address
  std::vector<std::int64_t> seq_row0_, seq_len_;  // a fresh prefill's sequences (first row, rows)
  std::string cudnn_why_;                         // why cuDNN's attention is not used, if not
#if TWELL_HAVE_CUDNN
  std::unique_ptr<CudnnAttention> cudnn_;
  bool has_cudnn() const noexcept { return cudnn_ != nullptr; }
  // Whether this fresh prefill (seq_row0_ / seq_len_) takes cuDNN (CudnnAttention::wanted): its
  // own-kernel attention, Σ 2·len²·q_dim a layer causal at ≈ 20 TFLOP/s, past 1e13 FLOP (≈ 0.5 s)
  // pays for a graph build at once.
  bool cudnn_wanted() {
    double flop = 0;
    for (const std::int64_t n : seq_len_) flop += 2.0 * static_cast<double>(n) * static_cast<double>(n);
    flop *= static_cast<double>(model_->config.q_dim()) * static_cast<double>(model_->config.num_layers);
    return cudnn_->wanted(seq_row0_, seq_len_, tuning_.cudnn_build_at, flop >= 1e13);
  }
  bool run_cudnn(const bf16_t* qkv, bf16_t* att) {
    return cudnn_->run(qkv, seq_row0_, seq_len_, att, stream_);
  }
#else
  bool has_cudnn() const noexcept { return false; }
  bool cudnn_wanted() { return false; }
  bool run_cudnn(const bf16_t*, bf16_t*) { return false; }
#endif
};

std::unique_ptr<Runtime> make_cuda_runtime(const Model& model, RuntimeOptions opt, const RuntimeTuning& tuning) {
  return std::make_unique<CudaRuntime>(model, opt, tuning);
}

}  // namespace twell::model
