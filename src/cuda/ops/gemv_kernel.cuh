#pragma once
// The decode GEMV's kernel (gemv.hpp), a template of its shape: kRows W rows per warp, kWin
// chunk steps per load window. Every shape gives the same bits: a row's sum is one lane's chunks in
// order, then the same butterfly, whatever the rows a warp holds or the loads it groups; the shape
// only changes how much is in flight and how many warps share the rows. One token only
// (launch_twell_gemv; 2–16 tokens run gemv_mma_kernel.cuh).
#include <cuda_bf16.h>

#include "cuda/common/device_math.cuh"
#include "cuda/common/fixed_point.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/ops/gemv.hpp"
#include "cuda/ops/weight_window.cuh"

namespace twell::cuda::detail {

inline constexpr int kGemvWarps = 4;     // warps per CTA
inline constexpr int kGemvWarpRows = 4;  // W rows per warp (the default shape)
inline constexpr int kGemvWindow = 2;    // chunk steps per load window (the default shape)

// One token (p.m == 1); lane l owns the row chunks l, l + 32, …; the warp's kRows rows are
// n0 .. n0 + kRows − 1. Sums of kRows values per lane, then a butterfly over the lanes.
// kGated (one token, TwellGemvParams::h): the warp's kRows / 2 neurons n0 … are its rows
// 0 … kRows / 2 − 1 (gate rows n0 + r) and kRows / 2 … kRows − 1 (up rows up_row + n0 + r).
template <int kRows = kGemvWarpRows, int kWin = kGemvWindow, bool kGated = false>
__global__ void __launch_bounds__(kGemvWarps * 32) twell_gemv_kernel(TwellGemvParams p) {
  static_assert(!kGated || kRows % 2 == 0, "the gated epilogue: gate and up rows in pairs");
  constexpr int kOut = kGated ? kRows / 2 : kRows;  // the warp's outputs: rows, or neurons
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const std::int64_t n0 = (static_cast<std::int64_t>(blockIdx.x) * kGemvWarps + warp) * kOut;
  const bool active = n0 < (kGated ? p.up_row : p.n);
  const int kchunks = static_cast<int>(p.k / 8);
  const __nv_bfloat16* rows[kRows];
  if constexpr (kGated) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {  // neurons past up_row read neuron n0's rows (dropped)
      const std::int64_t i = n0 + r % kOut < p.up_row ? n0 + r % kOut : n0;
      rows[r] = p.w + (!active ? 0 : r < kOut ? i : p.up_row + i) * p.k;
    }
  } else {
#pragma unroll
    for (int r = 0; r < kRows; ++r)  // rows past N read row n0 (their sums are dropped); none for idle warps
      rows[r] = p.w + (!active ? 0 : n0 + r < p.n ? n0 + r : n0) * p.k;
  }
  // Windows of kWin chunk steps (weight_window.cuh), used for every token once loaded.
  WeightWindow<kRows, kWin> wv(rows, p.k, active);
  // W that no kernel this one may overlap writes (w_before_wait): its first window is in flight
  // while the previous kernel finishes.
  if (p.w_before_wait && active) wv.load(0, lane);
  dev::pdl_begin();
  if (!active) return;
  if (!p.w_before_wait) wv.load(0, lane);
  // The residual add's terms (one token): lane r < kRows loads row n0 + r's now, beside x, so that
  // the epilogue after the butterfly waits for no round trip of its own.
  const bool res_lane = p.residual && lane < kRows && n0 + lane < p.n;
  float res = 0.0f;
  long long res_fixed = 0;
  if (res_lane) {
    res = p.residual[n0 + lane];
    if (p.residual_first_fixed) res_fixed = p.residual_first_fixed[n0 + lane];
  }
  // The folded norm's residual adds (store_r), formed now by lane r < kRows for row n0 + r and
  // stored in the epilogue by the same lane, before it writes g there.
  const bool store_lane = p.store_r && lane < kRows && n0 + lane < p.n;
  float stored = 0.0f;
  if (store_lane) {
    stored = p.store_r[n0 + lane];
    if (p.store_first) stored += __bfloat162float(p.store_first[n0 + lane]);
    stored += __bfloat162float(p.store_delta[n0 + lane]);
  }
  float acc[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
  for (int s0 = 0; s0 * 32 < kchunks; s0 += kWin) {
    if (s0 > 0) wv.load(s0, lane);
    // The window's x chunks loaded together, before any of its math (one round trip a window;
    // loaded inside the step's bounds test below, each was a round trip of its own behind the
    // previous step's math). Chunks past kchunks load as zeros and are not used.
    uint4 xw[kWin];
#pragma unroll
    for (int s = 0; s < kWin; ++s) {
      const int c = (s0 + s) * 32 + lane;
      xw[s] = c < kchunks ? __ldg(reinterpret_cast<const uint4*>(p.x) + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int s = 0; s < kWin; ++s) {
      const int c = (s0 + s) * 32 + lane;
      if (c < kchunks) {
        float wf[kRows][8];  // the rows' chunk in fp32
#pragma unroll
        for (int r = 0; r < kRows; ++r) dev::unpack8_bf16(wv.v[r][s], wf[r]);
        float xf[8];
        dev::unpack8_bf16(xw[s], xf);
#pragma unroll
        for (int r = 0; r < kRows; ++r)
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[r] = fmaf(xf[e], wf[r][e], acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = dev::warp_sum(acc[r]);
  if constexpr (kGated) {
    // Lane r stores neuron n0 + r's g and u as the plain epilogue would (bf16, no ReLU), then
    // its product from those stored values: ops::gated_product's bits, formed once a neuron.
#pragma unroll
    for (int r = 0; r < kOut; ++r) {
      const std::int64_t i = n0 + r;
      if (lane != r || i >= p.up_row) continue;
      dev::store_gated_neuron(acc[r], acc[kOut + r], i, p.up_row, p.g, p.h, p.h_n, p.act);
    }
  } else {
    // Every lane holds every sum (the butterfly); lane r writes row n0 + r.
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (lane != r || n0 + r >= p.n) continue;
      const float v = p.relu ? fmaxf(acc[r], 0.0f) : acc[r];
      if (p.g32) {
        p.g32[n0 + r] = v;
        continue;
      }
      const __nv_bfloat16 o = __float2bfloat16_rn(v);
      if (store_lane) p.store_r[n0 + r] = stored;
      p.g[n0 + r] = o;
      if (res_lane) {  // the residual add at column n0 + r
        const std::int64_t j = n0 + r;
        float e = res;
        if (p.residual_first_fixed) {
          e += dev::fixed_to_float_bf16(res_fixed);
          p.residual_first_fixed[j] = 0;
        }
        p.residual[j] = e + __bfloat162float(o);
      }
    }
  }
}

}  // namespace twell::cuda::detail
