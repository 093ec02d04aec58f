#pragma once
// The decode attention's grouped kernel on tensor cores (cuda/ops/attention.cu launches it for calls
// of 8 rows or more, kAttentionGroupedMinRows; lab/probes/probe_decode_attention.cu times it for
// other shapes too: one kernel, so the probe measures the library's), and the first key a sliding
// window lets a row see.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/common/device_math.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/ops/model_ops.hpp"

namespace twell::cuda::ops::detail {

// The first key a query at position pos sees: pos − window + 1 within a sliding window (window > 0),
// else 0 (LlamaConfig::first_key).
__device__ __forceinline__ int first_key(int pos, int window) { return window > 0 && pos >= window ? pos - window + 1 : 0; }

// GRP query heads on each KV head (1 on MHA models; 2, 4 or 8 on GQA ones),
// D ∈ {64, 128}, on tensor cores: one CTA of kGroupWarps warps a (row, KV head), which loads each
// key and value row once for its GRP query heads. K and V stream through shared memory in tiles of
// kGroupTileKeys keys, kGroupStages tiles in flight (cp.async, 16-byte chunks stored at
// chunk ^ (key & 7) so that ldmatrix reads 8 rows without bank conflicts; zero-filled outside the
// row's keys). Warp w takes keys 16w … 16w + 15 of each tile: S = Q·Kᵀ by mma.m16n8k16 (the GRP
// query heads as rows 0 … GRP − 1 of A, the other rows zero), the scores × scale, then an online
// softmax of its own (running max m and sum l, the output rescaled by e^(m_old − m_new)), and
// O += P·V by mma with P in two bf16 halves, hi = bf16(p) and lo = bf16(p − hi): P keeps 16 bits
// (|p − hi − lo| ≤ 2⁻¹⁶ p) where bf16 alone keeps 8. At the end the warps' (m, l, O) are combined in
// warp order. Every order is fixed, so a row's bits depend neither on the other rows of the call
// nor on the run; they are not attention_kernel_d's (another summation: the bound at
// GroupedAttention.MatchesFloat64AndItsRowsAlone adds the tensor cores' truncating sums, P's
// 2⁻¹⁶ and the rescalings). The form before it (a thread a key, attention_kernel_d's bits) waited on
// its loads (ncu: 56 % of its cycles); a scalar form of these tiles was instruction-bound. This one
// reads the 2b-gqa's 64 rows × 513 keys in 21.9 µs against 33.9 (73 % of the copy bandwidth,
// dd0facb), the 7B-GQA's in 49.9 against 87.0 (the probe's form at 7db8890), the MHA 2B's (a
// query head a CTA, 15 of 16 rows of A zero) in 83.8 against 99.6 (356759c; H200,
// lab/probes/probe_decode_attention.cu). old_keys_ready: rows_kv is read and the first tiles' keys
// below the row's position are issued before the wait; the row's own key and value, written by the
// kernel before, after it. q is read as 32-bit pairs: qkv 4-byte aligned (cudaMalloc'd buffers
// are; d is even).
constexpr int kGroupWarps = 4, kGroupTileKeys = 64, kGroupStages = 3;

template <int D>
constexpr std::size_t grouped_smem() {
  return sizeof(__nv_bfloat16) * kGroupStages * 2 * kGroupTileKeys * D;  // ≥ the combination's floats
}

// Where a tile keeps key `key`'s 16-byte chunk `ch`: bytes from the tile's start, the chunk at place
// ch ^ (key & 7) of its row (the swizzle above). The cp.async copies, the own-key store and both
// ldmatrix reads all take their addresses here, so they agree.
template <int D>
__device__ __forceinline__ int tile_chunk_offset(int key, int ch) {
  return key * D * 2 + ((ch ^ (key & 7)) << 4);
}

template <int D, int GRP>
__global__ void __launch_bounds__(kGroupWarps * 32) attention_grouped_kernel(const __nv_bfloat16* qkv, std::int64_t heads,
                                                                             std::int64_t kv_heads, const RowKv* rows_kv,
                                                                             std::int64_t layer, float scale, int window,
                                                                             __nv_bfloat16* out, bool old_keys_ready) {
  constexpr int CH = D / 8, KS = D / 16, NB = D / 8, kThreads = kGroupWarps * 32;  // 16-byte chunks a row, k-steps, n-blocks
  constexpr std::uint32_t kTileBytes = kGroupTileKeys * D * 2;
  static_assert(GRP >= 1 && GRP <= 8 && (GRP + 2) * kGroupWarps * D * sizeof(float) <= grouped_smem<D>(), "the combination fits");
  extern __shared__ __align__(128) unsigned char group_smem[];
  const auto sbase = static_cast<std::uint32_t>(__cvta_generic_to_shared(group_smem));
  const int r = static_cast<int>(blockIdx.x), kvh = static_cast<int>(blockIdx.y);
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;  // mma's row group and column pair
  const std::int64_t q_dim = heads * D, kv_dim = kv_heads * D;
  RowKv info{};
  if (!old_keys_ready) dev::pdl_begin();
  info = rows_kv[r];  // before the wait only with old_keys_ready: copied in before the step's first kernel
  const int n = info.pos + 1, first = first_key(info.pos, window);
  const int tile0 = first / kGroupTileKeys, tiles = (n - 1) / kGroupTileKeys - tile0 + 1;
  const __nv_bfloat16* kc = info.head_k(layer, kvh * D);
  const __nv_bfloat16* vc = info.head_v(layer, kvh * D);
  // Tile i's K and V into stage st. early: before the wait, the row's own key (written by the kernel
  // before) left out; it is stored after the wait. Thread tid loads chunk lch = tid % CH of the keys
  // lkey + kKeyStep·j of the tile, K and V: a key's bounds and slot are found once for both, and its
  // chunk's swizzle (key & 7) is lkey's for every j (kKeyStep is a multiple of 8), so a chunk costs
  // an add and its cp.async. Found a chunk at a time, the addresses were about half of the kernel's
  // instructions at the MHA 2B's 64 rows, which issued on 60 % of its cycles (ncu:
  // bench/results/2026-12-03-h200-ncu-grouped-attention-mha-64x513-e151c28.md); this form took the
  // 2B's decode step +7.9 % at 64 rows and +5.6 % at 32
  // (bench/results/model/2026-12-03-h200-2b-decode-ab-attention-load-per-key-e151c28/). The same
  // bytes land at the same shared addresses, so the bits are the loop's.
  constexpr int kKeyStep = kThreads / CH, kKeysPerThread = kGroupTileKeys / kKeyStep;
  static_assert(kThreads % CH == 0 && kKeyStep % 8 == 0 && kGroupTileKeys % kKeyStep == 0, "a thread's keys share their swizzle");
  const int lch = tid % CH, lkey = tid / CH;
  const auto ldst = static_cast<std::uint32_t>(tile_chunk_offset<D>(lkey, lch));
  const auto load = [&](int i, int st, bool early) {
    const std::uint32_t kdst = sbase + st * 2 * kTileBytes + ldst;
    const int t0 = (tile0 + i) * kGroupTileKeys + lkey;
#pragma unroll
    for (int j = 0; j < kKeysPerThread; ++j) {
      const int t = t0 + kKeyStep * j;
      if (early && t == info.pos) continue;
      const bool in = t >= first && t < n;
      const std::int64_t off = in ? info.slot(t) * kv_dim + lch * 8 : 0;
      const std::uint32_t dst = kdst + j * kKeyStep * D * 2;
      dev::cp_async16(dst, kc + off, in);
      dev::cp_async16(dst + kTileBytes, vc + off, in);
    }
  };
#pragma unroll
  for (int st = 0; st < kGroupStages - 1; ++st) {
    if (st < tiles) load(st, st, old_keys_ready);
    dev::cp_async_commit();
  }
  if (old_keys_ready) {
    dev::pdl_begin();
    // The row's own key and value, if a prologue tile holds them (later tiles load after the wait).
    const int i = info.pos / kGroupTileKeys - tile0, key = info.pos % kGroupTileKeys;
    if (i < kGroupStages - 1 && tid < 2 * CH) {
      const int which = tid / CH, ch = tid % CH;
      const uint4 v = reinterpret_cast<const uint4*>((which ? vc : kc) + info.slot(info.pos) * kv_dim)[ch];
      *reinterpret_cast<uint4*>(group_smem + (i * 2 + which) * kTileBytes + tile_chunk_offset<D>(key, ch)) = v;
    }
  }
  // Q as mma's A: row g < GRP is query head kvh · GRP + g; a0 its columns 16kk + 2t4 (+ 1), a2 those + 8.
  unsigned qa0[KS], qa2[KS];
  {
    const __nv_bfloat16* qrow = qkv + r * (q_dim + 2 * kv_dim) + (static_cast<std::int64_t>(kvh) * GRP + g % GRP) * D;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      qa0[kk] = g < GRP ? *reinterpret_cast<const unsigned*>(qrow + 16 * kk + 2 * t4) : 0u;
      qa2[kk] = g < GRP ? *reinterpret_cast<const unsigned*>(qrow + 16 * kk + 8 + 2 * t4) : 0u;
    }
  }
  float m = -INFINITY, l = 0.0f, o[NB][4] = {};
  const int k0 = 16 * warp, mi = lane / 8, rr = lane % 8;  // the warp's keys in a tile; ldmatrix's matrix and row
  for (int i = 0; i < tiles; ++i) {
    if (i + kGroupStages - 1 < tiles) load(i + kGroupStages - 1, (i + kGroupStages - 1) % kGroupStages, false);
    dev::cp_async_commit();
    dev::cp_async_wait<kGroupStages - 1>();
    __syncthreads();  // tile i (and the row's own key, stored above) visible to every warp
    const std::uint32_t ks = sbase + (i % kGroupStages) * 2 * kTileBytes, vs = ks + kTileBytes;
    // S for keys k0 … k0 + 7 (n-block 0) and k0 + 8 … k0 + 15 (n-block 1).
    float sc[2][4] = {};
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      const int key = k0 + rr + (mi >> 1) * 8, ch = 2 * kk + (mi & 1);
      unsigned b00, b01, b10, b11;
      dev::ldmatrix_x4(ks + tile_chunk_offset<D>(key, ch), b00, b01, b10, b11);
      dev::mma_16816_bf16(sc[0], qa0[kk], 0u, qa2[kk], 0u, b00, b01);
      dev::mma_16816_bf16(sc[1], qa0[kk], 0u, qa2[kk], 0u, b10, b11);
    }
    float sv[2][2];
#pragma unroll
    for (int nb = 0; nb < 2; ++nb)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int t = (tile0 + i) * kGroupTileKeys + k0 + 8 * nb + 2 * t4 + e;
        sv[nb][e] = t >= first && t < n ? sc[nb][e] * scale : -INFINITY;
      }
    float mx = fmaxf(fmaxf(sv[0][0], sv[0][1]), fmaxf(sv[1][0], sv[1][1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mn = fmaxf(m, mx);
    float corr = 1.0f, p[2][2] = {};
    if (mn != -INFINITY) {  // else no key for this warp yet: nothing changes
      corr = __expf(m - mn);  // 0 while m = −∞
#pragma unroll
      for (int nb = 0; nb < 2; ++nb)
#pragma unroll
        for (int e = 0; e < 2; ++e) p[nb][e] = __expf(sv[nb][e] - mn);
    }
    l = l * corr + ((p[0][0] + p[0][1]) + (p[1][0] + p[1][1]));
    m = mn;
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
      o[nb][0] *= corr;
      o[nb][1] *= corr;
    }
    // P as A (row g; keys 2t4, 2t4 + 1 in a0, keys 8 + 2t4 … in a2): hi and lo halves.
    const __nv_bfloat162 h0 = __floats2bfloat162_rn(p[0][0], p[0][1]), h2 = __floats2bfloat162_rn(p[1][0], p[1][1]);
    const float2 f0 = __bfloat1622float2(h0), f2 = __bfloat1622float2(h2);
    const __nv_bfloat162 l0 = __floats2bfloat162_rn(p[0][0] - f0.x, p[0][1] - f0.y);
    const __nv_bfloat162 l2 = __floats2bfloat162_rn(p[1][0] - f2.x, p[1][1] - f2.y);
    const unsigned ph0 = *reinterpret_cast<const unsigned*>(&h0), ph2 = *reinterpret_cast<const unsigned*>(&h2);
    const unsigned pl0 = *reinterpret_cast<const unsigned*>(&l0), pl2 = *reinterpret_cast<const unsigned*>(&l2);
#pragma unroll
    for (int j = 0; j < NB / 2; ++j) {
      const int key = k0 + rr + (mi & 1) * 8, ch = 2 * j + (mi >> 1);
      unsigned v0, v1, v2, v3;
      dev::ldmatrix_x4_trans(vs + tile_chunk_offset<D>(key, ch), v0, v1, v2, v3);
      dev::mma_16816_bf16(o[2 * j], ph0, 0u, ph2, 0u, v0, v1);
      dev::mma_16816_bf16(o[2 * j], pl0, 0u, pl2, 0u, v0, v1);
      dev::mma_16816_bf16(o[2 * j + 1], ph0, 0u, ph2, 0u, v2, v3);
      dev::mma_16816_bf16(o[2 * j + 1], pl0, 0u, pl2, 0u, v2, v3);
    }
    __syncthreads();  // every warp done with this stage before a later load refills it
  }
  dev::cp_async_wait<0>();
  __syncthreads();
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  float* cm = reinterpret_cast<float*>(group_smem);  // [warp][GRP] running maxima
  float* cl = cm + kGroupWarps * GRP;                 // [warp][GRP] sums
  float* co = cl + kGroupWarps * GRP;                 // [warp][GRP][D] outputs
  if (g < GRP) {
    if (t4 == 0) {
      cm[warp * GRP + g] = m;
      cl[warp * GRP + g] = l;
    }
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
      co[(warp * GRP + g) * D + 8 * nb + 2 * t4] = o[nb][0];
      co[(warp * GRP + g) * D + 8 * nb + 2 * t4 + 1] = o[nb][1];
    }
  }
  __syncthreads();
  for (int idx = tid; idx < GRP * D; idx += kThreads) {
    const int a = idx / D, d = idx % D;
    float mm = -INFINITY;
#pragma unroll
    for (int w = 0; w < kGroupWarps; ++w) mm = fmaxf(mm, cm[w * GRP + a]);
    float num = 0.0f, den = 0.0f;
#pragma unroll
    for (int w = 0; w < kGroupWarps; ++w) {
      const float mw = cm[w * GRP + a];
      const float e = mw == -INFINITY ? 0.0f : __expf(mw - mm);  // a warp that saw no key adds nothing
      num += co[(w * GRP + a) * D + d] * e;
      den += cl[w * GRP + a] * e;
    }
    out[r * q_dim + (static_cast<std::int64_t>(kvh) * GRP + a) * D + d] = __float2bfloat16(num / den);
  }
}

}  // namespace twell::cuda::ops::detail
