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
};

// What the layer knows when a call comes.
struct DispatchState {
  std::int64_t m = 0;           // rows of this call
  Path path = Path::automatic;  // what the caller asked for
  bool decode = false;          // a decode-sized call (FfnContext::is_decode)
  bool one_token = false;       // ... of one row on the fused one-token kernel (FfnContext::uses_decode_token)
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
