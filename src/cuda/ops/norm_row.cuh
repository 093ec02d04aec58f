#pragma once
// One row's RMSNorm in one block of kNormThreads threads, shared by rmsnorm.cu and
// rmsnorm_project.cu so that both give the same bits: x' = x (+ d0) (+ d1), added in that order
// (fp32 += bf16, each rounded as two separate residual adds would round), then
// y = bf16(x' / sqrt(mean(x'²) + eps) ⊙ w).
//
// Rows of k ≤ kNormThreads · kNormHeld are loaded into registers first (x, the deltas and w all in
// flight at once: a decode step's single row is one memory latency, not one per strided
// iteration); longer rows stream. Held rows with k % 4 == 0 move 4 elements a load (16 bytes of x
// and w, 8 of each delta and of y: a 4096-row prefill's add + norm ran at ≈ 1.9 TB/s element by
// element); there thread t sums elements 4t … 4t + 3, then 4(t + 256) …, in order; otherwise t,
// t + 256, … in order. Then warps by shuffles, then the 8 warp sums in order. The branch depends on
// k alone, so every caller gets the same bits for the same row; the 4-wide one needs x and w
// 16-byte aligned and the deltas and y 8-byte aligned (norm_row_aligned checks that on the host).
// kStore: x' is written back to x (a residual add); else x is only read. y may be in shared memory.
// Every thread of the block must call it (it synchronises the block).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/device_math.cuh"
#include "cuda/common/fixed_point.cuh"

namespace twell::cuda::ops::detail {

inline constexpr int kNormThreads = 256;
inline constexpr int kNormHeld = 16;  // elements per thread held in registers: rows up to 4096

// Whether norm_row takes its 4-wide branch for rows of k (a property of k alone).
__host__ __device__ constexpr bool norm_row_wide(std::int64_t k) {
  return k % 4 == 0 && k <= static_cast<std::int64_t>(kNormThreads) * kNormHeld;
}

// The 4-wide branch's alignment, for the host to check before a launch: x and w on 16 bytes, the
// deltas and y on 8 (row r of a [rows, k] buffer is then aligned too, as k % 4 == 0). Null is fine.
inline bool norm_row_aligned(std::int64_t k, const void* x, const void* w, const void* d0, const void* d1,
                             const void* y) {
  if (!norm_row_wide(k)) return true;
  const auto off = [](const void* p, unsigned a) { return (reinterpret_cast<std::uintptr_t>(p) & (a - 1)) != 0; };
  return !off(x, 16) && !off(w, 16) && !off(d0, 8) && !off(d1, 8) && !off(y, 8);
}

// 4 bf16 (raw: their 8 bytes; p: at p, 8-byte aligned) added to v[0..3], element by element.
__device__ __forceinline__ void add_bf16x4(float* v, const uint2 raw) {
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  v[0] += a.x;
  v[1] += a.y;
  v[2] += b.x;
  v[3] += b.y;
}
__device__ __forceinline__ void add_bf16x4(float* v, const __nv_bfloat16* p) {
  add_bf16x4(v, *reinterpret_cast<const uint2*>(p));
}

// norm_row_reread's first delta may also be the fixed-point FFN output (int64, fixed_point.hpp:
// bf16(acc · 2⁻³²), then added as the bf16 delta would be; 4 at p 16-byte aligned).
// Delta4Raw: a first delta's 4 raw values, loaded (null: zeros) apart from their adds, so that
// several groups' loads can be in flight before the first add.
template <typename D0>
struct Delta4Raw;
template <>
struct Delta4Raw<__nv_bfloat16> {
  uint2 raw;
  __device__ __forceinline__ void load(const __nv_bfloat16* p) {
    raw = p ? *reinterpret_cast<const uint2*>(p) : make_uint2(0, 0);
  }
  __device__ __forceinline__ void add(float* v) const { add_bf16x4(v, raw); }
};
template <>
struct Delta4Raw<long long> {
  longlong2 a, b;
  __device__ __forceinline__ void load(const long long* p) {
    a = p ? *reinterpret_cast<const longlong2*>(p) : make_longlong2(0, 0);
    b = p ? *reinterpret_cast<const longlong2*>(p + 2) : make_longlong2(0, 0);
  }
  __device__ __forceinline__ void add(float* v) const {
    v[0] += dev::fixed_to_float_bf16(a.x);
    v[1] += dev::fixed_to_float_bf16(a.y);
    v[2] += dev::fixed_to_float_bf16(b.x);
    v[3] += dev::fixed_to_float_bf16(b.y);
  }
};
template <typename D0>
__device__ __forceinline__ void add_delta4(float* v, const D0* p) {
  Delta4Raw<D0> r;
  r.load(p);
  r.add(v);
}
__device__ __forceinline__ float delta_at(const __nv_bfloat16* p, std::int64_t c) { return __bfloat162float(p[c]); }
__device__ __forceinline__ float delta_at(const long long* p, std::int64_t c) { return dev::fixed_to_float_bf16(p[c]); }

// 1 / sqrt(mean + eps) of the block's squares, each thread holding its partial sum ss: the warps'
// butterflies, then the 8 warp sums in order (synchronises the block).
__device__ __forceinline__ float inv_rms(float ss, std::int64_t k, float eps) {
  __shared__ float part[kNormThreads / 32];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.0f;
  for (int j = 0; j < kNormThreads / 32; ++j) total += part[j];
  return rsqrtf(total / static_cast<float>(k) + eps);
}

// x[c] (+ d0[c]) (+ d1[c]): the residual adds at one column, in that order.
template <typename D0>
__device__ __forceinline__ float residual_at(const float* x, const D0* d0, const __nv_bfloat16* d1, std::int64_t c) {
  float e = x[c];
  if (d0) e += delta_at(d0, c);
  if (d1) e += __bfloat162float(d1[c]);
  return e;
}

// y[0..3] = bf16(a[e] · inv · b[e]) (y 8-byte aligned).
__device__ __forceinline__ void store_norm4(__nv_bfloat16* y, const float* a, float inv, const float* b) {
  uint2 out;
  *reinterpret_cast<__nv_bfloat162*>(&out.x) =
      __halves2bfloat162(__float2bfloat16(a[0] * inv * b[0]), __float2bfloat16(a[1] * inv * b[1]));
  *reinterpret_cast<__nv_bfloat162*>(&out.y) =
      __halves2bfloat162(__float2bfloat16(a[2] * inv * b[2]), __float2bfloat16(a[3] * inv * b[3]));
  *reinterpret_cast<uint2*>(y) = out;
}

template <bool kStore>
__device__ void norm_row(float* __restrict__ xr, const __nv_bfloat16* __restrict__ d0,
                         const __nv_bfloat16* __restrict__ d1, std::int64_t k, const float* __restrict__ w, float eps,
                         __nv_bfloat16* __restrict__ yr) {
  const bool add = d0 || d1;
  // x' at column c, read from memory (for the streamed path).
  const auto value = [&](std::int64_t c) { return residual_at(xr, d0, d1, c); };
  float ss = 0.0f;
  float v[kNormHeld], wv[kNormHeld];
  const bool held = k <= static_cast<std::int64_t>(kNormThreads) * kNormHeld;
  const bool wide = norm_row_wide(k);
  constexpr int kGroups = kNormHeld / 4;  // the wide branch keeps group g in v[4g … 4g + 3]
  if (wide) {
    // Every group's x, w and deltas are loaded before the first is used: with the deltas' loads
    // behind a test each (SASS: a block of their own after the previous group's adds), the row came
    // in a chain of dependent round trips (four at K = 2048 for x + first + delta). The raw deltas
    // wait in registers; the adds below are the same, in the same order.
    uint2 r0[kGroups], r1[kGroups];
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      const std::int64_t c = 4 * (threadIdx.x + static_cast<std::int64_t>(g) * kNormThreads);
      const bool in = c < k;
      const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const float4 xv = in ? *reinterpret_cast<const float4*>(xr + c) : zero;
      const float4 ww = in ? *reinterpret_cast<const float4*>(w + c) : zero;
      r0[g] = in && d0 ? *reinterpret_cast<const uint2*>(d0 + c) : make_uint2(0, 0);
      r1[g] = in && d1 ? *reinterpret_cast<const uint2*>(d1 + c) : make_uint2(0, 0);
      v[4 * g] = xv.x;
      v[4 * g + 1] = xv.y;
      v[4 * g + 2] = xv.z;
      v[4 * g + 3] = xv.w;
      wv[4 * g] = ww.x;
      wv[4 * g + 1] = ww.y;
      wv[4 * g + 2] = ww.z;
      wv[4 * g + 3] = ww.w;
    }
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      const std::int64_t c = 4 * (threadIdx.x + static_cast<std::int64_t>(g) * kNormThreads);
      if (c < k && d0) add_bf16x4(v + 4 * g, r0[g]);
      if (c < k && d1) add_bf16x4(v + 4 * g, r1[g]);
    }
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      const std::int64_t c = 4 * (threadIdx.x + static_cast<std::int64_t>(g) * kNormThreads);
      if (c < k) {
        if (kStore && add) *reinterpret_cast<float4*>(xr + c) = make_float4(v[4 * g], v[4 * g + 1], v[4 * g + 2], v[4 * g + 3]);
#pragma unroll
        for (int e = 0; e < 4; ++e) ss += v[4 * g + e] * v[4 * g + e];
      }
    }
  } else if (held) {
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
  const float inv = inv_rms(ss, k, eps);
  if (wide) {
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      const std::int64_t c = 4 * (threadIdx.x + static_cast<std::int64_t>(g) * kNormThreads);
      if (c < k) store_norm4(yr + c, v + 4 * g, inv, wv + 4 * g);
    }
  } else if (held) {
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

// norm_row_reread's norm weights staged in shared memory by a kernel before its programmatic wait
// (weights: no kernel of the chain writes them), so that the norm's second pass waits for no round
// trip to them. Wide branch only (norm_row_wide(k); else nothing is staged and the second pass reads
// w). Thread t copies exactly the columns it reads in that pass, so its own cp.async wait orders
// them: no barrier. w 16-byte aligned (norm_row_aligned); s 16-byte aligned, norm_stage_bytes(k)
// long, group g's float4 of thread t at s[g · kNormThreads + t].
__host__ __device__ constexpr std::int64_t norm_stage_bytes(std::int64_t k) {
  return norm_row_wide(k) ? (k / 4 + kNormThreads - 1) / kNormThreads * kNormThreads * 16 : 0;
}
// The dynamic shared memory of a kernel that holds the normalised row (bf16 [k], k a multiple of 8)
// and then the stage, which starts after the row's k / 8 16-byte chunks (rmsnorm_project,
// twell_decode_token: `reinterpret_cast<float4*>(row + kchunks)`).
__host__ __device__ constexpr std::int64_t norm_row_smem_bytes(std::int64_t k) { return k * 2 + norm_stage_bytes(k); }
__device__ __forceinline__ void stage_norm_weights(const float* w, std::int64_t k, float4* s) {
  if (!norm_row_wide(k)) return;
#pragma unroll
  for (int g = 0; g < kNormHeld / 4; ++g) {
    const std::int64_t c = 4 * (threadIdx.x + static_cast<std::int64_t>(g) * kNormThreads);
    if (c < k)
      dev::cp_async16(static_cast<std::uint32_t>(__cvta_generic_to_shared(s + g * kNormThreads + threadIdx.x)), w + c, true);
  }
  dev::cp_async_commit();
}

// norm_row<false>'s bits (x only read) with few registers, for kernels that keep other data in
// registers across the norm (twell_decode_token's weight window): the sum of squares in norm_row's
// order (its 4-wide branch where norm_row_wide(k), else element by element: its held and streamed
// branches share that order), then every element formed again from memory, where the first pass
// left it cached. y may be in shared memory. Every thread of the block must call it.
// D0: bf16, or long long for the fixed-point FFN output (add_delta4). staged: w as this thread
// staged it (stage_norm_weights), or null to read w.
template <typename D0>
__device__ inline void norm_row_reread(const float* __restrict__ xr, const D0* __restrict__ d0,
                                       const __nv_bfloat16* __restrict__ d1, std::int64_t k, const float* __restrict__ w,
                                       float eps, __nv_bfloat16* __restrict__ yr, const float4* staged = nullptr) {
  const bool wide = norm_row_wide(k);
  constexpr int kGroups = kNormHeld / 4;
  // x' at columns c … c + 3 (wide) or c.
  const auto value4 = [&](std::int64_t c, float* v) {
    const float4 xv = *reinterpret_cast<const float4*>(xr + c);
    v[0] = xv.x;
    v[1] = xv.y;
    v[2] = xv.z;
    v[3] = xv.w;
    if (d0) add_delta4(v, d0 + c);
    if (d1) add_bf16x4(v, d1 + c);
  };
  const auto value = [&](std::int64_t c) { return residual_at(xr, d0, d1, c); };
  float ss = 0.0f;
  if (wide) {
    // kRereadPass groups' x and deltas are loaded before any of them is used: one round trip for
    // a row of ≤ kRereadPass · 1024 (the 2B's 2048), where each group's loads behind its own
    // bounds test were a round trip of their own after the previous group's adds. The adds and
    // squares are the same, in the same order. Two groups of a fixed-point delta take
    // rmsnorm_project's RoPE form from 80 registers to 104 (2 CTAs an SM, not 3), so that one
    // loads a group at a time.
    constexpr int kRereadPass = sizeof(D0) == 8 ? 1 : 2;
#pragma unroll
    for (int g0 = 0; g0 < kGroups; g0 += kRereadPass) {
      float4 xv[kRereadPass];
      Delta4Raw<D0> r0[kRereadPass];
      uint2 r1[kRereadPass];
#pragma unroll
      for (int j = 0; j < kRereadPass; ++j) {
        const std::int64_t c = 4 * (threadIdx.x + static_cast<std::int64_t>(g0 + j) * kNormThreads);
        const bool in = c < k;
        xv[j] = in ? *reinterpret_cast<const float4*>(xr + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        r0[j].load(in && d0 ? d0 + c : nullptr);
        r1[j] = in && d1 ? *reinterpret_cast<const uint2*>(d1 + c) : make_uint2(0, 0);
      }
#pragma unroll
      for (int j = 0; j < kRereadPass; ++j) {
        const std::int64_t c = 4 * (threadIdx.x + static_cast<std::int64_t>(g0 + j) * kNormThreads);
        if (c < k) {
          float v[4] = {xv[j].x, xv[j].y, xv[j].z, xv[j].w};
          if (d0) r0[j].add(v);
          if (d1) add_bf16x4(v, r1[j]);
#pragma unroll
          for (int e = 0; e < 4; ++e) ss += v[e] * v[e];
        }
      }
    }
  } else {
    for (std::int64_t c = threadIdx.x; c < k; c += kNormThreads) {
      const float e = value(c);
      ss += e * e;
    }
  }
  const float inv = inv_rms(ss, k, eps);
  if (wide) {
    if (staged) dev::cp_async_wait<0>();
    for (int g = 0; g < kGroups; ++g) {
      const std::int64_t c = 4 * (threadIdx.x + static_cast<std::int64_t>(g) * kNormThreads);
      if (c < k) {
        float a[4];
        value4(c, a);
        const float4 b4 = staged ? staged[g * kNormThreads + threadIdx.x] : *reinterpret_cast<const float4*>(w + c);
        const float b[4] = {b4.x, b4.y, b4.z, b4.w};
        store_norm4(yr + c, a, inv, b);
      }
    }
  } else {
    for (std::int64_t c = threadIdx.x; c < k; c += kNormThreads) yr[c] = __float2bfloat16(value(c) * inv * w[c]);
  }
}

}  // namespace twell::cuda::ops::detail
