// late_copy (late_writer.hpp).
#include "late_writer.hpp"

#include <cstdint>

#include "cuda/common/check.hpp"
#include "cuda/common/launch.cuh"

namespace twell::test {
namespace {

__global__ void late_copy_kernel(const unsigned char* src, unsigned char* dst, std::size_t bytes, unsigned spin_us) {
  cuda::dev::pdl_begin();
  const long long start = clock64();
  // ≈ 1.5 GHz or more: spin_us · 1500 cycles is at least spin_us microseconds on the GPUs here.
  while (clock64() - start < static_cast<long long>(spin_us) * 1500) {
  }
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < bytes; i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

}  // namespace

void late_copy(const void* src, void* dst, std::size_t bytes, unsigned spin_us, cudaStream_t stream) {
  cuda::launch_kernel(late_copy_kernel, dim3(64), dim3(256), 0, stream, static_cast<const unsigned char*>(src),
                      static_cast<unsigned char*>(dst), bytes, spin_us);
  TWELL_CUDA_CHECK_LAUNCH("late_copy_kernel");
}

}  // namespace twell::test
