#pragma once
// Device side of the fixed-point FFN output (fixed_point.hpp): the reader's conversion and the
// writer's reduction.
#include <cuda_bf16.h>

#include <cstdint>

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

}  // namespace twell::cuda::dev
