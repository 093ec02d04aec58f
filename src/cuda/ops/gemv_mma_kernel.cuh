#pragma once
// The decode GEMV at 2–16 tokens on tensor cores (gemv.hpp; launch_twell_gemv picks it from M = 2).
// The CUDA-core kernel (gemv_kernel.cuh) spends M FMAs, and M unpacks of x, per weight it loads: at
// 8 tokens it reads the 2B model's 131 MB LM head at 1.0 TB/s (131 µs a step, H200 timeline at
// 1017613). Here W is mma's A operand and xᵀ its B (y ᵀ = W · xᵀ, "swap AB"): one
// mma.m16n8k16 takes 16 W rows × 16 k against 8 tokens, so the math no longer grows with the
// weights' bytes times M, and the kernel can stream W at the memory's pace.
//
// A CTA owns 16 rows of W (16 outputs) for every token; its kWarps warps split K in 64-element
// blocks, warp w taking blocks w, w + kWarps, …; a block is two 16-byte chunks per lane per row
// (lane 4g + t loads chunks t and t + 4 of rows g and g + 8, and of tokens g and g + 8's x). The
// k order inside mma is the hardware's; A and B map a lane's registers to mma's k slots the same
// way (register 2s to slots 2t, 2t + 1 and register 2s + 1 to slots 2t + 8, 2t + 9 of step s), so
// each product pairs W[n][k] with x[t][k]. Invariants:
// - a token's sums never see another token's x: mma computes each column of D from its own column of
//   B, tokens past M load as zeros, and the warps' partial sums are added in warp order 0, 1, …;
//   so a token's bits do not depend on M (2–16) or on the other tokens' values;
// - exact products and fp32 sums, rounded to bf16 once (or stored as fp32); inside one k16 step the
//   tensor cores align and truncate rather than round to nearest (as in cuBLASLt's kernels);
// - W loaded before the programmatic wait only where w_before_wait says no kernel it overlaps
//   writes it; x always after.
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/common/device_math.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/ops/gemv.hpp"

namespace twell::cuda::detail {

inline constexpr int kGemvMmaWarps = 8;  // warps per CTA, each a share of K
inline constexpr int kGemvMmaRows = 16;  // W rows (outputs) per CTA: mma's M
inline constexpr int kGemvMmaWin = 2;    // 64-element K blocks a warp has in flight
// A CTA's stage for a warp's second window (gemv_mma_partials' stage): [warp][block][row][chunk][lane].
inline constexpr int kGemvMmaStage = kGemvMmaWarps * kGemvMmaWin * 2 * 2 * 32;  // uint4: 32 KB

__device__ __forceinline__ unsigned word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// The CTA's sums before their last step: part[w][row][tok] = warp w's share of K of
// ⟨W[16 · blockIdx.x + row], x[tok]⟩ (tokens past M and rows past N hold sums the caller drops).
// NT token tiles of 8 (M ≤ 8 · NT). Every thread of the CTA calls it; the caller syncs before it
// reads part. The kernel below and the lab's fused gates (lab/probes/probe_decode_rows.cu,
// probe_decode_fixed_rows.cu) share it, so their g has the same bits (by construction;
// probe_decode_rows checks it).
// stage (kGemvMmaStage uint4 of shared memory, or null): with w_before_wait, a warp's second window
// (its blocks warp + 16, warp + 24) is copied there by cp.async before the wait too, where the row
// has one (K > 1024), so that a 2048-wide row is all in flight before the previous kernel ends; a
// lane reads back only its own copies (its own cp.async wait orders them). The same values in the
// same order: the same bits.
template <int NT>
__device__ __forceinline__ void gemv_mma_partials(const TwellGemvParams& p,
                                                  float (&part)[kGemvMmaWarps][kGemvMmaRows][8 * NT],
                                                  uint4* stage = nullptr) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;  // mma's groupID and thread-in-group
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.x) * kGemvMmaRows;
  const int kchunks = static_cast<int>(p.k / 8), blocks = (kchunks + 7) / 8;
  // Rows past N read row n0 (their sums are dropped).
  const uint4* wrow[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const std::int64_t r = n0 + g + 8 * h;
    wrow[h] = reinterpret_cast<const uint4*>(p.w + (r < p.n ? r : n0) * p.k);
  }
  uint4 wv[kGemvMmaWin][2][2];  // [block of the window][row g, g + 8][chunk t, t + 4]
  // f(i, h, c, in, ch) for each 16-byte chunk this lane takes of the window from block b0: row
  // g + 8h's chunk ch = t + 4c of block b0 + i · kGemvMmaWarps; in: that block and chunk exist.
  const auto each_chunk = [&](int b0, auto&& f) {
#pragma unroll
    for (int i = 0; i < kGemvMmaWin; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int b = b0 + i * kGemvMmaWarps, ch = b * 8 + t + 4 * c;
          f(i, h, c, b < blocks && ch < kchunks, ch);
        }
  };
  const auto load_w = [&](int b0) {
    each_chunk(b0, [&](int i, int h, int c, bool in, int ch) { wv[i][h][c] = in ? __ldcs(wrow[h] + ch) : make_uint4(0, 0, 0, 0); });
  };
  // Window 1's slot of this lane: [warp][i][h][c][lane].
  const auto slot = [&](int i, int h, int c) { return stage + (((warp * kGemvMmaWin + i) * 2 + h) * 2 + c) * 32 + lane; };
  const bool staged = stage && p.w_before_wait && blocks > kGemvMmaWin * kGemvMmaWarps;
  if (p.w_before_wait) load_w(warp);
  if (staged) {
    each_chunk(warp + kGemvMmaWin * kGemvMmaWarps, [&](int i, int h, int c, bool in, int ch) {
      dev::cp_async16(static_cast<std::uint32_t>(__cvta_generic_to_shared(slot(i, h, c))), in ? wrow[h] + ch : wrow[h], in);
    });
    dev::cp_async_commit();
  }
  dev::pdl_begin();
  if (!p.w_before_wait) load_w(warp);
  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
  // x's chunks of a window (token g + 8j's chunks t, t + 4 of each block). At NT = 1 one window
  // ahead, loaded beside the next window's W before this window's mma, so that only the first
  // window's x is a round trip after the wait (not one a window: six at K = 5632); at NT = 2 that
  // would take 162 registers (one CTA an SM), so each window's x loads at its start.
  constexpr bool kXAhead = NT == 1;
  uint4 xv[kGemvMmaWin][NT][2];
  const auto load_x = [&](int b0) {
#pragma unroll
    for (int i = 0; i < kGemvMmaWin; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int b = b0 + i * kGemvMmaWarps, ch = b * 8 + t + 4 * c, tok = g + 8 * j;
          xv[i][j][c] = b < blocks && ch < kchunks && tok < p.m
                            ? __ldg(reinterpret_cast<const uint4*>(p.x + tok * p.ld_x) + ch)
                            : make_uint4(0, 0, 0, 0);
        }
  };
  if constexpr (kXAhead) load_x(warp);
  for (int b0 = warp; b0 < blocks; b0 += kGemvMmaWin * kGemvMmaWarps) {
    if constexpr (!kXAhead) load_x(b0);
    uint4 xc[kGemvMmaWin][NT][2];
#pragma unroll
    for (int i = 0; i < kGemvMmaWin; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) xc[i][j][c] = xv[i][j][c];
    if (kXAhead && b0 + kGemvMmaWin * kGemvMmaWarps < blocks) load_x(b0 + kGemvMmaWin * kGemvMmaWarps);
    uint4 cur[kGemvMmaWin][2][2];
#pragma unroll
    for (int i = 0; i < kGemvMmaWin; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int c = 0; c < 2; ++c) cur[i][h][c] = wv[i][h][c];
    const bool next_staged = staged && b0 == warp;  // read back after this window's math
    if (!next_staged && b0 + kGemvMmaWin * kGemvMmaWarps < blocks)
      load_w(b0 + kGemvMmaWin * kGemvMmaWarps);  // the next window in flight
#pragma unroll
    for (int i = 0; i < kGemvMmaWin; ++i)
#pragma unroll
      for (int s = 0; s < 4; ++s) {  // mma step s: registers 2s and 2s + 1 of the lane's 8 (chunk s / 2)
        const int c = s / 2, r0 = (2 * s) % 4;
        const unsigned a0 = word(cur[i][0][c], r0), a1 = word(cur[i][1][c], r0);
        const unsigned a2 = word(cur[i][0][c], r0 + 1), a3 = word(cur[i][1][c], r0 + 1);
#pragma unroll
        for (int j = 0; j < NT; ++j)
          dev::mma_16816_bf16(acc[j], a0, a1, a2, a3, word(xc[i][j][c], r0), word(xc[i][j][c], r0 + 1));
      }
    if (next_staged) {  // the next window, staged before the wait
      dev::cp_async_wait<0>();
#pragma unroll
      for (int i = 0; i < kGemvMmaWin; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int c = 0; c < 2; ++c) wv[i][h][c] = *slot(i, h, c);
    }
  }
  // D's fragment: acc[j][0..1] row g, tokens 8j + 2t, + 1; acc[j][2..3] row g + 8, the same tokens.
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    part[warp][g][8 * j + 2 * t] = acc[j][0];
    part[warp][g][8 * j + 2 * t + 1] = acc[j][1];
    part[warp][g + 8][8 * j + 2 * t] = acc[j][2];
    part[warp][g + 8][8 * j + 2 * t + 1] = acc[j][3];
  }
}

// NT token tiles of 8 (M ≤ 8 · NT). MinCtas: the CTAs an SM that ptxas must leave registers for (the
// library launches 0, no bound; lab/probes/probe_gemv.cu measures 3 and 4, a whole wave of the
// gate's 352 CTAs on 132 SMs instead of 1.33).
template <int NT, int MinCtas = 0>
__global__ void __launch_bounds__(kGemvMmaWarps * 32, MinCtas) twell_gemv_mma_kernel(TwellGemvParams p) {
  __shared__ float part[kGemvMmaWarps][kGemvMmaRows][8 * NT];
  __shared__ uint4 stage[kGemvMmaStage];
  gemv_mma_partials<NT>(p, part, stage);
  __syncthreads();
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.x) * kGemvMmaRows;
  for (int o = threadIdx.x; o < kGemvMmaRows * 8 * NT; o += kGemvMmaWarps * 32) {
    const int row = o % kGemvMmaRows, tok = o / kGemvMmaRows;
    const std::int64_t n = n0 + row;
    if (tok >= p.m || n >= p.n) continue;
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kGemvMmaWarps; ++w) v += part[w][row][tok];
    if (p.relu) v = fmaxf(v, 0.0f);
    if (p.g32)
      p.g32[tok * p.ld_g + n] = v;
    else
      p.g[tok * p.ld_g + n] = __float2bfloat16_rn(v);
  }
}

}  // namespace twell::cuda::detail
