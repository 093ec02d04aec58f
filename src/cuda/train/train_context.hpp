#pragma once
// One FFN layer's CUDA training step (DESIGN §3, training): forward saves what backward needs,
// backward produces dx and the weight gradients. Stream-taking, no process-global state; the
// context owns the device weights (through an FfnContext), the gradient buffers (fp32) and every
// workspace. Buffers only grow, so device_bytes() is the high-water mark of this context.
//
// Sparse path: gate GEMM (the sm90 kernel with the TwELL epilogue, or cuBLASLt with ReLU) → CSR
// of its non-zeros (exact for any distribution, nothing dropped) → token-major forward (u sampled
// at the pattern, y) → backward:
// token-major (dt, d_up, d_gate, dx), transposed index (radix sort), neuron-major weight gradients
// in column-slice passes over work items (runs of ≤ `run` entries of one neuron, one warp each;
// partial sums of a split neuron added in item order, so the result is deterministic).
// Saved for backward beyond x and y: offsets [M+1] i64 and per non-zero col i32 + p bf16 + u f32.
// No dense [M, N] tensor is kept (the bf16 gate output is a workspace, reused by the next step).
// Hot neurons (optional, on by default): the CSR leaves out the columns of a set of hot neurons,
// which run as dense cuBLASLt GEMMs over their gathered weight rows; their [g | u] (or h) columns,
// [M, 2·H] bf16, are saved too. The sum over neurons splits exactly, so only rounding order changes.
// Dense path (cuBLASLt): [g | u] = x·[Wg; Wu]ᵀ, h = ReLU(g) ⊙ u, y = h·Wdᵀ; dh = dy·Wd, the
// elementwise gradient, dx = [dg | du]·[Wg; Wu], [dWg; dWu] = [dg | du]ᵀ·x, dWd = dyᵀ·h.
// Dispatch (Path::automatic): after the gate GEMM the exact non-zero count decides. Training
// steps follow each other and the density drifts slowly, so once a step has measured a density
// above the threshold, the next steps run the stacked dense path directly (no split GEMM, no host
// wait) and keep counting in its elementwise kernel; the count is read back one step later.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda/common/device_buffer.hpp"
#include "cuda/dense/lt_gemm.hpp"
#include "cuda/ffn_plan.hpp"
#include "cuda/packed_weights.hpp"
#include "cuda/sm80/twell_hot_neurons.hpp"
#include "cuda/sm80/twell_kernels.hpp"
#include "cuda/train/train_kernels.hpp"
#include "twell/cuda/ffn_cuda.hpp"
#include "twell/ffn.hpp"

namespace twell::cuda {

// Words per TwELL block of the sparse step's sm90 gate (TrainContextOptions::gate_sm90): S = 32
// (C = 8, the inference default): a block overflows above 31 non-zeros of its 256 columns (12 %),
// at 0.5–1 % mean density hardly ever but in hot rows; an overflowed block is read from g_.
inline constexpr int kTrainTwellWords = 32;

// The training context's options: the dispatch policy (ffn_plan.hpp: the sparse step's thresholds
// and minimum M), then the kernels' configuration and the hot-neuron / dense-row splits.
struct TrainContextOptions : TrainDispatchPolicy {
  // One line each; the measurements behind the values: docs/engine.md, "The training step (CUDA)".
  bool autotune_gemm = false;                   // time cuBLASLt's candidate algorithms once per shape
  double weight_grad_l2_fraction = 0.7;         // weight-gradient passes: x and dy columns within this share of L2
  std::int64_t weight_grad_run = 0;             // entries per weight-gradient work item (0: 128; ≥ nnz / 8192)
  // Hot neurons (the inference path's split by neuron, twell_hot_neurons.hpp): neurons active in
  // more than hot_neurons_density of a batch's tokens run through cuBLASLt GEMMs over their columns
  // (forward and backward), the rest through the CSR path; chosen on the first sparse or automatic
  // step of ≥ hot_neurons_min_rows rows (hot_neurons_auto); none when more than
  // hot_neurons_max_share of N qualify. 0 turns the split off.
  bool hot_neurons_auto = true;
  double hot_neurons_density = 0.014;           // the break-even of CSR entries and dense columns
  double hot_neurons_density_nongated = 0.014;
  std::int64_t hot_neurons_min_rows = 4096;
  double hot_neurons_max_share = 0.5;
  int token_min_blocks = 6;                     // token-major kernels' resident blocks per SM (0: unbounded; 6 or 8)
  // Dense rows (the inference path's split by token row): inside the sparse step, a row with more
  // than dense_rows_density of the cold neurons active runs as rows of dense GEMMs. 0: off.
  double dense_rows_density = 0.02;
  std::int64_t dense_rows_min = 256;            // fewer such rows run through the CSR (the GEMMs' fixed cost)
  // The sparse step's gate through the sm90 kernel with the TwELL epilogue (sm90/gate_pack.hpp):
  // the CSR is built from its words, not from the bf16 gate read twice. Used where it can serve (a
  // GPU that runs it, K % 8 == 0, x 16-byte aligned, no hot-neuron calibration due in the step, no
  // dense step expected); the same CSR whichever gate ran, up to the GEMMs' rounding.
  bool gate_sm90 = true;
  bool gate_sm90_dense_rows = true;             // also after a step with dense rows (false: cuBLASLt then)
  bool gate_sm90_heavy_rows = true;             // the sm90 gate's heavy-row packing (false: a lane per row)
};

// The weight-gradient pass plan for m rows of K columns: slices of slice_cols columns (the last
// one narrower), each over token blocks of block_rows rows (≥ 1024 unless m is smaller).
struct WeightGradPasses {
  std::int64_t slice_cols = 0, block_rows = 0;
};
WeightGradPasses weight_grad_passes(std::int64_t m, std::int64_t k, std::int64_t l2_bytes, double l2_fraction);

struct TrainForwardResult {
  bool sparse = false;
  // Exact count of the non-zeros the CSR path takes: those of the cold neurons in the sparse rows
  // when hot neurons or dense rows are split off (−1 when the forced dense path ran without
  // counting). density: the measure the dispatch compares, (nnz + R · the row cap + H · the hot
  // threshold · M) / (M · N) — each dense row and hot neuron at its break-even count; nnz / (M · N)
  // without the splits. read_scalars() has every neuron's exact count (l0).
  std::int64_t nnz = -1;
  double density = 0;
  std::int64_t hot_neurons = 0;  // H: neurons run dense inside the sparse step (0: no split, or the dense step ran)
  std::int64_t dense_rows = 0;   // R: rows run dense inside the sparse step (their non-zeros are not in nnz)
  // The TwELL gate's (row, tile) blocks and rows beyond the format's width (exact: those blocks go
  // through the dense gate buffer); −1 when the gate ran as a cuBLASLt GEMM (no TwELL).
  std::int64_t overflow_tiles = -1, overflow_rows = -1;
  std::string path;
};

// Workspaces through which no state passes from a forward to its backward (the gate output of
// the sparse step, the backward's temporaries, the weight gradients until the caller reads them):
// the contexts of a model's layers, which run one after another on one stream, can share one set,
// so that their memory grows with the largest M and not with the layer count. Sharing contexts
// must run in one stream order, and a context's dw_gate() / dw_up() / dw_down() hold its gradients
// only until another context that shares the set runs a backward.
struct TrainScratch {
  // mem: where every buffer of the set comes from, the GEMM workspace's too (null: cudaMalloc).
  explicit TrainScratch(std::shared_ptr<DeviceAllocator> mem = nullptr);
  TrainScratch(const TrainScratch&) = delete;
  TrainScratch& operator=(const TrainScratch&) = delete;

  std::shared_ptr<DeviceAllocator> mem;  // first: the buffers below give their memory back to it
  DeviceBuffer<__nv_bfloat16> g, h, dh, dgu;  // h: gated layers only (a non-gated layer saves h)
  DeviceBuffer<std::int64_t> row_counts, wg_item_counts, wg_item_offsets;
  DeviceBuffer<std::int32_t> entry_rows, order, tmp_keys, tmp_vals, wg_item_neuron;
  DeviceBuffer<float> d_up_e, d_gate_e, dwd_t, dw_gu, dw_down;
  DeviceBuffer<float4> wg_entries;
  DeviceBuffer<unsigned char> wg_work, cub_ws;
  DeviceBuffer<std::uint32_t> twell_words, twell_row_ovf;
  DeviceBuffer<TwellCounters> twell_counters;
  // The contexts' GEMMs: the cuBLASLt handle, its plans and its 64 MB workspace (made by the first
  // context that shares the set, with its autotune option).
  std::shared_ptr<LtGemm> gemm;
  std::size_t bytes() const noexcept;
};

class TrainContext {
 public:
  explicit TrainContext(const TrainContextOptions& opt = {});
  // With `scratch` shared by other contexts (see TrainScratch); nullptr: a set of its own.
  TrainContext(const TrainContextOptions& opt, std::shared_ptr<TrainScratch> scratch);
  ~TrainContext();
  TrainContext(const TrainContext&) = delete;
  TrainContext& operator=(const TrainContext&) = delete;

  void upload_weights(const FfnWeights& w, cudaStream_t stream);
  // Copies device bf16 weights (asynchronous on `stream`, no host wait, no allocation once the
  // shape is known). The same N and K keep the dispatch statistics and the hot set (a training
  // step's new weights); the last forward's saved state is dropped either way.
  void load_weights(const DeviceFfnWeights& w, cudaStream_t stream);

  // x, y: device bf16 [m, K], row stride K. Synchronises once (the non-zero count) unless
  // path == Path::dense. x must stay unchanged until backward().
  TrainForwardResult forward(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, Path path, cudaStream_t stream);
  // Gradients of ⟨y, dy⟩ + l1_coeff · Σ|h| / m for the last forward (same x, same m). dx: bf16
  // [m, K] (row stride K); weight gradients into this context's buffers (dw_gate() etc.).
  void backward(const __nv_bfloat16* x, const __nv_bfloat16* dy, std::int64_t m, double l1_coeff, __nv_bfloat16* dx,
                cudaStream_t stream);
  // The same with l1_coeff read on the device when the kernels run (one fp32 value; no host wait).
  void backward(const __nv_bfloat16* x, const __nv_bfloat16* dy, std::int64_t m, const float* l1_coeff_device,
                __nv_bfloat16* dx, cudaStream_t stream);
  // The last forward's l1 and l0 (as read_scalars) as fp32 into device memory, on `stream`: no host wait.
  void write_scalars(float* l1, float* l0, cudaStream_t stream) const;
  // Synchronises `stream`; l1 = Σ|h| / m and l0 = active / m of the last forward.
  FfnTrainScalars read_scalars(cudaStream_t stream);

  // fp32 gradients, rows of stride K: dw_gate [N, K] (gated), dw_up [N, K]; dw_down [K, ldn]
  // (row stride ldn; columns ≥ N are not meaningful).
  const float* dw_gate() const noexcept { return gated() ? dw_gu_.get() : nullptr; }
  const float* dw_up() const noexcept { return dw_gu_.get() + (gated() ? ldn() * k() : 0); }
  const float* dw_down() const noexcept { return dw_down_.get(); }

  // Hot neurons: any subset of [0, N) (duplicates ignored; empty turns the split off), used by the
  // sparse steps from the next forward() on. Kept across upload_weights() of the same N and K
  // (training weights drift slowly; the hot weight rows are gathered again), cleared otherwise.
  void set_hot_neurons(const std::vector<std::int64_t>& hot, cudaStream_t stream);
  const std::vector<std::int64_t>& hot_neurons() const noexcept { return hot_; }  // ascending
  std::int64_t hot_count() const noexcept { return static_cast<std::int64_t>(hot_.size()); }
  bool hot_calibrated() const noexcept { return hot_calibrated_; }
  // The calibration's rule: neurons with count > density·m (the option for this FFN kind), none
  // when the density option is ≤ 0 or more than hot_neurons_max_share·N qualify.
  std::vector<std::int64_t> choose_hot_neurons(const std::vector<std::uint32_t>& counts, std::int64_t m) const;

  // Sees the step's phases as they are enqueued: phase_done(name, stream) after each phase's
  // launches, on the step's stream (a forward begins with "start"). Production installs none; a
  // benchmark times the phases with events (lab/bench/bench_train.cpp). The same names go to
  // profilers as NVTX marks whether or not an observer is installed.
  class PhaseObserver {
   public:
    virtual ~PhaseObserver() = default;
    virtual void phase_done(const char* phase, cudaStream_t stream) = 0;
  };
  void set_phase_observer(PhaseObserver* observer) noexcept { observer_ = observer; }  // null: none

  std::size_t saved_bytes() const noexcept { return saved_bytes_; }  // kept by the last forward beyond x, y
  std::size_t device_bytes() const noexcept;  // everything this context holds, its scratch set included
  std::size_t own_bytes() const noexcept;     // without the scratch set (shared ones count once, apart)
  const std::shared_ptr<TrainScratch>& scratch() const noexcept { return scratch_; }
  bool gated() const noexcept { return w_.gated(); }
  std::int64_t n() const noexcept { return w_.n(); }
  std::int64_t k() const noexcept { return w_.k(); }
  std::int64_t ldn() const noexcept { return w_.ldn(); }

 private:
  enum class Saved { none, dense_stacked, dense_split, sparse };
  void forget_measurements();  // the dispatch's density and row counts; the gradient buffers (a new layer)
  void dense_forward_stacked(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, cudaStream_t stream);
  void dense_forward_after_gate(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, cudaStream_t stream);
  void sparse_forward(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, cudaStream_t stream);
  void dense_backward(const __nv_bfloat16* x, const __nv_bfloat16* dy, std::int64_t m, float c1, __nv_bfloat16* dx,
                      cudaStream_t stream);
  void sparse_backward(const __nv_bfloat16* x, const __nv_bfloat16* dy, std::int64_t m, float c1, __nv_bfloat16* dx,
                       cudaStream_t stream);
  // The hot part of the sparse step: [g | u] over the hot columns, h, y += h·Wd_hotᵀ (forward);
  // dh, the elementwise gradient, dx += …, the hot gradient rows scattered (backward, before the
  // dWd transpose). Saved between them: [g | u]_hot (gated) or h_hot, in gu_ / h_.
  // hot_forward_up: g_hot gathered if the count did not, u_hot, h_hot and its sums into `scalars`.
  // hot_forward_down: y += h_hot·Wd_hotᵀ. hot_backward_grads: dh_hot, [dg | du]_hot, the hot
  // gradient rows into dw_hot_. hot_backward_dx: dx += [dg | du]_hot·[Wg_hot; Wu_hot].
  // hot_backward_scatter: dw_hot_ into the gradients (after the CSR passes zeroed those rows).
  void hot_forward_up(const __nv_bfloat16* x, std::int64_t m, DenseTrainScalars* scalars, cudaStream_t stream);
  void hot_forward_down(std::int64_t m, __nv_bfloat16* y, cudaStream_t stream);
  void hot_backward_reserve(std::int64_t m);
  void hot_backward_grads(const __nv_bfloat16* x, const __nv_bfloat16* dy, std::int64_t m, float c1, cudaStream_t stream);
  void hot_backward_dx(std::int64_t m, __nv_bfloat16* dx, cudaStream_t stream);
  void hot_backward_scatter(cudaStream_t stream);
  void calibrate_hot_neurons(std::int64_t m, cudaStream_t stream);  // from the gate output in g_
  // The dense rows of the sparse step (saved_rows_ of them, listed in dense_rows_): forward
  // [g | u]_R (or h_R) over every neuron, y rows overwritten; backward dx rows overwritten and the
  // weight gradients accumulated (after the dWd transpose). Saved: [g | u]_R or h_R in rows_gu_.
  void dense_rows_forward(const __nv_bfloat16* x, __nv_bfloat16* y, cudaStream_t stream);
  void dense_rows_backward(const __nv_bfloat16* x, const __nv_bfloat16* dy, float c1, __nv_bfloat16* dx,
                           cudaStream_t stream);
  void scatter_dense_rows(__nv_bfloat16* out, cudaStream_t stream);  // rows_out_ into out's dense rows
  // The elementwise gradient of a dense block (block_params in the .cpp) from dh into d ([dg | du]
  // or du); gated, the same pass recomputes h from the saved [g | u] and writes it (the dWd GEMMs
  // after read it).
  void block_backward(const DenseTrainElementwiseParams& block, const __nv_bfloat16* dh, float c1, __nv_bfloat16* d,
                      cudaStream_t stream);
  void gather_hot_weights(cudaStream_t stream);
  std::int64_t ldh() const noexcept { return (hot_count() + 7) / 8 * 8; }
  // The hot-neuron rule's threshold (share of tokens; ≤ 0: no split) and cap on the hot count.
  double hot_threshold() const noexcept { return gated() ? opt_.hot_neurons_density : opt_.hot_neurons_density_nongated; }
  double max_hot_neurons() const noexcept { return opt_.hot_neurons_max_share * static_cast<double>(n()); }
  static constexpr OverShare over_share() noexcept { return OverShare::none; }
  void reserve_grads();
  DenseTrainElementwiseParams elementwise_params(std::int64_t m);  // common fields; reserves h_
  void mark(const char* phase, cudaStream_t stream);  // an NVTX mark; the observer's phase_done

  TrainContextOptions opt_;
  PackedWeights w_;              // this layer's weights (bf16, the kernels' layouts)
  std::shared_ptr<LtGemm> gemm_;  // the shared set's, or this context's own
  Saved saved_ = Saved::none;
  std::int64_t saved_m_ = 0, nnz_ = 0;
  std::size_t saved_bytes_ = 0;
  double last_density_ = -1;       // density measured by the latest counted step (−1: none yet)
  bool count_pending_ = false;     // a dense step's count is on its way to scalars_host_
  std::int64_t pending_m_ = 0;
  cudaEvent_t counted_ = nullptr;
  std::int64_t l2_bytes_ = 0;
  PhaseObserver* observer_ = nullptr;
  // dense state: gu_ [m, 2·ldn] (stacked path), g_ [m, ldn] (gate output, also the sparse path's
  // workspace), u_ [m, ldn] (dispatched dense), h_ [m, ldn]; backward dh_ [m, ldn], dgu_ [m, 2·ldn]
  // g_ is free once the CSR is built: the sparse backward never reads it and uses it as the
  // weight-gradient workspace (the partials) when it is large enough.
  // The scratch set (declared before the references into it below); own or shared.
  std::shared_ptr<TrainScratch> scratch_;
  DeviceBuffer<__nv_bfloat16> gu_, u_, own_h_;
  DeviceBuffer<__nv_bfloat16>& g_;
  DeviceBuffer<__nv_bfloat16>& dh_;
  DeviceBuffer<__nv_bfloat16>& dgu_;
  // h: scratch for a gated layer (its backward recomputes h from the saved [g | u]); saved state
  // (own_h_) for a non-gated one, whose h is the activation itself.
  DeviceBuffer<__nv_bfloat16>& hbuf() noexcept { return gated() ? scratch_->h : own_h_; }
  // The gate output of a step that turned dense after it (Saved::dense_split, gated): g_ is
  // scratch when shared, so the step keeps a copy for its backward.
  DeviceBuffer<__nv_bfloat16> g_saved_;
  const __nv_bfloat16* saved_g_ = nullptr;  // g of the last Saved::dense_split forward (g_ or g_saved_)
  // sparse state: row_counts_ [m], offsets_ [m + 1], per entry cols_, p_, u_e_; row_l1_ [m]
  DeviceBuffer<std::int64_t> offsets_, col_offsets_;
  DeviceBuffer<std::int64_t>& row_counts_;
  DeviceBuffer<std::int32_t> cols_;
  DeviceBuffer<std::int32_t>& entry_rows_;
  DeviceBuffer<std::int32_t>& order_;
  DeviceBuffer<std::int32_t>& tmp_keys_;
  DeviceBuffer<std::int32_t>& tmp_vals_;
  DeviceBuffer<__nv_bfloat16> p_;
  DeviceBuffer<float> u_e_, row_l1_;
  DeviceBuffer<float>& d_up_e_;
  DeviceBuffer<float>& d_gate_e_;
  DeviceBuffer<float>& dwd_t_;
  DeviceBuffer<float4>& wg_entries_;  // [nnz] weight-gradient entries, neuron order
  DeviceBuffer<unsigned char>& wg_work_;   // the weight gradients' partials when g_ is too small
  DeviceBuffer<std::int64_t>& wg_item_counts_;
  DeviceBuffer<std::int64_t>& wg_item_offsets_;
  DeviceBuffer<std::int32_t>& wg_item_neuron_;
  DeviceBuffer<unsigned char>& cub_ws_;
  // gradients: dw_gu_ [2·ldn (gated) or ldn, K], dw_down_ [K, ldn]
  DeviceBuffer<float>& dw_gu_;
  DeviceBuffer<float>& dw_down_;
  // hot neurons: hot_ ascending; hot_idx_ [H]; skip8_ [ceil(N/8)] the CSR's column mask;
  // hot_base8_ [ceil(N/8)] the hot neurons before neuron 8·i;
  // w_hot_ [(gated ? 3 : 2)·ldh, K] = [Wg_hot; Wu_hot; Wdᵀ_hot] (padding rows 0); dw_hot_ the
  // hot gradient rows [(gated ? 3 : 2)·ldh, K] fp32 before the scatter.
  std::vector<std::int64_t> hot_;
  bool hot_calibrated_ = false;
  std::int64_t saved_hot_ = 0;  // H of the last forward's sparse step (0: no hot part saved)
  bool hot_gathered_ = false;   // this forward's CSR count gathered the hot gate columns
  DeviceBuffer<std::int32_t> hot_idx_, hot_base8_;
  DeviceBuffer<unsigned char> skip8_;
  DeviceBuffer<__nv_bfloat16> w_hot_;
  DeviceBuffer<float> dw_hot_;
  DeviceBuffer<DenseTrainScalars> scalars_;
  const float* c1_scale_ = nullptr;  // during a backward with the coefficient on the device
  // dense rows: row_flags_ [m], dense_rows_ [m] (the first saved_rows_ used), n_dense_ [1];
  // rows_gu_ [R, 2·ldn] (saved); rows_x_, rows_dy_, rows_out_ [R, K], rows_h_, rows_dh_ [R, ldn],
  // rows_dgu_ [R, 2·ldn] workspaces.
  // The TwELL gate (gate_sm90): words [m, tiles · kTrainTwellWords], row overflow flags [m] and
  // its counters (workspaces of the forward; the gate buffer g_ receives the overflowed blocks).
  bool gate_sm90_ok_ = false;  // this device runs the sm90 gate kernel
  int sm_count_ = 0;
  DeviceBuffer<std::uint32_t>& twell_words_;
  DeviceBuffer<std::uint32_t>& twell_row_ovf_;
  DeviceBuffer<TwellCounters>& twell_counters_;
  std::int64_t saved_rows_ = 0;
  DeviceBuffer<unsigned char> row_flags_;
  DeviceBuffer<std::int32_t> dense_rows_;
  DeviceBuffer<int> n_dense_;
  DeviceBuffer<__nv_bfloat16> rows_gu_, rows_x_, rows_dy_, rows_out_, rows_h_, rows_dh_, rows_dgu_;
  PinnedBuffer<DenseTrainScalars> scalars_host_;
  // The count's totals {nnz, dense rows, overflow tiles, overflow rows}, written by a kernel into pinned host memory
  // (launch_csr_publish_totals; totals_dev_ is its device address).
  PinnedBuffer<std::int64_t> totals_host_;
  std::int64_t* totals_dev_ = nullptr;
  std::int64_t last_dense_rows_ = 0;  // rows the latest counted step ran (or would have run) dense
};

}  // namespace twell::cuda
