#include "cuda/ffn_plan.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace twell::cuda {

double max_sparse_density(const DispatchPolicy& p, std::int64_t m, bool decode, bool gated, bool one_token) noexcept {
  if (decode) return one_token ? p.decode_token_max_density : p.decode_max_density;
  if (!gated) return p.max_sparse_density_nongated;
  return m >= p.dispatch_large_rows ? p.max_sparse_density_gated_large : p.max_sparse_density_gated;
}

CallShape shape_call(const DispatchPolicy& p, const LayerFacts& f, std::int64_t m) noexcept {
  CallShape c;
  c.n = f.n;
  c.union_ffn = p.union_min_rows >= 1 && m >= p.union_min_rows && m <= std::min(p.union_max_rows, f.union_max_rows) &&
                m < p.dispatch_min_rows;
  c.decode = (m <= p.decode_max_rows && m < p.dispatch_min_rows && f.decode_k) || c.union_ffn;
  c.one_token = m == 1 && p.decode_gemv && p.decode_gemv_max_rows >= 1 && f.token_k;
  c.gate_gemv = p.decode_gemv && m <= std::min(p.decode_gemv_max_rows, f.gemv_max_rows);
  c.down_gemv = m >= 2 && m <= std::min(p.down_gemv_max_rows, f.down_gemv_max_rows);
  c.token_gemv = m == 1 && p.dense_token_gemv && f.gemv_max_rows >= 1 && f.down_gemv_max_rows >= 1;
  // Decode sizes never split (their kernel reads every neuron's rows the tokens fire).
  const bool split = f.hot_n > 0 && f.hot_n < f.n && !c.decode && m >= std::max<std::int64_t>(1, p.hot_neurons_min_rows);
  c.sparse_n = split ? f.n - f.hot_n : f.n;
  c.hot_overlap = split && p.hot_overlap;
  c.dense_rows = p.dense_rows_density > 0 && !c.decode;
  c.gate_chunks = std::max<std::int64_t>(1, std::min<std::int64_t>(p.gate_chunks, m / 2048));
  c.gate = p.gate_sm90 && f.gate_sm90 ? GateKernel::sm90 : c.gate_chunks > 1 ? GateKernel::lt_chunked : GateKernel::lt;
  if (c.gate != GateKernel::lt_chunked) c.gate_chunks = 1;
  // Too few CTAs to fill the SMs below updown_occupancy_min_rows: more rows in flight per warp.
  const int v = f.gated ? p.updown_variant : p.updown_variant_nongated;
  c.updown_variant = m >= p.updown_occupancy_min_rows || v < 3 ? v : (f.gated ? 1 : 0);
  return c;
}

ForwardPlan plan_call(const DispatchPolicy& p, const LayerFacts& f, std::int64_t m, Path path, double last_density,
                      std::int64_t dense_calls) noexcept {
  const CallShape shape = shape_call(p, f, m);
  ForwardPlan plan = plan_forward(p, {.m = m, .path = path, .decode = shape.decode, .one_token = shape.decode && shape.one_token,
                                      .gated = f.gated, .last_density = last_density, .dense_calls = dense_calls});
  plan.shape = shape;
  return plan;
}

ForwardPlan plan_forward(const DispatchPolicy& p, const DispatchState& s) noexcept {
  ForwardPlan plan;
  if (s.path == Path::dense) return plan;  // dense, no count
  if (s.path == Path::automatic && s.m < p.dispatch_min_rows && !s.decode) {
    plan.below_min_rows = true;
    return plan;
  }
  if (s.path == Path::sparse) {
    plan.step = ForwardStep::sparse;
    return plan;
  }
  // Automatic: decode from its first call, others once a count has come back, follow the newest
  // count; a first call (or sticky dispatch off) counts on the device and waits for the flag.
  plan.max_density = max_sparse_density(p, s.m, s.decode, s.gated, s.one_token);
  if (s.decode || (p.sticky_dispatch && s.last_density >= 0)) {
    plan.sticky = true;
    if (s.last_density <= plan.max_density) {  // decode with no count yet (-1): sparse
      plan.step = s.decode ? ForwardStep::decode : ForwardStep::sparse;
      plan.counts = true;
    } else {
      const std::int64_t period = std::max<std::int64_t>(1, s.decode ? p.decode_dense_count_period : p.dense_count_period);
      plan.counts = s.dense_calls % period == 0;
      plan.step = plan.counts ? ForwardStep::dense_counted : ForwardStep::dense;
    }
    return plan;
  }
  plan.step = ForwardStep::first_call;
  plan.counts = true;
  return plan;
}

TrainPlan plan_train_forward(const TrainDispatchPolicy& p, const TrainDispatchState& s) noexcept {
  TrainPlan plan;
  plan.limit = s.gated ? p.max_sparse_density_gated : p.max_sparse_density_nongated;
  plan.forced_sparse = s.path == Path::sparse;
  if (s.path == Path::dense) return plan;
  if (s.path == Path::automatic && s.m < p.dispatch_min_rows) {
    plan.below_min_rows = true;
    return plan;
  }
  // Automatic after a step over the limit: dense, counting for the next step, unless hot neurons
  // are split off (the dispatch compares the cold neurons' measure, which only the count gives).
  if (s.path == Path::automatic && s.last_density > plan.limit && !s.hot_split) {
    plan.step = TrainStep::dense_counted;
    return plan;
  }
  plan.step = TrainStep::count;
  return plan;
}

namespace {

// The count a sticky decision followed.
std::string followed(const CallRecord& c) {
  if (c.followed_density < 0) return "no density measured yet";
  if (c.followed_row_costs)
    return fmt::format("the previous call measured a cost of {:.2f}% density, rows over {} non-zeros at {} each",
                       100.0 * c.followed_density, c.row_cap, c.row_cost);
  return fmt::format("the previous call measured {:.2f}% density", 100.0 * c.followed_density);
}

std::string sparse_name(const CallRecord& c) {
  const char* first = c.gate_sm90 ? (c.gated ? "sm90 gate GEMM with TwELL epilogue" : "sm90 up GEMM with TwELL epilogue")
                                   : (c.gated ? "cublasLt gate + pack" : "cublasLt up + pack");
  const char* rest = c.gated ? "fused up+down" : "sparse down";
  const std::string hot = c.sparse_n < c.n
                              ? fmt::format("; {} of {} neurons (the hot ones) dense", c.n - c.sparse_n, c.n)
                              : std::string();
  if (c.dense_rows_capacity > 0)
    return fmt::format("twell: {}, {}; rows over {} non-zeros dense (up to {}){}", first, rest, c.row_cap,
                       c.dense_rows_capacity, hot);
  return fmt::format("twell: {}, {}{}", first, rest, hot);
}

// The dense path's kernels: cuBLASLt's GEMMs, the down product by the GEMV at 2–8 rows, or every
// product by the one-token GEMV at one row.
const char* dense_name(const CallRecord& c) {
  return c.token_gemv ? "dense one-token GEMV" : c.down_gemv ? "dense cublasLt + GEMV down" : "dense cublasLt";
}

}  // namespace

std::string describe_call(const CallRecord& c) {
  switch (c.step) {
    case ForwardStep::dense:
    case ForwardStep::dense_counted:
      if (c.asked == Path::dense) return dense_name(c);
      if (c.below_min_rows) return fmt::format("{} (M below the dispatch minimum)", dense_name(c));
      return fmt::format("{} ({})", dense_name(c), c.sticky ? followed(c) : std::string());
    case ForwardStep::decode:
      if (c.union_ffn)
        return fmt::format("twell union FFN ({} gate; list, up, down on tensor cores) ({})", c.gate_gemv ? "GEMV" : "cublasLt",
                           c.sticky ? followed(c) : std::string());
      return fmt::format("twell decode kernel{} ({})",
                         c.one_token ? ", one token, gate fused in" : c.gate_gemv ? ", GEMV gate" : "",
                         c.sticky ? followed(c) : std::string());
    case ForwardStep::sparse:
      return c.sticky ? fmt::format("{} ({})", sparse_name(c), followed(c)) : sparse_name(c);
    case ForwardStep::first_call:
      if (c.sparse) return sparse_name(c);
      return c.gated ? "twell gate + dense cublasLt up/down (density above threshold)"
                     : "twell up + dense cublasLt down (density above threshold)";
  }
  return "unknown step";
}

}  // namespace twell::cuda
