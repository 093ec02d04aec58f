#pragma once
// Device side of the fixed-point FFN output (fixed_point.hpp): the reader's conversion and the
// writer's reduction.
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/common/device_math.cuh"
#include "cuda/common/fixed_point.hpp"

namespace twell::cuda::dev {

static_assert(kFixedShift == 32, "the conversions below scale by 2^32");

// bf16(acc · 2^−32) as a float: fixed_to_float_bf16's value.
__device__ __forceinline__ float fixed_to_float_bf16(long long acc) {
  return __bfloat162float(__double2bfloat16(__ll2double_rn(acc) * 0x1p-32));
}

// acc += round(t · 2^32) (a reduction: nothing waits for it); false, and nothing added, where t is
// not finite or |t| ≥ limit (fixed_term_limit).
__device__ __forceinline__ bool fixed_add(long long* acc, float t, float limit) {
  if (!(fabsf(t) < limit)) return false;
  atomicAdd(reinterpret_cast<unsigned long long*>(acc),
            static_cast<unsigned long long>(__float2ll_rn(t * 0x1p32f)));
  return true;
}

// One 256-column step of h · Wdᵀ[n, :] into a row's accumulators acc [k]: lane l holds the step's
// chunk l as 8 floats (wf: columns col0 + 8l … + 7). The products go through the warp's 256 floats
// of shared memory (terms) so that lane l reduces columns col0 + 32e + l (e = 0 … 7): 256
// contiguous bytes a reduction instruction, not 32 lines 64 bytes apart. All 8 terms are converted
// (a term out of range, fixed_add's test, to 0: nothing added) before the 8 reductions, which then
// issue back to back without a branch a term; term by term (fixed_add) a warp alone took 3.8 µs to
// issue its 2048 columns against 1.5 (twell_probe_red_rate, H200). Columns past k are left out.
// False where a term was left out. Every lane of the warp calls it.
__device__ __forceinline__ bool fixed_add_step(long long* acc, long long col0, long long k, float h, const float (&wf)[8],
                                               float* terms, int lane, float limit) {
  __syncwarp();  // the previous step's terms are read
#pragma unroll
  for (int e = 0; e < 8; ++e) terms[8 * lane + e] = h * wf[e];
  __syncwarp();
  bool in_range = true;
  unsigned long long* a = reinterpret_cast<unsigned long long*>(acc + col0 + lane);
  const bool whole = col0 + 256 <= k;  // the whole step in the row (warp-uniform): no test a term
#pragma unroll
  for (int e0 = 0; e0 < 8; e0 += 4) {  // in halves: 4 int64 terms live, not 8 (64 registers)
    long long v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float t = terms[32 * (e0 + e) + lane];
      const bool ok = fabsf(t) < limit;  // false for NaN too
      in_range &= ok;
      v[e] = ok ? __float2ll_rn(t * 0x1p32f) : 0;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (whole || col0 + 32 * (e0 + e) + lane < k)
        atomicAdd(a + 32 * (e0 + e), static_cast<unsigned long long>(v[e]));
  }
  return in_range;
}

// The walk over a bf16 row (dr, kchunks 16-byte chunks) that feeds fixed_add_step: windows of kWin
// steps of 32 chunks (lane l takes chunk 32 · step + l), every load of a window in flight before
// its steps run; f(step0, wf) for each step whose first chunk step0 lies in the row, wf the lane's
// chunk as 8 floats (zeros past the row). Every lane of the warp calls it.
template <int kWin, typename F>
__device__ __forceinline__ void down_row_steps(const uint4* dr, int kchunks, int lane, F&& f) {
  for (int c0 = 0; c0 < kchunks; c0 += 32 * kWin) {
    uint4 wd[kWin];
#pragma unroll
    for (int i = 0; i < kWin; ++i) {
      const int c = c0 + i * 32 + lane;
      wd[i] = c < kchunks ? __ldg(dr + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < kWin; ++i) {
      const int step0 = c0 + i * 32;  // the step's first chunk
      if (step0 >= kchunks) break;
      float wf[8];
      unpack8_bf16(wd[i], wf);
      f(step0, wf);
    }
  }
}

}  // namespace twell::cuda::dev
