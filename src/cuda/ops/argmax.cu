// argmax: greedy sampling on the device, the index of each row's largest logit (lowest on ties).
#include "cuda/common/check.hpp"
#include "cuda/common/launch.cuh"
#include "cuda/ops/model_ops.hpp"

namespace twell::cuda::ops {
namespace {

constexpr int kThreads = 512;

__device__ bool better(float a, int ia, float b, int ib) { return a > b || (a == b && ia < ib); }

// Loads in flight a thread: the row is read in steps of kBatch 16-byte loads, all issued before
// the first is compared (a loop that compares each load before the next is issued waits for one
// round trip a load: the 2B's 49 152 logits took 24 dependent round trips, ≈ 8.5 µs a step).
constexpr int kBatch = 8;

__global__ void argmax_kernel(const float* logits, std::int64_t v, std::int32_t* out) {
  dev::pdl_begin();
  const float* row = logits + blockIdx.x * v;
  float best = -INFINITY;
  int idx = 0x7fffffff;
  bool bad = false;
  const auto take = [&](float x, std::int64_t i) {
    bad = bad || !isfinite(x);
    if (better(x, static_cast<int>(i), best, idx)) {
      best = x;
      idx = static_cast<int>(i);
    }
  };
  // better() orders by value, then by the lower index: the winner does not depend on the order in
  // which the elements are taken, so the 16-byte path and the scalar one give the same index.
  std::int64_t done = 0;
  if (v % 4 == 0 && (reinterpret_cast<std::uintptr_t>(row) & 15) == 0) {
    const float4* row4 = reinterpret_cast<const float4*>(row);
    const std::int64_t v4 = v / 4;
    for (std::int64_t b = threadIdx.x; b < v4; b += static_cast<std::int64_t>(kThreads) * kBatch) {
      float4 x[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const std::int64_t j = b + static_cast<std::int64_t>(u) * kThreads;
        x[u] = j < v4 ? row4[j] : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const std::int64_t j = b + static_cast<std::int64_t>(u) * kThreads;
        if (j < v4) {
          take(x[u].x, 4 * j);
          take(x[u].y, 4 * j + 1);
          take(x[u].z, 4 * j + 2);
          take(x[u].w, 4 * j + 3);
        }
      }
    }
    done = v;
  }
  for (std::int64_t i = done + threadIdx.x; i < v; i += kThreads) take(row[i], i);
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
