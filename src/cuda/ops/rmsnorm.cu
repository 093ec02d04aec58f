// rmsnorm: y = bf16(x / sqrt(mean(x²) + eps) ⊙ w), one block per row, fp32 sums.
#include "cuda/common/check.hpp"
#include "cuda/common/launch.cuh"
#include "cuda/ops/model_ops.hpp"

namespace twell::cuda::ops {
namespace {

constexpr int kThreads = 256;
constexpr int kHeld = 16;  // elements per thread held in registers: rows up to kThreads · kHeld = 4096

// One block per row. Rows of k ≤ 4096 are loaded into registers first (all loads in flight at once:
// a decode step's single row is one memory latency, not one per strided iteration), longer rows
// stream. Sum order: thread t sums elements t, t + 256, … in order, then warps by shuffles, then
// the 8 warp sums in order; the same in both kernels and both branches (add_rmsnorm is bit-identical
// to residual_add then rmsnorm).
template <bool kAdd>
__device__ void norm_row(float* __restrict__ xr, const __nv_bfloat16* __restrict__ dr, std::int64_t k,
                         const float* __restrict__ w, float eps, __nv_bfloat16* __restrict__ yr) {
  float ss = 0.0f;
  float v[kHeld], wv[kHeld];
  const bool held = k <= static_cast<std::int64_t>(kThreads) * kHeld;
  if (held) {  // x, delta and w all in flight at once: the weights' latency is not after the sums'
#pragma unroll
    for (int j = 0; j < kHeld; ++j) {
      const std::int64_t c = threadIdx.x + static_cast<std::int64_t>(j) * kThreads;
      v[j] = c < k ? xr[c] : 0.0f;
      wv[j] = c < k ? w[c] : 0.0f;
      if constexpr (kAdd) v[j] += c < k ? __bfloat162float(dr[c]) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kHeld; ++j) {
      const std::int64_t c = threadIdx.x + static_cast<std::int64_t>(j) * kThreads;
      if (c < k) {
        if constexpr (kAdd) xr[c] = v[j];
        ss += v[j] * v[j];
      }
    }
  } else {
    for (std::int64_t c = threadIdx.x; c < k; c += kThreads) {
      float e = xr[c];
      if constexpr (kAdd) {
        e += __bfloat162float(dr[c]);
        xr[c] = e;
      }
      ss += e * e;
    }
  }
  __shared__ float part[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.0f;
  for (int j = 0; j < kThreads / 32; ++j) total += part[j];
  const float inv = rsqrtf(total / static_cast<float>(k) + eps);
  if (held) {
#pragma unroll
    for (int j = 0; j < kHeld; ++j) {
      const std::int64_t c = threadIdx.x + static_cast<std::int64_t>(j) * kThreads;
      if (c < k) yr[c] = __float2bfloat16(v[j] * inv * wv[j]);
    }
  } else {
    for (std::int64_t c = threadIdx.x; c < k; c += kThreads) yr[c] = __float2bfloat16(xr[c] * inv * w[c]);
  }
}

__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(const float* x, const std::int32_t* row_index, std::int64_t k,
                                                           const float* w, float eps, __nv_bfloat16* y) {
  dev::pdl_begin();
  const std::int64_t i = blockIdx.x;
  const std::int64_t src = row_index ? row_index[i] : i;
  norm_row<false>(const_cast<float*>(x + src * k), nullptr, k, w, eps, y + i * k);  // kAdd false: x is only read
}

// residual_add then rmsnorm of the same rows in one pass: x[i] += delta[i]; y[i] = rmsnorm(x[i]).
__global__ void __launch_bounds__(kThreads) add_rmsnorm_kernel(float* x, const __nv_bfloat16* delta, std::int64_t k,
                                                               const float* w, float eps, __nv_bfloat16* y) {
  dev::pdl_begin();
  const std::int64_t i = blockIdx.x;
  norm_row<true>(x + i * k, delta + i * k, k, w, eps, y + i * k);
}

}  // namespace

void add_rmsnorm(float* x, const __nv_bfloat16* delta, std::int64_t rows, std::int64_t k, const float* w, float eps,
                 __nv_bfloat16* y, cudaStream_t stream) {
  TWELL_CU_REQUIRE(rows > 0 && rows < (1ll << 31) && k > 0, ErrorCode::invalid_argument, "add_rmsnorm: bad shape [{}, {}]",
                   rows, k);
  launch_kernel(add_rmsnorm_kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, stream, x, delta, k, w, eps, y);
  TWELL_CUDA_CHECK_LAUNCH("add_rmsnorm_kernel");
}

void rmsnorm(const float* x, const std::int32_t* row_index, std::int64_t rows, std::int64_t k, const float* w, float eps,
             __nv_bfloat16* y, cudaStream_t stream) {
  TWELL_CU_REQUIRE(rows > 0 && rows < (1ll << 31) && k > 0, ErrorCode::invalid_argument, "rmsnorm: bad shape [{}, {}]", rows, k);
  launch_kernel(rmsnorm_kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, stream, x, row_index, k, w, eps, y);
  TWELL_CUDA_CHECK_LAUNCH("rmsnorm_kernel");
}

}  // namespace twell::cuda::ops
