// rmsnorm: y = bf16(x / sqrt(mean(x²) + eps) ⊙ w), one block per row, fp32 sums (norm_row.cuh).
#include "cuda/common/check.hpp"
#include "cuda/common/launch.cuh"
#include "cuda/ops/model_ops.hpp"
#include "cuda/ops/norm_row.cuh"

namespace twell::cuda::ops {
namespace {

using detail::kNormThreads;
using detail::norm_row;

// (kNormThreads, 1): with the thread count alone ptxas held these kernels to 64 registers on sm_90a
// and spilled norm_row's register-held row (nvcc 13.0); one block a multiprocessor lets it use 75.
__global__ void __launch_bounds__(kNormThreads, 1) rmsnorm_kernel(const float* x, const std::int32_t* row_index,
                                                                  std::int64_t k, const float* w, float eps,
                                                                  __nv_bfloat16* y) {
  dev::pdl_begin();
  const std::int64_t i = blockIdx.x;
  const std::int64_t src = row_index ? row_index[i] : i;
  norm_row<false>(const_cast<float*>(x + src * k), nullptr, nullptr, k, w, eps, y + i * k);  // x is only read
}

// residual adds then rmsnorm of the same rows in one pass: x[i] += first[i] (if any), += delta[i];
// y[i] = rmsnorm(x[i]).
__global__ void __launch_bounds__(kNormThreads, 1) add_rmsnorm_kernel(float* x, const __nv_bfloat16* first,
                                                                      const __nv_bfloat16* delta, std::int64_t k,
                                                                      const float* w, float eps, __nv_bfloat16* y) {
  dev::pdl_begin();
  const std::int64_t i = blockIdx.x;
  norm_row<true>(x + i * k, first ? first + i * k : nullptr, delta + i * k, k, w, eps, y + i * k);
}

}  // namespace

void add_rmsnorm(float* x, const __nv_bfloat16* delta, std::int64_t rows, std::int64_t k, const float* w, float eps,
                 __nv_bfloat16* y, cudaStream_t stream, const __nv_bfloat16* first) {
  TWELL_CU_REQUIRE(rows > 0 && rows < (1ll << 31) && k > 0, ErrorCode::invalid_argument, "add_rmsnorm: bad shape [{}, {}]",
                   rows, k);
  TWELL_CU_REQUIRE(delta, ErrorCode::invalid_argument, "add_rmsnorm: null delta");
  TWELL_CU_REQUIRE(detail::norm_row_aligned(k, x, w, first, delta, y), ErrorCode::invalid_argument,
                   "add_rmsnorm: rows of k = {} need x and w 16-byte aligned, the deltas and y 8-byte aligned", k);
  launch_kernel(add_rmsnorm_kernel, dim3(static_cast<unsigned>(rows)), dim3(kNormThreads), 0, stream, x, first, delta, k, w,
                eps, y);
  TWELL_CUDA_CHECK_LAUNCH("add_rmsnorm_kernel");
}

void rmsnorm(const float* x, const std::int32_t* row_index, std::int64_t rows, std::int64_t k, const float* w, float eps,
             __nv_bfloat16* y, cudaStream_t stream) {
  TWELL_CU_REQUIRE(rows > 0 && rows < (1ll << 31) && k > 0, ErrorCode::invalid_argument, "rmsnorm: bad shape [{}, {}]", rows, k);
  TWELL_CU_REQUIRE(detail::norm_row_aligned(k, x, w, nullptr, nullptr, y), ErrorCode::invalid_argument,
                   "rmsnorm: rows of k = {} need x and w 16-byte aligned and y 8-byte aligned", k);
  launch_kernel(rmsnorm_kernel, dim3(static_cast<unsigned>(rows)), dim3(kNormThreads), 0, stream, x, row_index, k, w, eps,
                y);
  TWELL_CUDA_CHECK_LAUNCH("rmsnorm_kernel");
}

}  // namespace twell::cuda::ops
