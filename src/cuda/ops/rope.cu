// rope_store_kv: RoPE on q (in place) and k, k and v into the row's KV cache (k optionally in place too).
#include <cstdint>

#include "cuda/common/check.hpp"
#include "cuda/common/launch.cuh"
#include "cuda/ops/model_ops.hpp"
#include "cuda/ops/rope_pair.cuh"

namespace twell::cuda::ops {
namespace {

constexpr int kThreads = 128;
constexpr int kVec = 8;  // bf16 elements in one 16-byte access

// Grid (rows, chunks): a row's work items are the (head, i < d/2) pairs of q's and k's heads, then
// v's kv_dim elements; each thread takes one item (32-bit index math: a row has < 2³¹ items), so
// a decode step's single row spreads over many CTAs instead of looping in one.
// Both kernels read rows_kv[r], the row's cache slot (a paged sequence's block table) and the
// cos / sin tables before their programmatic wait, as rmsnorm_project does (model_ops.hpp: a
// step's inputs, copied in before its first kernel; tables built at load), so that after the wait
// only the projection's q, k and v leave the SM: one round trip where the RowKv, then the slot,
// then the row and the angles were three.
__global__ void __launch_bounds__(kThreads) rope_store_kv_kernel(__nv_bfloat16* qkv, int heads, int kv_heads, int d,
                                                                 const float* cos_table, const float* sin_table,
                                                                 const RowKv* rows_kv, std::int64_t layer,
                                                                 bool k_in_place) {
  const std::int64_t r = blockIdx.x;
  const int half = d / 2, q_dim = heads * d, kv_dim = kv_heads * d, pairs = (heads + kv_heads) * half;
  const int j = static_cast<int>(blockIdx.y) * kThreads + static_cast<int>(threadIdx.x);
  const bool live = j < pairs + kv_dim;
  // Before the wait (see the header): the row's RowKv, its cache row and the angle.
  RowKv info{};
  std::int64_t cache = 0;
  float c = 0.0f, s = 0.0f;
  if (live) {
    info = rows_kv[r];
    cache = layer * info.layer_stride + info.slot(info.pos) * kv_dim;
    if (j < pairs) {
      c = cos_table[static_cast<std::int64_t>(info.pos) * half + j % half];
      s = sin_table[static_cast<std::int64_t>(info.pos) * half + j % half];
    }
  }
  dev::pdl_begin();
  if (!live) return;
  __nv_bfloat16* row = qkv + r * (q_dim + 2 * kv_dim);
  if (j >= pairs) {  // v into the cache
    info.v[cache + (j - pairs)] = row[q_dim + kv_dim + (j - pairs)];
    return;
  }
  const int h = j / half, i = j % half;
  const bool is_q = h < heads;
  __nv_bfloat16* v = is_q ? row + h * d : row + q_dim + (h - heads) * d;
  const float x1 = __bfloat162float(v[i]), x2 = __bfloat162float(v[i + half]);
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

// The same work 8 elements a thread, every access 16 bytes wide (the scalar kernel above moved 2
// bytes a thread and ran a 2B model's 4096-row prefill at ≈ 320 GB/s: 160 µs a layer, 6 ms of its
// 35). Items: (head, i0) with i0 a multiple of 8 below d/2 (8 RoPE pairs: x1 from i0…i0+7, x2 from
// d/2 + i0…), then v's kv_dim in 8-element pieces. Each pair through the same rope_pair, so the bits
// equal the scalar kernel's. Needs d % 16 == 0 and a row length (Q + 2·KV) % 8 == 0, qkv and each
// RowKv's k and v 16-byte aligned, the tables from cudaMalloc (rope_store_kv checks what it can).
__global__ void __launch_bounds__(kThreads) rope_store_kv_vec_kernel(__nv_bfloat16* qkv, int heads, int kv_heads, int d,
                                                                     const float* cos_table, const float* sin_table,
                                                                     const RowKv* rows_kv, std::int64_t layer,
                                                                     bool k_in_place) {
  const std::int64_t r = blockIdx.x;
  const int half = d / 2, q_dim = heads * d, kv_dim = kv_heads * d, groups = half / kVec;
  const int pairs = (heads + kv_heads) * groups;
  const int j = static_cast<int>(blockIdx.y) * kThreads + static_cast<int>(threadIdx.x);
  const bool live = j < pairs + kv_dim / kVec;
  // Before the wait (see the header): the row's RowKv, its cache row and the pairs' angles.
  RowKv info{};
  std::int64_t cache = 0;
  float4 c0{}, c1{}, s0{}, s1{};
  if (live) {
    info = rows_kv[r];
    cache = layer * info.layer_stride + info.slot(info.pos) * kv_dim;
    if (j < pairs) {
      const std::int64_t t = static_cast<std::int64_t>(info.pos) * half + (j % groups) * kVec;
      c0 = *reinterpret_cast<const float4*>(cos_table + t);
      c1 = *reinterpret_cast<const float4*>(cos_table + t + 4);
      s0 = *reinterpret_cast<const float4*>(sin_table + t);
      s1 = *reinterpret_cast<const float4*>(sin_table + t + 4);
    }
  }
  dev::pdl_begin();
  if (!live) return;
  __nv_bfloat16* row = qkv + r * (q_dim + 2 * kv_dim);
  if (j >= pairs) {  // v into the cache
    const int e = (j - pairs) * kVec;
    *reinterpret_cast<uint4*>(info.v + cache + e) = *reinterpret_cast<const uint4*>(row + q_dim + kv_dim + e);
    return;
  }
  const int h = j / groups, i0 = (j % groups) * kVec;
  const bool is_q = h < heads;
  __nv_bfloat16* v = is_q ? row + h * d : row + q_dim + (h - heads) * d;
  const uint4 a = *reinterpret_cast<const uint4*>(v + i0), b = *reinterpret_cast<const uint4*>(v + i0 + half);
  const float c[kVec] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
  const float sn[kVec] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
  const auto* x1 = reinterpret_cast<const __nv_bfloat16*>(&a);
  const auto* x2 = reinterpret_cast<const __nv_bfloat16*>(&b);
  uint4 o1v, o2v;
  auto* o1 = reinterpret_cast<__nv_bfloat16*>(&o1v);
  auto* o2 = reinterpret_cast<__nv_bfloat16*>(&o2v);
#pragma unroll
  for (int t = 0; t < kVec; ++t)
    detail::rope_pair(__bfloat162float(x1[t]), __bfloat162float(x2[t]), c[t], sn[t], o1[t], o2[t]);
  if (is_q || k_in_place) {
    *reinterpret_cast<uint4*>(v + i0) = o1v;
    *reinterpret_cast<uint4*>(v + i0 + half) = o2v;
  }
  if (!is_q) {
    __nv_bfloat16* dst = info.k + cache + (h - heads) * d;
    *reinterpret_cast<uint4*>(dst + i0) = o1v;
    *reinterpret_cast<uint4*>(dst + i0 + half) = o2v;
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

}  // namespace

bool rope_store_kv_wide(const __nv_bfloat16* qkv, std::int64_t d, const float* cos_table, const float* sin_table) {
  // Every row, head and half-head then starts on 16 bytes (a row is (heads + 2·kv_heads)·d
  // elements), the tables' rows too (pos · d/2 floats).
  return d % (2 * kVec) == 0 && aligned16(qkv) && aligned16(cos_table) && aligned16(sin_table);
}

void rope_store_kv(__nv_bfloat16* qkv, std::int64_t rows, std::int64_t heads, std::int64_t kv_heads, std::int64_t d,
                   const float* cos_table, const float* sin_table, const RowKv* rows_kv, std::int64_t layer,
                   cudaStream_t stream, bool k_in_place) {
  TWELL_CU_REQUIRE(rows > 0 && rows < (1ll << 31) && heads > 0 && kv_heads > 0 && d > 0 && d % 2 == 0 &&
                       (heads + 2 * kv_heads) * d < (1ll << 30),
                   ErrorCode::invalid_argument, "rope_store_kv: bad shape (rows {}, heads {}/{}, d {})", rows, heads,
                   kv_heads, d);
  const bool vec = rope_store_kv_wide(qkv, d, cos_table, sin_table);  // else 2 bytes a thread; the same bits
  const std::int64_t items = vec ? ((heads + kv_heads) * (d / 2) + kv_heads * d) / kVec
                                 : (heads + kv_heads) * (d / 2) + kv_heads * d;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>((items + kThreads - 1) / kThreads));
  launch_kernel(vec ? rope_store_kv_vec_kernel : rope_store_kv_kernel, grid, dim3(kThreads), 0, stream, qkv,
                static_cast<int>(heads), static_cast<int>(kv_heads), static_cast<int>(d), cos_table, sin_table, rows_kv,
                layer, k_in_place);
  if (vec)
    TWELL_CUDA_CHECK_LAUNCH("rope_store_kv_vec_kernel");
  else
    TWELL_CUDA_CHECK_LAUNCH("rope_store_kv_kernel");
}

}  // namespace twell::cuda::ops
