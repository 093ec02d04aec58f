// attention: causal, GQA, each row's query heads over its sequence's KV cache.
// One block of 8 warps per (row, head), exact fp32 scores and sums. head_dim 64 and 128 (the
// models' sizes) run attention_kernel_d: a thread per key for the scores with the whole key row
// loaded at once (all 16-byte loads in flight), then the weighted sum of V with D/8 lanes per key
// row (16 bytes each) and several keys per warp and loop step in flight; decode steps are latency
// bound (32 CTAs at 2B), so what matters is how many loads each thread has in flight. Other
// head_dims run attention_kernel (a key's d elements over a warp's lanes). The tensor-core kernel
// (flash_attention) serves prefill blocks. Calls of 8 rows or more (kAttentionGroupedMinRows:
// batched decode steps) run attention_grouped_kernel (attention_grouped.cuh): a CTA a (row, KV
// head) on tensor cores, each K and V row loaded once for its query heads, one on MHA models
// (other bits than attention_kernel_d's, a row's the same in any call).
#include <algorithm>
#include <cstdint>

#include "cuda/common/check.hpp"
#include "cuda/common/device_math.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/ops/attention_grouped.cuh"
#include "cuda/ops/attention_softmax.cuh"
#include "cuda/ops/model_ops.hpp"

namespace twell::cuda::ops {
namespace {

constexpr int kWarps = 8;
constexpr int kMaxD = 256;  // ≤ 8 dims per lane in the output accumulators
using detail::attention_grouped_kernel;
using detail::first_key;
using detail::grouped_smem;
using detail::kGroupWarps;

__global__ void __launch_bounds__(kWarps * 32) attention_kernel(const __nv_bfloat16* qkv, std::int64_t heads,
                                                                std::int64_t kv_heads, std::int64_t d,
                                                                const RowKv* rows_kv, std::int64_t layer, float scale,
                                                                int window, __nv_bfloat16* out) {
  dev::pdl_begin();
  extern __shared__ float smem[];
  const std::int64_t r = blockIdx.x, h = blockIdx.y;
  const std::int64_t q_dim = heads * d, kv_dim = kv_heads * d, kvh = h / (heads / kv_heads);
  const RowKv info = rows_kv[r];
  const int first = first_key(info.pos, window);
  const int n = info.pos + 1 - first;  // keys first … pos, as n keys from `first`
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  float* q = smem;                 // [d] the query, pre-scaled
  float* part = q + d;             // [kWarps, d] per-warp output sums
  float* red = part + kWarps * d;  // [kWarps] reductions
  float* score = red + kWarps;     // [n] scores, then probabilities (unnormalised)
  const __nv_bfloat16* qrow = qkv + r * (q_dim + 2 * kv_dim) + h * d;
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) q[i] = __bfloat162float(qrow[i]) * scale;
  __syncthreads();
  // Key t (cache position first + t) of this head: kc + info.slot(first + t)·kv_dim.
  const __nv_bfloat16* kc = info.k + layer * info.layer_stride + kvh * d;
  const __nv_bfloat16* vc = info.v + layer * info.layer_stride + kvh * d;

  // Scores: a thread per key (a decode row's keys are all in flight at once; a warp per key with
  // shuffle sums left the loads one latency apart). 16-byte loads where the rows allow them.
  float mx = -INFINITY;
  const bool vec = d % 8 == 0 && reinterpret_cast<std::uintptr_t>(kc) % 16 == 0;
  for (int t = static_cast<int>(threadIdx.x); t < n; t += kWarps * 32) {
    const __nv_bfloat16* kr = kc + info.slot(first + t) * kv_dim;
    float s = 0.0f;
    if (vec) {
      for (std::int64_t i = 0; i < d; i += 8) {
        const uint4 raw = *reinterpret_cast<const uint4*>(kr + i);
        const auto* p2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 f = __bfloat1622float2(p2[e]);
          s += q[i + 2 * e] * f.x;
          s += q[i + 2 * e + 1] * f.y;
        }
      }
    } else {
      for (std::int64_t i = 0; i < d; ++i) s += q[i] * __bfloat162float(kr[i]);
    }
    score[t] = s;
    mx = fmaxf(mx, s);
  }
  const float sum = detail::softmax_in_place<kWarps>(score, n, mx, red);  // also publishes every score

  float acc[kMaxD / 32];
#pragma unroll
  for (int j = 0; j < kMaxD / 32; ++j) acc[j] = 0.0f;
#pragma unroll 4
  for (int t = warp; t < n; t += kWarps) {
    const float p = score[t];
    const __nv_bfloat16* vr = vc + info.slot(first + t) * kv_dim;
#pragma unroll
    for (int j = 0; j < kMaxD / 32; ++j)
      if (lane + 32 * j < d) acc[j] += p * __bfloat162float(vr[lane + 32 * j]);
  }
#pragma unroll
  for (int j = 0; j < kMaxD / 32; ++j)
    if (lane + 32 * j < d) part[warp * d + lane + 32 * j] = acc[j];
  __syncthreads();
  const float inv = 1.0f / sum;
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w) o += part[w * d + i];
    out[r * q_dim + h * d + i] = __float2bfloat16(o * inv);
  }
}

// head_dim D ∈ {64, 128}. Scores: thread t takes keys t, t + 256, …, its key row's D/8 16-byte
// loads issued together. P·V: lanes in groups of L = D/8, each lane 8 dims (16 bytes) of a key's V
// row, G = 32/L keys per warp instruction, kUnroll instructions in flight per step; the G groups
// are summed by shuffles, then the warps through shared memory.
// old_keys_ready (a decode step: every row is its sequence's one new token, so every key before a
// row's own position was written by an earlier call): the first loop step's K (D = 64) and V rows
// below the row's position are loaded before the kernel waits for the one before it (programmatic
// launches; the step's QKV projection still runs then), the row's own key and value after. The same
// values in the same order either way, so the same bits.
// prefetch_v (the launcher sets it while the grid has no more CTAs than the GPU has SMs): the score
// loop asks L2 for each key's value row, which P·V reads after the softmax. With 1 row (32 CTAs at
// 2B) 1.02–1.20× faster on an H200; on a full grid (8 rows and more at 513–2049 keys) the prefetches
// compete with the key loads: 4–26 % slower (bench/results/2026-11-30-h200-attention-prefetch-v-9483100.md).
// kStaged (old_keys_ready, a grid on at most a quarter of the SMs): the K and V rows of the first
// min(keys below the row's position, stage_keys) keys are copied into shared memory by cp.async
// before the wait (at stage_at, in uint4: K [stage_keys][L], a key's chunks swizzled (load_key),
// then V), the row's own key, where the stage has room, right after the wait beside the query, and
// both loops read them there: after the wait only the query, the own key and the keys past the
// stage leave the SM, none of them inside a loop. The same values in the same order, so the same bits.
template <int D, bool kStaged>
__global__ void __launch_bounds__(kWarps * 32) attention_kernel_d(const __nv_bfloat16* qkv, std::int64_t heads,
                                                                  std::int64_t kv_heads, const RowKv* rows_kv,
                                                                  std::int64_t layer, float scale, int window,
                                                                  __nv_bfloat16* out, bool old_keys_ready,
                                                                  bool prefetch_v, int stage_keys, int stage_at) {
  constexpr int L = D / 8, G = 32 / L, kUnroll = 4, kStep = kWarps * G;  // keys per loop step of all warps
  // The early key row takes L uint4 registers: at D = 128 (16 of them) the kernel went from 128 to
  // 170 registers (one CTA an SM), so there only V is loaded early.
  constexpr bool kEarlyK = D <= 64;
  extern __shared__ __align__(16) float smem[];  // 16-byte aligned: the staged rows are uint4
  const std::int64_t r = blockIdx.x, h = blockIdx.y;
  const std::int64_t q_dim = heads * D, kv_dim = kv_heads * D, kvh = h / (heads / kv_heads);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / L, c = lane % L;  // P·V: this lane's key group g, dims [8c, 8c + 8)
  // Before the wait (old_keys_ready only): rows_kv was copied in before the step's first kernel, and
  // keys t < pos by earlier calls. pre_k: this thread's first key row; pre_v: its first V step.
  RowKv info{};
  uint4 pre_k[kEarlyK ? L : 1], pre_v[kUnroll];
  int pre_below = 0;  // keys below this one (counted from the window's first) were loaded early (0: none)
  int first = 0;      // the window's first key; key t of the loops below is cache row first + t
  int staged = 0;     // kStaged: keys below this one are in shared memory
  uint4* sk = reinterpret_cast<uint4*>(smem) + stage_at;  // kStaged: K [stage_keys][L], then V
  uint4* sv = sk + static_cast<std::int64_t>(stage_keys) * L;
  // Where staged key t keeps its chunk j: place j ^ (t mod L) of its row (the score loop says why).
  const auto staged_k = [&](int t, int j) { return sk + t * L + (j ^ (t % L)); };
  if (old_keys_ready) {
    info = rows_kv[r];
    first = first_key(info.pos, window);
    pre_below = info.pos - first;
  }
  if (kStaged && old_keys_ready) {
    staged = min(pre_below, stage_keys);
    pre_below = 0;  // nothing in registers
    const __nv_bfloat16* kc0 = info.head_k(layer, kvh * D);
    const __nv_bfloat16* vc0 = info.head_v(layer, kvh * D);
    // Thread t copies chunk t % L of keys t / L, t / L + 256 / L, …: a key's row by L neighbours.
    for (int e = static_cast<int>(threadIdx.x); e < staged * L; e += kWarps * 32) {
      const int t = e / L, j = e % L;
      const std::int64_t row = info.slot(first + t) * kv_dim + 8 * j;
      dev::cp_async16(static_cast<std::uint32_t>(__cvta_generic_to_shared(staged_k(t, j))), kc0 + row, true);
      dev::cp_async16(static_cast<std::uint32_t>(__cvta_generic_to_shared(sv + e)), vc0 + row, true);
    }
    dev::cp_async_commit();
  } else if (old_keys_ready) {
    // A paged sequence's block table was written before the step too.
    const __nv_bfloat16* kc0 = info.head_k(layer, kvh * D);
    const __nv_bfloat16* vc0 = info.head_v(layer, kvh * D);
    const int t = static_cast<int>(threadIdx.x);
    if constexpr (kEarlyK) {
      if (t < pre_below) {
        const uint4* kr = reinterpret_cast<const uint4*>(kc0 + info.slot(first + t) * kv_dim);
#pragma unroll
        for (int j = 0; j < L; ++j) pre_k[j] = kr[j];
      } else {
#pragma unroll
        for (int j = 0; j < L; ++j) pre_k[j] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int tv = warp * G + g + u * kStep;
      pre_v[u] = tv < pre_below ? reinterpret_cast<const uint4*>(vc0 + info.slot(first + tv) * kv_dim)[c]
                                : make_uint4(0, 0, 0, 0);
    }
  }
  dev::pdl_begin();
  if (!old_keys_ready) {
    info = rows_kv[r];
    first = first_key(info.pos, window);
  }
  const int n = info.pos + 1 - first;
  // Key t (cache position first + t) of this head: kc + info.slot(first + t)·kv_dim.
  const __nv_bfloat16* kc = info.head_k(layer, kvh * D);
  const __nv_bfloat16* vc = info.head_v(layer, kvh * D);
  // kStaged: the row's own key n − 1, which the step's QKV kernel has just written (so read only
  // after the wait), joins the stage where it has room: the CTA's last 2L threads copy its K and V
  // chunks while the first D load the query, one round trip for both, so the loops below read every
  // key in shared memory and no score thread or P·V warp waits on an L2 round trip of its own inside
  // its loop. The same values in the same order: the same bits as reading the key from the cache.
  if (kStaged && old_keys_ready && staged < stage_keys && staged == n - 1) {
    const int e = static_cast<int>(threadIdx.x) - (kWarps * 32 - 2 * L);
    if (e >= 0) {
      const int t = staged, j = e % L;
      const std::int64_t row = info.slot(first + t) * kv_dim + 8 * j;
      if (e < L)
        dev::cp_async16(static_cast<std::uint32_t>(__cvta_generic_to_shared(staged_k(t, j))), kc + row, true);
      else
        dev::cp_async16(static_cast<std::uint32_t>(__cvta_generic_to_shared(sv + t * L + j)), vc + row, true);
    }
    dev::cp_async_commit();
    staged = n;
  }
  float* q = smem;                 // [D] the query, pre-scaled
  float* part = q + D;             // [kWarps, D] per-warp output sums
  float* red = part + kWarps * D;  // [kWarps] reductions
  float* score = red + kWarps;     // [n] scores, then probabilities (unnormalised)
  const __nv_bfloat16* qrow = qkv + r * (q_dim + 2 * kv_dim) + h * D;
  for (int i = static_cast<int>(threadIdx.x); i < D; i += kWarps * 32) q[i] = __bfloat162float(qrow[i]) * scale;
  if constexpr (kStaged) dev::cp_async_wait<0>();  // this thread's copies; the barrier publishes everyone's
  __syncthreads();

  // Both loops are pipelined: a loop step's rows are loaded before the previous step's math (the
  // score loop at D = 64 only: at 128 a second key row takes 16 more 16-byte registers), so a CTA
  // waits for one round trip a loop rather than one a step.
  // A staged key row holds its chunk j at place j ^ (t mod L): the score loop's thread t reads
  // chunk j of key t while its neighbours read keys t + 1 …, and in rows laid out plainly the 8
  // threads of a 16-byte load's phase would hit the same 4 banks (rows are 128 or 256 bytes): 8
  // wavefronts where 1 does. load_key(t, dst) reads key t's row in chunk order wherever it is.
  const auto load_key = [&](int t, uint4(&dst)[L]) {
    if (kStaged && t < staged) {
#pragma unroll
      for (int j = 0; j < L; ++j) dst[j] = *staged_k(t, j);
    } else {
      const uint4* row = reinterpret_cast<const uint4*>(kc + info.slot(first + t) * kv_dim);
#pragma unroll
      for (int j = 0; j < L; ++j) dst[j] = row[j];
    }
  };
  const float4* q4 = reinterpret_cast<const float4*>(q);  // smem's first bytes: 16-byte aligned
  float mx = -INFINITY;
  uint4 cur[L];
  {
    const int t = static_cast<int>(threadIdx.x);
    if (kEarlyK && t < pre_below) {  // loaded before the wait
#pragma unroll
      for (int j = 0; j < L; ++j) cur[j] = pre_k[kEarlyK ? j : 0];
    } else if (t < n) {
      load_key(t, cur);
    }
  }
  for (int t = static_cast<int>(threadIdx.x); t < n; t += kWarps * 32) {
    if (prefetch_v && !(kStaged && t < staged))
      dev::prefetch_l2<D * 2>(vc + info.slot(first + t) * kv_dim);  // P·V's rows of key t
    const int tn = t + kWarps * 32;
    uint4 nxt[kEarlyK ? L : 1];
    if constexpr (kEarlyK)
      if (tn < n) load_key(tn, nxt);
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < L; ++j) {
      const auto* p2 = reinterpret_cast<const __nv_bfloat162*>(&cur[j]);
      const float4 qa = q4[2 * j], qb = q4[2 * j + 1];  // q[8j … 8j + 7], two broadcast loads
      const float qj[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = __bfloat1622float2(p2[e]);
        s += qj[2 * e] * f.x;
        s += qj[2 * e + 1] * f.y;
      }
    }
    score[t] = s;
    mx = fmaxf(mx, s);
    if (tn < n) {
      if constexpr (kEarlyK) {
#pragma unroll
        for (int j = 0; j < L; ++j) cur[j] = nxt[j];
      } else {
        load_key(tn, cur);
      }
    }
  }
  // P·V's first step: its rows are in flight across the softmax's barriers.
  const int first_t = warp * G + g;
  const auto load_v = [&](int t) {
    if (kStaged && t < staged) return sv[static_cast<std::int64_t>(t) * L + c];
    return t < n ? reinterpret_cast<const uint4*>(vc + info.slot(first + t) * kv_dim)[c] : make_uint4(0, 0, 0, 0);
  };
  uint4 raw[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int t = first_t + u * kStep;
    raw[u] = t < pre_below ? pre_v[u] : load_v(t);  // below pre_below: loaded before the wait
  }
  const float sum = detail::softmax_in_place<kWarps>(score, n, mx, red);  // also publishes every score

  float acc[8] = {};
  for (int base = first_t; base < n; base += kStep * kUnroll) {
    uint4 nraw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) nraw[u] = load_v(base + kStep * kUnroll + u * kStep);
    float p[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int t = base + u * kStep;
      p[u] = t < n ? score[t] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const auto* p2 = reinterpret_cast<const __nv_bfloat162*>(&raw[u]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = __bfloat1622float2(p2[e]);
        acc[2 * e] += p[u] * f.x;
        acc[2 * e + 1] += p[u] * f.y;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) raw[u] = nraw[u];
  }
#pragma unroll
  for (int o = L; o < 32; o <<= 1)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], o);
  if (g == 0)
#pragma unroll
    for (int j = 0; j < 8; ++j) part[warp * D + 8 * c + j] = acc[j];
  __syncthreads();
  const float inv = 1.0f / sum;
  for (int i = static_cast<int>(threadIdx.x); i < D; i += kWarps * 32) {
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w) o += part[w * D + i];
    out[r * q_dim + h * D + i] = __float2bfloat16(o * inv);
  }
}

// An attribute of the current device (a multiprocessor count, or shared memory in bytes).
int device_attribute(cudaDeviceAttr attr) {
  int dev = 0, value = 0;
  TWELL_CUDA_CHECK(cudaGetDevice(&dev));
  TWELL_CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, dev));
  return value;
}
int sm_count() { return device_attribute(cudaDevAttrMultiProcessorCount); }
// The opt-in shared memory a block.
std::size_t smem_optin() { return static_cast<std::size_t>(device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin)); }

}  // namespace

bool attention_runs_grouped(std::int64_t rows, std::int64_t heads, std::int64_t kv_heads, std::int64_t d,
                            std::int64_t /*max_keys*/, std::int64_t grouped_min_rows) {
  if (kv_heads <= 0 || heads % kv_heads != 0) return false;
  const std::int64_t group = heads / kv_heads;
  // Its shared memory holds tiles, not the scores: any number of keys.
  return grouped_min_rows >= 1 && rows >= grouped_min_rows && (d == 64 || d == 128) &&
         (group == 1 || group == 2 || group == 4 || group == 8);
}

std::int64_t attention_max_keys(std::int64_t d) {
  return static_cast<std::int64_t>(smem_optin() / sizeof(float)) - (1 + kWarps) * d - kWarps;
}

void attention(const __nv_bfloat16* qkv, std::int64_t rows, std::int64_t heads, std::int64_t kv_heads, std::int64_t d,
               const RowKv* rows_kv, std::int64_t layer, std::int64_t max_keys, __nv_bfloat16* out,
               cudaStream_t stream, bool old_keys_ready, std::int64_t window, std::int64_t grouped_min_rows) {
  TWELL_CU_REQUIRE(rows > 0 && rows < (1ll << 31) && heads > 0 && heads < 65536 && kv_heads > 0 &&
                       heads % kv_heads == 0 && d > 0 && d <= kMaxD && max_keys > 0 && window >= 0 &&
                       window < (1ll << 31),
                   ErrorCode::invalid_argument, "attention: bad shape (rows {}, heads {}/{}, d {}, keys {})", rows,
                   heads, kv_heads, d, max_keys);
  const std::size_t smem = static_cast<std::size_t>((1 + kWarps) * d + kWarps + max_keys) * sizeof(float);
  if (smem > 48 * 1024) {
    const std::size_t optin = smem_optin();
    TWELL_CU_REQUIRE(smem <= optin, ErrorCode::unsupported,
                     "attention: {} keys need {} bytes of shared memory for the scores; this GPU allows {}", max_keys,
                     smem, optin);
  }
  const float scale = 1.0f / sqrtf(static_cast<float>(d));
  const int win = static_cast<int>(window);
  // grouped_min_rows rows or more: a CTA a (row, KV head) on tensor cores (attention_grouped_kernel).
  const std::int64_t group = heads / kv_heads;
  if (attention_runs_grouped(rows, heads, kv_heads, d, max_keys, grouped_min_rows)) {
    const dim3 ggrid(static_cast<unsigned>(rows), static_cast<unsigned>(kv_heads));
    auto go = [&](auto kernel, std::size_t gsmem) {
      if (gsmem > 48 * 1024)
        TWELL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(gsmem)));
      launch_kernel(kernel, ggrid, dim3(kGroupWarps * 32), gsmem, stream, qkv, heads, kv_heads, rows_kv, layer, scale,
                    win, out, old_keys_ready);
    };
    if (d == 64 && group == 1)
      go(attention_grouped_kernel<64, 1>, grouped_smem<64>());
    else if (d == 64 && group == 2)
      go(attention_grouped_kernel<64, 2>, grouped_smem<64>());
    else if (d == 64 && group == 4)
      go(attention_grouped_kernel<64, 4>, grouped_smem<64>());
    else if (d == 64)
      go(attention_grouped_kernel<64, 8>, grouped_smem<64>());
    else if (group == 1)
      go(attention_grouped_kernel<128, 1>, grouped_smem<128>());
    else if (group == 2)
      go(attention_grouped_kernel<128, 2>, grouped_smem<128>());
    else if (group == 4)
      go(attention_grouped_kernel<128, 4>, grouped_smem<128>());
    else
      go(attention_grouped_kernel<128, 8>, grouped_smem<128>());
    TWELL_CUDA_CHECK_LAUNCH("attention_grouped_kernel");
    return;
  }
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(heads));
  // The D-specialised kernels read K and V rows by 16-byte loads (RowKv's precondition, model_ops.hpp).
  auto launch = [&](auto kernel, auto... args) {
    if (smem > 48 * 1024)
      TWELL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    launch_kernel(kernel, grid, dim3(kWarps * 32), smem, stream, qkv, args...);
  };
  const std::int64_t sms = sm_count();
  const bool prefetch_v = rows * heads <= sms;  // a grid of one partial wave: idle memory slots
  // A decode step whose CTAs fit on a quarter of the SMs stages its keys' K and V rows in shared
  // memory (kStaged): up to kStageBytes a CTA (640 keys at head_dim 64, 320 at 128), one CTA on an
  // SM. Measured on the H200's 2B at 512 keys (bench/results/2026-12-01-h200-session-68.md): 32 CTAs
  // (batch 1) +6.9 % tokens/s; 256 CTAs, two an SM at half the SM's shared memory each (batch 8),
  // −7.5 %: the staged CTAs hold SMs and memory slots that the QKV projection, still running, needs.
  // The own key's copy after the wait (bench/results/model/2026-12-02-h200-2b-decode-ab-own-key-b51164c/):
  // batch 1 sparse +3.6 %, dense +2.6 %.
  constexpr std::size_t kStageBytes = 160 * 1024;
  if (old_keys_ready && rows * heads * 4 <= sms && (d == 64 || d == 128)) {
    const std::size_t at = (smem + 15) / 16;  // in uint4
    const std::size_t optin = smem_optin();
    const std::size_t per_sm = static_cast<std::size_t>(device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor));
    const std::size_t cta_max = std::min(per_sm - 1024, optin);
    const std::size_t room = cta_max > at * 16 ? cta_max - at * 16 : 0;
    const std::int64_t keys = std::min<std::int64_t>(max_keys, static_cast<std::int64_t>(std::min(room, kStageBytes) / (4 * d)));
    if (keys >= 64) {
      const std::size_t staged_smem = at * 16 + static_cast<std::size_t>(keys) * 4 * static_cast<std::size_t>(d);
      auto go = [&](auto kernel) {
        // The opt-in limit, not this call's size: the attribute is one value per function, and a
        // smaller later call must not lower it under a larger one's captured launch.
        TWELL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(optin)));
        launch_kernel(kernel, grid, dim3(kWarps * 32), staged_smem, stream, qkv, heads, kv_heads, rows_kv, layer, scale,
                      win, out, old_keys_ready, prefetch_v, static_cast<int>(keys), static_cast<int>(at));
      };
      if (d == 64)
        go(attention_kernel_d<64, true>);
      else
        go(attention_kernel_d<128, true>);
      TWELL_CUDA_CHECK_LAUNCH("attention_kernel");
      return;
    }
  }
  if (d == 64)
    launch(attention_kernel_d<64, false>, heads, kv_heads, rows_kv, layer, scale, win, out, old_keys_ready, prefetch_v, 0, 0);
  else if (d == 128)
    launch(attention_kernel_d<128, false>, heads, kv_heads, rows_kv, layer, scale, win, out, old_keys_ready, prefetch_v, 0, 0);
  else
    launch(attention_kernel, heads, kv_heads, d, rows_kv, layer, scale, win, out);
  TWELL_CUDA_CHECK_LAUNCH("attention_kernel");
}

}  // namespace twell::cuda::ops
