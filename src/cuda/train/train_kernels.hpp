#pragma once
// Kernels of the CUDA training path (DESIGN §3, training). Sparse: every product runs over the CSR
// entries of the pattern (csr_kernels.hpp), fp32 accumulation, weights read as bf16 rows.
// Dense: the elementwise steps around cuBLASLt GEMMs. Shapes: x, dy, dx [m, K]; weights as in
// FfnContext (Wg, Wu, Wdᵀ [N, K] rows of stride K).
//
//   forward:   u_e = ⟨x[m], Wu[n]⟩, t_e = p_e · u_e (gated) or p_e, y[m] = Σ_e t_e · Wdᵀ[n]
//   backward:  dt_e = ⟨dy[m], Wdᵀ[n]⟩ + c1 · sign(t_e)      (c1 = l1_coeff / M)
//              gated: dup_e = dt_e · p_e, dgate_e = dt_e · u_e; non-gated: dup_e = dt_e
//              dx[m] = Σ_e dup_e · Wu[n] + dgate_e · Wg[n]
//              dWu[n] = Σ_e dup_e · x[m], dWg[n] = Σ_e dgate_e · x[m], dWdᵀ[n] = Σ_e t_e · dy[m]
// (e ranges over the entries of row m, or of neuron n for the weight gradients.)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace twell::cuda {

struct SparseTrainForwardParams {
  const __nv_bfloat16* x = nullptr;  // [m, K], row stride ld
  const std::int64_t* offsets = nullptr;
  const std::int32_t* cols = nullptr;
  const __nv_bfloat16* p = nullptr;  // [nnz] gate values (gated) or h (non-gated), all > 0
  float* u = nullptr;                // [nnz] out (gated): ⟨x[m], Wu[n]⟩
  const __nv_bfloat16* w_up = nullptr;      // [N, K] (gated)
  const __nv_bfloat16* w_down_t = nullptr;  // [N, K]
  __nv_bfloat16* y = nullptr;        // [m, K], row stride ld
  float* row_l1 = nullptr;           // [m] out: Σ_e |t_e| of the row
  std::int64_t ld = 0, m = 0, k = 0;
  bool gated = true;
  int min_blocks = 0;  // 6 or 8: a variant compiled for that many resident blocks (K ≤ 2048); else the default
};
void launch_sparse_train_forward(const SparseTrainForwardParams& p, cudaStream_t stream);

struct SparseTrainBackwardParams {
  const __nv_bfloat16* dy = nullptr;  // [m, K], row stride ld
  const std::int64_t* offsets = nullptr;
  const std::int32_t* cols = nullptr;
  const __nv_bfloat16* p = nullptr;
  const float* u = nullptr;           // gated
  const __nv_bfloat16* w_gate = nullptr;    // gated
  const __nv_bfloat16* w_up = nullptr;
  const __nv_bfloat16* w_down_t = nullptr;
  float c1 = 0;
  const float* c1_scale = nullptr;    // set: the L1 slope is c1 · *c1_scale (the coefficient on the device)
  float* d_up = nullptr;              // [nnz] out
  float* d_gate = nullptr;            // [nnz] out (gated)
  __nv_bfloat16* dx = nullptr;        // [m, K], row stride ld
  std::int64_t ld = 0, m = 0, k = 0;
  bool gated = true;
  int min_blocks = 0;  // as in SparseTrainForwardParams
};
void launch_sparse_train_backward(const SparseTrainBackwardParams& p, cudaStream_t stream);

// The weight-gradient kernel's view of an entry, in neuron-major (CSC) order with tokens ascending:
// {row (int bits), dup, dgate (0 when non-gated), t}. Gathered once per backward so that every
// column-slice pass reads its neuron's entries as one contiguous run.
struct WeightGradEntriesParams {
  const std::int32_t* entry_rows = nullptr;  // [nnz]
  const std::int32_t* order = nullptr;       // [nnz] entries by neuron, tokens ascending
  const __nv_bfloat16* p = nullptr;
  const float* u = nullptr;                  // gated
  const float* d_up = nullptr;
  const float* d_gate = nullptr;             // gated
  float4* out = nullptr;                     // [nnz]
  std::int64_t nnz = 0;
  bool gated = true;
};
void launch_weight_grad_entries(const WeightGradEntriesParams& p, cudaStream_t stream);

// One warp per work item (a run of one neuron's entries, csr_kernels.hpp: build_weight_grad_items);
// lane l owns the 16-byte chunks {l, l + 32, ...} of the column slice.
inline constexpr std::int64_t kWeightGradMaxSlice = 512;  // columns per pass (2 chunks per lane)

struct SparseWeightGradParams {
  // The column slice of x and dy: [m, col_end − col_begin] at column col_begin of their rows, row stride ld.
  const __nv_bfloat16* x = nullptr;
  const __nv_bfloat16* dy = nullptr;
  const float4* entries = nullptr;    // [nnz] from launch_weight_grad_entries
  const std::int64_t* col_offsets = nullptr;   // [n + 1]
  const std::int64_t* item_offsets = nullptr;  // [n + 1]
  const std::int32_t* item_neuron = nullptr;   // [items_bound]
  std::int64_t run = 0;               // entries per item (the last item of a neuron has fewer)
  std::int64_t items_bound = 0;       // ≥ item_offsets[n]: the launch size
  // Item s > 0 of neuron c writes its sums to partials row block item_offsets[c] − c + s − 1
  // ([3, kWeightGradMaxSlice] fp32: up, gate, down), which launch_weight_grad_fixup adds, in item
  // order, to the row item 0 wrote: the result does not depend on scheduling.
  float* partials = nullptr;          // [items_bound − n, 3, kWeightGradMaxSlice]
  float* dw_gate = nullptr;           // [n, K] rows of stride K (gated)
  float* dw_up = nullptr;             // [n, K]
  float* dw_down_t = nullptr;         // [n, K] = dWdᵀ
  std::int64_t ld = 0, n = 0, k = 0;
  bool gated = true;
  // Column slice [col_begin, col_end) of the gradient rows (multiples of 8 or col_end = K, at most
  // kWeightGradMaxSlice wide) and token block [row_begin, row_end): only entries with row in the
  // block are summed; accumulate adds the block's sums to the gradient slice instead of
  // overwriting it. Running slices (and, at large M, token blocks) one after the other keeps the
  // x and dy columns a pass reads in L2 while every neuron reads them; slices cost no extra
  // gradient traffic, each extra token block one read-modify-write of the gradient slice.
  std::int64_t col_begin = 0, col_end = 0;
  std::int64_t row_begin = 0, row_end = std::int64_t{1} << 62;
  bool accumulate = false;
};
void launch_sparse_weight_grads(const SparseWeightGradParams& p, cudaStream_t stream);
// After launch_sparse_weight_grads with the same parameters: adds the partial sums of every
// neuron's items s > 0 to its gradient slice (no-op for neurons with one item).
void launch_weight_grad_fixup(const SparseWeightGradParams& p, cudaStream_t stream);

// dst[idx[i], 0:cols] = src[i, 0:cols] for i < rows (fp32, row strides ld_src, ld_dst): the hot
// neurons' weight-gradient rows, computed densely, into the gradient matrices.
void launch_scatter_rows_f32(const float* src, std::int64_t ld_src, const std::int32_t* idx, std::int64_t rows,
                             std::int64_t cols, float* dst, std::int64_t ld_dst, cudaStream_t stream);

// Σ of row_l1[0 .. m) in float64 into *l1_sum (one block; deterministic).
void launch_sum_rows(const float* row_l1, std::int64_t m, double* l1_sum, cudaStream_t stream);

// Dense path, columns [0, ldn) of [m, ldn] activations; columns ≥ n are written as 0 and their
// inputs never read. Scalars are added with atomics (zero them first): Σ|h| and #(gate > 0).
struct DenseTrainScalars {
  double l1_sum;
  unsigned long long active;
};
// *l1 = l1_sum / m, *l0 = active / m (fp32): a step's L1 term and non-zeros per row on the device.
void launch_train_scalars_f32(const DenseTrainScalars* s, std::int64_t m, float* l1, float* l0, cudaStream_t stream);
struct DenseTrainElementwiseParams {
  const __nv_bfloat16* g = nullptr;   // gate pre-activation or ReLU output (gated)
  std::int64_t ld_g = 0;
  const __nv_bfloat16* u = nullptr;   // up output (gated)
  std::int64_t ld_u = 0;
  // forward: out (gated) / in (non-gated: ReLU(x·Wuᵀ)); backward: in, or out with recompute_h (gated)
  __nv_bfloat16* h = nullptr;
  std::int64_t ld_h = 0;
  const __nv_bfloat16* dh = nullptr;  // backward: dy · Wd
  std::int64_t ld_dh = 0;
  __nv_bfloat16* d_gate = nullptr;    // backward out (gated)
  __nv_bfloat16* d_up = nullptr;      // backward out
  std::int64_t ld_d = 0;
  float c1 = 0;
  const float* c1_scale = nullptr;  // set: the L1 slope is c1 · *c1_scale (the coefficient on the device)
  DenseTrainScalars* scalars = nullptr;  // forward out
  // Optional [m]: rows with a non-zero flag are treated as all-inactive (h, d_up, d_gate written
  // as 0, nothing counted): the training step's dense rows inside the hot-neuron part.
  const unsigned char* row_skip = nullptr;
  std::int64_t m = 0, n = 0, ldn = 0;
  bool gated = true;
  // Backward, gated only: h is not read but recomputed from g and u with the forward's arithmetic
  // (the same bits) and written to h (padding columns and skipped rows as 0), for the GEMMs after.
  bool recompute_h = false;
};
// gated: h = ReLU(g) ⊙ u; both: scalars.
void launch_dense_train_forward(const DenseTrainElementwiseParams& p, cudaStream_t stream);
// dt = dh + c1·sign(h); gated: d_up = dt ⊙ ReLU(g), d_gate = dt ⊙ u ⊙ [g > 0]; non-gated: d_up = dt ⊙ [h > 0].
// With recompute_h (gated), h = ReLU(g) ⊙ u is computed here and written, not read.
void launch_dense_train_backward(const DenseTrainElementwiseParams& p, cudaStream_t stream);

}  // namespace twell::cuda
