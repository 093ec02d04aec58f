// embedding: x[r, :] = table[ids[r], :] (bf16 → fp32).
#include "cuda/common/check.hpp"
#include "cuda/common/launch.cuh"
#include "cuda/ops/model_ops.hpp"

namespace twell::cuda::ops {
namespace {

__global__ void embedding_kernel(const std::int32_t* ids, const __nv_bfloat16* table, std::int64_t k, float* x) {
  dev::pdl_begin();
  const std::int64_t r = blockIdx.x;
  const __nv_bfloat16* src = table + static_cast<std::int64_t>(ids[r]) * k;
  for (std::int64_t i = threadIdx.x; i < k; i += blockDim.x) x[r * k + i] = __bfloat162float(src[i]);
}

}  // namespace

void embedding(const std::int32_t* ids, std::int64_t rows, const __nv_bfloat16* table, std::int64_t k, float* x,
               cudaStream_t stream) {
  TWELL_CU_REQUIRE(rows > 0 && rows < (1ll << 31) && k > 0, ErrorCode::invalid_argument, "embedding: bad shape [{}, {}]", rows, k);
  launch_kernel(embedding_kernel, dim3(static_cast<unsigned>(rows)), dim3(256), 0, stream, ids, table, k, x);
  TWELL_CUDA_CHECK_LAUNCH("embedding_kernel");
}

}  // namespace twell::cuda::ops
