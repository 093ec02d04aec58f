#pragma once
// Synthetic FFN inputs whose ReLU(x·Wgᵀ) has the statistics of trained ReLU-sparse models
// (DESIGN §7): a chosen mean density, a heavy-tailed spread over rows with optional "hot" rows,
// skewed neuron popularity and a share of dead neurons. Reproducible from the seed.
//
// Construction: x[:,0] = 1 and x[:,1] = s_m (a per-row shift); Wg[n,0] = b_n (a per-neuron bias),
// Wg[n,1] = 1; the remaining entries are Gaussian scaled so that the rest of the dot product is
// ≈ N(0, 1). Then P(g[m,n] > 0) ≈ Φ(s_m + b_n); b_n and s_m are solved for the targets.
#include <cstdint>
#include <string>

#include "twell/tensor.hpp"

namespace twell {

struct SparsityParams {
  std::int64_t m = 512, k = 2048, n = 5632;
  double density = 0.005;       // target mean fraction of active neurons per row
  double row_spread = 0.6;      // σ of the log-normal per-row density multiplier (0 = i.i.d. rows)
  double hot_rows = 0.0;        // fraction of rows that are "hot"
  double hot_density = 0.12;    // target density of a hot row
  double neuron_skew = 1.0;     // σ of the log-normal neuron popularity (0 = uniform)
  double dead_neurons = 0.05;   // fraction of neurons that never fire
  bool gated = true;            // generate w_gate (else the sparsity is put into w_up)
  std::uint64_t seed = 1;
  void validate() const;        // throws ErrorCode::invalid_argument
};

struct GeneratedFfn {
  HostTensor x, w_gate, w_up, w_down;  // fp32; w_gate empty when !gated
  HostTensor dy;                       // [M, K] upstream gradient for training, N(0, 1)
};

GeneratedFfn generate_ffn(const SparsityParams& p);

}  // namespace twell
