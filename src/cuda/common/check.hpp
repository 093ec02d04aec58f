#pragma once
// Error macros of the CUDA backend. Every failure throws twell::Error(ErrorCode::cuda) naming the
// call, file:line and the current device, so a message says what failed and where.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "twell/error.hpp"

namespace twell::cuda::detail {

// nvcc 13 cannot evaluate fmt 9's consteval format-string checks, so CUDA translation units
// format at run time (fmt::runtime) through this instead of twell::fail.
template <typename... Args>
[[noreturn]] void raise(ErrorCode code, const char* format, const Args&... args) {
  throw Error(code, fmt::format(fmt::runtime(format), args...));
}

inline int current_device_or_minus_one() noexcept {
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess) return -1;
  return d;
}

// Reports e by the throw and clears it as the runtime's last error, so that the next launch's check
// (TWELL_CUDA_CHECK_LAUNCH) does not report it again under its own name after a caller has handled
// this one (a full device, a refused launch). A sticky error (a kernel's fault) stays: the runtime
// keeps it whatever is asked.
[[noreturn]] inline void throw_cuda(cudaError_t e, const char* call, const char* file, int line) {
  (void)cudaGetLastError();
  raise(ErrorCode::cuda, "{} failed: {} ({}) at {}:{} on device {}", call, cudaGetErrorString(e),
        cudaGetErrorName(e), file, line, current_device_or_minus_one());
}

[[noreturn]] inline void throw_cublas(cublasStatus_t s, const char* call, const char* file, int line) {
  raise(ErrorCode::cuda, "{} failed: cuBLAS status {} at {}:{} on device {}", call, static_cast<int>(s), file,
        line, current_device_or_minus_one());
}

}  // namespace twell::cuda::detail

#define TWELL_CUDA_CHECK(call)                                                              \
  do {                                                                                      \
    cudaError_t twell_err_ = (call);                                                        \
    if (twell_err_ != cudaSuccess) ::twell::cuda::detail::throw_cuda(twell_err_, #call, __FILE__, __LINE__); \
  } while (0)

#define TWELL_CUBLAS_CHECK(call)                                                            \
  do {                                                                                      \
    cublasStatus_t twell_st_ = (call);                                                      \
    if (twell_st_ != CUBLAS_STATUS_SUCCESS)                                                 \
      ::twell::cuda::detail::throw_cublas(twell_st_, #call, __FILE__, __LINE__);            \
  } while (0)

// After a kernel launch: reports launch-configuration errors (not asynchronous faults).
#define TWELL_CUDA_CHECK_LAUNCH(name)                                                        \
  do {                                                                                      \
    cudaError_t twell_err_ = cudaGetLastError();                                            \
    if (twell_err_ != cudaSuccess) ::twell::cuda::detail::throw_cuda(twell_err_, "launch of " name, __FILE__, __LINE__); \
  } while (0)

namespace twell::cuda {
// Blocks for a grid-stride kernel over `items` work items, `threads` per block: enough to fill any
// GPU, never more than the items need, never 0.
inline unsigned grid_stride_blocks(std::int64_t items, int threads) {
  const std::int64_t b = (items + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > (1 << 16) ? (1 << 16) : b));
}
}  // namespace twell::cuda

// Throws twell::Error(code, formatted message) unless cond holds (CUDA-TU-safe TWELL_CHECK).
#define TWELL_CU_REQUIRE(cond, code, ...)                      \
  do {                                                         \
    if (!(cond)) ::twell::cuda::detail::raise(code, __VA_ARGS__); \
  } while (0)
