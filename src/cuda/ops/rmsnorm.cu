// rmsnorm: y = bf16(x / sqrt(mean(x²) + eps) ⊙ w), one block per row, fp32 sums.
#include "cuda/common/check.hpp"
#include "cuda/ops/model_ops.hpp"

namespace twell::cuda::ops {
namespace {

constexpr int kThreads = 256;

__global__ void rmsnorm_kernel(const float* x, const std::int32_t* row_index, std::int64_t k, const float* w, float eps,
                               __nv_bfloat16* y) {
  const std::int64_t i = blockIdx.x;
  const std::int64_t src = row_index ? row_index[i] : i;
  const float* xr = x + src * k;
  float ss = 0.0f;
  for (std::int64_t c = threadIdx.x; c < k; c += kThreads) ss += xr[c] * xr[c];
  __shared__ float part[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.0f;
  for (int j = 0; j < kThreads / 32; ++j) total += part[j];
  const float inv = rsqrtf(total / static_cast<float>(k) + eps);
  for (std::int64_t c = threadIdx.x; c < k; c += kThreads) y[i * k + c] = __float2bfloat16(xr[c] * inv * w[c]);
}

// residual_add then rmsnorm of the same rows in one pass: x[i] += delta[i]; y[i] = rmsnorm(x[i]).
// The same fp32 operations in the same order as the two kernels (results bit-identical to them).
__global__ void add_rmsnorm_kernel(float* x, const __nv_bfloat16* delta, std::int64_t k, const float* w, float eps,
                                   __nv_bfloat16* y) {
  const std::int64_t i = blockIdx.x;
  float* xr = x + i * k;
  const __nv_bfloat16* dr = delta + i * k;
  float ss = 0.0f;
  for (std::int64_t c = threadIdx.x; c < k; c += kThreads) {
    const float v = xr[c] + __bfloat162float(dr[c]);
    xr[c] = v;
    ss += v * v;
  }
  __shared__ float part[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.0f;
  for (int j = 0; j < kThreads / 32; ++j) total += part[j];
  const float inv = rsqrtf(total / static_cast<float>(k) + eps);
  for (std::int64_t c = threadIdx.x; c < k; c += kThreads) y[i * k + c] = __float2bfloat16(xr[c] * inv * w[c]);
}

}  // namespace

void add_rmsnorm(float* x, const __nv_bfloat16* delta, std::int64_t rows, std::int64_t k, const float* w, float eps,
                 __nv_bfloat16* y, cudaStream_t stream) {
  TWELL_CU_REQUIRE(rows > 0 && rows < (1ll << 31) && k > 0, ErrorCode::invalid_argument, "add_rmsnorm: bad shape [{}, {}]",
                   rows, k);
  add_rmsnorm_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, delta, k, w, eps, y);
  TWELL_CUDA_CHECK_LAUNCH("add_rmsnorm_kernel");
}

void rmsnorm(const float* x, const std::int32_t* row_index, std::int64_t rows, std::int64_t k, const float* w, float eps,
             __nv_bfloat16* y, cudaStream_t stream) {
  TWELL_CU_REQUIRE(rows > 0 && rows < (1ll << 31) && k > 0, ErrorCode::invalid_argument, "rmsnorm: bad shape [{}, {}]", rows, k);
  rmsnorm_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, row_index, k, w, eps, y);
  TWELL_CUDA_CHECK_LAUNCH("rmsnorm_kernel");
}

}  // namespace twell::cuda::ops
