#pragma once
// Device-memory helpers of the tests that use the library's internal buffers (DeviceBuffer).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/common/device_buffer.hpp"

namespace twell::cuda::test {

// A device copy of bf16 bit patterns.
inline DeviceBuffer<__nv_bfloat16> upload_bits(const std::vector<std::uint16_t>& v) {
  DeviceBuffer<__nv_bfloat16> d(v.size());
  EXPECT_EQ(cudaMemcpy(d.get(), v.data(), v.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

// n elements of device memory as host values of type H (T's bit patterns: uint16 for bf16).
template <typename H, typename T>
std::vector<H> download(const T* p, std::size_t n) {
  std::vector<H> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(H), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

}  // namespace twell::cuda::test
