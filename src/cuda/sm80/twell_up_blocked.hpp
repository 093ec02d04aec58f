#pragma once
// Blocked up product, the first half of the gated inference remainder when
// ContextOptions::blocked_up is on (DESIGN §4b; docs/perf-notes-cuda.md, "reuse of weight rows").
//
// h[m, n] = g[m, n] · ⟨x[m, :], Wu[n, :]⟩ at every TwELL entry of the rows not flagged in
// row_overflow, written as TwELL words of h (bf16 h << 16 | local column, word 0 = count) into
// h_words, which the non-gated sparse down product then reads (twell_kernels.hpp). The fused
// kernel reads a 4 KB Wu row from L2 for every non-zero; here a CTA owns a block of
// kUpBlockedRows tokens × kUpBlockedTiles TwELL tiles and streams x and Wu for the whole block
// through shared memory in K chunks of 16, so each row of either is read once per block: L2 bytes
// M·N·K·2·(1/rows + 1/neurons) instead of nnz·K·2. The entries themselves are dot products on CUDA
// cores (fp32 accumulation), spread evenly over the CTA's threads by a prefix sum of the blocks'
// counts, so hot rows do not unbalance it.
//
// Rows flagged in row_overflow (an overflowed block: TwELL does not hold all of their non-zeros)
// are left out, word 0 included; the caller runs them through the fused kernel. h is rounded to
// bf16 once (the dense path's h is bf16 too).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace twell::cuda {

inline constexpr int kUpBlockedRows = 1024;  // tokens per CTA
inline constexpr int kUpBlockedTiles = 3;    // TwELL tiles per CTA (768 neurons)

struct TwellUpBlockedParams {
  const __nv_bfloat16* x = nullptr;      // [M, K], row stride ld_x
  std::int64_t ld_x = 0;
  const __nv_bfloat16* w_up = nullptr;   // [N, K], row stride K
  const std::uint32_t* words = nullptr;  // TwELL of g [M, tiles · S]
  const std::uint32_t* row_overflow = nullptr;  // [M]: 1 = row left out
  std::uint32_t* h_words = nullptr;      // [M, tiles · S]: TwELL of h for the rows not flagged
  std::int64_t m = 0, n = 0, k = 0;
  int words_per_tile = 32;               // S
};

// Dynamic shared memory the kernel needs (for the context's opt-in check).
std::size_t up_blocked_smem_bytes();

void launch_twell_up_blocked(const TwellUpBlockedParams& p, cudaStream_t stream);

}  // namespace twell::cuda
