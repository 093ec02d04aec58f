// rope_store_kv: RoPE on q (in place) and k, k and v into the row's KV cache (k optionally in place too).
#include "cuda/common/check.hpp"
#include "cuda/common/launch.cuh"
#include "cuda/ops/model_ops.hpp"
#include "cuda/ops/rope_pair.cuh"

namespace twell::cuda::ops {
namespace {

constexpr int kThreads = 128;

// Grid (rows, chunks): a row's work items are the (head, i < d/2) pairs of q's and k's heads, then
// v's kv_dim elements; each thread takes one item (32-bit index math: a row has < 2³¹ items), so
// a decode step's single row spreads over many CTAs instead of looping in one.
__global__ void __launch_bounds__(kThreads) rope_store_kv_kernel(__nv_bfloat16* qkv, int heads, int kv_heads, int d,
                                                                 const float* cos_table, const float* sin_table,
                                                                 const RowKv* rows_kv, std::int64_t layer,
                                                                 bool k_in_place) {
  dev::pdl_begin();
  const std::int64_t r = blockIdx.x;
  const int half = d / 2, q_dim = heads * d, kv_dim = kv_heads * d, pairs = (heads + kv_heads) * half;
  const int j = static_cast<int>(blockIdx.y) * kThreads + static_cast<int>(threadIdx.x);
  if (j >= pairs + kv_dim) return;
  __nv_bfloat16* row = qkv + r * (q_dim + 2 * kv_dim);
  const RowKv info = rows_kv[r];
  const std::int64_t cache = layer * info.layer_stride + static_cast<std::int64_t>(info.pos) * kv_dim;
  if (j >= pairs) {  // v into the cache
    info.v[cache + (j - pairs)] = row[q_dim + kv_dim + (j - pairs)];
    return;
  }
  const int h = j / half, i = j % half;
  const bool is_q = h < heads;
  __nv_bfloat16* v = is_q ? row + h * d : row + q_dim + (h - heads) * d;
  const float x1 = __bfloat162float(v[i]), x2 = __bfloat162float(v[i + half]);
  const float c = cos_table[static_cast<std::int64_t>(info.pos) * half + i];
  const float s = sin_table[static_cast<std::int64_t>(info.pos) * half + i];
  __nv_bfloat16 o1, o2;
  detail::rope_pair(x1, x2, c, s, o1, o2);
  if (is_q || k_in_place) {
    v[i] = o1;
    v[i + half] = o2;
  }
  if (!is_q) {
    __nv_bfloat16* dst = info.k + cache + (h - heads) * d;
    dst[i] = o1;
    dst[i + half] = o2;
  }
}

}  // namespace

void rope_store_kv(__nv_bfloat16* qkv, std::int64_t rows, std::int64_t heads, std::int64_t kv_heads, std::int64_t d,
                   const float* cos_table, const float* sin_table, const RowKv* rows_kv, std::int64_t layer,
                   cudaStream_t stream, bool k_in_place) {
  TWELL_CU_REQUIRE(rows > 0 && rows < (1ll << 31) && heads > 0 && kv_heads > 0 && d > 0 && d % 2 == 0 &&
                       (heads + 2 * kv_heads) * d < (1ll << 30),
                   ErrorCode::invalid_argument, "rope_store_kv: bad shape (rows {}, heads {}/{}, d {})", rows, heads,
                   kv_heads, d);
  const std::int64_t items = (heads + kv_heads) * (d / 2) + kv_heads * d;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>((items + kThreads - 1) / kThreads));
  launch_kernel(rope_store_kv_kernel, grid, dim3(kThreads), 0, stream, qkv, static_cast<int>(heads),
                static_cast<int>(kv_heads), static_cast<int>(d), cos_table, sin_table, rows_kv, layer, k_in_place);
  TWELL_CUDA_CHECK_LAUNCH("rope_store_kv_kernel");
}

}  // namespace twell::cuda::ops
