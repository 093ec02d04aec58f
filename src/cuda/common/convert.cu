#include "cuda/common/convert.hpp"

#include "cuda/common/check.hpp"

namespace twell::cuda {
namespace {

__global__ void convert_f32_to_bf16_kernel(const float* in, std::int64_t ld_in, std::int64_t rows, std::int64_t cols,
                                           __nv_bfloat16* out, std::int64_t ld_out) {
  const std::int64_t total = rows * cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / cols, c = i % cols;
    out[r * ld_out + c] = __float2bfloat16_rn(in[r * ld_in + c]);
  }
}

}  // namespace

void launch_convert_f32_to_bf16(const float* in, std::int64_t ld_in, std::int64_t rows, std::int64_t cols,
                                __nv_bfloat16* out, std::int64_t ld_out, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  TWELL_CU_REQUIRE(ld_in >= cols && ld_out >= cols, ErrorCode::invalid_argument,
                   "convert: strides {}, {} below {} columns", ld_in, ld_out, cols);
  convert_f32_to_bf16_kernel<<<grid_stride_blocks(rows * cols, 256), 256, 0, stream>>>(in, ld_in, rows, cols, out, ld_out);
  TWELL_CUDA_CHECK_LAUNCH("convert_f32_to_bf16_kernel");
}

}  // namespace twell::cuda
