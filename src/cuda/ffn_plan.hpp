#pragma once
// Plan, then execute: what one inference forward (FfnContext::forward) or training forward
// (TrainContext::forward) of the CUDA FFN does, decided on the host from the layer's statistics
// before anything is enqueued. Pure host
// code with no CUDA types, compiled into the host library so that CPU tests check every rule.
// Every step is exact; the plan only chooses which exact computation is fastest.
#include <cstdint>
#include <string>

#include "twell/cuda/ffn_cuda.hpp"

namespace twell::cuda {

// The measured thresholds the plan reads (ContextOptions holds them, each with its measurement).
struct DispatchPolicy {
  double max_sparse_density_gated = 0.009;        // crossover of the sparse and dense remainders
  double max_sparse_density_nongated = 0.006;
  std::int64_t dispatch_large_rows = 65536;       // from this M on, the _large threshold
  double max_sparse_density_gated_large = 0.0095;
  std::int64_t dispatch_min_rows = 2048;          // below: dense without counting (a count's read costs more)
  double decode_max_density = 0.008;              // decode kernel up to this density
  double decode_token_max_density = 0.02;         // the same for one token on the fused one-token kernel
  bool sticky_dispatch = true;                    // later calls follow the newest count, no host wait
  std::int64_t dense_count_period = 8;            // a dense call counts every this many calls
  std::int64_t decode_dense_count_period = 16;    // the same at decode sizes
  // The call's shape: which kernels and splits a call of M rows runs (shape_call). Where each value
  // comes from: docs/engine.md, "Kernel configuration".
  // The fused up+down kernel's variant (TwellUpDownParams::variant), gated / non-gated: 6 / 8
  // resident blocks per SM from updown_occupancy_min_rows rows on, 1 / 0 below (faster there).
  int updown_variant = 3;
  int updown_variant_nongated = 4;
  std::int64_t updown_occupancy_min_rows = 2048;
  // Decode (M ≤ decode_max_rows, M < dispatch_min_rows, K within the decode kernel's): gate, then
  // the decode kernel while counts stay under decode_max_density (decode_token_max_density for one
  // token on the fused one-token kernel); always sticky.
  std::int64_t decode_max_rows = 16;
  // The union FFN (sm90/union_ffn.hpp) as the decode step's sparse path from union_min_rows to
  // union_max_rows rows (decode-sized there even past decode_max_rows), where the layer allows it
  // (LayerFacts::union_max_rows): at its splits 1.18× the dense FFN at 32 rows, 0.90× at 64,
  // 1.15–1.20× the decode kernel's path at 8–16 rows (the 2B's layer at 0.5 %, H200, 3c8b48b,
  // docs/runtime.md). From 8: in the step at 8 / 16 rows sparse / dense 1.107 / 1.098 against the
  // decode kernel's 1.063 / 1.066 (2b-gqa), 1.086 / 1.077 against 1.045 / 1.060 (2B) (H200,
  // 4ba5ed6). From 4: at 4 / 6 rows 1.078 / 1.104 against 1.054 / 1.090 (2b-gqa), 1.081 / 1.098
  // against 1.044 / 1.069 (2B); at 2 rows it loses (1.118 against 1.160, 1.104 against 1.130), so
  // 2–3 rows stay on the decode kernel (H200, 99bafc6). 0: never.
  std::int64_t union_min_rows = 4;
  std::int64_t union_max_rows = 32;
  bool decode_gemv = true;                   // the decode gate by the GEMV kernel (ops/gemv.hpp; one token: the fused twell_decode_token.hpp) ...
  // ... up to this M (from 2 rows the GEMV's tensor-core kernel, its first weights read before the
  // programmatic wait). In the step at 2 rows (the decode kernel) sparse / dense 1.176 against
  // cuBLASLt's gate's 1.157 (2b-gqa), 1.155 against 1.143 (2B); at 2 / 3 rows 1.182 / 1.137
  // against 1.171 / 1.123 (2b-gqa), 1.162 / 1.136 against 1.144 / 1.117 (2B), H200, a6db2c3. Before
  // the union (4–16 rows) the GEMV gate and the list kernel take 18.3 / 19.0 / 22.5 µs a layer in
  // the chain against cuBLASLt's gate's 17.5 / 17.6 / 19.0 at 4 / 8 / 16 rows (probe, H200,
  // a9b24fd). So the rows below union_min_rows' default (a lower union_min_rows puts the union
  // behind the GEMV gate at 2–3).
  // Measured on the H200 only; a GPU without the union takes the GEMV gate at 2–3 rows as well.
  std::int64_t decode_gemv_max_rows = 3;
  // The dense FFN's down projection (y = h·Wdᵀ) by the GEMV's tensor-core kernel from 2 rows up to
  // this M (0: never): 2048 × 5632 at 2 / 4 / 8 / 16 rows 8.8 / 8.9 / 9.1 / 10.8 µs against
  // cuBLASLt's 10.3 / 10.8 / 10.8 / 10.2 (its split-K reduce kernel included), H200 at a90ce72,
  // bench/results/2026-11-29-h200-probe-gemv-a90ce72.txt: 16 rows (a second token tile) lose.
  std::int64_t down_gemv_max_rows = 8;
  // The dense FFN at one row on the one-token GEMV (ops/gemv.hpp, CUDA cores): [g | u] = x·[Wg; Wu]ᵀ
  // (the up projection, ReLU'd, where not gated) and y = h·Wdᵀ, each loading its first weight window
  // before the programmatic wait, in place of cuBLASLt's M = 1 GEMMs (≈ 1 TB/s on an 11.5 MB Wg,
  // H200). false: cuBLASLt.
  bool dense_token_gemv = true;
  // The sm90 gate GEMM with the TwELL packing in its epilogue (sm90/gate_pack.hpp) on a
  // compute-capability-9.0 GPU; false, or another GPU: the cuBLASLt ReLU GEMM + twell_pack. The
  // first call of a layer (dispatch's sampled count) always uses the cuBLASLt gate.
  bool gate_sm90 = true;
  int gate_chunks = 2;                       // cuBLASLt gate in row chunks (one per 2048 rows at most), each packed beside the next one's GEMM
  // Dense rows (sm80/twell_dense_rows.hpp): rows with more than dense_rows_density·N non-zeros run
  // as gathered rows of cuBLASLt GEMMs on the sparse remainder (never at decode sizes). 0: off.
  double dense_rows_density = 0.02;
  std::int64_t hot_neurons_min_rows = 2048;  // hot neurons split off (when chosen) from this M on, never at decode sizes
  bool hot_overlap = true;                   // the hot part's GEMMs on a second stream beside the cold kernels
};

// What the layer is when a call comes (fixed between weight changes): the facts shape_call reads
// besides the policy.
struct LayerFacts {
  std::int64_t n = 0;           // neurons
  std::int64_t hot_n = 0;       // of them split off as hot (the last ones; 0: no split)
  bool gated = true;
  bool decode_k = true;         // K fits the decode kernel (kDecodeMaxK)
  bool token_k = true;          // ... and the one-token kernel (kDecodeTokenMaxK)
  bool gate_sm90 = false;       // this device and build run the sm90 gate kernel
  std::int64_t gemv_max_rows = 0;  // rows the decode gate's GEMV kernel takes at this K (0: K too large)
  std::int64_t down_gemv_max_rows = 0;  // rows the down projection's GEMV takes over N (0: N too large, or padded)
  std::int64_t union_max_rows = 0;  // rows the union FFN takes on this device and layer (0: none: not sm90, non-gated, N, K or the gate's stride off its grid)
};

enum class GateKernel {
  sm90,        // the sm90 gate GEMM with the TwELL epilogue (one kernel)
  lt,          // the cuBLASLt ReLU GEMM, then twell_pack
  lt_chunked,  // the same in gate_chunks row chunks, each packing beside the next chunk's GEMM
};

// Every decision of a call that follows from its size and the layer alone (never from measured
// counts): the executors read these and ask nothing again.
struct CallShape {
  bool decode = false;          // decode-sized: the decode kernel is its sparse path
  // Read only where decode holds (the decode path's kernels): one_token alone does not imply decode.
  bool one_token = false;       // one row, which the fused one-token kernels serve (gate fused in)
  bool gate_gemv = false;       // not one_token: the decode gate by the GEMV kernel (else the cuBLASLt GEMM)
  bool down_gemv = false;       // the dense FFN's down projection by the GEMV's tensor-core kernel (else cuBLASLt)
  bool token_gemv = false;      // one row: the dense FFN's GEMMs by the one-token GEMV (DispatchPolicy::dense_token_gemv)
  bool union_ffn = false;       // decode: the sparse path is the union FFN (after the gate), not the decode kernel
  std::int64_t sparse_n = 0;    // neurons the sparse path runs (the first ones; the rest hot, dense)
  bool hot() const noexcept { return sparse_n < n; }
  std::int64_t n = 0;
  bool dense_rows = false;      // the sparse remainder runs heavy rows dense; counts weigh them at their cost
  GateKernel gate = GateKernel::lt;
  std::int64_t gate_chunks = 1; // lt_chunked: the number of row chunks
  int updown_variant = 0;       // TwellUpDownParams::variant of the fused up+down kernel
  bool hot_overlap = false;     // hot(): the hot GEMMs on the side stream beside the cold kernels
};

CallShape shape_call(const DispatchPolicy& p, const LayerFacts& f, std::int64_t m) noexcept;

// What the layer knows when a call comes.
struct DispatchState {
  std::int64_t m = 0;           // rows of this call
  Path path = Path::automatic;  // what the caller asked for
  bool decode = false;          // a decode-sized call (CallShape::decode)
  bool one_token = false;       // ... of one row on the fused one-token kernel (CallShape::one_token)
  bool gated = true;
  double last_density = -1;     // the newest count that came back (< 0: none yet)
  std::int64_t dense_calls = 0; // automatic dense calls so far (spaces out their counts)
};

enum class ForwardStep {
  dense,          // the cuBLASLt FFN
  dense_counted,  // the cuBLASLt FFN, then a sampled count of its gate for later calls
  sparse,         // gate GEMM with TwELL packing, then the sparse remainder
  decode,         // the decode kernel (counts through its last CTA)
  first_call,     // gate GEMM; a sampled count decides on the device; the host waits for it
};

struct ForwardPlan {
  CallShape shape;              // plan_call: the call's kernels and splits
  ForwardStep step = ForwardStep::dense;
  bool counts = false;          // the call publishes a count for later calls (never waited for)
  bool sticky = false;          // decided from last_density (no host wait); false: asked, or first call
  bool below_min_rows = false;  // automatic ran dense because m < dispatch_min_rows
  double max_density = 0;       // the threshold of this call (automatic)
};

// What one forward ran, as values: the plan, the facts the executor added (the device's decision
// of a first call, the dense-row capacity it used) and the measurement a sticky decision followed.
// Filling it is a few stores; describe_call turns it into text only when someone asks (the last
// path of a layer, a benchmark's report), so no call formats a string.
struct CallRecord {
  ForwardStep step = ForwardStep::dense;
  Path asked = Path::automatic;
  bool sticky = false;                // ForwardPlan::sticky
  bool below_min_rows = false;        // ForwardPlan::below_min_rows
  bool sparse = false;                // a sparse path ran (first_call: the device's decision)
  bool gated = true;
  bool gate_sm90 = false;             // the sparse path's gate is the sm90 GEMM with the TwELL epilogue
  bool one_token = false;             // decode: the one-token kernels, the gate fused in
  bool union_ffn = false;             // decode: the union FFN
  bool gate_gemv = false;             // decode, not one_token: the gate by the GEMV kernel (else cuBLASLt's GEMM)
  bool token_gemv = false;            // dense, one row: every product by the one-token GEMV (CallShape::token_gemv)
  bool down_gemv = false;             // dense, 2–8 rows: the down product by the tensor-core GEMV (CallShape::down_gemv)
  double followed_density = -1;       // sticky: the count the decision followed (< 0: none yet)
  bool followed_row_costs = false;    // ... which weighed rows over row_cap non-zeros at row_cost each
  std::uint32_t row_cap = 0, row_cost = 0;  // dense rows: the row threshold and its cost, of sparse_n neurons
  std::int64_t dense_rows_capacity = 0;     // the sparse remainder ran dense rows, up to this many (0: none)
  std::int64_t n = 0, sparse_n = 0;   // neurons; of them the sparse path's (the rest hot, run dense)
};

// The human-readable path of a call ("twell: sm90 gate GEMM with TwELL epilogue, fused up+down",
// "dense cublasLt (the previous call measured 1.20% density)", …).
std::string describe_call(const CallRecord& c);

// The density threshold of a call: one-token decode, decode, non-gated, large-M gated or gated.
double max_sparse_density(const DispatchPolicy& p, std::int64_t m, bool decode, bool gated, bool one_token = false) noexcept;

ForwardPlan plan_forward(const DispatchPolicy& p, const DispatchState& s) noexcept;

// The whole plan of a forward of m rows: its shape (shape_call), then its step (plan_forward on
// that shape's decode facts), in one value. last_density and dense_calls: as in DispatchState.
ForwardPlan plan_call(const DispatchPolicy& p, const LayerFacts& f, std::int64_t m, Path path, double last_density,
                      std::int64_t dense_calls) noexcept;

// Whether the one-token decode kernel's neurons are reordered by their activity (FfnLayer::
// reorder_decode_neurons) before one-token step number `step` (1, 2, … since the layer's weights
// came): at steps 8, 16, 32, 64, 128 and 256, as the counts first say something, then every 256th
// (a reorder is one small kernel; the counts accumulate, so the order settles).
constexpr bool decode_reorder_due(std::int64_t step) noexcept {
  return step >= 8 && (step % 256 == 0 || (step < 256 && (step & (step - 1)) == 0));
}

// ---- The training forward ----

// The measured thresholds a training step's dispatch reads (TrainContextOptions holds them, with
// their measurements in docs/engine.md).
struct TrainDispatchPolicy {
  double max_sparse_density_gated = 0.009;  // the sparse step iff the step's measure ≤ this
  double max_sparse_density_nongated = 0.006;
  std::int64_t dispatch_min_rows = 4096;    // below: dense without counting (fixed costs)
};

// What a training layer knows when a step comes.
struct TrainDispatchState {
  std::int64_t m = 0;
  Path path = Path::automatic;
  bool gated = true;
  double last_density = -1;  // the newest counted step's measure (< 0: none yet)
  bool hot_split = false;    // hot neurons are split off: a dense step cannot count the cold ones
};

enum class TrainStep {
  dense,          // the stacked cuBLASLt step, no count
  dense_counted,  // the same, counting every neuron for later steps (read back through an event: no wait)
  count,          // the gate and the CSR's count; the host waits for the count, then runs_sparse decides
};

// The 32-bit entry indices of the sparse step's backward address this many CSR entries.
inline constexpr std::int64_t kMaxSparseTrainNnz = 0x7fffffff;

struct TrainPlan {
  TrainStep step = TrainStep::dense;
  double limit = 0;             // the step's density threshold
  bool forced_sparse = false;   // Path::sparse asked
  bool below_min_rows = false;  // automatic ran dense because m < dispatch_min_rows
  // After the count: the sparse step runs if asked, or if the step's measure is within the limit
  // and the CSR's entries fit the backward's indices (never when the plan is a dense step).
  bool runs_sparse(double density, std::int64_t nnz) const noexcept {
    return step == TrainStep::count && (forced_sparse || (density <= limit && nnz <= kMaxSparseTrainNnz));
  }
};

TrainPlan plan_train_forward(const TrainDispatchPolicy& p, const TrainDispatchState& s) noexcept;

}  // namespace twell::cuda
