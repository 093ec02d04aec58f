#pragma once
// The Llama forward on the CPU: OpenBLAS for the projections, twell's CPU FFN ops for the
// ReLU-gated FFN (TwELL sparse path or dense path, chosen per layer from its measured density),
// a KV cache per sequence, batches of sequences of different lengths.
//
// Precision: fp32 storage and accumulation throughout; on the sparse FFN path the gate values are
// held in TwELL as bf16 (DESIGN §2), so a sparse layer's h carries one bf16 rounding of g.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "twell/cpu/ffn_ops.hpp"
#include "twell/model/step_bytes.hpp"
#include "twell/model/model.hpp"
#include "twell/model/sampler.hpp"
#include "twell/model/tuning.hpp"

namespace twell::model {

// One sequence's state in a runtime (its KV cache): made by Runtime::new_sequence, used only with
// the runtime that made it.
class Sequence {
 public:
  virtual ~Sequence() = default;
  std::int64_t length() const noexcept { return length_; }      // tokens the cache holds
  std::int64_t capacity() const noexcept { return capacity_; }  // tokens it can hold now
  virtual std::int64_t bytes() const noexcept = 0;               // memory of its cache
  // Empties the sequence (a paged one gives its blocks back: they may be shared).
  virtual void clear() { length_ = 0; }
  // Room for `tokens` more tokens. A paged sequence (Runtime::new_paged_sequence) takes the blocks
  // they need from its pool and grows its capacity; false, taking none, when the pool has too few
  // free blocks or the model's context would be passed. A sequence of fixed capacity: whether it
  // has the room. forward() never takes blocks: reserve first.
  virtual bool reserve(std::int64_t tokens) { return tokens >= 0 && length_ + tokens <= capacity_; }
  // KV blocks this sequence holds (0 for a sequence of fixed capacity); they go back to the pool
  // when the sequence is destroyed.
  virtual std::int64_t blocks() const noexcept { return 0; }

 protected:
  std::int64_t length_ = 0, capacity_ = 0;
  friend class CpuRuntime;
  friend class CudaRuntime;
};

// The paged KV cache: fixed-size blocks of kKvBlockTokens positions (every layer's keys and values
// of those positions), all from one pool per runtime, a block table per sequence. A sequence holds
// only the blocks of the tokens written so far, so sequences of mixed lengths share one memory
// budget instead of each reserving its maximum.
inline constexpr std::int64_t kKvBlockTokens = 16;

class KvPool {
 public:
  virtual ~KvPool() = default;
  virtual std::int64_t total_blocks() const noexcept = 0;
  // Blocks a sequence can take: the free ones and the cached ones (published blocks of finished
  // sequences, kept for the next prompt that starts with their tokens until their memory is needed).
  virtual std::int64_t free_blocks() const noexcept = 0;
  virtual std::int64_t cached_blocks() const noexcept = 0;  // of free_blocks(), the cached ones
  virtual std::int64_t block_bytes() const noexcept = 0;  // one block's keys and values, every layer
  static constexpr std::int64_t blocks_for(std::int64_t tokens) noexcept {
    return (tokens + kKvBlockTokens - 1) / kKvBlockTokens;
  }
};

enum class FfnPath { automatic, dense, sparse };
const char* to_string(FfnPath p) noexcept;

// The CPU FFN's sparse path ran 1.2× dense at 10 % density (M = 64 and 512), 1.04× / 0.93× at 15 %
// and 2.3× at M = 1 (2B layer shape, 2 cores, bench/results/2026-11-25-cpu-2core-ffn-crossover-*).
inline constexpr double kCpuMaxSparseDensity = 0.10;

// The user's choices for a runtime. The A/B switches of its optimizations are not among them: they
// are a RuntimeTuning (twell/model/tuning.hpp; TWELL_TUNING in the environment), passed beside.
struct RuntimeOptions {
  RuntimeOptions() = default;
  RuntimeOptions(FfnPath path, double max_density = kCpuMaxSparseDensity) : ffn_path(path), max_sparse_density(max_density) {}
  FfnPath ffn_path = FfnPath::automatic;  // automatic: sparse for ReLU layers measured sparse enough
  // CPU runtime: a ReLU layer runs the TwELL path while its latest measured density is at most
  // this (the GPU's engine dispatches by its own measured thresholds).
  double max_sparse_density = kCpuMaxSparseDensity;
  // CPU runtime only: called with each layer's FFN input (RMSNorm'd, [rows, K]) before its FFN
  // runs; for capturing activations (telemetry) or calibrating: the hook may change that layer's
  // weights in the Model (not their shapes), and its FFN then runs on the changed ones (synthetic
  // models set their gate biases so). May throw to stop the forward (no sequence changes then).
  std::function<void(std::int64_t layer, CMatrixF ffn_input)> ffn_input_hook;
};

// What each layer's FFN did, summed over calls.
struct FfnLayerStats {
  std::int64_t rows = 0;          // token rows
  std::int64_t active = 0;        // non-zeros of h summed over the calls (ReLU layers); −1: not summed (GPU)
  std::int64_t sparse_rows = 0;   // rows that ran the TwELL path
  std::int64_t overflow_rows = 0; // rows whose tiles overflowed TwELL (exact through the backup)
  // Latest measured active / (rows · N); −1: none yet. CPU: the latest call's, exactly. GPU: the
  // newest count the FFN engine's dispatch has read back (it trails the calls; exact over the rows
  // it counted: a TwELL or decode call's, or a dense call's sample of rows; where hot neurons are
  // split off, a TwELL or dense call's count covers the cold ones only, a decode call's all of
  // them), with active not summed (−1).
  double last_density = -1;
  // Non-zeros per token over all calls; −1: not measured, or not summed (the GPU runtime sums no
  // counts: read last_density there).
  double active_per_token() const noexcept;
};

// One sequence's part of a forward call: its tokens are appended to its cache.
struct SeqStep {
  Sequence* seq = nullptr;
  std::span<const std::int32_t> tokens;
};

// A model on one device. forward() enqueues nothing that outlives it: the logits come back on the host.
class Runtime {
 public:
  virtual ~Runtime() = default;
  virtual const Model& model() const noexcept = 0;
  virtual std::string device() const = 0;  // "cpu", or the GPU's name
  // A sequence whose cache holds up to `capacity` tokens (≤ the model's context).
  virtual std::unique_ptr<Sequence> new_sequence(std::int64_t capacity) = 0;
  // A pool of `blocks` KV blocks, and a sequence that grows from it block by block
  // (Sequence::reserve). The pool lives while any of its sequences does. Prefix sharing: a paged
  // sequence starts holding the pool's published blocks of `prefix`'s first full blocks of
  // kKvBlockTokens tokens (blocks that other sequences of the pool filled with the same tokens from
  // position 0; never all of prefix: at least its last token is left to compute), so its length()
  // starts at the tokens they hold; the caller feeds prefix from there. Its own blocks are published
  // as forward() fills them. Throws
  // ErrorCode::unsupported where the runtime has no paged cache (TWELL_TUNING=no-paged-kv; the GPU
  // runtime for a context longer than its decode attention takes), ErrorCode::invalid_argument where
  // the blocks do not fit the device's free memory (the GPU's pool is allocated whole).
  virtual std::shared_ptr<KvPool> make_kv_pool(std::int64_t blocks);
  virtual std::unique_ptr<Sequence> new_paged_sequence(const std::shared_ptr<KvPool>& pool,
                                                       std::span<const std::int32_t> prefix = {});
  // Runs the model on every step's tokens (appended to its sequence, at positions length()…) and
  // returns logits [rows, V] on the host: one row per step (its last token), or one per token with
  // all_positions. Throws before changing any sequence if a step does not fit its cache, a token
  // id is out of range, or a sequence appears twice or belongs to another runtime.
  virtual std::vector<float> forward(std::span<const SeqStep> steps, bool all_positions = false) = 0;
  // Greedy decoding's forward: the argmax token of each step's last position (lowest id on ties),
  // computed where the logits are (the GPU copies back one id per step instead of V floats).
  virtual std::vector<std::int32_t> forward_argmax(std::span<const SeqStep> steps);
  // Top-k sampling's forward: each step's k best candidates by z, the logits of its last position
  // after the repetition penalty over histories[i] (top_candidates' rule and set), k a step in no
  // particular order, [steps × k]; computed where the logits are (the GPU copies back k candidates
  // a step instead of V floats). 1 ≤ k ≤ V; histories: one per step (read only with a penalty).
  // A non-finite logit is an Error.
  virtual std::vector<Candidate> forward_top(std::span<const SeqStep> steps, std::int64_t k, double repetition_penalty,
                                             std::span<const std::span<const std::int32_t>> histories);
  // Whether forward_sample draws where the logits are (the GPU runtime, at vocabularies its
  // sampling kernel takes); generate then samples every temperature > 0 step through it.
  virtual bool samples_on_device() const noexcept { return false; }
  // A sampled step's forward: each step's token by sample_fixed_point's rule from its last
  // position's logits, histories[i] and the sequence's draw r[i] ∈ [0, 1) (one id a step comes
  // back). temperature > 0. The base implementation copies the logits and applies the rule here.
  virtual std::vector<std::int32_t> forward_sample(std::span<const SeqStep> steps, const SamplingOptions& o,
                                                   std::span<const std::span<const std::int32_t>> histories,
                                                   std::span<const double> r);
  virtual const std::vector<FfnLayerStats>& ffn_stats() const noexcept = 0;
  virtual void reset_stats() = 0;
  // Bytes of device memory in use on the runtime's GPU (the whole device, as cudaMemGetInfo says);
  // −1 on the CPU.
  virtual std::int64_t device_memory_in_use() const { return -1; }
  // Forward calls replayed from a captured CUDA graph (RuntimeTuning::cuda_graphs); 0 on the CPU.
  virtual std::int64_t graph_launches() const noexcept { return 0; }
  // The runtime's GPU's energy counter in joules (NVML; monotonic, so take differences), or −1
  // where it cannot be read (the CPU, no NVML, a GPU without the counter).
  virtual double device_energy_joules() const { return -1; }
  // The bandwidth of a large copy in the memory the runtime's weights live in, measured when called
  // (a few hundred ms; bytes read plus bytes written per second, the median of several copies):
  // the ceiling a decode step's bytes (step_bytes.hpp) are set against. CPU: every core copying its
  // share of host memory; GPU: a device-to-device copy.
  virtual double copy_bandwidth() const;
  // Which kernel runs prefill attention, for reports (e.g. "cuDNN SDPA 91400 for prefills from
  // position 0, else twell's tensor-core kernel").
  virtual std::string prefill_attention() const { return "twell (CPU loops)"; }
  // Whether RuntimeTuning::programmatic_launch is in effect (asked for, and the device takes it).
  virtual bool programmatic_launch() const noexcept { return false; }
  // Whether RuntimeTuning::fused_decode is in effect.
  virtual bool fused_decode() const noexcept { return false; }
  // Whether RuntimeTuning::fixed_point_decode is in effect (false once a step overflowed it).
  virtual bool fixed_point_decode() const noexcept { return false; }
  // How the weights are held, for reports ("" where there is nothing to say).
  virtual std::string weight_storage() const { return ""; }
  // The element sizes a decode step of `rows` rows reads (step_bytes.hpp; batch and KV length left
  // to the caller): bf16 weights and caches here (the GPU runtime).
  virtual StepShape decode_step_shape(std::int64_t rows) const;
};

class CpuRuntime final : public Runtime {
 public:
  // tuning: its cpu_bf16_weights is the one switch the CPU runtime reads.
  explicit CpuRuntime(const Model& model, RuntimeOptions opt = {}, const RuntimeTuning& tuning = RuntimeTuning::from_env());
  const Model& model() const noexcept override { return *model_; }
  std::string device() const override { return "cpu"; }
  std::unique_ptr<Sequence> new_sequence(std::int64_t capacity) override;
  std::shared_ptr<KvPool> make_kv_pool(std::int64_t blocks) override;
  std::unique_ptr<Sequence> new_paged_sequence(const std::shared_ptr<KvPool>& pool,
                                               std::span<const std::int32_t> prefix = {}) override;
  std::vector<float> forward(std::span<const SeqStep> steps, bool all_positions = false) override;
  const std::vector<FfnLayerStats>& ffn_stats() const noexcept override { return stats_; }
  void reset_stats() override;
  std::string weight_storage() const override;
  // fp32 caches; bf16 weights at steps of ≤ cpu::kGemvBf16MaxRows rows where every matrix has its
  // bf16 copy, else fp32; the sparse FFN's up and down rows fp32.
  StepShape decode_step_shape(std::int64_t rows) const override;

 private:
  void ffn(std::int64_t layer, const float* x, std::int64_t rows, float* y);
  // y [rows, n] = x [rows, k] · Wᵀ, W [n, k]: through w16 (its bf16 copy, when it has one) at
  // decode sizes, else OpenBLAS on the fp32 w.
  void project(const float* x, std::int64_t rows, const std::vector<float>& w, const std::vector<std::uint16_t>& w16,
               std::int64_t n, std::int64_t k, float* y) const;
  const Model* model_;
  RuntimeOptions opt_;
  bool bf16_wanted_ = false;  // RuntimeTuning::cpu_bf16_weights, and no ffn_input_hook
  bool paged_kv_ = true;      // RuntimeTuning::paged_kv
  bool prefix_cache_ = true;  // RuntimeTuning::prefix_cache
  std::vector<FfnLayerStats> stats_;
  // RuntimeTuning::cpu_bf16_weights: each matrix's bf16 copy, empty where it has none.
  struct Bf16Layer {
    std::vector<std::uint16_t> wqkv, wo, w_gate, w_up, w_down;
  };
  std::vector<Bf16Layer> bf16_;
  // Each ReLU layer's FFN prepared for the sparse path (views of the model's matrices plus Wdᵀ);
  // empty where the sparse path never runs (the dense path asked, or not ReLU).
  std::vector<cpu::PreparedFfn> prepared_;
  std::vector<std::uint16_t> bf16_head_;
  std::int64_t bf16_matrices_ = 0, matrices_ = 0;
};

// Whether make_runtime(…, "cuda") can run here: a CUDA build and a usable GPU (else why not).
bool cuda_usable(std::string* why = nullptr);

// The runtime for `device`: "cpu", or "cuda" (throws ErrorCode::unsupported where this build or
// machine has no usable GPU). tuning: the A/B switches, by default this process's TWELL_TUNING.
std::unique_ptr<Runtime> make_runtime(const Model& model, const std::string& device, RuntimeOptions opt = {},
                                      const RuntimeTuning& tuning = RuntimeTuning::from_env());

}  // namespace twell::model
