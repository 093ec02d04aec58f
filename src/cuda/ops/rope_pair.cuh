#pragma once
// One RoPE pair, shared by rope.cu and rmsnorm_project.cu so that both give the same bits:
// (x1, x2) at (i, i + d/2) of a head rotate by the angle whose cosine and sine are c and s,
// o1 = x1·c − x2·s, o2 = x2·c + x1·s, each product and sum rounded to fp32 on its own (no
// contraction into FMAs, which a compiler may choose differently in two kernels), then to bf16.
#include <cuda_bf16.h>

namespace twell::cuda::ops::detail {

__device__ __forceinline__ void rope_pair(float x1, float x2, float c, float s, __nv_bfloat16& o1, __nv_bfloat16& o2) {
  o1 = __float2bfloat16(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)));
  o2 = __float2bfloat16(__fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)));
}

}  // namespace twell::cuda::ops::detail
