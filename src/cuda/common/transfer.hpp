#pragma once
// Host fp32 matrices to and from device bf16, each call complete on return (it waits for its
// stream): uploads round to bf16 (round to nearest even, twell/bf16.hpp), downloads widen to fp32.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda/common/check.hpp"
#include "cuda/common/device_buffer.hpp"
#include "twell/bf16.hpp"
#include "twell/tensor.hpp"

namespace twell::cuda {

// x [rows, cols] (any row stride) → a new device buffer, bf16 [rows, cols] contiguous.
inline DeviceBuffer<__nv_bfloat16> upload_bf16(CMatrixF x, cudaStream_t stream) {
  std::vector<std::uint16_t> xb(static_cast<std::size_t>(x.rows * x.cols));
  for (std::int64_t r = 0; r < x.rows; ++r)
    for (std::int64_t c = 0; c < x.cols; ++c) xb[static_cast<std::size_t>(r * x.cols + c)] = to_bf16(x(r, c)).bits;
  DeviceBuffer<__nv_bfloat16> d(xb.size());
  TWELL_CUDA_CHECK(cudaMemcpyAsync(d.get(), xb.data(), xb.size() * 2, cudaMemcpyHostToDevice, stream));
  TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
  return d;
}

// Device bf16 [rows, cols] contiguous → host fp32, row-major.
inline std::vector<float> download_bf16(const __nv_bfloat16* y, std::int64_t rows, std::int64_t cols,
                                        cudaStream_t stream) {
  std::vector<std::uint16_t> yb(static_cast<std::size_t>(rows * cols));
  TWELL_CUDA_CHECK(cudaMemcpyAsync(yb.data(), y, yb.size() * 2, cudaMemcpyDeviceToHost, stream));
  TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> out(yb.size());
  for (std::size_t i = 0; i < yb.size(); ++i) out[i] = to_float(bf16{yb[i]});
  return out;
}

}  // namespace twell::cuda
