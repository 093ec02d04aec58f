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
//                     dense_rest:  u = x·Wuᵀ, h = g ⊙ u, y = h·Wdᵀ (cuBLASLt), reusing g.
// Non-gated:          gate_twell packs h = ReLU(x·Wuᵀ); sparse_rest = sparse down; dense_rest = y = h·Wdᵀ.
// Overflowed TwELL blocks are read whole from the bf16 [M, N] gate buffer, so every row is exact.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

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
#include "cuda/sm80/twell_decode.hpp"
#include "cuda/sm80/twell_dense_rows.hpp"
#include "cuda/sm80/twell_hot_neurons.hpp"
#include "cuda/sm80/twell_kernels.hpp"
#include "twell/cuda/ffn_cuda.hpp"
#include "twell/ffn.hpp"

namespace twell::cuda {

// The inference context's options: the dispatch policy (ffn_plan.hpp: thresholds, sticky
// dispatch, count periods; where each value comes from: docs/perf-notes-cuda.md, "Dispatch
// policy"), then the kernels' variants and the hot-row / hot-neuron splits.
struct ContextOptions : DispatchPolicy {
  TwellConfig twell{};
  bool autotune_gemm = false;  // time cuBLASLt's candidate algorithms once per shape
  std::int64_t dispatch_sample_rows = 2048;  // rows the dispatch count reads (all rows when M is smaller)
  // TwellUpDownParams::variant of the fused kernel, gated (1 measured fastest or equal at M ≥ 16
  // on H100 and H200) and non-gated (0: 0.224 vs 0.273 ms for variant 1, H200, M = 16384, 0.5 %,
  // timed alternately, 9832d1e).
  // Variants 3 and 4 (as 0, compiled for 6 and 8 resident blocks per SM: 80 and 64 registers
  // instead of up to 128, so 24–32 warps per SM wait on L2 round trips instead of 16) measured
  // faster from M = 4096 on (H200, M = 16384, remainder alternating with variant 1 / 0, 9a11918:
  // gated 3: 0.576 / 0.642 ms at 0.5 %, 0.880 / 0.927 at 1 %, 0.833 / 0.892 hot; non-gated 4:
  // 0.277 / 0.356) and slower below (M = 1024: 0.052 / 0.045): below updown_occupancy_min_rows
  // they run as 1 (gated) and 0 (non-gated).
  int updown_variant = 3;
  int updown_variant_nongated = 4;
  std::int64_t updown_occupancy_min_rows = 2048;
  // Decode (M ≤ decode_max_rows, M < dispatch_min_rows, K ≤ kDecodeMaxK): always sticky; the
  // gate GEMM then the decode kernel (twell_decode.hpp: a token's non-zeros spread over N/256
  // CTAs) until a count measures more than decode_max_density. H100, K = 2048, N = 5632
  // (17629ec, dense and automatic alternately): 1.16–1.4x dense at M = 1…16 and 0.3–0.6 %,
  // 1.05–1.3x at 1 %, 1.0–1.27x at M = 1 and 2.5 %, 0.8–0.9x at M = 4…16 and 3 %. H200 (more
  // memory bandwidth, so a faster dense GEMV; 4be0c14 and 4011fd1): 1.01–1.12x at ≤ 0.73 %, but
  // 0.90–0.99x at M = 4…16 and 1.0–1.1 %; so 0.8 %, not the 2 % the H100 alone suggested.
  std::int64_t decode_max_rows = 16;
  // The decode path's gate through the GEMV kernel (sm80/twell_gemv.hpp) instead of the cuBLASLt
  // ReLU GEMM, for M ≤ decode_gemv_max_rows (and K ≤ 8192). Measured on the H200 (whole decode
  // path, alternating, 416e007): M = 1 0.023 vs 0.024 ms (three points,
  // always ~1 µs ahead); M = 4 0.029–0.040 vs 0.024–0.034, M = 8 and 16 up to 2.3x slower (CUDA-core
  // dot products per token; cuBLASLt uses tensor cores there). Hence M = 1 only.
  bool decode_gemv = true;
  std::int64_t decode_gemv_max_rows = 1;
  // gate_twell on a compute-capability-9.0 GPU: the sm90 gate GEMM with the TwELL packing in its
  // epilogue (sm90/gate_pack.hpp; the gate buffer then holds only overflowed blocks). false, or
  // another GPU: the cuBLASLt gate GEMM (ReLU epilogue) + twell_pack below. On by default since
  // its packers went one lane per row with bulk-copy stores (49dab5b, H200, M = 16384, bench):
  // gate + pack 0.483 ms at 0.5 % and 0.492 at 1 % against 0.585–0.643 for cuBLASLt + twell_pack
  // and 0.53 for the cuBLASLt GEMM alone; at 3 % and above it is 1.1–1.6x the GEMM (the packers
  // fall behind), where dispatch runs dense (docs/perf-notes-cuda.md, "Sixth session"). The first
  // call of a layer (dispatch's sampled count) always uses the cuBLASLt gate.
  bool gate_sm90 = true;
  // With the sm90 gate: also store every gate value in the gate buffer (tests and diagnostics
  // that read gate_values() after gate_twell; costs the [M, N] write the epilogue saves).
  bool gate_store_values = false;
  // The sm90 gate's cluster size along M (1, 2 or 4): CTAs of a cluster multicast W tiles to each
  // other, cutting the L2 → SM traffic per stage from 48 KB to 16 + 32/cluster KB.
  int gate_sm90_cluster = 2;
  // The sm90 gate's consumers stage tiles by stmatrix (GatePackParams::stage_stmatrix): the same
  // values in the same places. H100 (6a75e21, probe alternating with the GEMM, cluster 2): whole
  // gate 1.067x the GEMM vs 1.104x with 32-bit shared stores; false keeps those.
  bool gate_sm90_stmatrix = true;
  // The sm90 gate's packers take rows with many non-zero words by the whole warp
  // (GatePackParams::heavy_rows): the same words; false packs every row by its own lane.
  bool gate_sm90_heavy_rows = true;
  // The sm90 gate's consumers write per-row masks of the non-zero 16-byte words for the packers
  // (GatePackParams::word_masks): the same words; false: the packers scan the staged rows.
  bool gate_sm90_word_masks = true;
  // gate_twell in this many row chunks (1: one GEMM, then one packing pass): chunk i's packing
  // runs on a second stream while chunk i + 1's GEMM runs. At most M / 2048 chunks, each a whole
  // number of 128-row tiles except the last.
  // Measured (M = 16384): gate+pack 0.589 ms unchunked vs 0.588 / 0.602 / 0.619 with 2 / 4 / 8
  // chunks at 0.5 %, and 0.66–0.73 vs 0.59–0.61 (2 chunks) at 1–10 % (GEMM alone 0.50–0.54).
  int gate_chunks = 2;
  // Dense rows (sm80/twell_dense_rows.hpp), on the TwELL remainder: rows with more than dense_rows_density·N non-zeros (hot tokens,
  // heavy rows, rows with overflowed blocks) run as rows of cuBLASLt GEMMs, gathered, instead of
  // through the fused kernel, up to a capacity sized from the share of such rows an earlier call
  // counted (+10 % + 64 rows; dense_rows_capacity ≥ 0 fixes it instead). Rows past the capacity
  // stay sparse: exact either way. 0 turns it off. 0.02 since the seventeenth session: at the hot
  // point it read 1–3 % faster than 0.015 in three H100 runs, alternating, neutral at the others
  // (the training step's threshold is 0.02 too).
  double dense_rows_density = 0.02;
  // A dense row's weight in the dispatch count, as a density of N: automatic compares
  // Σ_rows (row dense ? this·N : count) / (M·N) with its thresholds, so a layer whose non-zeros
  // sit in a few heavy rows still runs sparse.
  double dense_rows_cost_density = 0.015;
  // Dense rows engage once an earlier call's share of rows over the threshold, scaled to this
  // call's M, comes to at least this many rows: small gathered GEMMs run far below the GEMM rate.
  // Measured (H200, M = 16384, d048c10, alternating): at 0.5 % the 296 heavy rows (capacity 512)
  // cost 1.058 vs 1.011 ms for the whole sparse path without them; at 1 % 2767 rows saved 0.05 ms,
  // with the reference's hot rows (1.33 %) 3193 rows 0.40 ms. With hot neurons split off (fewer
  // non-zeros per row in the cold part) the reference's 492 hot tokens plus ~300 heavy rows fell
  // under 1024 and ran sparse: whole sparse path 1.425 ms (ef0a7bb) against 1.346 ms when they ran
  // dense (69c4d08, H200, M = 16384); hence 512 (still above the 296 rows measured at 0.5 %).
  std::int64_t dense_rows_min = 512;
  std::int64_t dense_rows_capacity = -1;  // ≥ 0: this fixed capacity (tests, benchmarks)
  // Hot neurons (sm80/twell_hot_neurons.hpp): neurons active in more than hot_neurons_density of a
  // calibration batch's tokens run as columns of dense cuBLASLt GEMMs (their gate and up product,
  // h, and a down GEMM that adds into y), the others through the sparse path, for calls of at least
  // hot_neurons_min_rows rows (decode and small batches run every neuron through their usual path).
  // The break-even: a neuron costs ≈ 6·M·K flops as GEMM columns (≈ 0.26 µs per 1000 tokens at
  // K = 2048 and ~650 TF/s, less the 2·M·K of gate it needs anyway) and ≈ 1.1 ns per non-zero
  // through the fused kernel, so ≈ 1.2 % (gated) and ≈ 1.3 % (non-gated, ≈ 0.6 ns per non-zero
  // against 4·M·K flops). Calibration: calibrate_hot_neurons(), or automatically on the first
  // sparse or automatic call of a layer with at least hot_neurons_min_rows rows (hot_neurons_auto).
  // Thresholds ≤ 0 turn the split off. Measured (H200, M = 16384, 584ccce, whole sparse path,
  // alternating with the split off / at other thresholds): gated 0.5 % 0.993 vs 1.020 ms off
  // (0.008 / 0.016 / 0.024: 1.104 / 1.106 / 1.118 vs 1.065–1.086 at 0.012), 1 % 1.178 vs 1.341
  // (0.016 / 0.024: 1.353 / 1.315 vs 1.310 / 1.229); non-gated 0.5 %: 0.743 vs 0.722 ms off (its
  // GEMM columns cost less to skip: the sparse down alone is ≈ 0.65 ns per non-zero), so off.
  bool hot_neurons_auto = true;
  double hot_neurons_density = 0.012;
  double hot_neurons_density_nongated = 0;
  std::int64_t hot_neurons_min_rows = 2048;
  // At most this share of the neurons runs hot (the hot part's workspace holds half of them). An
  // unbounded split measured slower than the dense FFN at 10 % (b47f0fe, H200: 5224 of 5632
  // neurons hot, 1.79 vs 1.74 ms), where the dispatch's cold-neuron density (the cold few are rare)
  // would still pick it.
  double hot_neurons_max_share = 0.5;
  // When more neurons than that qualify: true takes the densest hot_neurons_max_share of them,
  // false none (the rule before the eighteenth session). The dispatch then decides on the cold
  // half's density. Measured (H100, M = 16384, whole sparse path alternating with dense,
  // probe_dispatch, d8be6c5), the densest 49 % hot against none: 2 % mean density 1.12× dense
  // (cold 0.61 %) against 0.88×, 3 % 1.03× (cold 0.92 %) against 0.83×; at 5 % and 10 % (cold
  // 1.58 % and 3.35 %) 0.92× and 0.82×, where the dispatch runs dense.
  bool hot_neurons_densest_share = true;
  // The hot neurons' [g | u] GEMM and product run on a second, high-priority stream
  // (common/side_stream.hpp) beside the cold part's sparse kernels, which are bound by L2
  // bandwidth on CUDA cores while the GEMM is bound by tensor cores; the down GEMM that adds into
  // y waits for both. Off: one stream, in the same order. Same results bit for bit.
  bool hot_overlap = true;
  // Gated, on a GPU that runs the sm90 gate kernel: the hot neurons' [g | u] GEMM and the product
  // h = ReLU(g) ⊙ u as one kernel (sm90/gate_pack.hpp, launch_gated_product_sm90: h staged in
  // shared memory from the accumulators and stored once), instead of a cuBLASLt GEMM writing
  // [M, 2·hot] and an elementwise pass reading it back (the same arithmetic; the GEMMs' sums in
  // their own orders). Measured (H100, M = 16384, K = 2048, 323fd30): the phase 0.116 vs 0.133 ms
  // at 512 hot neurons and 0.27–0.29 vs 0.32–0.34 at 1408 (the kernel as fast as the GEMM alone);
  // the whole sparse path −1.3…−2.5 % at 0.5–1 %, −4 % at 3 % (docs/perf-notes-cuda.md).
  bool hot_product_sm90 = true;
};

// Device bf16 weights in nn.Linear's layouts, row-major and contiguous: w_gate, w_up [N, K]
// (w_gate null: a non-gated FFN), w_down [K, N].
struct DeviceFfnWeights {
  const __nv_bfloat16* w_gate = nullptr;
  const __nv_bfloat16* w_up = nullptr;
  const __nv_bfloat16* w_down = nullptr;
  std::int64_t n = 0, k = 0;
};

struct ForwardResult {
  bool sparse = false;              // which remainder ran
  bool counted = false;             // Path::automatic: a sampled count decided
  double sampled_density = 0;       // nnz / (rows · N) over the sampled rows
  std::string path;
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
  void dense_forward(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, cudaStream_t stream);
  // gate GEMM (ReLU epilogue) + TwELL packing.
  void gate_twell(const __nv_bfloat16* x, std::int64_t m, cudaStream_t stream);
  void gate_gemm(const __nv_bfloat16* x, std::int64_t m, cudaStream_t stream);
  void pack(std::int64_t m, const std::uint32_t* enable, cudaStream_t stream);

  void sparse_rest(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, cudaStream_t stream);
  void dense_rest(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, cudaStream_t stream);
  // The cuBLASLt GEMM of the gate's shape alone ([m, K]·[N, K]ᵀ, no epilogue), for benchmarks.
  void dense_gate_gemm(const __nv_bfloat16* x, std::int64_t m, cudaStream_t stream);
  // Path::dense: the cuBLASLt FFN. Path::sparse: gate_twell + sparse_rest. Path::automatic: gate
  // GEMM, a sampled count of its non-zeros decides on the device (packing is skipped when dense
  // wins), the host waits for that one flag and enqueues the matching remainder; later calls follow
  // the latest count without a host wait (sticky_dispatch), decode (M ≤ decode_max_rows) from the first call.
  ForwardResult forward(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, Path path, cudaStream_t stream);
  // Decode steps inside a CUDA graph (M ≤ decode_max_rows, see is_decode): decode_plan_sparse()
  // is the path forward(automatic) would take now (the decode kernel unless the latest count is
  // over decode_max_density); prepare_decode(m) makes every allocation a step of m rows needs (not
  // capturable; nothing once done); decode_step then enqueues only that path's kernels, with no
  // host wait, no allocation and no count read back (the decode kernel stores its count into a
  // fixed device word instead of the count ring), so it can be captured and replayed. The caller
  // re-plans from time to time by an ordinary forward(automatic), which counts.
  bool is_decode(std::int64_t m) const noexcept;
  bool decode_plan_sparse();  // polls the counts in flight first (never waits)
  void prepare_decode(std::int64_t m, cudaStream_t stream);
  void decode_step(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, bool sparse, cudaStream_t stream);
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
  std::int64_t sparse_n(std::int64_t m) const noexcept;
  std::int64_t sparse_tiles(std::int64_t m) const noexcept { return (sparse_n(m) + kTwellTile - 1) / kTwellTile; }

  bool gated() const noexcept { return gated_; }
  // gate_twell runs the sm90 gate GEMM with the TwELL epilogue (option on, device and build able).
  bool gate_sm90_active() const noexcept { return opt_.gate_sm90 && gate_sm90_ok_; }
  std::int64_t n() const noexcept { return n_; }
  std::int64_t k() const noexcept { return k_; }
  std::int64_t ldn() const noexcept { return ldn_; }
  std::int64_t tiles() const noexcept { return (n_ + kTwellTile - 1) / kTwellTile; }
  int words_per_tile() const noexcept { return opt_.twell.words_per_tile(); }
  const ContextOptions& options() const noexcept { return opt_; }
  LtGemm& gemm() noexcept { return gemm_; }
  const LtGemm& gemm() const noexcept { return gemm_; }
  // GEMMs on a second stream (hot_overlap here and in the training context): their own workspace,
  // of gemm()'s size so that the heuristics choose the same algorithms; created on first use.
  LtGemm& side_gemm();
  std::size_t side_gemm_workspace_bytes() const noexcept { return ws_->side_gemm ? ws_->side_gemm->workspace_bytes() : 0; }

  // Device weights (bf16): [Wg; 0; Wu; 0] as [2·ldn, K] (gated) or [Wu; 0] as [ldn, K]; Wd as
  // [K, ldn] (padding columns zero); Wdᵀ as [N, K].
  const __nv_bfloat16* w_gate_up() const noexcept { return w_gu_.get(); }
  const __nv_bfloat16* w_down() const noexcept { return w_down_.get(); }
  const __nv_bfloat16* w_down_t() const noexcept { return w_down_t_.get(); }
  std::size_t weight_bytes() const noexcept {
    return w_gu_.bytes() + w_down_.bytes() + w_down_t_.bytes() + w_hot_gu_.bytes();
  }


  // Results of the last gate_twell (valid for its m until the next call of any layer sharing the
  // workspace); columns in neuron_order().
  const std::uint32_t* twell_words() const noexcept { return ws_->words.get(); }   // [m, sparse_tiles(m) · S]
  const __nv_bfloat16* gate_values() const noexcept { return ws_->g.get(); }       // [m, ldn]
  const std::uint32_t* row_overflow() const noexcept { return ws_->row_ovf.get(); }  // [m]

 private:
  void reserve(std::int64_t m);
  void set_shape(bool gated, std::int64_t n, std::int64_t k);  // checks the shape; sets gated_, n_, k_ and ldn_
  // The packing writes per-row counts (the dense rows' input).
  bool needs_row_nnz() const noexcept;
  void check_m(std::int64_t m) const;
  // Packs rows [r0, r0 + rows) of the gate buffer; adds to the counters unless reset_counters.
  // n: the call's sparse_n.
  void pack_rows(std::int64_t r0, std::int64_t rows, std::int64_t n, const std::uint32_t* enable, bool reset_counters,
                 cudaStream_t stream);
  // sparse_rest over the cold neurons [0, sparse_n(m)) (all of them without the split).
  void cold_rest(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, cudaStream_t stream);
  // The hot neurons' dense part. hot_up: [g | u] = x·[Wg; Wu]ᵀ over them, h = ReLU(g) ⊙ u
  // (non-gated h = ReLU(x·Wuᵀ)) into hot_workspace (one sm90 kernel where hot_sm90()), on
  // `gemm` (the side stream's with hot_overlap, beside cold_rest); hot_down: y += h·Wd[:, hot]ᵀ,
  // after cold_rest wrote y.
  void hot_up(const __nv_bfloat16* x, std::int64_t m, LtGemm& gemm, cudaStream_t stream);
  void hot_down(std::int64_t m, __nv_bfloat16* y, cudaStream_t stream);
  // gate_gemm over the first n neurons (the call's sparse_n in gate_twell).
  void gate_gemm_cols(const __nv_bfloat16* x, std::int64_t m, std::int64_t n, cudaStream_t stream);
  __nv_bfloat16* hot_workspace(std::int64_t m) noexcept;  // [m, 2·ldh]: h in its first ldh columns
  int updown_variant(std::int64_t m, bool gated) const noexcept;  // TwellUpDownParams::variant for m rows
  // Dense rows on the sparse remainder at this M (ContextOptions::dense_rows_density); never at
  // decode sizes, whose sparse path is the decode kernel.
  bool use_dense_rows(std::int64_t m) const noexcept;
  // The dense-row capacity for a call of m rows: fixed, or from the newest counted share.
  std::int64_t dense_rows_capacity(std::int64_t m);
  // Of a row over n neurons (the call's sparse_n):
  std::uint32_t dense_row_cap(std::int64_t n) const noexcept;   // hot iff count > this
  std::uint32_t dense_row_cost(std::int64_t n) const noexcept;  // a hot row's weight in the dispatch count
  // The sparse remainder's dense rows: plan (always), then with capacity > 0 the gathered GEMMs;
  // returns the row filter for the fused kernel (null: every row sparse).
  const std::uint32_t* dense_rows_begin(const __nv_bfloat16* x, std::int64_t m, std::int64_t cap, cudaStream_t stream);
  void dense_rows_finish(std::int64_t m, std::int64_t cap, __nv_bfloat16* y, cudaStream_t stream);
  void gate_pack_sm90(const __nv_bfloat16* x, std::int64_t m, cudaStream_t stream);
  // This layer's operands for a call on x [m, K] → y [m, K] (both row stride K).
  // n: the neurons [0, n) the kernel runs (the call's sparse_n, or N for decode).
  FfnOperands operands(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, std::int64_t n) const noexcept;
  std::string sparse_path_name(std::int64_t m) const;  // the sparse path's description
  void resolve_pending();  // folds the newest returned count into last_density_
  // Decode: gate GEMM, then the decode kernel (twell_decode.hpp), its count into counts_.
  void decode_forward(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, cudaStream_t stream);
  // decode_forward's kernels with the count stored at nnz_out (device); allocates only if unprepared.
  void enqueue_decode(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, unsigned long long* nnz_out,
                      cudaStream_t stream);
  // Rows of the last dense_forward's gate still in gu_ (its last row chunk), from row 0.
  std::int64_t dense_gate_rows_ = 0;
  // dense_forward, then a sampled count of its gate, read back by a later call (counts_).
  void dense_forward_counted(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, cudaStream_t stream);
  // Dispatch count over ≤ dispatch_sample_rows evenly spaced rows of src [m, n] (row stride ld),
  // n the call's sparse_n (its cold neurons: their density is what the thresholds compare).
  // rows_at_cost: rows over the dense-row threshold count at their dense cost (use_dense_rows of the call).
  TwellSampleParams sample_params(const __nv_bfloat16* src, std::int64_t ld, std::int64_t m, std::int64_t n,
                                  double max_density, bool rows_at_cost);
  void reset_dispatch_state();  // forget measured densities and hot-row shares (new weights or order)
  // Per-neuron counts (original numbering) of the gate buffer's m rows (gate_gemm ran); with `cold`
  // (by original neuron), rows with more than dense_row_cap(#cold) non-zeros in those are skipped.
  std::vector<std::uint32_t> neuron_counts_of_gate(std::int64_t m, const std::vector<unsigned char>* cold,
                                                   std::int64_t* rows_left_out, cudaStream_t stream);
  double max_hot_neurons() const noexcept;  // choose_hot_neurons' cap on the hot count
  // hot_up runs the sm90 gated-product kernel (and w_hot_gu_ has its layout): fixed from
  // set_hot_neurons on, since the options, the device and gated_ are.
  bool hot_sm90() const noexcept { return gated_ && hot_n_ > 0 && opt_.hot_product_sm90 && gate_sm90_ok_; }
  OverShare over_share() const noexcept { return opt_.hot_neurons_densest_share ? OverShare::densest : OverShare::none; }
  // choose_hot_neurons' threshold (share of tokens; ≤ 0: no split)
  double hot_threshold() const noexcept { return gated_ ? opt_.hot_neurons_density : opt_.hot_neurons_density_nongated; }

  ContextOptions opt_;
  bool gate_sm90_ok_ = false;  // this device runs the sm90 gate kernel (gate_pack_sm90_available)
  std::shared_ptr<FfnWorkspace> ws_;  // per-call scratch, possibly shared by many layers
  LtGemm& gemm_;                      // ws_->gemm
  bool gated_ = true;
  std::int64_t n_ = 0, k_ = 0, ldn_ = 0;
  std::int64_t cap_m_ = 0;
  // weights
  DeviceBuffer<__nv_bfloat16> w_gu_;      // gated: [2·ldn, K] = [Wg; 0; Wu; 0]; non-gated: [ldn, K] = [Wu; 0]
  DeviceBuffer<__nv_bfloat16> w_down_;    // [K, ldn] = Wd (padding columns zero)
  DeviceBuffer<__nv_bfloat16> w_down_t_;  // [N, K] = Wdᵀ
  // All three in neuron_order(): cold neurons first, the hot_n_ hot ones last.
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
    std::uint32_t decision;
    std::uint32_t pad;
  };
  DeviceBuffer<Dispatch> dispatch_;
  PinnedBuffer<Dispatch> dispatch_host_;
  cudaEvent_t decided_ = nullptr;
  // chunked gate_twell: chunk i's packing beside chunk i + 1's GEMM, at the default priority (the
  // packing's many small CTAs must not take the SMs ahead of the GEMM's)
  SideStream pack_side_{SideStream::Priority::normal};
  SideStream hot_side_;                // hot_overlap: the hot part's GEMMs beside cold_rest
  double last_density_ = -1;  // density of the latest call whose count came back (−1: none)
  std::int64_t dense_calls_ = 0;  // dense calls of automatic since upload (for the count periods)
  CountRing counts_;          // counts of sticky calls on their way back (never waited for)
  DeviceBuffer<TwellCounters> counters_;
  PinnedBuffer<TwellCounters> counters_host_;
  DeviceBuffer<unsigned int> decode_tickets_;     // row tickets, CTA ticket (kept zero between launches)
  DeviceBuffer<unsigned long long> decode_nnz_;   // [1] (kept zero between launches)
  DeviceBuffer<unsigned long long> decode_step_nnz_{1};  // [1] decode_step's count (not read back)
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
