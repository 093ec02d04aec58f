#pragma once
// One row's RMSNorm in one block of kNormThreads threads, shared by rmsnorm.cu and
// rmsnorm_project.cu so that both give the same bits: x' = x (+ d0) (+ d1), added in that order
// (fp32 += bf16, each rounded as two separate residual adds would round), then
// y = bf16(x' / sqrt(mean(x'²) + eps) ⊙ w).
//
// Rows of k ≤ kNormThreads · kNormHeld are loaded into registers first (x, the deltas and w all in
// flight at once: a decode step's single row is one memory latency, not one per strided
// iteration); longer rows stream. Sum order: thread t sums elements t, t + 256, … in order, then
// warps by shuffles, then the 8 warp sums in order — the same in every caller and branch.
// kStore: x' is written back to x (a residual add); else x is only read. y may be in shared memory.
// Every thread of the block must call it (it synchronises the block).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace twell::cuda::ops::detail {

inline constexpr int kNormThreads = 256;
inline constexpr int kNormHeld = 16;  // elements per thread held in registers: rows up to 4096

template <bool kStore>
__device__ void norm_row(float* __restrict__ xr, const __nv_bfloat16* __restrict__ d0,
                         const __nv_bfloat16* __restrict__ d1, std::int64_t k, const float* __restrict__ w, float eps,
                         __nv_bfloat16* __restrict__ yr) {
  const bool add = d0 || d1;
  // x' at column c, read from memory (for the streamed path).
  const auto value = [&](std::int64_t c) {
    float e = xr[c];
    if (d0) e += __bfloat162float(d0[c]);
    if (d1) e += __bfloat162float(d1[c]);
    return e;
  };
  float ss = 0.0f;
  float v[kNormHeld], wv[kNormHeld];
  const bool held = k <= static_cast<std::int64_t>(kNormThreads) * kNormHeld;
  if (held) {
#pragma unroll
    for (int j = 0; j < kNormHeld; ++j) {
      const std::int64_t c = threadIdx.x + static_cast<std::int64_t>(j) * kNormThreads;
      v[j] = c < k ? xr[c] : 0.0f;
      wv[j] = c < k ? w[c] : 0.0f;
      if (d0) v[j] += c < k ? __bfloat162float(d0[c]) : 0.0f;
      if (d1) v[j] += c < k ? __bfloat162float(d1[c]) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kNormHeld; ++j) {
      const std::int64_t c = threadIdx.x + static_cast<std::int64_t>(j) * kNormThreads;
      if (c < k) {
        if (kStore && add) xr[c] = v[j];
        ss += v[j] * v[j];
      }
    }
  } else {
    for (std::int64_t c = threadIdx.x; c < k; c += kNormThreads) {
      const float e = value(c);
      if (kStore && add) xr[c] = e;
      ss += e * e;
    }
  }
  __shared__ float part[kNormThreads / 32];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.0f;
  for (int j = 0; j < kNormThreads / 32; ++j) total += part[j];
  const float inv = rsqrtf(total / static_cast<float>(k) + eps);
  if (held) {
#pragma unroll
    for (int j = 0; j < kNormHeld; ++j) {
      const std::int64_t c = threadIdx.x + static_cast<std::int64_t>(j) * kNormThreads;
      if (c < k) yr[c] = __float2bfloat16(v[j] * inv * wv[j]);
    }
  } else {
    // Stored: x' is in x now (this thread wrote its own columns); else computed again.
    for (std::int64_t c = threadIdx.x; c < k; c += kNormThreads)
      yr[c] = __float2bfloat16((kStore ? xr[c] : value(c)) * inv * w[c]);
  }
}

}  // namespace twell::cuda::ops::detail
