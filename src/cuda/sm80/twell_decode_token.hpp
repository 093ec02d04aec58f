#pragma once
// Decode FFN of one token in one kernel (the decode kernel's job at M = 1, without its gate GEMV
// launch, its round trip through g and its partials). One warp per neuron streams the neuron's
// first-GEMM row (Wg gated, Wu non-gated) with all of its loads in flight: the value
// g = bf16(ReLU(⟨x, W[n]⟩)) (what twell_gemv writes). A warp whose neuron is active (g > 0)
// computes h at once (gated: g · ⟨x, Wu[n]⟩ in fp32; non-gated: g), stores it, sets the neuron's
// bit in a bitmap and prefetches its Wdᵀ row into L2. The last CTA to finish (ticket) lists the
// marked neurons in ascending order and accumulates y = Σ h · Wdᵀ[n] in fp32 over them in that
// order (deterministic), rounded to bf16 once; it stores the exact count to nnz_out and leaves the
// bitmap and the ticket zero. No tiles and no capacity: exact at any density.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/ffn_operands.hpp"

namespace twell::cuda {

inline constexpr std::int64_t kDecodeTokenMaxK = 8192;

struct TwellDecodeTokenParams : FfnOperands {  // m must be 1
  const __nv_bfloat16* w_first = nullptr;  // [N, K] (row stride K): Wg gated, Wu non-gated
  float* h = nullptr;                      // [N] scratch (only the active neurons' entries are written)
  unsigned int* active = nullptr;          // [decode_token_words(N)]: bitmap + ticket, zero on entry (left zero)
  unsigned long long* nnz_out = nullptr;   // optional: receives the count of active neurons
};

// Words of the `active` buffer for N neurons: the bitmap, then the CTA ticket.
constexpr std::int64_t decode_token_words(std::int64_t n) { return (n + 31) / 32 + 1; }

// Requires M = 1, K a multiple of 8 with K ≤ kDecodeTokenMaxK, 16-byte aligned rows.
void launch_twell_decode_token(const TwellDecodeTokenParams& p, cudaStream_t stream);
// The lab's variants (bench/cuda/probe_decode_token.cu): 1 or 2 neurons per warp; tail = false
// skips the last CTA's phase (y is not written, the bitmap not cleared: time only).
void launch_twell_decode_token_lab(const TwellDecodeTokenParams& p, int rows_per_warp, bool tail, cudaStream_t stream);

}  // namespace twell::cuda
