#include "cuda/common/transpose.hpp"

#include "cuda/common/check.hpp"

namespace twell::cuda {
namespace {

constexpr int kTile = 32;

template <typename T>
__global__ void transpose_kernel(const T* in, std::int64_t ld_in, std::int64_t rows, std::int64_t cols, T* out,
                                 std::int64_t ld_out) {
  __shared__ T tile[kTile][kTile + 1];  // +1: no bank conflicts on the transposed read
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * kTile, c0 = static_cast<std::int64_t>(blockIdx.x) * kTile;
  for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
    const std::int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = in[r * ld_in + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
    const std::int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (r < rows && c < cols) out[c * ld_out + r] = tile[threadIdx.x][i];
  }
}

template <typename T>
void launch_transpose(const T* in, std::int64_t ld_in, std::int64_t rows, std::int64_t cols, T* out, std::int64_t ld_out,
                      cudaStream_t stream) {
  TWELL_CU_REQUIRE(rows >= 1 && cols >= 1 && ld_in >= cols && ld_out >= rows && (rows + kTile - 1) / kTile <= 65535 &&
                       (cols + kTile - 1) / kTile <= 0x7fffffff,
                   ErrorCode::unsupported, "transpose: shape [{}, {}] (strides {}, {}) out of range", rows, cols, ld_in,
                   ld_out);
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile), static_cast<unsigned>((rows + kTile - 1) / kTile));
  transpose_kernel<T><<<grid, dim3(kTile, 8), 0, stream>>>(in, ld_in, rows, cols, out, ld_out);
  TWELL_CUDA_CHECK_LAUNCH("transpose_kernel");
}

}  // namespace

void launch_transpose_f32(const float* in, std::int64_t ld_in, std::int64_t rows, std::int64_t cols, float* out,
                          std::int64_t ld_out, cudaStream_t stream) {
  launch_transpose(in, ld_in, rows, cols, out, ld_out, stream);
}

void launch_transpose_bf16(const __nv_bfloat16* in, std::int64_t ld_in, std::int64_t rows, std::int64_t cols,
                           __nv_bfloat16* out, std::int64_t ld_out, cudaStream_t stream) {
  launch_transpose(in, ld_in, rows, cols, out, ld_out, stream);
}

}  // namespace twell::cuda
