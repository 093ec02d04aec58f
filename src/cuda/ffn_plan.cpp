#include "cuda/ffn_plan.hpp"

#include <algorithm>

namespace twell::cuda {

double max_sparse_density(const DispatchPolicy& p, std::int64_t m, bool decode, bool gated, bool one_token) noexcept {
  if (decode) return one_token ? p.decode_token_max_density : p.decode_max_density;
  if (!gated) return p.max_sparse_density_nongated;
  return m >= p.dispatch_large_rows ? p.max_sparse_density_gated_large : p.max_sparse_density_gated;
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

}  // namespace twell::cuda
