// residual_add, residual_add_fixed and gated_product: elementwise, grid-stride.
#include "cuda/common/check.hpp"
#include "cuda/common/device_math.cuh"
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

// h[r, j] = bf16(act(g[r, j]) · u[r, j]), 8 columns a thread: 16-byte loads and a 16-byte store
// where both strides allow them (the vector path), else one element at a time; the same
// arithmetic either way. A thread reads its g and u before it writes its h, and no other thread
// reads them, so h may be g itself (ld_h = ld_gu, in place).
template <int kAct>
__global__ void gated_product_kernel(const __nv_bfloat16* g, const __nv_bfloat16* u, std::int64_t ld_gu,
                                     __nv_bfloat16* h, std::int64_t ld_h, std::int64_t m, std::int64_t n) {
  dev::pdl_begin();  // g and u come from the kernel before
  const std::int64_t chunks_per_row = (n + 7) / 8;
  const std::int64_t total = m * chunks_per_row;
  const bool vec = (ld_gu % 8 == 0) && (ld_h % 8 == 0);
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / chunks_per_row, c0 = (i % chunks_per_row) * 8;
    if (vec && c0 + 8 <= n) {
      const uint4 gv = __ldcs(reinterpret_cast<const uint4*>(g + r * ld_gu + c0));
      const uint4 uv = __ldcs(reinterpret_cast<const uint4*>(u + r * ld_gu + c0));
      const std::uint32_t gw[4] = {gv.x, gv.y, gv.z, gv.w}, uw[4] = {uv.x, uv.y, uv.z, uv.w};
      __nv_bfloat162 o[4];
#pragma unroll
      for (int e = 0; e < 4; ++e)
        o[e] = __floats2bfloat162_rn(dev::activate(kAct, dev::lo_bf16(gw[e])) * dev::lo_bf16(uw[e]),
                                     dev::activate(kAct, dev::hi_bf16(gw[e])) * dev::hi_bf16(uw[e]));
      *reinterpret_cast<uint4*>(h + r * ld_h + c0) = *reinterpret_cast<const uint4*>(o);
    } else {
      for (std::int64_t c = c0; c < min(c0 + 8, n); ++c)
        h[r * ld_h + c] = __float2bfloat16_rn(dev::activate(kAct, __bfloat162float(g[r * ld_gu + c])) *
                                              __bfloat162float(u[r * ld_gu + c]));
    }
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

void gated_product(const __nv_bfloat16* g, const __nv_bfloat16* u, std::int64_t ld_gu, __nv_bfloat16* h,
                   std::int64_t ld_h, std::int64_t m, std::int64_t n, int act, cudaStream_t stream) {
  TWELL_CU_REQUIRE(g && u && h && m > 0 && n > 0 && ld_gu >= n && ld_h >= n && act >= 0 && act <= 3,
                   ErrorCode::invalid_argument, "gated_product: m {}, n {}, ld_gu {}, ld_h {}, act {}", m, n, ld_gu,
                   ld_h, act);
  // The kernel takes its vector path from the strides alone: those rows must then start on 16 bytes.
  const auto aligned = [](const void* q) { return (reinterpret_cast<std::uintptr_t>(q) & 15) == 0; };
  TWELL_CU_REQUIRE(ld_gu % 8 != 0 || ld_h % 8 != 0 || (aligned(g) && aligned(u) && aligned(h)),
                   ErrorCode::invalid_argument,
                   "gated_product: with both strides multiples of 8, g, u and h must be 16-byte aligned");
  // Through launch_kernel: inside a forward the kernel after it (the one-token down GEMV) loads
  // its first weights while this one runs.
  const dim3 grid(grid_stride_blocks(m * ((n + 7) / 8), 256)), block(256);
  switch (act) {
    case 0: launch_kernel(gated_product_kernel<0>, grid, block, 0, stream, g, u, ld_gu, h, ld_h, m, n); break;
    case 1: launch_kernel(gated_product_kernel<1>, grid, block, 0, stream, g, u, ld_gu, h, ld_h, m, n); break;
    case 2: launch_kernel(gated_product_kernel<2>, grid, block, 0, stream, g, u, ld_gu, h, ld_h, m, n); break;
    default: launch_kernel(gated_product_kernel<3>, grid, block, 0, stream, g, u, ld_gu, h, ld_h, m, n); break;
  }
  TWELL_CUDA_CHECK_LAUNCH("gated_product_kernel");
}

}  // namespace twell::cuda::ops
