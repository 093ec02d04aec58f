#pragma once
// Plan, then execute: what one inference forward of the CUDA FFN does, decided on the host from the
// layer's statistics before anything is enqueued (FfnContext::forward executes the plan). Pure host
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
  bool sticky_dispatch = true;                    // later calls follow the newest count, no host wait
  std::int64_t dense_count_period = 8;            // a dense call counts every this many calls
  std::int64_t decode_dense_count_period = 16;    // the same at decode sizes
};

// What the layer knows when a call comes.
struct DispatchState {
  std::int64_t m = 0;           // rows of this call
  Path path = Path::automatic;  // what the caller asked for
  bool decode = false;          // a decode-sized call (FfnContext::is_decode)
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

// The density threshold of a call: decode, non-gated, large-M gated or gated.
double max_sparse_density(const DispatchPolicy& p, std::int64_t m, bool decode, bool gated) noexcept;

ForwardPlan plan_forward(const DispatchPolicy& p, const DispatchState& s) noexcept;

}  // namespace twell::cuda
