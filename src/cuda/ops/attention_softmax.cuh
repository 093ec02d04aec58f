#pragma once
// The decode attention's softmax over a CTA's scores in shared memory (cuda/ops/attention.cu's
// kernels, and lab/probes/probe_decode_attention.cu's candidates, whose bits must equal the
// library's: one function, so they do by construction).
#include <cuda_runtime.h>

namespace twell::cuda::ops::detail {

// The block's scores score[0, n) → exp(score − max) in place; returns their sum. W: the CTA's warps
// (W · 32 threads); mx: this thread's running max over the scores it wrote; red: W floats of shared
// scratch. Ends with a barrier, so every probability is visible to every thread.
template <int W>
__device__ __forceinline__ float softmax_in_place(float* score, int n, float mx, float* red) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  mx = red[0];
  for (int w = 1; w < W; ++w) mx = fmaxf(mx, red[w]);
  __syncthreads();  // red is reused below
  float sum = 0.0f;
  for (int t = static_cast<int>(threadIdx.x); t < n; t += W * 32) {
    const float e = __expf(score[t] - mx);
    score[t] = e;
    sum += e;
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) red[warp] = sum;
  __syncthreads();
  sum = 0.0f;
  for (int w = 0; w < W; ++w) sum += red[w];
  return sum;
}

}  // namespace twell::cuda::ops::detail
