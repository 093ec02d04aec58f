// argmax: greedy sampling on the device, the index of each row's largest logit (lowest on ties).
#include "cuda/common/check.hpp"
#include "cuda/common/launch.cuh"
#include "cuda/ops/model_ops.hpp"

namespace twell::cuda::ops {
namespace {

constexpr int kThreads = 512;

__device__ bool better(float a, int ia, float b, int ib) { return a > b || (a == b && ia < ib); }

__global__ void argmax_kernel(const float* logits, std::int64_t v, std::int32_t* out) {
  dev::pdl_begin();
  const float* row = logits + blockIdx.x * v;
  float best = -INFINITY;
  int idx = 0x7fffffff;
  bool bad = false;
  for (std::int64_t i = threadIdx.x; i < v; i += kThreads) {
    bad = bad || !isfinite(row[i]);
    if (better(row[i], static_cast<int>(i), best, idx)) {
      best = row[i];
      idx = static_cast<int>(i);
    }
  }
  bad = __syncthreads_or(bad);
  for (int o = 16; o > 0; o >>= 1) {
    const float b2 = __shfl_xor_sync(0xffffffffu, best, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
    if (better(b2, i2, best, idx)) {
      best = b2;
      idx = i2;
    }
  }
  __shared__ float sb[kThreads / 32];
  __shared__ int si[kThreads / 32];
  if (threadIdx.x % 32 == 0) {
    sb[threadIdx.x / 32] = best;
    si[threadIdx.x / 32] = idx;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w)
      if (better(sb[w], si[w], best, idx)) {
        best = sb[w];
        idx = si[w];
      }
    out[blockIdx.x] = bad ? -1 : idx;  // −1: a non-finite logit (the caller throws non_finite)
  }
}

}  // namespace

void argmax(const float* logits, std::int64_t rows, std::int64_t v, std::int32_t* out, cudaStream_t stream) {
  TWELL_CU_REQUIRE(rows > 0 && rows < (1ll << 31) && v > 0 && v < (1ll << 31), ErrorCode::invalid_argument,
                   "argmax: bad shape [{}, {}]", rows, v);
  launch_kernel(argmax_kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, stream, logits, v, out);
  TWELL_CUDA_CHECK_LAUNCH("argmax_kernel");
}

}  // namespace twell::cuda::ops
