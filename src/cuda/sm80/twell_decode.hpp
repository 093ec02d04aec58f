#pragma once
// Decode FFN (a few tokens): one kernel after the gate GEMM, reading the bf16 gate output row
// directly (no TwELL, so no tile capacity and no overflow: exact at any density). CTA (tile of 256
// neurons, token m): finds the tile's active neurons (value > 0, ascending), computes h (gated:
// g · ⟨x[m], Wu[n]⟩, one warp per neuron; non-gated: h = the value) and the tile's partial
// y[m] = Σ h · Wdᵀ[n] in fp32 into a workspace; the last CTA of a token (ticket) adds the
// partials in tile order and writes y[m] in bf16 (deterministic). The last CTA overall stores the
// exact non-zero count to `nnz_out`. Tickets and the count are left zero for the next launch.
// Spreading one token's non-zeros over N/256 CTAs is what the token-major fused kernel cannot do
// at M = 1 (one CTA walks the whole row).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/ffn_operands.hpp"

namespace twell::cuda {

inline constexpr std::int64_t kDecodeMaxK = 8192;  // K / 8 chunks over 256 threads, ≤ 4 each

struct TwellDecodeParams : FfnOperands {
  const __nv_bfloat16* g = nullptr;         // [m, N] gate ReLU output (gated) or h (non-gated), stride ld_g
  std::int64_t ld_g = 0;
  float* partials = nullptr;                // [m, tiles, K] workspace
  unsigned int* row_tickets = nullptr;      // [m], zero on entry (left zero)
  unsigned int* cta_ticket = nullptr;       // [1], zero on entry (left zero)
  unsigned long long* nnz = nullptr;        // [1], zero on entry (left zero)
  unsigned long long* nnz_out = nullptr;    // optional: receives the count (e.g. mapped host memory)
};

// Requires K a multiple of 8 with K ≤ kDecodeMaxK, M ≤ 65535.
void launch_twell_decode(const TwellDecodeParams& p, cudaStream_t stream);

}  // namespace twell::cuda
