#pragma once
// Stream-taking CUDA FFN API. An FfnContext owns one layer's device weights (bf16), the cuBLASLt
// handle and plan cache, and the workspaces; nothing is process-global, and several contexts may
// live side by side (one per layer, say). Every op is enqueued on the caller's stream; only the
// first automatic forward of a layer (and one whose count is not in yet with sticky_dispatch off)
// and read_counters() synchronise, to read the gate's non-zero count.
// Calls on one context must be ordered: one stream, or the caller orders its streams (the
// workspaces and the asynchronous count read-backs are shared between calls).
//
// Gated (DESIGN §3):  gate_twell: g = ReLU(x·Wgᵀ) by a cuBLASLt GEMM into a bf16 [M, N] buffer,
//                     packed to TwELL by twell_pack (counts nnz, flags overflowed blocks/rows);
//                     sparse_rest: fused up+down reading TwELL (h stays on chip);
//                     dense_rest:  u = x·Wuᵀ, h = g ⊙ u, y = h·Wdᵀ (cuBLASLt; y by the GEMV at 1–8 rows), reusing g.
// Non-gated:          gate_twell packs h = ReLU(x·Wuᵀ); sparse_rest = sparse down; dense_rest = y = h·Wdᵀ.
// Overflowed TwELL blocks are read whole from the bf16 [M, N] gate buffer, so every row is exact.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/common/count_ring.hpp"
#include "cuda/ffn_plan.hpp"
#include "cuda/common/device_buffer.hpp"
#include "cuda/common/side_stream.hpp"
#include "cuda/dense/lt_gemm.hpp"
#include "cuda/ffn_workspace.hpp"
#include "cuda/packed_weights.hpp"
#include "cuda/sm80/twell_decode.hpp"
#include "cuda/sm80/twell_decode_token.hpp"
#include "cuda/sm80/twell_dense_rows.hpp"
#include "cuda/sm80/twell_hot_neurons.hpp"
#include "cuda/sm80/twell_kernels.hpp"
#include "twell/cuda/ffn_cuda.hpp"
#include "twell/cuda/weight_type.hpp"
#include "twell/ffn.hpp"

namespace twell::cuda {

// The inference context's options: the plan's policy (ffn_plan.hpp: thresholds, sticky dispatch,
// count periods, and which kernels and splits a call's shape runs; where each value comes from:
// docs/engine.md, "Plan and dispatch"), then the kernels' settings and the hot-row / hot-neuron
// splits' thresholds.
struct ContextOptions : DispatchPolicy {
  // One line each; the measurements behind the values: docs/engine.md, "Kernel configuration".
  TwellConfig twell{};
  bool autotune_gemm = false;                // time cuBLASLt's candidate algorithms once per shape
  std::int64_t dispatch_sample_rows = 2048;  // rows the dispatch count reads (all rows when M is smaller)
  bool decode_reorder = true;                // the one-token kernel's neurons most active first (reorder_decode); off: identity
  bool dense_fold_norm = false;              // a one-token dense step's norm in its [Wg; Wu] GEMV (dense_token_folded); a candidate, off until measured
  bool gate_store_values = false;            // also store every gate value (tests reading gate_values())
  int gate_sm90_cluster = 2;                 // CTAs along M that multicast W tiles to each other (1, 2, 4)
  bool gate_sm90_stmatrix = true;            // consumers stage tiles by stmatrix (same values, faster)
  bool gate_sm90_heavy_rows = true;          // packers take rows with many words by the whole warp
  bool gate_sm90_word_masks = true;          // consumers hand the packers per-row masks of non-zero words
  // The union FFN's kernels (sm90/union_ffn.hpp): CTAs an up and a down cluster (1, 2, 4, 8), and
  // at most this many up clusters, each taking 64-slot blocks in turn (0: a cluster a block the
  // list could fill). The same bits whatever up_clusters says; the splits change the sums' order.
  int union_up_split = 8;
  int union_down_split = 8;
  int union_up_clusters = 0;
  // Dense rows (sm80/twell_dense_rows.hpp; on where DispatchPolicy::dense_rows_density > 0): heavy
  // rows run as gathered rows of cuBLASLt GEMMs, up to a capacity learned from an earlier call's
  // count (dense_rows_capacity ≥ 0 fixes it); rows past it stay sparse (exact either way).
  double dense_rows_cost_density = 0.015;    // a dense row's weight in the dispatch count, as a density of N
  std::int64_t dense_rows_min = 512;         // fewer such rows (scaled to M) run sparse: small GEMMs are slow
  std::int64_t dense_rows_capacity = -1;     // ≥ 0: this fixed capacity (tests, benchmarks)
  // Hot neurons (sm80/twell_hot_neurons.hpp): neurons active in more than hot_neurons_density of a
  // calibration batch's tokens run as columns of dense GEMMs, for calls of ≥ hot_neurons_min_rows
  // rows (DispatchPolicy); calibrated on the first sparse or automatic call that large (hot_neurons_auto) or by
  // calibrate_hot_neurons(). Thresholds ≤ 0 turn the split off.
  bool hot_neurons_auto = true;
  double hot_neurons_density = 0.012;        // gated: the break-even of GEMM columns and fused-kernel non-zeros
  double hot_neurons_density_nongated = 0;   // off: its sparse down is cheap enough per non-zero
  double hot_neurons_max_share = 0.5;        // at most this share of N runs hot (the hot workspace's size)
  bool hot_neurons_densest_share = true;     // more qualify: the densest share runs hot (false: none)
  bool hot_product_sm90 = true;              // gated, sm90: hot [g | u] GEMM and product as one kernel
};

struct ForwardResult {
  bool sparse = false;              // which remainder ran
  bool counted = false;             // Path::automatic: a sampled count decided
  double sampled_density = 0;       // nnz / (rows · N) over the sampled rows
  CallRecord call;                  // what ran, as values
  std::string path() const { return describe_call(call); }  // ... as text (formatted here, on request)
};

class FfnContext {
 public:
  // ws: the per-call scratch, shared with other layers (null: this context's own).
  explicit FfnContext(const ContextOptions& opt = {}, std::shared_ptr<FfnWorkspace> ws = nullptr);
  const FfnWorkspace& workspace() const noexcept { return *ws_; }
  ~FfnContext();
  FfnContext(const FfnContext&) = delete;
  FfnContext& operator=(const FfnContext&) = delete;

  // Converts the fp32 host weights to bf16 and uploads them (synchronous on `stream`).
  void upload_weights(const FfnWeights& w, cudaStream_t stream);
  // Copies device bf16 weights into this context's layouts on `stream` (no host wait; allocates
  // only when the shape changes). The same shape keeps the dispatch statistics (unless hot
  // neurons had been split off); the hot split is dropped and calibrated again when due.
  void load_weights(const DeviceFfnWeights& w, cudaStream_t stream);

  // All x / y are device bf16, row-major: x [m, K] with row stride K, y [m, K] with row stride K.
  // Where the sm90 kernels run (gate_sm90, hot_product_sm90) x must be 16-byte aligned: they read it
  // by TMA, and refuse an unaligned x with an error (cudaMalloc'd buffers, and rows of them, are).
  void dense_forward(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, cudaStream_t stream) {
    dense_forward(x, m, y, shape(m), stream);
  }
  void dense_forward(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, const CallShape& s, cudaStream_t stream);
  // gate GEMM (ReLU epilogue) + TwELL packing, over the sparse path's neurons (shape(m)).
  void gate_twell(const __nv_bfloat16* x, std::int64_t m, cudaStream_t stream) { gate_twell(x, m, shape(m), stream); }
  void gate_gemm(const __nv_bfloat16* x, std::int64_t m, cudaStream_t stream);
  void pack(std::int64_t m, const std::uint32_t* enable, cudaStream_t stream);

  void sparse_rest(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, cudaStream_t stream) {
    sparse_rest(x, m, y, shape(m), stream);
  }
  void dense_rest(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, const CallShape& s, cudaStream_t stream);
  // The cuBLASLt GEMM of the gate's shape alone ([m, K]·[N, K]ᵀ, no epilogue), for benchmarks.
  void dense_gate_gemm(const __nv_bfloat16* x, std::int64_t m, cudaStream_t stream);
  // Path::dense: the cuBLASLt FFN. Path::sparse: gate_twell + sparse_rest. Path::automatic: gate
  // GEMM, a sampled count of its non-zeros decides on the device (packing is skipped when dense
  // wins), the host waits for that one flag and enqueues the matching remainder; later calls follow
  // the latest count without a host wait (sticky_dispatch), decode (M ≤ decode_max_rows, or the union
  // FFN's rows: is_decode) from the first call.
  ForwardResult forward(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, Path path, cudaStream_t stream);
  // Decode steps inside a CUDA graph (M ≤ decode_max_rows, or the union FFN's rows: see is_decode):
  // decode_plan_sparse() is the path forward(automatic) of m rows would take now (the decode kernel
  // or the union FFN unless the latest count is over decode_max_density, or decode_token_max_density
  // for one token); prepare_decode(m) makes every allocation a step of m rows needs (not capturable;
  // the layer's own buffers are sized for every decode size at once, so a larger step never moves
  // what a captured smaller one reads; the shared workspace's may grow: InferWorkspace::
  // step_addresses); decode_step then enqueues only that path's kernels, with no
  // host wait, no allocation and no count read back (the decode kernel stores its count into a
  // fixed device word instead of the count ring), so it can be captured and replayed. The caller
  // re-plans from time to time by an ordinary forward(automatic), which counts.
  bool is_decode(std::int64_t m) const noexcept { return shape(m).decode; }
  // Every decision a call of m rows takes from its size and the layer alone (shape_call: kernels,
  // splits, variants); forward() plans with it, and the executors read only it.
  CallShape shape(std::int64_t m) const noexcept { return shape_call(opt_, facts(), m); }
  // The record of the last forward() (its text: describe_call); a default record before one.
  const CallRecord& last_call() const noexcept { return last_call_; }
  // True iff forward(automatic) of m rows runs the plain cuBLASLt FFN without a count (m under
  // dispatch_min_rows and not a decode size): a decision of the shape alone, never of the layer's
  // statistics, so such calls capture into a graph like dense_forward (which they are).
  bool automatic_is_plain_dense(std::int64_t m) const noexcept;
  // Changes whenever the layer's weight buffers or their layout change (upload_weights,
  // load_weights, a hot-neuron split, which a large automatic or sparse call may make on its own):
  // a CUDA graph that captured this layer's calls must be captured again once it moved.
  std::uint64_t weights_epoch() const noexcept { return weights_epoch_; }
  bool decode_plan_sparse(std::int64_t m);  // polls the counts in flight first (never waits)
  void prepare_decode(std::int64_t m, cudaStream_t stream);
  void prepare_dense(std::int64_t m) { reserve(m); }  // dense_forward of m rows allocates nothing after it
  void decode_step(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, bool sparse, cudaStream_t stream);
  // A sparse decode step of one row whose input is the residual stream's next norm (DecodeTokenNorm),
  // folded into the one-token kernels: only where folds_norm() (else the caller runs
  // ops::add_rmsnorm, then decode_step on its output).
  bool folds_norm() const noexcept { return shape(1).one_token; }
  void decode_step_folded(const DecodeTokenNorm& in, __nv_bfloat16* y, cudaStream_t stream);
  // A dense step of one row whose input is the residual stream's next norm, folded into the
  // [Wg; Wu] GEMV (ops::rmsnorm_gated_up), the down GEMV then storing r = (r + first) + delta
  // (TwellGemvParams::store_r): the bits of ops::add_rmsnorm, then decode_step's dense path, in
  // one kernel fewer. Only where folds_dense_norm() (else the caller runs add_rmsnorm first).
  bool folds_dense_norm() const noexcept { return opt_.dense_fold_norm && gated() && shape(1).token_gemv; }
  void dense_token_folded(const DecodeTokenNorm& in, __nv_bfloat16* y, cudaStream_t stream);
  // The same step with its output added into a fixed-point accumulator (one kernel:
  // TwellDecodeTokenParams::y_fixed): in holds r and w only (r is current; nothing stores it).
  void decode_step_fixed(const DecodeTokenNorm& in, long long* y_fixed, unsigned* overflow, cudaStream_t stream);
  // Sorts the one-token kernel's neurons by their activity so far, the most active first
  // (launch_decode_token_reorder): the same results, a schedule. forward() does it itself on
  // decode_reorder_due's steps, and advance_decode_order does for a caller replaying decode_step
  // graphs. No-op before prepare_decode(1). Not capturable (nothing stops it; it belongs between
  // replays).
  void reorder_decode(cudaStream_t stream);
  // One one-token step is about to run (forward() counts its own; a caller replaying decode_step
  // graphs calls this before each one-token step, outside the capture): counts it toward
  // decode_reorder_due's schedule and reorders when due. New weights (a hot split among them, which
  // renumbers the neurons) restart the identity order and the count. Prepares the step too. No-op
  // where the one-token kernels do not serve this layer.
  void advance_decode_order(cudaStream_t stream);
  // One-token steps counted since the order's weights came, the order itself (device [N], neuron
  // indices) and the activations counted since (valid once prepared): what tests read.
  std::int64_t decode_order_steps() const noexcept { return decode_order_steps_; }
  const std::int32_t* decode_order() const noexcept { return decode_order_.get(); }
  const std::uint32_t* decode_hits() const noexcept { return decode_hits_.get(); }  // device [N]: each neuron's count
  // What the automatic dispatch has measured, never waiting (polls the counts in flight first):
  // the density it follows (−1: none yet; rows the sparse path would run dense weigh at their
  // dense cost, so a dense layer reads far below its true density), the same count's true share
  // of non-zero activations (exact over the rows it counted: all of a TwELL or decode call's, a
  // dense call's sampled ones), and the newest counted TwELL call's exact counters that came back
  // (m −1: none). With hot neurons split off, a TwELL or dense call's counts are the cold
  // neurons' (per cold neuron); a decode call's (decode sizes never split) cover every neuron.
  struct Measured {
    double density = -1;
    double active = -1;
    std::int64_t m = -1, nnz = -1, overflow_tiles = -1, overflow_rows = -1;
  };
  Measured measured();
  // Synchronises `stream` and returns the counters of the last packing (zeros if it was skipped).
  // With hot neurons split off (sparse_n(m) < n()), the counts are the cold neurons' only.
  TwellCounters read_counters(cudaStream_t stream);
  // Synchronises `stream`; the last sparse_rest's dense rows (ContextOptions::dense_rows_density):
  // rows over the threshold, rows run dense (≤ capacity), the dispatch cost and nnz it counted.
  struct DenseRowsInfo {
    bool counted = false;  // the last sparse_rest planned dense rows at all
    std::uint64_t hot = 0, dense = 0, cost = 0, nnz = 0;
    std::int64_t capacity = 0;
  };
  DenseRowsInfo read_dense_rows(cudaStream_t stream);

  // Hot neurons (ContextOptions::hot_neurons_*). count_neurons: the gate's non-zeros per neuron
  // over x's m rows (a gate GEMM, a count, a host read), indexed by the original neuron numbering.
  // choose_hot_neurons: those over the density threshold. set_hot_neurons: permutes the weights so
  // that these neurons (original numbering, any order, duplicates ignored) come last and run
  // dense; more of the cold ones join them (the hottest by `counts` if given, else the last) until
  // the cold count is a multiple of 8; an empty list, or one leaving no cold neuron, turns the split
  // off. The results of every path stay the same function of x (the order of a sum changes). Resets
  // the dispatch's measured density. calibrate_hot_neurons: all three, by
  // choose_hot_neurons_calibrated where the sparse path runs dense rows (a first guess without the
  // max-share rule, then the choice over the rows that would still run sparse after it when at
  // least dense_rows_min rows would not: hot tokens cost nothing per neuron); returns the hot count.
  std::vector<std::uint32_t> count_neurons(const __nv_bfloat16* x, std::int64_t m, cudaStream_t stream);
  std::vector<std::int64_t> choose_hot_neurons(const std::vector<std::uint32_t>& counts, std::int64_t m) const;
  void set_hot_neurons(const std::vector<std::int64_t>& hot, cudaStream_t stream,
                       const std::vector<std::uint32_t>* counts = nullptr);
  std::int64_t calibrate_hot_neurons(const __nv_bfloat16* x, std::int64_t m, cudaStream_t stream);
  // What the first sparse or automatic forward() of m rows does first: with hot_neurons_auto, a
  // layer not calibrated yet and m ≥ hot_neurons_min_rows (not decode), calibrate_hot_neurons.
  // Returns whether it calibrated. (Benchmarks call it before timing gate_twell / sparse_rest.)
  bool calibrate_if_due(const __nv_bfloat16* x, std::int64_t m, cudaStream_t stream);
  std::int64_t hot_count() const noexcept { return hot_n_; }
  std::vector<std::int64_t> hot_neurons() const;  // original numbering, ascending
  // Position → original neuron of the device weights, gate buffer and TwELL columns (empty: identity).
  const std::vector<std::int64_t>& neuron_order() const noexcept { return order_; }
  // Neurons the sparse path of a call of m rows runs (the first sparse_n(m) positions): N − hot
  // neurons when the split is used at this m, else N. The TwELL words of gate_twell(x, m) are
  // [m, sparse_tiles(m) · S].
  std::int64_t sparse_n(std::int64_t m) const noexcept { return shape(m).sparse_n; }
  std::int64_t sparse_tiles(std::int64_t m) const noexcept { return (sparse_n(m) + kTwellTile - 1) / kTwellTile; }

  bool gated() const noexcept { return w_.gated(); }
  // gate_twell runs the sm90 gate GEMM with the TwELL epilogue (option on, device and build able).
  bool gate_sm90_active() const noexcept { return opt_.gate_sm90 && gate_sm90_ok_; }
  std::int64_t n() const noexcept { return w_.n(); }
  std::int64_t k() const noexcept { return w_.k(); }
  std::int64_t ldn() const noexcept { return w_.ldn(); }
  std::int64_t tiles() const noexcept { return (n() + kTwellTile - 1) / kTwellTile; }
  int words_per_tile() const noexcept { return opt_.twell.words_per_tile(); }
  const ContextOptions& options() const noexcept { return opt_; }
  void set_decode_max_density(double d) noexcept {  // both decode thresholds; the next plans follow them
    opt_.decode_max_density = d;
    opt_.decode_token_max_density = d;
  }
  void set_decode_max_rows(std::int64_t m) noexcept { opt_.decode_max_rows = m; }  // the next plans follow it
  void set_decode_gemv_max_rows(std::int64_t m) noexcept { opt_.decode_gemv_max_rows = m; }  // the same
  void set_union_max_rows(std::int64_t m) noexcept { opt_.union_max_rows = m; }    // the same
  void set_union_min_rows(std::int64_t m) noexcept { opt_.union_min_rows = m; }    // the same
  void set_union_kernels(int up_split, int down_split, int up_clusters) noexcept {  // the next launches
    opt_.union_up_split = up_split;
    opt_.union_down_split = down_split;
    opt_.union_up_clusters = up_clusters;
  }
  // At most the rows a decode step of this layer runs on the union FFN (0: none).
  std::int64_t union_rows_cap() const noexcept;
  void set_decode_reorder(bool on, cudaStream_t stream);  // off: back to the identity order at once
  void set_dense_fold_norm(bool on) noexcept { opt_.dense_fold_norm = on; }  // the next steps
  LtGemm& gemm() noexcept { return gemm_; }
  const LtGemm& gemm() const noexcept { return gemm_; }
  // GEMMs on a second stream (hot_overlap here and in the training context): their own workspace,
  // of gemm()'s size so that the heuristics choose the same algorithms; created on first use.
  LtGemm& side_gemm();
  std::size_t side_gemm_workspace_bytes() const noexcept { return ws_->side_gemm ? ws_->side_gemm->workspace_bytes() : 0; }

  // The device weights in the kernels' layouts (packed_weights.hpp), in neuron_order().
  const PackedWeights& weights() const noexcept { return w_; }
  const __nv_bfloat16* w_gate_up() const noexcept { return w_.gate_up(); }
  const __nv_bfloat16* w_down() const noexcept { return w_.down(); }
  const __nv_bfloat16* w_down_t() const noexcept { return w_.down_t(); }
  std::size_t weight_bytes() const noexcept { return w_.bytes() + w_hot_gu_.bytes(); }

  // Results of the last gate_twell (valid for its m until the next call of any layer sharing the
  // workspace); columns in neuron_order().
  const std::uint32_t* twell_words() const noexcept { return ws_->words.get(); }   // [m, sparse_tiles(m) · S]
  const __nv_bfloat16* gate_values() const noexcept { return ws_->g.get(); }       // [m, ldn]
  const std::uint32_t* row_overflow() const noexcept { return ws_->row_ovf.get(); }  // [m]

 private:
  void reserve(std::int64_t m);
  // Before new weights arrive: a new epoch, no hot split, workspaces sized again, and unless
  // keep_measurements the dispatch measures again.
  void weights_changing(bool keep_measurements);
  // The packing writes per-row counts (the dense rows' input).
  bool needs_row_nnz() const noexcept;
  void check_m(std::int64_t m) const;
  // Packs rows [r0, r0 + rows) of the gate buffer; adds to the counters unless reset_counters.
  // n: the call's sparse_n.
  void pack_rows(std::int64_t r0, std::int64_t rows, std::int64_t n, const std::uint32_t* enable, bool reset_counters,
                 cudaStream_t stream);
  LayerFacts facts() const noexcept;  // what shape_call reads of this layer
  // The executors: each runs what the call's shape says and decides nothing.
  void gate_twell(const __nv_bfloat16* x, std::int64_t m, const CallShape& s, cudaStream_t stream);
  void sparse_rest(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, const CallShape& s, cudaStream_t stream);
  // sparse_rest over the cold neurons [0, s.sparse_n) (all of them without the split).
  void cold_rest(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, const CallShape& s, cudaStream_t stream);
  // The hot neurons' dense part. hot_up: [g | u] = x·[Wg; Wu]ᵀ over them, h = ReLU(g) ⊙ u
  // (non-gated h = ReLU(x·Wuᵀ)) into hot_workspace (one sm90 kernel where hot_sm90()), on
  // `gemm` (the side stream's with hot_overlap, beside cold_rest); hot_down: y += h·Wd[:, hot]ᵀ,
  // after cold_rest wrote y.
  void hot_up(const __nv_bfloat16* x, std::int64_t m, LtGemm& gemm, cudaStream_t stream);
  void hot_down(std::int64_t m, __nv_bfloat16* y, cudaStream_t stream);
  // gate_gemm over the first n neurons (the call's sparse_n in gate_twell).
  void gate_gemm_cols(const __nv_bfloat16* x, std::int64_t m, std::int64_t n, cudaStream_t stream);
  __nv_bfloat16* hot_workspace(std::int64_t m) noexcept;  // [m, 2·ldh]: h in its first ldh columns
  // The dense-row capacity for a call of m rows: fixed, or from the newest counted share.
  std::int64_t dense_rows_capacity(std::int64_t m);
  // Of a row over n neurons (the call's sparse_n):
  std::uint32_t dense_row_cap(std::int64_t n) const noexcept;   // hot iff count > this
  std::uint32_t dense_row_cost(std::int64_t n) const noexcept;  // a hot row's weight in the dispatch count
  // The sparse remainder's dense rows: plan (always), then with capacity > 0 the gathered GEMMs;
  // returns the row filter for the fused kernel (null: every row sparse).
  // n: the call's sparse_n.
  const std::uint32_t* dense_rows_begin(const __nv_bfloat16* x, std::int64_t m, std::int64_t n, std::int64_t cap,
                                        cudaStream_t stream);
  void dense_rows_finish(std::int64_t m, std::int64_t n, std::int64_t cap, __nv_bfloat16* y, cudaStream_t stream);
  // y = h · Wdᵀ for m rows of h [m, ldn]: the GEMV where s.down_gemv (tensor cores, 2–8 rows) or s.token_gemv
  // (one row, CUDA cores), else cuBLASLt.
  // store (dense_token_folded: one row on the GEMV): the GEMV also stores the residual
  // r = (r + first) + delta that a norm folded into the kernel before left (TwellGemvParams::store_r).
  void down_product(const __nv_bfloat16* h, std::int64_t m, __nv_bfloat16* y, const CallShape& s, cudaStream_t stream,
                    const DecodeTokenNorm* store = nullptr);
  void gate_pack_sm90(const __nv_bfloat16* x, std::int64_t m, std::int64_t n, cudaStream_t stream);
  // This layer's operands for a call on x [m, K] → y [m, K] (both row stride K).
  // n: the neurons [0, n) the kernel runs (the call's sparse_n, or N for decode).
  FfnOperands operands(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, std::int64_t n) const noexcept;
  void resolve_pending();  // folds the newest returned count into last_density_
  // Decode: gate GEMM, then the decode kernel (twell_decode.hpp; one token: the fused one-token
  // kernels, twell_decode_token.hpp), its count into counts_.
  void decode_forward(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, const CallShape& s, cudaStream_t stream);
  // decode_forward's kernels with the count stored at nnz_out (device); allocates only if unprepared.
  // norm (decode_step_folded only: one token, the one-token kernels): x from the residual stream.
  void enqueue_decode(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, const CallShape& s, unsigned long long* nnz_out,
                      cudaStream_t stream, const DecodeTokenNorm* norm = nullptr);
  // Rows of the last dense_forward's gate still in gu_ (its last row chunk), from row 0.
  std::int64_t dense_gate_rows_ = 0;
  // dense_forward, then a sampled count of its gate, read back by a later call (counts_).
  void dense_forward_counted(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, const CallShape& s,
                             cudaStream_t stream);
  // Dispatch count over ≤ dispatch_sample_rows evenly spaced rows of src [m, n] (row stride ld),
  // n the call's sparse_n (its cold neurons: their density is what the thresholds compare).
  // rows_at_cost: rows over the dense-row threshold count at their dense cost (the call's dense_rows).
  TwellSampleParams sample_params(const __nv_bfloat16* src, std::int64_t ld, std::int64_t m, std::int64_t n,
                                  double max_density, bool rows_at_cost);
  void reset_dispatch_state();  // forget measured densities and hot-row shares (new weights or order)
  // Per-neuron counts (original numbering) of the gate buffer's m rows (gate_gemm ran); with `cold`
  // (by original neuron), rows with more than dense_row_cap(#cold) non-zeros in those are skipped.
  std::vector<std::uint32_t> neuron_counts_of_gate(std::int64_t m, const std::vector<unsigned char>* cold,
                                                   std::int64_t* rows_left_out, cudaStream_t stream);
  double max_hot_neurons() const noexcept;  // choose_hot_neurons' cap on the hot count
  // hot_up runs the sm90 gated-product kernel (and w_hot_gu_ has its layout): fixed from
  // set_hot_neurons on, since the options, the device and gated() are.
  bool hot_sm90() const noexcept { return gated() && hot_n_ > 0 && opt_.hot_product_sm90 && gate_sm90_ok_; }
  OverShare over_share() const noexcept { return opt_.hot_neurons_densest_share ? OverShare::densest : OverShare::none; }
  // choose_hot_neurons' threshold (share of tokens; ≤ 0: no split)
  double hot_threshold() const noexcept { return gated() ? opt_.hot_neurons_density : opt_.hot_neurons_density_nongated; }

  ContextOptions opt_;
  bool union_ok_ = false;      // this device runs the union FFN (union_ffn_available)
  bool gate_sm90_ok_ = false;  // this device runs the sm90 gate kernel (gate_pack_sm90_available)
  std::shared_ptr<FfnWorkspace> ws_;  // per-call scratch, possibly shared by many layers
  LtGemm& gemm_;                      // ws_->gemm
  PackedWeights w_;
  std::int64_t cap_m_ = 0;
  // w_ in neuron_order(): cold neurons first, the hot_n_ hot ones last.
  std::int64_t hot_n_ = 0;
  std::vector<std::int64_t> order_;       // position → original neuron (empty: identity)
  // gated [2·ldh, K] = [Wg_hot; 0; Wu_hot; 0], non-gated [ldh, K] = [Wu_hot; 0]; with hot_sm90()
  // [256·⌈hot/128⌉, K] (pack_gated_product_weights): per 128 hot neurons their Wg rows then their Wu rows.
  DeviceBuffer<__nv_bfloat16> w_hot_gu_;
  bool hot_calibrated_ = false;           // hot_neurons_auto: this layer calibrated (or tried)
  // workspaces
  struct Dispatch {
    unsigned long long count;  // Σ over sampled rows of the row's cost (count, or the dense-row cost)
    unsigned long long hot;    // sampled rows over the dense-row threshold
    // The sampled rows' true non-zeros, then two words never read: the count ring's three extra
    // words (a dense counted call's push carries them, tag 0, beside a TwELL call's counters).
    unsigned long long nnz;
    unsigned long long unused[2];  // zeroed before each push that carries them
    std::uint32_t decision;
    std::uint32_t pad;
  };
  static_assert(offsetof(Dispatch, unused) == offsetof(Dispatch, nnz) + sizeof(unsigned long long) &&
                    sizeof(Dispatch::unused) == 2 * sizeof(unsigned long long),
                "Dispatch's nnz and unused words must be the count ring's three extra words");
  DeviceBuffer<Dispatch> dispatch_;
  PinnedBuffer<Dispatch> dispatch_host_;
  cudaEvent_t decided_ = nullptr;
  // chunked gate_twell: chunk i's packing beside chunk i + 1's GEMM, at the default priority (the
  // packing's many small CTAs must not take the SMs ahead of the GEMM's)
  SideStream pack_side_{SideStream::Priority::normal};
  SideStream hot_side_;                // hot_overlap: the hot part's GEMMs beside cold_rest
  double last_density_ = -1;  // density of the latest call whose count came back (−1: none)
  double last_active_ = -1;   // its true share of non-zeros (last_density_ weighs dense rows at their cost)
  std::uint64_t weights_epoch_ = 0;  // see weights_epoch()
  CallRecord last_call_;             // see last_call()
  Measured last_counted_;     // the counters that came back with it (TwELL calls; see measured())
  std::int64_t dense_calls_ = 0;  // dense calls of automatic since upload (for the count periods)
  CountRing counts_;          // counts of sticky calls on their way back (never waited for)
  DeviceBuffer<TwellCounters> counters_;
  PinnedBuffer<TwellCounters> counters_host_;
  DeviceBuffer<unsigned int> decode_tickets_;     // row tickets, CTA ticket (kept zero between launches)
  DeviceBuffer<unsigned long long> decode_nnz_;   // [1] (kept zero between launches)
  DeviceBuffer<unsigned long long> decode_step_nnz_{1};  // [1] decode_step's count (not read back)
  DeviceBuffer<float> decode_h_;                  // [N] one-token decode's h (twell_decode_token.hpp)
  DeviceBuffer<unsigned char> decode_flags_;      // its active flags
  std::int64_t decode_token_n_ = 0;               // the N decode_h_ and decode_flags_ are sized for
  // The one-token kernel's schedule (TwellDecodeTokenParams::order, hits): a permutation of the
  // neurons, most active first, and each neuron's activity since the weights of decode_order_epoch_.
  DeviceBuffer<std::int32_t> decode_order_;
  DeviceBuffer<std::uint32_t> decode_hits_;
  std::uint64_t decode_order_epoch_ = ~std::uint64_t{0};
  std::int64_t decode_order_steps_ = 0;           // one-token steps (advance_decode_order) since that epoch
  // The order and counts are those of the current weights (else the next prepare_decode restarts them).
  bool decode_order_current() const noexcept;
  // decode_step of m rows may run: prepare_decode(m) made everything it needs (for these weights' shape).
  bool decode_prepared(std::int64_t m) const noexcept;
  int sm_count_ = 0;
  std::size_t smem_optin_ = 0;
  // Dense rows (twell_dense_rows.hpp).
  DeviceBuffer<DenseRowsStats> dense_stats_;  // [1]
  CountRing hot_share_;                       // share of rows over the threshold, per call
  double last_hot_share_ = -1;                // newest share that came back (−1: none)
  std::int64_t dense_cap_ = 0;                // current learned capacity (rows)
  std::int64_t last_dense_cap_ = 0;           // capacity of the last sparse_rest (for its path name)
  bool last_dense_planned_ = false;
};

}  // namespace twell::cuda
