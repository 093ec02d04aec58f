// rope_store_kv: RoPE on q (in place) and k, k and v into the row's KV cache.
#include "cuda/common/check.hpp"
#include "cuda/ops/model_ops.hpp"

namespace twell::cuda::ops {
namespace {

// One block per row; threads over (head, i < d/2) pairs of q and k, then over v's elements.
__global__ void rope_store_kv_kernel(__nv_bfloat16* qkv, std::int64_t heads, std::int64_t kv_heads, std::int64_t d,
                                     const float* cos_table, const float* sin_table, const RowKv* rows_kv,
                                     std::int64_t layer) {
  const std::int64_t r = blockIdx.x;
  const std::int64_t q_dim = heads * d, kv_dim = kv_heads * d, half = d / 2;
  __nv_bfloat16* row = qkv + r * (q_dim + 2 * kv_dim);
  const RowKv info = rows_kv[r];
  const float* cs = cos_table + static_cast<std::int64_t>(info.pos) * half;
  const float* sn = sin_table + static_cast<std::int64_t>(info.pos) * half;
  __nv_bfloat16* kc = info.k + layer * info.layer_stride + static_cast<std::int64_t>(info.pos) * kv_dim;
  __nv_bfloat16* vc = info.v + layer * info.layer_stride + static_cast<std::int64_t>(info.pos) * kv_dim;
  for (std::int64_t j = threadIdx.x; j < (heads + kv_heads) * half; j += blockDim.x) {
    const std::int64_t h = j / half, i = j % half;
    const bool is_q = h < heads;
    __nv_bfloat16* v = is_q ? row + h * d : row + q_dim + (h - heads) * d;
    const float x1 = __bfloat162float(v[i]), x2 = __bfloat162float(v[i + half]);
    const float c = cs[i], s = sn[i];
    const __nv_bfloat16 o1 = __float2bfloat16(x1 * c - x2 * s), o2 = __float2bfloat16(x2 * c + x1 * s);
    if (is_q) {
      v[i] = o1;
      v[i + half] = o2;
    } else {
      __nv_bfloat16* dst = kc + (h - heads) * d;
      dst[i] = o1;
      dst[i + half] = o2;
    }
  }
  for (std::int64_t j = threadIdx.x; j < kv_dim; j += blockDim.x) vc[j] = row[q_dim + kv_dim + j];
}

}  // namespace

void rope_store_kv(__nv_bfloat16* qkv, std::int64_t rows, std::int64_t heads, std::int64_t kv_heads, std::int64_t d,
                   const float* cos_table, const float* sin_table, const RowKv* rows_kv, std::int64_t layer,
                   cudaStream_t stream) {
  TWELL_CU_REQUIRE(rows > 0 && rows < (1ll << 31) && heads > 0 && kv_heads > 0 && d > 0 && d % 2 == 0,
                   ErrorCode::invalid_argument, "rope_store_kv: bad shape (rows {}, heads {}/{}, d {})", rows, heads,
                   kv_heads, d);
  rope_store_kv_kernel<<<static_cast<unsigned>(rows), 128, 0, stream>>>(qkv, heads, kv_heads, d, cos_table, sin_table,
                                                                         rows_kv, layer);
  TWELL_CUDA_CHECK_LAUNCH("rope_store_kv_kernel");
}

}  // namespace twell::cuda::ops
