#pragma once
// Decode FFN of one token in two kernels (the GEMV + decode kernel pair's job at M = 1, without
// the round trip through g and the per-tile partials).
// 1. One warp per neuron streams the neuron's first-GEMM row (Wg gated, Wu non-gated) with all
//    of its loads in flight: g = bf16(ReLU(⟨x, W[n]⟩)) (the value ops/gemv.hpp writes). It stores
//    the neuron's flag (g > 0); an active neuron's warp computes h at once (gated:
//    g · ⟨x, Wu[n]⟩ in fp32; non-gated: g), stores it and prefetches the neuron's Wdᵀ row into L2.
// 2. Each CTA owns 64 columns of y: it lists the flagged neurons in ascending order, then 32
//    groups of its threads take every 32nd of them (all rows' loads in flight at once) and the
//    groups' sums are added in group order: a fixed order for a given set of active neurons
//    (deterministic), fp32, rounded to bf16 once. CTA 0 stores the exact count to nnz_out.
// No tiles and no capacity: exact at any density (the lists run in passes).
// Programmatic launches (Hopper): inside the caller's ProgrammaticLaunch scope the first kernel may
// start while the kernel before it runs, loading its weight rows before it waits for x; the down
// kernel always follows the first one programmatically and lets the next kernel start at once (that
// kernel waits for the whole down grid before it reads y).
// Fixed-point output (y_fixed set): no down kernel. Each active neuron's warp adds its h · Wdᵀ[n, :]
// into y_fixed as int64 reductions (cuda/common/fixed_point.hpp: exact in any order, so
// deterministic); the reader converts. One kernel a token instead of two.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/ffn_operands.hpp"

namespace twell::cuda {

inline constexpr std::int64_t kDecodeTokenMaxK = 8192;

// The FFN's input from the residual stream, folded into the kernels (a model runtime's one-token
// step: the add + RMSNorm before the FFN without a kernel of its own). x = bf16(rmsnorm(r') ⊙ w) with
// r' = r + first + delta (fp32 += bf16, in that order: ops::add_rmsnorm's bits, cuda/ops/norm_row.cuh).
// Each CTA of the first kernel forms x in shared memory and reads nothing at FfnOperands::x; the down
// kernel stores r' into r for its 64 columns (r is read by every first-kernel CTA, so only once that
// grid is done), before it writes y there: y may alias `first` (the runtime's previous FFN output).
struct DecodeTokenNorm {
  float* r = nullptr;                    // [K] fp32, 16-byte aligned: the residual, updated in place
  const __nv_bfloat16* first = nullptr;  // [K] optional, 8-byte aligned
  const __nv_bfloat16* delta = nullptr;  // [K], 8-byte aligned
  const float* w = nullptr;              // [K] the norm's weight, 16-byte aligned
  float eps = 0.0f;
};

struct TwellDecodeTokenParams : FfnOperands {  // m must be 1
  const __nv_bfloat16* w_first = nullptr;  // [N, K] (row stride K): Wg gated, Wu non-gated
  float* h = nullptr;                      // [N] scratch (only the active neurons' entries are written)
  unsigned char* flags = nullptr;          // [decode_token_flag_bytes(N)] scratch, zero past N (set once)
  unsigned long long* nnz_out = nullptr;   // optional: receives the count of active neurons
  DecodeTokenNorm norm;                    // with norm.w set: x from the residual stream (x unused)
  // Fixed-point output instead of y (y, h, flags and nnz_out unused): y_fixed [K] int64, 16-byte
  // aligned, receives Σ round(h_n · Wdᵀ[n, c] · 2^32) added to what it holds (zeros for y alone).
  // A term that is not finite or reaches fixed_term_limit(N) is left out and *overflow set to 1:
  // y_fixed is then not the sum and the caller must run the step the other way. The norm (if
  // any) must have no first or delta (nothing would store r' back).
  long long* y_fixed = nullptr;
  unsigned* overflow = nullptr;
  // The first kernel's schedule (the results are the same bits with or without it): its warp i
  // (CTA i / 8) computes neuron order[i]; order must be a permutation of 0 … N − 1 (null: neuron i).
  // Its CTAs start in index order, and the grid is more than one wave (4 CTAs an SM), so the
  // neurons listed first run their chains (gate row, up row, h, the down terms) while the gate's
  // later rows still stream in: decode_token_reorder puts the most active ones there.
  const std::int32_t* order = nullptr;
  // optional [N]: hits[n] += 1 for each active neuron n (the activity decode_token_reorder sorts by)
  std::uint32_t* hits = nullptr;
};

// Bytes of the flags buffer for N neurons (whole 32-byte groups; the bytes past N stay zero).
constexpr std::int64_t decode_token_flag_bytes(std::int64_t n) { return (n + 31) / 32 * 32; }

// Requires M = 1, K a multiple of 8 with K ≤ kDecodeTokenMaxK, 16-byte aligned x (or the norm's
// operands aligned as DecodeTokenNorm says) and y.
void launch_twell_decode_token(const TwellDecodeTokenParams& p, cudaStream_t stream);

// order ← 0 … N − 1 sorted by activity, the most active first: by ⌊log2 hits[n]⌋ descending (hits
// 0 last), ascending n within a class (a stable sort). One CTA; any N ≥ 1. order is a permutation
// whatever hits holds; hits is read only. For TwellDecodeTokenParams::order; launched plainly (no
// programmatic overlap), so that every kernel after it reads the new order, even before its wait.
void launch_decode_token_reorder(const std::uint32_t* hits, std::int32_t* order, std::int64_t n, cudaStream_t stream);

}  // namespace twell::cuda
