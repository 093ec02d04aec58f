#pragma once
// The feed-forward block and its operations, shared by every backend (DESIGN §1, §3).
//
//   gated:      g = ReLU(x·Wgᵀ), u = x·Wuᵀ, h = g ⊙ u, y = h·Wdᵀ
//   non-gated:  h = ReLU(x·Wuᵀ),                       y = h·Wdᵀ
//   x: [M, K]; Wg, Wu: [N, K]; Wd: [K, N] (Hugging Face layouts)
//   training loss: ⟨y, dy⟩ + l1_coeff · l1,  l1 = Σ|h| / M,  l0 = (number of active neurons) / M,
//   an active neuron being one whose ReLU input is > 0.
#include <cstdint>

#include "twell/tensor.hpp"

namespace twell {

struct FfnWeights {
  CMatrixF w_gate;  // [N, K]; data == nullptr for a non-gated FFN
  CMatrixF w_up;    // [N, K]
  CMatrixF w_down;  // [K, N]

  bool gated() const noexcept { return w_gate.data != nullptr; }
  std::int64_t hidden() const noexcept { return w_up.cols; }        // K
  std::int64_t intermediate() const noexcept { return w_up.rows; }  // N
};

// Views of row-major fp32 buffers as the weights of an FFN with N neurons and hidden size K:
// w_gate, w_up [N, K] and w_down [K, N]; w_gate == nullptr makes it non-gated.
inline FfnWeights ffn_weights(const float* w_gate, const float* w_up, const float* w_down, std::int64_t n,
                              std::int64_t k) {
  FfnWeights w;
  if (w_gate) w.w_gate = CMatrixF(w_gate, n, k);
  w.w_up = CMatrixF(w_up, n, k);
  w.w_down = CMatrixF(w_down, k, n);
  return w;
}

// Throws ErrorCode::shape_mismatch with a message naming the tensors unless x [M, K] and the
// weights fit together, and ErrorCode::invalid_argument on empty or over-large shapes.
void ffn_check_shapes(CMatrixF x, const FfnWeights& w);

// Gradients and scalars of one training step.
struct FfnGrads {
  MatrixF dx;       // [M, K]
  MatrixF dw_gate;  // [N, K]; ignored for a non-gated FFN
  MatrixF dw_up;    // [N, K]
  MatrixF dw_down;  // [K, N]
};

struct FfnTrainScalars {
  double l1 = 0;  // Σ|h| / M
  double l0 = 0;  // active neurons / M
};

}  // namespace twell
