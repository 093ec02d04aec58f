#pragma once
// A CUDA stream of one's own: non-blocking (no implicit order with the legacy default stream),
// created with the object and destroyed with it. For callers that are given no stream (the host
// API's calls, a model runtime).
#include <cuda_runtime.h>

#include "cuda/common/check.hpp"

namespace twell::cuda {

class OwnedStream {
 public:
  OwnedStream() { TWELL_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~OwnedStream() { cudaStreamDestroy(s_); }
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  cudaStream_t get() const noexcept { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

}  // namespace twell::cuda
