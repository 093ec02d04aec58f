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
#include "twell/model/model.hpp"
#include "twell/model/sampler.hpp"

namespace twell::model {

// One sequence's state in a runtime (its KV cache): made by Runtime::new_sequence, used only with
// the runtime that made it.
class Sequence {
 public:
  virtual ~Sequence() = default;
  std::int64_t length() const noexcept { return length_; }      // tokens the cache holds
  std::int64_t capacity() const noexcept { return capacity_; }  // tokens it can hold
  virtual std::int64_t bytes() const noexcept = 0;               // memory of its cache
  void clear() noexcept { length_ = 0; }

 protected:
  std::int64_t length_ = 0, capacity_ = 0;
  friend class CpuRuntime;
  friend class CudaRuntime;
};

enum class FfnPath { automatic, dense, sparse };
const char* to_string(FfnPath p) noexcept;

// The CPU FFN's sparse path ran 1.2× dense at 10 % density (M = 64 and 512), 1.04× / 0.93× at 15 %
// and 2.3× at M = 1 (2B layer shape, 2 cores, bench/results/2026-11-25-cpu-2core-ffn-crossover-*).
inline constexpr double kCpuMaxSparseDensity = 0.10;

struct RuntimeOptions {
  RuntimeOptions() = default;
  RuntimeOptions(FfnPath path, double max_density = kCpuMaxSparseDensity) : ffn_path(path), max_sparse_density(max_density) {}
  FfnPath ffn_path = FfnPath::automatic;  // automatic: sparse for ReLU layers measured sparse enough
  // CPU runtime: a ReLU layer runs the TwELL path while its latest measured density is at most
  // this (the GPU's engine dispatches by its own measured thresholds).
  double max_sparse_density = kCpuMaxSparseDensity;
  // CUDA runtime only: decode steps (one token per sequence; ReLU models under the automatic path:
  // up to 2047 sequences, where the FFN engine's dispatch needs no statistics) replay a captured
  // CUDA graph of the whole forward instead of launching ~10 kernels per layer.
  // Bit-identical to the launches; off for A/B measurement.
  bool cuda_graphs = true;
  // CUDA runtime only: prefill calls whose every sequence starts empty run their attention through
  // cuDNN's fused SDPA where this build has cuDNN (see prefill_attention()); off: the runtime's
  // own tensor-core kernel always (for A/B measurement and checks).
  bool cudnn_attention = true;
  // CUDA runtime only: cuDNN builds a graph per prefill shape (sequence count, longest length's
  // bucket), 0.2–1.7 s each on an H100. A shape's prefills run the runtime's own kernel until its
  // `cudnn_build_at`-th call, which builds the graph (1: at the first; a call whose attention would
  // keep the own kernel busy ≈ 0.5 s or more builds at once). Default 2: a one-off prompt answers in
  // milliseconds, a shape that recurs (a server, a benchmark's repetitions) gets cuDNN.
  int cudnn_build_at = 2;
  // CUDA runtime only: the runtime's own kernels (norms, RoPE, attention, the one-token
  // projections, embedding, argmax) as programmatic dependent launches on Hopper — each may be
  // scheduled while the one before it still runs and waits for it on the device — to hide launch
  // latency between the ≈ 10 small kernels a layer of a decode step runs. Same results, bit for
  // bit; 2B decode at batch 1 +6.6 % on an H100 (docs/model-runtime.md). Off: for A/B measurement.
  bool programmatic_launch = true;
  // CUDA runtime only: at one row (a batch-1 decode step) the attention's add + RMSNorm, QKV
  // projection, RoPE and KV-cache store run as one kernel (cuda::ops::rmsnorm_project) and the FFN's
  // residual add joins the next add + RMSNorm: 2 kernels fewer a layer, the same bits; 2B decode at
  // batch 1 +3.4-3.8 % on an H100 (docs/model-runtime.md). Off: for A/B measurement.
  bool fused_decode = true;
  // CUDA runtime only, with fused_decode: a batch-1 decode step's ReLU FFN on the one-token kernels
  // leaves its output as a fixed-point sum (int64 reductions, exact in any order, rounded to bf16
  // by its readers) instead of running its down kernel, and the attention output projection after
  // it stores the residual stream: one kernel fewer a layer (docs/model-runtime.md). Deterministic;
  // not the two-kernel path's bits (another summation of the same products, exact before the bf16
  // rounding). A term past the range (cuda/common/fixed_point.hpp) reruns the step the two-kernel
  // way and turns this off. Off: for A/B measurement.
  bool fixed_point_decode = true;
  // CUDA runtime only: the one-token FFN kernels run their neurons most active first, as counted
  // over the decode steps so far (cuda::FfnLayer::advance_decode_order), so that the active ones'
  // work overlaps the gate's stream instead of trailing it. A schedule: the same bits either way.
  // Off: for A/B measurement.
  bool decode_neuron_order = true;
  // CUDA runtime only: the density up to which a ReLU layer's decode steps run the sparse decode
  // kernels (the layer's newest count decides; both paths exact); < 0: the engine's measured default.
  double decode_max_density = -1;
  // CUDA runtime only: steps of up to this many rows run as decode steps (the decode kernels while
  // a layer's count allows); < 0: the engine's default (16). For measuring batched decode.
  std::int64_t decode_max_rows = -1;
  // CPU runtime only: the weight matrices whose values are all bf16 exactly (a bf16 checkpoint) are
  // also kept as bf16, and steps of ≤ 8 rows (decode) read those — half the bytes of the fp32 copy
  // that bounds a CPU decode step; the same products in fp32 sums (another order than OpenBLAS's).
  // Costs half the weights' memory again. Only without an ffn_input_hook (a hook may change the
  // weights); off: fp32 everywhere.
  bool cpu_bf16_weights = true;
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
  // Forward calls replayed from a captured CUDA graph (RuntimeOptions::cuda_graphs); 0 on the CPU.
  virtual std::int64_t graph_launches() const noexcept { return 0; }
  // The runtime's GPU's energy counter in joules (NVML; monotonic, so take differences), or −1
  // where it cannot be read (the CPU, no NVML, a GPU without the counter).
  virtual double device_energy_joules() const { return -1; }
  // Which kernel runs prefill attention, for reports (e.g. "cuDNN SDPA 91400 for prefills from
  // position 0, else twell's tensor-core kernel").
  virtual std::string prefill_attention() const { return "twell (CPU loops)"; }
  // Whether RuntimeOptions::programmatic_launch is in effect (asked for, and the device takes it).
  virtual bool programmatic_launch() const noexcept { return false; }
  // Whether RuntimeOptions::fused_decode is in effect.
  virtual bool fused_decode() const noexcept { return false; }
  // Whether RuntimeOptions::fixed_point_decode is in effect (false once a step overflowed it).
  virtual bool fixed_point_decode() const noexcept { return false; }
  // How the weights are held, for reports ("" where there is nothing to say).
  virtual std::string weight_storage() const { return ""; }
};

class CpuRuntime final : public Runtime {
 public:
  explicit CpuRuntime(const Model& model, RuntimeOptions opt = {});
  const Model& model() const noexcept override { return *model_; }
  std::string device() const override { return "cpu"; }
  std::unique_ptr<Sequence> new_sequence(std::int64_t capacity) override;
  std::vector<float> forward(std::span<const SeqStep> steps, bool all_positions = false) override;
  const std::vector<FfnLayerStats>& ffn_stats() const noexcept override { return stats_; }
  void reset_stats() override;
  std::string weight_storage() const override;

 private:
  void ffn(std::int64_t layer, const float* x, std::int64_t rows, float* y);
  // y [rows, n] = x [rows, k] · Wᵀ, W [n, k]: through w16 (its bf16 copy, when it has one) at
  // decode sizes, else OpenBLAS on the fp32 w.
  void project(const float* x, std::int64_t rows, const std::vector<float>& w, const std::vector<std::uint16_t>& w16,
               std::int64_t n, std::int64_t k, float* y) const;
  const Model* model_;
  RuntimeOptions opt_;
  std::vector<FfnLayerStats> stats_;
  // RuntimeOptions::cpu_bf16_weights: each matrix's bf16 copy, empty where it has none.
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
// machine has no usable GPU).
std::unique_ptr<Runtime> make_runtime(const Model& model, const std::string& device, RuntimeOptions opt = {});

}  // namespace twell::model
