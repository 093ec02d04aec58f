#pragma once
// Decode-size GEMV: g[m, n] = bf16(⟨x[m, :], W[n, :]⟩), ReLU'd where relu, for a few tokens
// (M ≤ 16), fp32 accumulation, rounded to bf16 once (or the fp32 sums). An op of the model runtime
// and of the FFN engine. Without the ReLU it serves the runtime's projections and logits at decode
// sizes (the attention output's 8 MB at 2B: cuBLASLt 7.4 µs, 1.1 TB/s); with it, the engine's
// decode gate: the values the cuBLASLt ReLU GEMM writes into the gate buffer, at decode sizes where
// that GEMM runs far below the memory bandwidth (≈ 12 µs for an 11.5 MB Wg at M = 1 on an H200,
// i.e. ~1 TB/s). One token: each warp streams 1 or 4 rows of W on CUDA cores (16-byte loads, a
// window of each row in flight: the shape launch_twell_gemv picks, gemv_kernel.cuh) and reuses
// every x chunk for its rows; x stays in L1. 2–16 tokens: tensor cores, 16 rows of W a CTA, K split
// over its warps (gemv_mma_kernel.cuh); within 2–16 a token's bits do not depend on the others.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace twell::cuda {

inline constexpr std::int64_t kGemvMaxRows = 16;    // tokens
inline constexpr std::int64_t kGemvMaxK = 8192;

// Whether the GEMV takes rows of k elements: a multiple of 8 (its 16-byte loads), 8 ≤ k ≤ kGemvMaxK.
// The one test for every caller that chooses between this GEMV and cuBLASLt.
inline constexpr bool gemv_takes_k(std::int64_t k) { return k >= 8 && k % 8 == 0 && k <= kGemvMaxK; }

struct TwellGemvParams {
  const __nv_bfloat16* x = nullptr;  // [m, k], row stride ld_x
  std::int64_t ld_x = 0;
  const __nv_bfloat16* w = nullptr;  // [n, k], row stride k
  __nv_bfloat16* g = nullptr;        // [m, n] out, row stride ld_g
  float* g32 = nullptr;              // instead of g: the fp32 sums (ReLU'd if relu), not rounded
  std::int64_t ld_g = 0;
  std::int64_t m = 0, n = 0, k = 0;
  bool relu = true;  // false: g = bf16(x·Wᵀ)
  // W is written by no kernel that this launch may overlap (a model's weights): under programmatic
  // launches its first load window (every shape; at one token and K ≤ 2048 the whole row) is issued
  // before the wait for the previous kernel, and at 2–16 tokens with K > 1024 its second window too,
  // into shared memory (gemv_mma_partials' stage). Leave false where W may come from the kernel before (the FFN engine's
  // weights under an optimiser): the loads then follow the wait.
  bool w_before_wait = false;
  // One token with bf16 output only (m = 1, g set): also the residual add after a projection, at
  // the output columns j < n: r[j] = (r[j] + first[j]) + g[j] (fp32 += bf16, in that order: the
  // adds norm_row makes), `first` the fixed-point residual_first_fixed (cuda/common/fixed_point.hpp,
  // bf16(first · 2⁻³²); zeroed once read: this kernel is its last reader) or none. A model
  // runtime's attention output projection storing the residual stream at one token.
  float* residual = nullptr;
  long long* residual_first_fixed = nullptr;
  // One token with bf16 output only, and not with `residual`: the residual adds that a norm folded
  // into the kernel before left to this one (ops::rmsnorm_gated_up: a one-token dense FFN's down
  // GEMV), at the output columns j < n: store_r[j] = (store_r[j] + store_first[j]) + store_delta[j]
  // (fp32 += bf16, in add_rmsnorm's order; store_first may be null). Column j's lane reads its terms
  // before it writes g[j], so store_first may be g itself (the FFN's output buffer, whose previous
  // value is that first term); no other column's lane touches them.
  float* store_r = nullptr;
  const __nv_bfloat16* store_first = nullptr;
  const __nv_bfloat16* store_delta = nullptr;
  // One token, a gated FFN's up product (h set): W is [Wg; Wu] stacked, n = 2 · up_row rows (Wu's
  // row i at up_row + i), and a warp holds gate row i and up row i together. g gets [g | u] as it
  // would without h (each row's bf16 sum, no ReLU: relu false), and the epilogue stores
  // h[i] = bf16(act(g_i) · u_i) for i < h_n from those stored values (dev::activate; act in
  // model::Activation's order): the bits of ops::gated_product on g, each neuron's product
  // formed once, by no kernel of its own.
  __nv_bfloat16* h = nullptr;
  std::int64_t up_row = 0;
  std::int64_t h_n = 0;
  int act = 0;
};

// Requires 1 ≤ M ≤ kGemvMaxRows, K a multiple of 8 with K ≤ kGemvMaxK, 16-byte aligned rows.
void launch_twell_gemv(const TwellGemvParams& p, cudaStream_t stream);

// Parameters for m contiguous rows of x [m, k] against W [n, k], no ReLU, output [m, n] (set g or g32).
inline TwellGemvParams gemv_rows(const __nv_bfloat16* x, std::int64_t m, const __nv_bfloat16* w, std::int64_t n,
                                 std::int64_t k) {
  TwellGemvParams p;
  p.x = x;
  p.ld_x = k;
  p.w = w;
  p.ld_g = n;
  p.m = m;
  p.n = n;
  p.k = k;
  p.relu = false;
  return p;
}

// One token of a gated FFN's up product on [Wg; Wu] (w_gu [2 · up_row, k], Wu's row i at up_row + i):
// gu [1, 2 · up_row] gets [g | u], h [1, h_n] gets act(g) ⊙ u from the epilogue (TwellGemvParams::h).
inline TwellGemvParams gemv_gated_row(const __nv_bfloat16* x, const __nv_bfloat16* w_gu, std::int64_t up_row,
                                      std::int64_t h_n, std::int64_t k, __nv_bfloat16* gu, __nv_bfloat16* h,
                                      int act) {
  TwellGemvParams p = gemv_rows(x, 1, w_gu, 2 * up_row, k);
  p.g = gu;
  p.h = h;
  p.up_row = up_row;
  p.h_n = h_n;
  p.act = act;
  return p;
}

// m contiguous rows, fp32 out: y[m, n] = x[m, k] · W[n, k]ᵀ (the LM head's logits at decode).
inline void launch_twell_gemv_f32(const __nv_bfloat16* x, std::int64_t m, const __nv_bfloat16* w, std::int64_t n,
                                  std::int64_t k, float* y, cudaStream_t stream) {
  TwellGemvParams p = gemv_rows(x, m, w, n, k);
  p.g32 = y;
  launch_twell_gemv(p, stream);
}

// One contiguous row: y[n] = bf16(x[k] · W[n, k]ᵀ) (a projection at one token). w_before_wait: see
// TwellGemvParams.
inline void launch_twell_gemv_row(const __nv_bfloat16* x, const __nv_bfloat16* w, std::int64_t n, std::int64_t k,
                                  __nv_bfloat16* y, cudaStream_t stream, bool w_before_wait = false) {
  TwellGemvParams p = gemv_rows(x, 1, w, n, k);
  p.g = y;
  p.w_before_wait = w_before_wait;
  launch_twell_gemv(p, stream);
}

// launch_twell_gemv_row with the residual add after it (TwellGemvParams::residual): y = bf16(x · Wᵀ),
// then r = (r + first) + y with first the fixed-point sum (zeroed), or r += y where first_fixed is null.
inline void launch_twell_gemv_row_residual(const __nv_bfloat16* x, const __nv_bfloat16* w, std::int64_t n,
                                           std::int64_t k, __nv_bfloat16* y, float* r, std::int64_t* first_fixed,
                                           cudaStream_t stream, bool w_before_wait = false) {
  TwellGemvParams p = gemv_rows(x, 1, w, n, k);
  p.g = y;
  p.w_before_wait = w_before_wait;
  p.residual = r;
  p.residual_first_fixed = reinterpret_cast<long long*>(first_fixed);
  launch_twell_gemv(p, stream);
}

}  // namespace twell::cuda
