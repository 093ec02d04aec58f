#pragma once
// CPU implementations of every FFN operation (fp32 storage, fp32 accumulation; GEMMs through
// OpenBLAS; OpenMP across rows/neurons). The float64 oracle is in twell/cpu/reference.hpp.
#include <cstdint>
#include <vector>

#include "twell/ffn.hpp"
#include "twell/hybrid_format.hpp"
#include "twell/twell_format.hpp"

namespace twell::cpu {

// Weights plus the layouts the sparse kernels read: Wdᵀ as contiguous [N, K] rows.
struct PreparedFfn {
  FfnWeights w;
  std::vector<float> down_t;  // [N, K]: down_t[n·K + k] = Wd[k, n]
  CMatrixF down_t_view() const { return {down_t.data(), w.intermediate(), w.hidden()}; }
};
PreparedFfn prepare_ffn(const FfnWeights& w);

// ---- dense baseline ----
void ffn_dense(CMatrixF x, const FfnWeights& w, MatrixF y);

// ---- inference through TwELL ----
// ReLU(x·wᵀ) packed into TwELL, a block of rows at a time (the gate GEMM with its packing epilogue).
TwellMatrix ffn_gate_twell(CMatrixF x, CMatrixF w, TwellConfig config = {});
// ReLU(pre) packed into TwELL, for a first GEMM's output computed elsewhere: the same matrix as
// ffn_gate_twell when pre = x·wᵀ.
TwellMatrix ffn_pack_gate(CMatrixF pre, TwellConfig config = {});
// y = (g ⊙ (x·Wuᵀ))·Wdᵀ reading g from TwELL; h never materialised. Overflowed rows use the backup.
void ffn_up_down_twell(CMatrixF x, const TwellMatrix& gate, CMatrixF w_up, CMatrixF down_t, MatrixF y);
// y = h·Wdᵀ for h in TwELL (non-gated FFN down product).
void ffn_down_twell(const TwellMatrix& h, CMatrixF down_t, MatrixF y);

struct SparseInferenceInfo {
  TwellStats stats;
  double gate_seconds = 0;    // gate GEMM + packing
  double sparse_seconds = 0;  // fused up+down (or down)
};
// The whole sparse FFN: gated or not according to w.
SparseInferenceInfo ffn_sparse(CMatrixF x, const PreparedFfn& w, MatrixF y, TwellConfig config = {});
// The same from the first GEMM's output pre = x·Wgᵀ (x·Wuᵀ non-gated) [M, N], computed by the caller
// (a decode step's GEMV over bf16 weight copies): ffn_sparse's result whenever pre holds the values
// its gate GEMM would compute.
SparseInferenceInfo ffn_sparse_from_gate(CMatrixF x, CMatrixF pre, const PreparedFfn& w, MatrixF y,
                                         TwellConfig config = {});

// ---- training ----
// State saved by the forward for the backward: the pattern and values in hybrid form, never a
// dense [M, N] tensor. p holds g = ReLU(x·Wgᵀ) (> 0 exactly on the pattern); r holds u = x·Wuᵀ at
// the same positions (same ELL slots, same tail slots; in tail rows only pattern positions are
// meaningful and the pattern is read from p). Non-gated: p holds ReLU(x·Wuᵀ) and r is empty.
struct TrainState {
  HybridMatrix p;
  HybridMatrix r;
  FfnTrainScalars scalars;
  std::size_t bytes() const noexcept { return p.bytes() + r.bytes(); }
};

TrainState ffn_train_forward(CMatrixF x, const PreparedFfn& w, MatrixF y, HybridConfig config = {});
// Gradients of ⟨y, dy⟩ + l1_coeff · l1. dw_gate is ignored for a non-gated FFN.
void ffn_train_backward(CMatrixF x, CMatrixF dy, const PreparedFfn& w, const TrainState& state,
                        double l1_coeff, const FfnGrads& grads);

// Dense training baseline (the same math with dense GEMMs; every [M, N] intermediate dense).
FfnTrainScalars ffn_dense_train(CMatrixF x, CMatrixF dy, const FfnWeights& w, double l1_coeff, MatrixF y,
                                const FfnGrads& grads);

}  // namespace twell::cpu
