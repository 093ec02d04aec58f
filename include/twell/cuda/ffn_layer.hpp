#pragma once
// The FFN engine as a model runtime, a trainer or a framework binding calls it: one object per
// layer, the caller's device memory and stream, and workspaces that the layers of a device share.
// No CUDA types: a stream travels as an opaque handle (a cudaStream_t), device values as twell::bf16
// / float pointers. Only declared when the library was built with CUDA (TWELL_HAVE_CUDA).
//
// Sharing: layers given the same workspace must run one after another in one stream order (the
// layers of a model do). What a training forward leaves for its backward is the layer's own; the
// workspace holds only what lives within one call. A layer's fp32 gradients (dw_*) stay valid until
// another layer of the same workspace runs a backward: read them (gradients_to) before that.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "twell/bf16.hpp"
#include "twell/cuda/device_allocator.hpp"
#include "twell/cuda/ffn_cuda.hpp"
#include "twell/cuda/weight_type.hpp"
#include "twell/ffn.hpp"

namespace twell::cuda {

class FfnContext;
class LtGemm;
class TrainContext;
struct FfnWorkspace;
struct TrainScratch;

using Stream = void*;  // a cudaStream_t; nullptr: the legacy default stream

// Makes `device` current for the calls in its scope (and restores the previous one).
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

// Device weights in nn.Linear's layouts, row-major, contiguous, all three of one type: w_gate, w_up
// [n, k] (w_gate null: a non-gated FFN), w_down [k, n]. A layer copies them into its kernels' layouts.
struct DeviceWeights {
  const void* w_gate = nullptr;
  const void* w_up = nullptr;
  const void* w_down = nullptr;
  std::int64_t n = 0, k = 0;
  WeightType type = WeightType::bf16;
};

// Per-call workspaces of inference layers (grown to the largest M served, never per layer).
// allocator: where their device memory comes from (see DeviceAllocator; null: cudaMalloc). The
// layers' own memory (weights in the kernels' layouts, dispatch statistics) is cudaMalloc'd.
class InferWorkspace {
 public:
  explicit InferWorkspace(std::shared_ptr<DeviceAllocator> allocator = nullptr);
  std::int64_t bytes() const noexcept;  // device memory held now
  // The cuBLASLt GEMM (handle, plans cached per shape, its workspace) that the layers' GEMMs run
  // on. A caller's own GEMMs issued in the layers' stream order may run on it too: one cuBLASLt
  // handle and workspace per device (a model runtime's projections). Opaque here: the library's
  // own type (src/cuda/dense/lt_gemm.hpp).
  LtGemm& gemm() const noexcept;
  // For shapes not planned yet, on gemm() and the layers' side-stream GEMMs: cuBLASLt's fastest of
  // `candidates` heuristic algorithms, timed on a shape's first use outside a graph capture, for
  // shapes of up to max_rows rows (candidates ≤ 1: the first candidate, the default).
  void set_gemm_autotune(int candidates, std::int64_t max_rows);
  // The device scratch that a layer's run_step reads and writes (see FfnLayer), in a fixed order.
  // It moves when a larger call grows the workspace: a CUDA graph holding run_step of a layer over
  // this workspace must be captured again once these addresses changed.
  std::vector<const void*> step_addresses() const;
  const std::shared_ptr<FfnWorkspace>& get() const noexcept { return set_; }

 private:
  std::shared_ptr<FfnWorkspace> set_;
};

// Workspaces of training layers (the sparse step's gate output, the backward's temporaries, the
// fp32 weight gradients until read, the cuBLASLt handle and workspace). allocator: as InferWorkspace's;
// what a forward saves for its backward is the layer's own (cudaMalloc'd).
class TrainWorkspace {
 public:
  explicit TrainWorkspace(std::shared_ptr<DeviceAllocator> allocator = nullptr);
  std::int64_t bytes() const noexcept;
  const std::shared_ptr<TrainScratch>& get() const noexcept { return set_; }

 private:
  std::shared_ptr<TrainScratch> set_;
};

// What an inference layer's calls did and measured, read on the host without waiting for the GPU.
// Counts come back from the device when their kernels complete (nothing waits for them), so the
// measured fields describe the newest counted call that has completed, which may trail the newest
// call issued. The automatic path counts (its TwELL and decode calls, one dense call in a few);
// forced paths and captured replays count nothing.
struct LayerStats {
  std::int64_t calls = 0;         // forwards issued
  std::int64_t sparse_calls = 0;  // of which ran a sparse path (TwELL or the decode kernel)
  std::int64_t hot_neurons = 0;   // neurons the layer runs dense as hot (its split now)
  // The measure the dispatch follows now (non-zeros / (M · cold neurons), rows the sparse path
  // would run dense weighed at their dense cost; −1: none yet), and the same count's true share of
  // non-zero activations (exact over the rows it counted: a dense call counts a sample of rows).
  double density = -1;
  double active = -1;
  // The newest counted TwELL call's exact counters (−1: none came back yet): its M, the non-zeros of
  // the cold neurons, and the (row, tile) blocks and rows beyond TwELL's width (computed exactly
  // through the fallback: a speed figure, not an error).
  std::int64_t counted_rows = -1, nnz = -1, overflow_tiles = -1, overflow_rows = -1;
  std::string path;  // the last forward()'s path as dispatched (last_path())
};

// One FFN layer for inference: y = FFN(x), exact on every input.
class FfnLayer {
 public:
  explicit FfnLayer(const InferWorkspace* workspace = nullptr);  // null: a workspace of its own
  ~FfnLayer();
  FfnLayer(FfnLayer&&) noexcept;
  FfnLayer& operator=(FfnLayer&&) noexcept;

  void load_weights(const DeviceWeights& w, Stream stream);  // asynchronous; no host round trip
  void upload_weights(const FfnWeights& w, Stream stream);   // from host fp32 (rounded to bf16)
  // x, y: device bf16 [m, k]. Formats no text: last_path() describes the call when asked.
  void forward(const bf16* x, std::int64_t m, bf16* y, Path path, Stream stream);
  bool last_sparse() const noexcept;  // the last forward() ran a sparse path (false before one)
  std::string last_path() const;  // the last forward()'s path as dispatched, human-readable ("" before one)
  LayerStats stats();  // never waits (folds in the counts that have come back)
  std::int64_t n() const noexcept;
  std::int64_t k() const noexcept;
  bool gated() const noexcept;
  // Decode-sized steps (≤ 16 rows by default) run the decode kernels while the layer's newest count is at
  // most this density, else the dense FFN (default: the engine's measured thresholds, one for one
  // token on the fused kernel and one for more rows; this sets both). Both paths exact.
  void set_decode_max_density(double density);
  double decode_max_density() const noexcept;
  // Steps of up to this many rows are decode-sized (default 16, the measured crossover at the
  // engine's densities; at most 2047, below the dispatch minimum): for measuring batched decode.
  // The union FFN's rows (below) are decode-sized whatever this says.
  void set_decode_max_rows(std::int64_t rows);
  std::int64_t decode_max_rows() const noexcept;
  // Decode steps of 2 up to this many rows compute their gate on the GEMV's tensor-core kernel,
  // its first weights read before a programmatic launch's wait (default 3: the rows below the
  // union's, cuBLASLt's ReLU GEMM from 4; 1 … 16; one row always runs the one-token kernels): for
  // measuring the gate in the step. Takes effect at the next step, as set_union_kernels does.
  void set_decode_gemv_max_rows(std::int64_t rows);
  std::int64_t decode_gemv_max_rows() const noexcept;
  // On a GPU that runs it (compute capability 9.0), a gated layer's decode steps of union_min_rows
  // up to this many rows run the union FFN (the neurons some row fired, read once for the batch;
  // default 32, at most 64; 0: never): for measuring batched decode.
  void set_union_max_rows(std::int64_t rows);
  std::int64_t union_max_rows() const noexcept;
  // ... and from this many rows (default 4; 2 … 64; 0: never): up to 16 rows the union takes the
  // steps the decode kernel would serve, for measuring where it wins.
  void set_union_min_rows(std::int64_t rows);
  std::int64_t union_min_rows() const noexcept;
  // The union FFN's kernel shape, for measuring it. Takes effect at the next step (a captured graph
  // keeps its launches until the layer's graphs are captured again).
  struct UnionKernels {
    int up_split = 8;     // CTAs an up cluster: 1, 2, 4 or 8 (the splits set the order of the sums, so the bits)
    int down_split = 8;   // CTAs a down cluster: the same
    int up_clusters = 0;  // 0: a cluster for each 64-slot block the list could fill; N > 0: N that take the blocks in turn (the same bits)
  };
  void set_union_kernels(const UnionKernels& k);
  UnionKernels union_kernels() const noexcept;

  // Steps a caller captures into CUDA graphs (a model runtime's decode steps), in three parts.
  // plan_step(m, path): what forward(x, m, y, path) would run now (it polls the counts in flight,
  // never waits), and whether that can be captured — the automatic path at decode sizes (the decode
  // kernels, or the dense FFN once the layer measured dense) and from there up to the dispatch
  // minimum (the plain dense FFN, uncounted), and the dense path at any size; else run forward().
  // prepare_step: the allocations the step needs (not capturable; nothing once done). run_step:
  // exactly the plan's kernels, with no host wait, no allocation and no count read back, so it can
  // be captured and replayed once an ordinary forward of m rows has run (cuBLASLt chooses its
  // algorithms then). A plan goes stale as the layer's counts move (an ordinary automatic forward
  // now and then counts: plan again after it) and whenever weights_epoch() changes.
  struct StepPlan {
    std::int64_t m = 0;
    bool capturable = false;
    bool sparse = false;  // the decode kernels; else the dense FFN
    bool operator==(const StepPlan&) const = default;
  };
  StepPlan plan_step(std::int64_t m, Path path);
  void prepare_step(const StepPlan& plan, Stream stream);
  void run_step(const bf16* x, bf16* y, const StepPlan& plan, Stream stream);
  // run_step of one row whose input is the next RMSNorm of a residual stream (a model runtime's
  // decode step): x = bf16(rmsnorm(r') ⊙ w), r' = r + first + delta (fp32 += bf16, in that order;
  // first may be null) stored back into r — the bits of a separate add + RMSNorm kernel before
  // run_step. A plan of the one-token kernels folds that into them (each CTA normalises, x is not
  // written), and so does a dense plan of a gated layer on the one-token GEMV where
  // folds_dense_norm(plan) (set_dense_fold_norm below); any other plan writes x first. r, w: device
  // fp32 [k], 16-byte aligned; first, delta: bf16 [k], 8-byte aligned; y may alias first.
  struct ResidualNorm {
    float* r = nullptr;
    const bf16* first = nullptr;
    const bf16* delta = nullptr;
    const float* w = nullptr;
    float eps = 0.0f;
  };
  void run_step(const ResidualNorm& in, bf16* x, bf16* y, const StepPlan& plan, Stream stream);
  // The one-token step without its down kernel (a model runtime's decode step): each active
  // neuron's warp adds round(h · Wdᵀ[n, c] · 2³²) into acc[c] (int64, exact in any order), so
  // that y = bf16(acc · 2⁻³²) for acc zero before (the reader converts: the model runtime's next
  // kernels do; src/cuda/common/fixed_point.hpp states the rounding). A term that is not finite or
  // past the range (|term| ≥ 2^(31 − ⌈log2 N⌉)) is left out and *overflow set to 1: acc is then
  // not y, and the caller must run the step again through run_step above. in: r and w only (r
  // current: first and delta null). acc: device [k], 16-byte aligned; overflow: a word the device
  // can write (mapped host memory lets the host read it without a copy). Only where
  // folds_fixed_point(plan).
  struct FixedPointOut {
    std::int64_t* acc = nullptr;
    unsigned* overflow = nullptr;
  };
  bool folds_fixed_point(const StepPlan& plan) const;
  void run_step(const ResidualNorm& in, const FixedPointOut& out, const StepPlan& plan, Stream stream);
  // The one-token kernel runs its neurons in an order of its own (a schedule: the results are the
  // same bits in any order). Its grid is more than one wave, and the neurons it lists first run
  // their up and down products while the gate's later rows still stream in. It counts each
  // neuron's activations, and this sorts the neurons by that count, the most active first. forward()
  // calls it itself now and then (at one-token calls 8, 16, …, 256, then every 256th). It may not be
  // captured. It does nothing before the layer's first one-token step.
  void reorder_decode_neurons(Stream stream);
  // For a caller that replays run_step from CUDA graphs: call it before each one-token step, outside
  // the capture. It counts the step and reorders on forward()'s schedule. New weights, including a
  // hot-neuron split (which renumbers the neurons), start the order and its schedule again.
  void advance_decode_order(Stream stream);
  // Off: the identity order from now on (reorder_decode_neurons does nothing); for A/B measurement.
  void set_decode_reorder(bool on, Stream stream);
  // On: a one-token dense run_step with a ResidualNorm forms the norm inside its [Wg; Wu] GEMV, and
  // its down GEMV stores r (the same bits as add_rmsnorm, then the step; one kernel fewer). Off (the
  // default until measured, docs/runtime.md): add_rmsnorm runs first. Takes effect at the next step
  // (a graph that captured the other form must be captured again).
  void set_dense_fold_norm(bool on);
  bool folds_dense_norm(const StepPlan& plan) const;
  // Changes whenever the layer's weight buffers move (load_weights, upload_weights, a hot-neuron
  // split that a large automatic or sparse forward may make on its own): a graph holding this
  // layer's run_step must be captured again.
  std::uint64_t weights_epoch() const noexcept;

 private:
  std::unique_ptr<FfnContext> ctx_;
  std::int64_t calls_ = 0, sparse_calls_ = 0;
};

struct TrainForwardInfo {
  bool sparse = false;         // which step ran
  std::int64_t nnz = -1;       // non-zeros the sparse step's CSR holds (−1: a dense step that did not count)
  std::int64_t hot_neurons = 0, dense_rows = 0;  // split off the sparse step and run dense
  // The TwELL gate's (row, tile) blocks and rows beyond the format's width (exact through the dense
  // gate buffer: a speed figure); −1 when no TwELL gate ran (a cuBLASLt gate, or a dense step).
  std::int64_t overflow_tiles = -1, overflow_rows = -1;
  std::string path;            // human-readable
};

// Where a weight gradient goes: caller device memory, contiguous, fp32 or bf16 (rounded from
// twell's fp32 sums).
struct GradOut {
  enum class Type { f32, bf16 };
  void* data = nullptr;
  Type type = Type::f32;
};

// One FFN layer for training: forward keeps what its backward needs; backward gives dx and the
// weight gradients of ⟨y, dy⟩ + l1_coeff · Σ|h| / m.
class FfnTrainLayer {
 public:
  explicit FfnTrainLayer(const TrainWorkspace* workspace = nullptr);  // null: a workspace of its own
  ~FfnTrainLayer();
  FfnTrainLayer(FfnTrainLayer&&) noexcept;
  FfnTrainLayer& operator=(FfnTrainLayer&&) noexcept;

  // New weights (an optimizer step): the dispatch statistics carry over at the same shape; a
  // saved forward is dropped.
  void load_weights(const DeviceWeights& w, Stream stream);
  void upload_weights(const FfnWeights& w, Stream stream);
  // x, y: device bf16 [m, k]; x must stay unchanged until backward(). Waits once on the host for
  // the non-zero count (it sizes the saved state), unless the step runs dense.
  TrainForwardInfo forward(const bf16* x, std::int64_t m, bf16* y, Path path, Stream stream);
  // l1 = Σ|h| / m and l0 = non-zeros / m of the last forward, as fp32 into device memory.
  void write_scalars(float* l1, float* l0, Stream stream) const;
  // The last forward's backward (same x, m). l1_coeff_device: one fp32 on the device, read when the
  // kernels run (no host wait). dx: device bf16 [m, k].
  void backward(const bf16* x, const bf16* dy, std::int64_t m, const float* l1_coeff_device, bf16* dx,
                Stream stream);
  void backward(const bf16* x, const bf16* dy, std::int64_t m, double l1_coeff, bf16* dx, Stream stream);
  // The last backward's weight gradients into caller memory in nn.Linear's layouts: dw_gate,
  // dw_up [n, k] (dw_gate ignored when non-gated), dw_down [k, n]. Asynchronous on `stream`.
  void gradients_to(GradOut dw_gate, GradOut dw_up, GradOut dw_down, Stream stream) const;
  std::int64_t n() const noexcept;
  std::int64_t k() const noexcept;
  bool gated() const noexcept;
  std::int64_t own_bytes() const noexcept;     // device memory of this layer alone
  std::int64_t device_bytes() const noexcept;  // with its workspace (shared ones counted in each)

 private:
  std::unique_ptr<TrainContext> ctx_;
};

}  // namespace twell::cuda
