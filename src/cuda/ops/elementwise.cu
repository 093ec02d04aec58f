// residual_add and gated_activation: elementwise, grid-stride.
#include "cuda/common/check.hpp"
#include "cuda/common/fixed_point.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/ops/model_ops.hpp"

namespace twell::cuda::ops {
namespace {

__global__ void residual_add_kernel(float* x, const __nv_bfloat16* y, std::int64_t n) {
  dev::pdl_begin();
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    x[i] += __bfloat162float(y[i]);
}

__global__ void residual_add_fixed_kernel(float* x, long long* y, std::int64_t n) {
  dev::pdl_begin();
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    x[i] += dev::fixed_to_float_bf16(y[i]);
    y[i] = 0;
  }
}

__device__ float activate(int act, float g) {
  switch (act) {
    case 0: return g > 0.0f ? g : 0.0f;
    case 1: return g / (1.0f + expf(-g));
    case 2: return 0.5f * g * (1.0f + erff(g * 0.70710678118654752f));
    default: return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
  }
}

__global__ void gated_activation_kernel(const __nv_bfloat16* gu, std::int64_t rows, std::int64_t n, int act,
                                        __nv_bfloat16* h) {
  dev::pdl_begin();
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < rows * n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / n, j = i % n;
    const float g = __bfloat162float(gu[r * 2 * n + j]), u = __bfloat162float(gu[r * 2 * n + n + j]);
    h[i] = __float2bfloat16(activate(act, g) * u);
  }
}

}  // namespace

void residual_add(float* x, const __nv_bfloat16* y, std::int64_t n, cudaStream_t stream) {
  TWELL_CU_REQUIRE(n > 0, ErrorCode::invalid_argument, "residual_add: n = {}", n);
  launch_kernel(residual_add_kernel, dim3(grid_stride_blocks(n, 256)), dim3(256), 0, stream, x, y, n);
  TWELL_CUDA_CHECK_LAUNCH("residual_add_kernel");
}

void residual_add_fixed(float* x, std::int64_t* y_fixed, std::int64_t n, cudaStream_t stream) {
  TWELL_CU_REQUIRE(n > 0 && x && y_fixed, ErrorCode::invalid_argument, "residual_add_fixed: n = {} or a null pointer", n);
  launch_kernel(residual_add_fixed_kernel, dim3(grid_stride_blocks(n, 256)), dim3(256), 0, stream, x,
                reinterpret_cast<long long*>(y_fixed), n);
  TWELL_CUDA_CHECK_LAUNCH("residual_add_fixed_kernel");
}

void gated_activation(const __nv_bfloat16* gu, std::int64_t rows, std::int64_t n, int act, __nv_bfloat16* h,
                      cudaStream_t stream) {
  TWELL_CU_REQUIRE(rows > 0 && n > 0 && act >= 0 && act <= 3, ErrorCode::invalid_argument,
                   "gated_activation: rows {}, n {}, act {}", rows, n, act);
  launch_kernel(gated_activation_kernel, dim3(grid_stride_blocks(rows * n, 256)), dim3(256), 0, stream, gu, rows, n, act, h);
  TWELL_CUDA_CHECK_LAUNCH("gated_activation_kernel");
}

}  // namespace twell::cuda::ops
