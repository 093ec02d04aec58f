// twell_probe_decode_attention: the decode attention (cuda::ops::attention: one CTA of 8 warps per
// (row, query head), exact fp32 scores and sums; or at 8 rows or more the tensor-core kernel, a CTA
// of 4 warps per (row, KV head)) against the bytes it must read, at the batches and
// contexts a server runs (issue 59: at batch 64 and context 512 the 2B model's KV cache is most of a
// step's bytes, and PyTorch moved a step's bytes at ≈ 3.1 TB/s where twell moved them at ≈ 2.6).
// For each shape: µs a launch, graph-replayed over `layers` caches launched in turn (together past
// the L2), the KV bytes a launch must read (rows × keys × KV heads × D × 2 × 2 B; query heads of a
// GQA group read their KV head's rows again, from L2 at best) and the bandwidth on them, beside the
// device-to-device copy bandwidth measured in the same process; beside it a candidate, split-KV
// attention (split_attention_kernel below: chunks of 128 keys, a CTA each, combined by the last).
// The library's kernel runs as in a decode step (old_keys_ready: its first K and V rows load before
// the programmatic wait, overlapping the launch before it); the candidates wait first, so they are
// understated where that overlap matters; the "plain" columns time the library, the split and the pipelined
// candidates with plain launches, where no launch overlaps the one before it. A second candidate,
// pipelined_attention_kernel: the per-head kernel with its loads issued a loop step ahead (its bits
// must equal the per-head library kernel's: checked where the library runs that one), as ptxas
// chooses ("pipe") and bounded to 3 CTAs an SM ("pipe3"). (The cluster split-KV candidate of 963fe7d
// lost at every shape and is gone: bench/results/2026-11-29-h200-probe-decode-attention-963fe7d.md.)
// For GQA shapes a third, grouped_attention_kernel ("GQA-CTA"): the library's grouped kernel before
// its tensor-core form, a CTA a (row, KV head) with its scores a thread a key and the per-head bits.
// At every shape, "tc": the library's tensor-core grouped kernel (cuda/ops/attention_grouped.cuh) as
// a decode step runs it, at every row count (the library from kAttentionGroupedMinRows rows: 8), with groups of 1 on the MHA
// model; checked against its own bound, its bits repeating and equal to the library's where the
// library runs it.
// Forms tried here and gone: the thread-a-key score loop read coalesced ("coal", 42 against 34 µs at
// 64 × 513: bench/results/2026-11-30-h200-probe-decode-attention-coal-e2cb715.txt), and the tensor-core
// kernel's scalar twin ("tile": 64-key tiles through cp.async and an online softmax on CUDA cores, 49.8
// µs, instruction-bound: …-probe-decode-attention-tile-4ca3df2.txt) before the tensor-core one went
// into the library (21.5 µs: …-probe-decode-attention-mma-7db8890.txt).
// Checks: every output finite, and every head of the last row, of each kernel, against a float64
// softmax over the same bf16 values (the bound derived at the checks below).
//   twell_probe_decode_attention [max GB of caches (default 12) [rows context [model 0-2]]]   (one shape: for ncu)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda/common/device_buffer.hpp"
#include "cuda/common/launch.cuh"
#include "cuda/ops/attention_grouped.cuh"
#include "cuda/ops/attention_softmax.cuh"
#include "cuda/ops/model_ops.hpp"
#include "probe_graph.cuh"

using namespace twell::cuda;
using namespace twell::probe;

namespace {

// The candidate: split-KV decode attention (flash-decoding). One CTA of kSplitThreads per (row,
// query head, chunk of kChunk keys): the chunk's scores (a thread a key), their max m and
// Σ exp(s − m) = l, and o = Σ exp(s − m)·v over the chunk (D/8 lanes a value row, the warps' key
// groups summed in a fixed order); the last CTA of a (row, head) (a ticket) combines the chunks in
// chunk order: out = Σ o_c·e^(m_c − M) / Σ l_c·e^(m_c − M). More CTAs than the library's one per
// (row, head) where rows × heads is small (batch 1: 32 at 2B), the same bytes. Deterministic: the
// combination's order is fixed, whatever order the chunks finish in.
constexpr int kChunk = 128, kSplitThreads = 128, kSplitWarps = kSplitThreads / 32;

template <int D>
__global__ void __launch_bounds__(kSplitThreads) split_attention_kernel(const __nv_bfloat16* qkv, int heads, int kv_heads,
                                                                        const ops::RowKv* rows_kv, long long layer,
                                                                        float scale, float* work, unsigned* tickets,
                                                                        int max_chunks, __nv_bfloat16* out) {
  constexpr int L = D / 8, G = 32 / L;  // P·V: L lanes a value row, G rows a warp at a time
  __shared__ float q[D], sc[kChunk], red[kSplitWarps], part[kSplitWarps][D];
  __shared__ bool last;
  const int r = blockIdx.x, h = blockIdx.y, chunk = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const long long q_dim = static_cast<long long>(heads) * D, kv_dim = static_cast<long long>(kv_heads) * D;
  const int kvh = h / (heads / kv_heads);
  twell::cuda::dev::pdl_begin();
  const ops::RowKv info = rows_kv[r];
  const int n = info.pos + 1, chunks = (n + kChunk - 1) / kChunk;
  if (chunk >= chunks) return;  // grid sized for the longest row
  const int t0 = chunk * kChunk, cnt = min(kChunk, n - t0);
  const __nv_bfloat16* qrow = qkv + r * (q_dim + 2 * kv_dim) + h * D;
  for (int i = tid; i < D; i += kSplitThreads) q[i] = __bfloat162float(qrow[i]) * scale;
  __syncthreads();
  const __nv_bfloat16* kc = info.k + layer * info.layer_stride + kvh * D;
  const __nv_bfloat16* vc = info.v + layer * info.layer_stride + kvh * D;
  float mx = -INFINITY;
  if (tid < cnt) {
    const uint4* kr = reinterpret_cast<const uint4*>(kc + info.slot(t0 + tid) * kv_dim);
    uint4 raw[L];
#pragma unroll
    for (int j = 0; j < L; ++j) raw[j] = kr[j];
    float a = 0.0f;
#pragma unroll
    for (int j = 0; j < L; ++j) {
      const auto* p2 = reinterpret_cast<const __nv_bfloat162*>(&raw[j]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = __bfloat1622float2(p2[e]);
        a += q[8 * j + 2 * e] * f.x;
        a += q[8 * j + 2 * e + 1] * f.y;
      }
    }
    sc[tid] = a;
    mx = a;
  }
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  mx = red[0];
  for (int w = 1; w < kSplitWarps; ++w) mx = fmaxf(mx, red[w]);
  __syncthreads();
  float l = 0.0f;
  if (tid < cnt) l = sc[tid] = __expf(sc[tid] - mx);
  for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
  if (lane == 0) red[warp] = l;
  __syncthreads();
  l = 0.0f;
  for (int w = 0; w < kSplitWarps; ++w) l += red[w];
  // o over the chunk: warp w's key group g takes keys w·G + g, + kSplitWarps·G, …
  const int g = lane / L, c = lane % L;
  float acc[8] = {};
  constexpr int kStepS = kSplitWarps * G, kUnroll = 4;  // 4 value loads in flight a lane, as the library's kernel
  for (int base = warp * G + g; base < cnt; base += kStepS * kUnroll) {
    uint4 raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int t = base + u * kStepS;
      raw[u] = t < cnt ? reinterpret_cast<const uint4*>(vc + info.slot(t0 + t) * kv_dim)[c] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int t = base + u * kStepS;
      const float pr = t < cnt ? sc[t] : 0.0f;
      const auto* p2 = reinterpret_cast<const __nv_bfloat162*>(&raw[u]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = __bfloat1622float2(p2[e]);
        acc[2 * e] += pr * f.x;
        acc[2 * e + 1] += pr * f.y;
      }
    }
  }
#pragma unroll
  for (int o = L; o < 32; o <<= 1)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], o);
  if (g == 0)
#pragma unroll
    for (int j = 0; j < 8; ++j) part[warp][8 * c + j] = acc[j];
  __syncthreads();
  // This chunk's (m, l, o[D]) into the work area [rows, heads, max_chunks, D + 2].
  float* mine = work + ((static_cast<long long>(r) * heads + h) * max_chunks + chunk) * (D + 2);
  for (int i = tid; i < D; i += kSplitThreads) {
    float o = 0.0f;
    for (int w = 0; w < kSplitWarps; ++w) o += part[w][i];
    mine[i] = o;
  }
  if (tid == 0) {
    mine[D] = mx;
    mine[D + 1] = l;
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    unsigned* tk = tickets + static_cast<long long>(r) * heads + h;
    last = atomicAdd(tk, 1u) == static_cast<unsigned>(chunks - 1);
    if (last) *tk = 0;  // ready for the next launch
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const float* all = work + (static_cast<long long>(r) * heads + h) * max_chunks * (D + 2);
  float big = -INFINITY;
  for (int cc = 0; cc < chunks; ++cc) big = fmaxf(big, __ldcg(all + cc * (D + 2) + D));
  float den = 0.0f;
  for (int cc = 0; cc < chunks; ++cc) den += __ldcg(all + cc * (D + 2) + D + 1) * __expf(__ldcg(all + cc * (D + 2) + D) - big);
  for (int i = tid; i < D; i += kSplitThreads) {
    float o = 0.0f;
    for (int cc = 0; cc < chunks; ++cc) o += __ldcg(all + cc * (D + 2) + i) * __expf(__ldcg(all + cc * (D + 2) + D) - big);
    out[r * q_dim + h * D + i] = __float2bfloat16(o / den);
  }
}

// The third candidate: the library's per-head kernel (attention_kernel_d: a CTA of 8 warps a (row,
// query head), the same arithmetic in the same order, so the same bits), with its loads pipelined:
// the score loop issues the next key step's row (D = 64 only: at 128 the second row would take 16
// more registers of 16 bytes) before it works on this one's, and the P·V loop issues the next step's
// kUnroll value chunks before this step's products. The library's loop waits for each step's loads
// before it issues the next: ≈ 3 + 5 dependent round trips a CTA at 513 keys, which at 64 rows
// (2048 CTAs, 2 an SM) is a fixed cost of ≈ 26 µs a launch (the fit in docs/runtime.md). kMinBlocks:
// 0 lets ptxas choose the registers (as the library), 3 bounds it to 3 CTAs an SM. Loads nothing
// before its wait (its overlapped column credits it with no early loads; the plain column is the
// fair comparison).
constexpr int kPipeWarps = 8, kPipeThreads = kPipeWarps * 32;

template <int D, int kMinBlocks>
__global__ void __launch_bounds__(kPipeThreads, kMinBlocks)
    pipelined_attention_kernel(const __nv_bfloat16* qkv, int heads, int kv_heads, const ops::RowKv* rows_kv,
                               long long layer, float scale, __nv_bfloat16* out) {
  constexpr int L = D / 8, G = 32 / L, kUnroll = 4, kStep = kPipeWarps * G;
  constexpr bool kPipeK = D <= 64;
  extern __shared__ float smem[];
  const int r = blockIdx.x, h = blockIdx.y;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / L, c = lane % L;
  const long long q_dim = static_cast<long long>(heads) * D, kv_dim = static_cast<long long>(kv_heads) * D;
  const int kvh = h / (heads / kv_heads);
  twell::cuda::dev::pdl_begin();
  const ops::RowKv info = rows_kv[r];
  const int n = info.pos + 1;
  float* q = smem;                   // [D]
  float* part = q + D;               // [kPipeWarps, D]
  float* red = part + kPipeWarps * D;  // [kPipeWarps]
  float* score = red + kPipeWarps;   // [n]
  const __nv_bfloat16* qrow = qkv + r * (q_dim + 2 * kv_dim) + static_cast<long long>(h) * D;
  const __nv_bfloat16* kc = info.k + layer * info.layer_stride + static_cast<long long>(kvh) * D;
  const __nv_bfloat16* vc = info.v + layer * info.layer_stride + static_cast<long long>(kvh) * D;
  // This thread's first key row is in flight while q loads.
  uint4 cur[L];
  if (tid < n) {
    const uint4* kr = reinterpret_cast<const uint4*>(kc + info.slot(tid) * kv_dim);
#pragma unroll
    for (int j = 0; j < L; ++j) cur[j] = kr[j];
  }
  for (int i = tid; i < D; i += kPipeThreads) q[i] = __bfloat162float(qrow[i]) * scale;
  __syncthreads();
  float mx = -INFINITY;
  for (int t = tid; t < n; t += kPipeThreads) {
    uint4 nxt[kPipeK ? L : 1];
    const int tn = t + kPipeThreads;
    if constexpr (kPipeK) {
      if (tn < n) {
        const uint4* kr = reinterpret_cast<const uint4*>(kc + info.slot(tn) * kv_dim);
#pragma unroll
        for (int j = 0; j < L; ++j) nxt[j] = kr[j];
      }
    }
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < L; ++j) {
      const auto* p2 = reinterpret_cast<const __nv_bfloat162*>(&cur[j]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = __bfloat1622float2(p2[e]);
        s += q[8 * j + 2 * e] * f.x;
        s += q[8 * j + 2 * e + 1] * f.y;
      }
    }
    score[t] = s;
    mx = fmaxf(mx, s);
    if (tn < n) {
      if constexpr (kPipeK) {
#pragma unroll
        for (int j = 0; j < L; ++j) cur[j] = nxt[j];
      } else {
        const uint4* kr = reinterpret_cast<const uint4*>(kc + info.slot(tn) * kv_dim);
#pragma unroll
        for (int j = 0; j < L; ++j) cur[j] = kr[j];
      }
    }
  }
  // The first P·V step's values are in flight across the softmax's barriers.
  const int first_t = warp * G + g;
  uint4 raw[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int t = first_t + u * kStep;
    raw[u] = t < n ? reinterpret_cast<const uint4*>(vc + info.slot(t) * kv_dim)[c] : make_uint4(0, 0, 0, 0);
  }
  const float sum = ops::detail::softmax_in_place<kPipeWarps>(score, n, mx, red);  // the library's softmax

  float acc[8] = {};
  for (int base = first_t; base < n; base += kStep * kUnroll) {
    uint4 nraw[kUnroll];
    const int nb = base + kStep * kUnroll;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int t = nb + u * kStep;
      nraw[u] = t < n ? reinterpret_cast<const uint4*>(vc + info.slot(t) * kv_dim)[c] : make_uint4(0, 0, 0, 0);
    }
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
  for (int i = tid; i < D; i += kPipeThreads) {
    float o = 0.0f;
    for (int w = 0; w < kPipeWarps; ++w) o += part[w * D + i];
    out[r * q_dim + static_cast<long long>(h) * D + i] = __float2bfloat16(o * inv);
  }
}

// The GQA candidate: one CTA of 8 warps per (row, KV head) serves the GRP query heads that read
// that KV head, so each key and value row is loaded once for all of them (the library's kernel runs
// a CTA per query head, each loading the rows again: from L2 at best). Scores [GRP][n] in shared
// memory; the softmax per query head; P·V with each value chunk loaded once and used GRP times.
constexpr int kGroupWarps = 8;

template <int D, int GRP>
__global__ void __launch_bounds__(kGroupWarps * 32) grouped_attention_kernel(const __nv_bfloat16* qkv, int heads,
                                                                             int kv_heads, const ops::RowKv* rows_kv,
                                                                             long long layer, float scale,
                                                                             __nv_bfloat16* out) {
  constexpr int L = D / 8, G = 32 / L, kStep = kGroupWarps * G, kThreads = kGroupWarps * 32;
  extern __shared__ float smem[];
  const int r = blockIdx.x, kvh = blockIdx.y;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const long long q_dim = static_cast<long long>(heads) * D, kv_dim = static_cast<long long>(kv_heads) * D;
  twell::cuda::dev::pdl_begin();
  const ops::RowKv info = rows_kv[r];
  const int n = info.pos + 1;
  float* q = smem;                          // [GRP][D], pre-scaled
  float* red = q + GRP * D;                 // [GRP][kGroupWarps]
  float* part = red + GRP * kGroupWarps;    // [kGroupWarps][GRP][D]
  float* score = part + kGroupWarps * GRP * D;  // [GRP][n]
  const __nv_bfloat16* qrow = qkv + r * (q_dim + 2 * kv_dim) + static_cast<long long>(kvh) * GRP * D;
  for (int i = tid; i < GRP * D; i += kThreads) q[i] = __bfloat162float(qrow[i]) * scale;
  __syncthreads();
  const __nv_bfloat16* kc = info.k + layer * info.layer_stride + static_cast<long long>(kvh) * D;
  const __nv_bfloat16* vc = info.v + layer * info.layer_stride + static_cast<long long>(kvh) * D;
  float mx[GRP];
#pragma unroll
  for (int a = 0; a < GRP; ++a) mx[a] = -INFINITY;
  // Scores: a thread a key.
  for (int t = tid; t < n; t += kThreads) {
    const uint4* kr = reinterpret_cast<const uint4*>(kc + info.slot(t) * kv_dim);
    uint4 raw[L];
#pragma unroll
    for (int j = 0; j < L; ++j) raw[j] = kr[j];
    float a_s[GRP] = {};
#pragma unroll
    for (int j = 0; j < L; ++j) {
      const auto* p2 = reinterpret_cast<const __nv_bfloat162*>(&raw[j]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = __bfloat1622float2(p2[e]);
#pragma unroll
        for (int a = 0; a < GRP; ++a) {
          a_s[a] += q[a * D + 8 * j + 2 * e] * f.x;
          a_s[a] += q[a * D + 8 * j + 2 * e + 1] * f.y;
        }
      }
    }
#pragma unroll
    for (int a = 0; a < GRP; ++a) {
      score[a * n + t] = a_s[a];
      mx[a] = fmaxf(mx[a], a_s[a]);
    }
  }
  // Softmax per query head: the block's max, then exp and the sum.
#pragma unroll
  for (int a = 0; a < GRP; ++a) {
    for (int o = 16; o > 0; o >>= 1) mx[a] = fmaxf(mx[a], __shfl_xor_sync(0xffffffffu, mx[a], o));
    if (lane == 0) red[a * kGroupWarps + warp] = mx[a];
  }
  __syncthreads();
#pragma unroll
  for (int a = 0; a < GRP; ++a) {
    mx[a] = red[a * kGroupWarps];
    for (int w = 1; w < kGroupWarps; ++w) mx[a] = fmaxf(mx[a], red[a * kGroupWarps + w]);
  }
  __syncthreads();  // red is reused for the sums
  float sum[GRP] = {};
  for (int t = tid; t < n; t += kThreads)
#pragma unroll
    for (int a = 0; a < GRP; ++a) {
      const float e = __expf(score[a * n + t] - mx[a]);
      score[a * n + t] = e;
      sum[a] += e;
    }
#pragma unroll
  for (int a = 0; a < GRP; ++a) {
    for (int o = 16; o > 0; o >>= 1) sum[a] += __shfl_xor_sync(0xffffffffu, sum[a], o);
    if (lane == 0) red[a * kGroupWarps + warp] = sum[a];
  }
  __syncthreads();
#pragma unroll
  for (int a = 0; a < GRP; ++a) {
    sum[a] = 0.0f;
    for (int w = 0; w < kGroupWarps; ++w) sum[a] += red[a * kGroupWarps + w];
  }
  // P·V: lane group g of warp w takes keys w·G + g, + kStep, …; dims [8c, 8c + 8).
  const int g = lane / L, c = lane % L;
  float acc[GRP][8] = {};
  constexpr int kUnroll = 4;  // 4 value loads in flight a lane, as the library's kernel
  for (int base = warp * G + g; base < n; base += kStep * kUnroll) {
    uint4 raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int t = base + u * kStep;
      raw[u] = t < n ? reinterpret_cast<const uint4*>(vc + info.slot(t) * kv_dim)[c] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int t = base + u * kStep;
      const auto* p2 = reinterpret_cast<const __nv_bfloat162*>(&raw[u]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = __bfloat1622float2(p2[e]);
#pragma unroll
        for (int a = 0; a < GRP; ++a) {
          const float pr = t < n ? score[a * n + t] : 0.0f;
          acc[a][2 * e] += pr * f.x;
          acc[a][2 * e + 1] += pr * f.y;
        }
      }
    }
  }
#pragma unroll
  for (int a = 0; a < GRP; ++a)
#pragma unroll
    for (int o = L; o < 32; o <<= 1)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[a][j] += __shfl_xor_sync(0xffffffffu, acc[a][j], o);
  if (g == 0)
#pragma unroll
    for (int a = 0; a < GRP; ++a)
#pragma unroll
      for (int j = 0; j < 8; ++j) part[(warp * GRP + a) * D + 8 * c + j] = acc[a][j];
  __syncthreads();
  for (int i = tid; i < GRP * D; i += kThreads) {
    const int a = i / D, d = i % D;
    float o = 0.0f;
    for (int w = 0; w < kGroupWarps; ++w) o += part[(w * GRP + a) * D + d];
    out[r * q_dim + (static_cast<long long>(kvh) * GRP + a) * D + d] = __float2bfloat16(o / sum[a]);
  }
}


}  // namespace

int main(int argc, char** argv) {
  // Optional: one shape only (rows of {1, 4, 8, 12, 16, 32, 64}, context of {144, 512, 2048}, model 0-2), for a
  // profiler to find its launches. Every argument must be a whole number (the GB a finite one).
  bool args_ok = argc <= 5 && argc != 3;
  const auto number = [&](int i, double fallback) {
    if (i >= argc) return fallback;
    char* end = nullptr;
    const double v = std::strtod(argv[i], &end);
    args_ok = args_ok && end != argv[i] && *end == '\0' && std::isfinite(v);
    return v;
  };
  const double max_gb = number(1, 12.0);
  const double rows_arg = number(2, 0), ctx_arg = number(3, 0), model_arg = number(4, -1);
  const int only_rows = static_cast<int>(rows_arg), only_ctx = static_cast<int>(ctx_arg), only_model = static_cast<int>(model_arg);
  const bool whole = rows_arg == only_rows && ctx_arg == only_ctx && model_arg == only_model;
  const bool shape_ok = argc <= 3 || ((only_rows == 1 || only_rows == 4 || only_rows == 8 || only_rows == 12 || only_rows == 16 || only_rows == 32 || only_rows == 64) &&
                                      (only_ctx == 144 || only_ctx == 512 || only_ctx == 2048));
  if (!args_ok || !whole || !(max_gb > 0.1 && max_gb < 1e4) || !shape_ok || (argc > 4 && (only_model < 0 || only_model > 2))) {
    std::fprintf(stderr,
                 "usage: twell_probe_decode_attention [max GB of caches (0.1, 1e4) [rows (1, 4, 8, 12, 16, 32, 64) context (144, 512, "
                 "2048) [model 0-2]]]\n");
    return 2;
  }
  int shapes_run = 0;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const double copy = copy_gbps(s);
  std::printf("device %s, %d SMs, L2 %.0f MB; copy bandwidth %.0f GB/s (bytes read + written a second, as twell bench model reports it)\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize / 1e6, copy);
  struct Model {
    const char* name;
    int heads, kv_heads, d;
  };
  bool all_ok = true;
  int model_index = -1;
  for (const Model md : {Model{"2B (MHA, 32 heads of 64)", 32, 32, 64}, Model{"GQA 32/8 heads of 64", 32, 8, 64},
                         Model{"7B-GQA (32/8 heads of 128)", 32, 8, 128}}) {
    if (++model_index != only_model && only_model >= 0) continue;
    std::printf("\n%s\n%5s %6s %7s %10s %10s %8s %8s %10s %8s %8s %8s %8s %15s %8s %8s %35s  %s\n", md.name, "rows", "keys", "layers",
                "us", "KV MB", "GB/s", "of copy", "split us", "GB/s", "pipe us", "pipe3 us", "GB/s", "GQA-CTA", "tc us", "of copy",
                "plain us lib / split / pipe / pipe3", "checks (library / split / pipe / pipe3 / GQA-CTA / tc)");
    const std::int64_t kv_dim = static_cast<std::int64_t>(md.kv_heads) * md.d, q_dim = static_cast<std::int64_t>(md.heads) * md.d;
    // 4, 8, 12 and 16 rows: where the tensor-core kernel ("tc", rows × KV heads CTAs, each over all the
    // keys) overtakes the per-head one (rows × heads CTAs), by context; the library switches at 8
    // (from b9bc052's run of this probe).
    for (const int rows : {1, 4, 8, 12, 16, 32, 64})
      for (const int ctx : {144, 512, 2048}) {
        if (only_rows > 0 && (rows != only_rows || ctx != only_ctx)) continue;
        const int keys = ctx + 1;  // the new token's key is in the cache too
        if (keys > ops::attention_max_keys(md.d)) continue;
        const double kv_bytes = 2.0 * 2.0 * rows * keys * kv_dim;  // a launch's K and V rows
        // Enough layers that a replay's caches pass the L2 several times over, within max_gb.
        int layers = static_cast<int>(std::ceil(4.0 * prop.l2CacheSize / kv_bytes));
        layers = std::max(1, std::min(layers, static_cast<int>(max_gb * 1e9 / kv_bytes)));
        if (layers < 1 || kv_bytes > max_gb * 1e9) continue;
        ++shapes_run;
        const std::int64_t layer_stride = static_cast<std::int64_t>(keys) * kv_dim;  // elements a layer of a row
        // One cache per row: [layers][keys][kv_dim] for K and for V.
        std::vector<DeviceBuffer<__nv_bfloat16>> kc(static_cast<std::size_t>(rows)), vc(kc.size());
        unsigned seed = 7;
        for (int r = 0; r < rows; ++r) {
          kc[r].resize(static_cast<std::size_t>(layers * layer_stride));
          vc[r].resize(kc[r].size());
          fill<<<256, 256, 0, s>>>(kc[r].get(), static_cast<long long>(layers) * keys, static_cast<int>(kv_dim), 1.0f, -1, 0.0f, seed++);
          fill<<<256, 256, 0, s>>>(vc[r].get(), static_cast<long long>(layers) * keys, static_cast<int>(kv_dim), 1.0f, -1, 0.0f, seed++);
        }
        std::vector<ops::RowKv> hrows(static_cast<std::size_t>(rows));
        for (int r = 0; r < rows; ++r) {
          hrows[r].k = kc[r].get();
          hrows[r].v = vc[r].get();
          hrows[r].layer_stride = layer_stride;
          hrows[r].pos = ctx;
        }
        DeviceBuffer<ops::RowKv> drows(hrows.size());
        CK(cudaMemcpyAsync(drows.get(), hrows.data(), hrows.size() * sizeof(ops::RowKv), cudaMemcpyHostToDevice, s));
        DeviceBuffer<__nv_bfloat16> qkv(static_cast<std::size_t>(rows * (q_dim + 2 * kv_dim))),
            out(static_cast<std::size_t>(rows * q_dim));
        fill<<<64, 256, 0, s>>>(qkv.get(), rows, static_cast<int>(q_dim + 2 * kv_dim), 1.0f, -1, 0.0f, 99);
        const auto launch = [&](int l) {
          ops::attention(qkv.get(), rows, md.heads, md.kv_heads, md.d, drows.get(), l, keys, out.get(), s,
                         /*old_keys_ready=*/true);
        };
        // The candidate's work area and tickets (zero; each (row, head)'s last CTA leaves its ticket zero).
        const int max_chunks = (keys + kChunk - 1) / kChunk;
        DeviceBuffer<float> work(static_cast<std::size_t>(rows) * md.heads * max_chunks * (md.d + 2));
        DeviceBuffer<unsigned> tickets(static_cast<std::size_t>(rows) * md.heads);
        CK(cudaMemsetAsync(tickets.get(), 0, tickets.bytes(), s));
        DeviceBuffer<__nv_bfloat16> out_split(out.size());
        const float scale = 1.0f / std::sqrt(static_cast<float>(md.d));
        // The GQA candidate (4 query heads a KV head only): scores [4][keys] in shared memory.
        const bool grouped = md.heads == 4 * md.kv_heads;
        bool attr_set = false;
        DeviceBuffer<__nv_bfloat16> out_group(out.size());
        const std::size_t group_smem = sizeof(float) * (4 * md.d + 4 * kGroupWarps + kGroupWarps * 4 * md.d + 4 * keys);
        const auto launch_group = [&](int l) {
          const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(md.kv_heads));
          const auto go = [&](auto kernel) {
            if (!attr_set)  // once, at the checks, before the graphs capture the launches
              CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(group_smem)));
            attr_set = true;
            launch_kernel(kernel, grid, dim3(kGroupWarps * 32), group_smem, s, qkv.get(), md.heads, md.kv_heads,
                          drows.get(), static_cast<long long>(l), scale, out_group.get());
          };
          if (md.d == 64)
            go(grouped_attention_kernel<64, 4>);
          else
            go(grouped_attention_kernel<128, 4>);
          CK(cudaGetLastError());
        };
        const bool group_fits = grouped && group_smem <= static_cast<std::size_t>(prop.sharedMemPerBlockOptin);
        // The library's tensor-core grouped kernel (attention_grouped.cuh) at every shape, as a decode
        // step runs it (old keys before the wait): the group of the model (1 on the MHA model), whatever
        // the rows (the library's from 16).
        const int group = md.heads / md.kv_heads;
        bool tc_attr = false;
        DeviceBuffer<__nv_bfloat16> out_tc(out.size());
        const auto launch_tc = [&](int l) {
          const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(md.kv_heads));
          const auto go = [&](auto kernel, std::size_t smem) {
            if (!tc_attr && smem > 48 * 1024)  // once, at the checks, before the graphs capture the launches
              CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
            tc_attr = true;
            launch_kernel(kernel, grid, dim3(ops::detail::kGroupWarps * 32), smem, s, qkv.get(), md.heads, md.kv_heads,
                          drows.get(), l, scale, 0, out_tc.get(), true);
          };
          if (md.d == 64)
            group == 1 ? go(ops::detail::attention_grouped_kernel<64, 1>, ops::detail::grouped_smem<64>())
                       : go(ops::detail::attention_grouped_kernel<64, 4>, ops::detail::grouped_smem<64>());
          else
            group == 1 ? go(ops::detail::attention_grouped_kernel<128, 1>, ops::detail::grouped_smem<128>())
                       : go(ops::detail::attention_grouped_kernel<128, 4>, ops::detail::grouped_smem<128>());
          CK(cudaGetLastError());
        };
        const auto launch_split = [&](int l) {
          const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(md.heads), static_cast<unsigned>(max_chunks));
          if (md.d == 64)
            launch_kernel(split_attention_kernel<64>, grid, dim3(kSplitThreads), 0, s, qkv.get(), md.heads, md.kv_heads,
                          drows.get(), static_cast<long long>(l), scale, work.get(), tickets.get(), max_chunks,
                          out_split.get());
          else
            launch_kernel(split_attention_kernel<128>, grid, dim3(kSplitThreads), 0, s, qkv.get(), md.heads, md.kv_heads,
                          drows.get(), static_cast<long long>(l), scale, work.get(), tickets.get(), max_chunks,
                          out_split.get());
          CK(cudaGetLastError());
        };
        // The pipelined per-head candidate, as ptxas chooses (pipe) and bounded to 3 CTAs an SM (pipe3).
        DeviceBuffer<__nv_bfloat16> out_pipe(out.size()), out_pipe3(out.size());
        const std::size_t pipe_smem = sizeof(float) * ((1 + kPipeWarps) * md.d + kPipeWarps + keys);  // < 48 KB here
        const auto launch_pipe = [&](int l, bool bounded) {
          const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(md.heads));
          __nv_bfloat16* o = bounded ? out_pipe3.get() : out_pipe.get();
          const auto go = [&](auto kernel) {
            launch_kernel(kernel, grid, dim3(kPipeThreads), pipe_smem, s, qkv.get(), md.heads, md.kv_heads,
                          drows.get(), static_cast<long long>(l), scale, o);
          };
          if (md.d == 64)
            bounded ? go(pipelined_attention_kernel<64, 3>) : go(pipelined_attention_kernel<64, 0>);
          else
            bounded ? go(pipelined_attention_kernel<128, 3>) : go(pipelined_attention_kernel<128, 0>);
          CK(cudaGetLastError());
        };
        // Checks: the last layer (a kernel that ignored the layer would fail), every head of the last
        // row, each kernel's output poisoned first (NaN: an unwritten element fails), with the
        // queries at unit scale and at 40× (scores past exp's range: a wrong max would show). Bound
        // per element, derived: one bf16 step of the result (2⁻⁸ relative); the fp32 sums over the
        // keys, keys · 2⁻²⁴ · Σ p|v|; and the scores' own fp32 error, which moves each probability by
        // a factor e^(±(e_t + max e)): e_t = (D + 2) · 2⁻²⁴ · Σ_i |q_i k_i| / √D for key t, plus
        // __expf's (2 + 1.2 |s_t − max|) ulps, so 2 · max_t e_t + max_t e_exp,t relative on Σ p|v|.
        // A kernel that dropped one key of 2049 is off by ≈ 1 / 2049 of a value (≈ 5e-4).
        const int lc = layers - 1, r = rows - 1;
        bool finite = true;
        double worst[6] = {0, 0, 0, 0, 0, 0};  // library, split, pipe, pipe3, GQA-CTA, tc: the largest error over its bound
        // The library at kAttentionGroupedMinRows rows or more runs its tensor-core grouped kernel: its own
        // bound, and other bits than the per-head kernels'.
        const bool lib_grouped = ops::attention_runs_grouped(rows, md.heads, md.kv_heads, md.d, keys);
        bool pipe_bits = true;  // pipe and pipe3 return the per-head library's bits, every row and head
        bool lib_bits = true;   // the library's bits repeat from run to run
        bool tc_bits = true;    // the tensor-core kernel's: the library's where the library runs it, and repeating
        for (const float qs : {1.0f, 40.0f}) {
          fill<<<64, 256, 0, s>>>(qkv.get(), rows, static_cast<int>(q_dim + 2 * kv_dim), qs, -1, 0.0f, 99);
          for (auto* o : {&out, &out_split, &out_pipe, &out_pipe3, &out_group, &out_tc})
            CK(cudaMemsetAsync(o->get(), 0xff, o->bytes(), s));
          launch(lc);
          launch_split(lc);
          launch_pipe(lc, false);
          launch_pipe(lc, true);
          if (group_fits) launch_group(lc);
          launch_tc(lc);
          CK(cudaStreamSynchronize(s));
          std::vector<unsigned short> ho(out.size()), hsplit(out.size()), hpipe(out.size()), hpipe3(out.size()), hgroup(out.size()),
              htc(out.size()), hq(qkv.size()), hk(static_cast<std::size_t>(keys * kv_dim)), hv(hk.size());
          CK(cudaMemcpy(ho.data(), out.get(), out.bytes(), cudaMemcpyDeviceToHost));
          CK(cudaMemcpy(hsplit.data(), out_split.get(), out_split.bytes(), cudaMemcpyDeviceToHost));
          CK(cudaMemcpy(hpipe.data(), out_pipe.get(), out_pipe.bytes(), cudaMemcpyDeviceToHost));
          CK(cudaMemcpy(hpipe3.data(), out_pipe3.get(), out_pipe3.bytes(), cudaMemcpyDeviceToHost));
          pipe_bits = pipe_bits && (lib_grouped || (hpipe == ho && hpipe3 == ho)) && hpipe == hpipe3;
          {  // the library again: the same bits
            std::vector<unsigned short> again(out.size());
            launch(lc);
            CK(cudaStreamSynchronize(s));
            CK(cudaMemcpy(again.data(), out.get(), out.bytes(), cudaMemcpyDeviceToHost));
            lib_bits = lib_bits && again == ho;
          }
          if (group_fits) CK(cudaMemcpy(hgroup.data(), out_group.get(), out_group.bytes(), cudaMemcpyDeviceToHost));
          CK(cudaMemcpy(htc.data(), out_tc.get(), out_tc.bytes(), cudaMemcpyDeviceToHost));
          {  // and again: the same bits
            std::vector<unsigned short> again(out.size());
            launch_tc(lc);
            CK(cudaStreamSynchronize(s));
            CK(cudaMemcpy(again.data(), out_tc.get(), out_tc.bytes(), cudaMemcpyDeviceToHost));
            tc_bits = tc_bits && again == htc && (!lib_grouped || htc == ho);
          }
          CK(cudaMemcpy(hq.data(), qkv.get(), qkv.bytes(), cudaMemcpyDeviceToHost));
          CK(cudaMemcpy(hk.data(), kc[r].get() + lc * layer_stride, hk.size() * 2, cudaMemcpyDeviceToHost));
          CK(cudaMemcpy(hv.data(), vc[r].get() + lc * layer_stride, hv.size() * 2, cudaMemcpyDeviceToHost));
          const std::vector<unsigned short>* outputs[6] = {&ho, &hsplit, &hpipe, &hpipe3, group_fits ? &hgroup : nullptr, &htc};
          // Against float64, each output within its kernel's derived bound (probe_check.hpp; the
          // library's grouped tensor-core kernel its own).
          for (int h = 0; h < md.heads; ++h) {
            const int kvh = h / (md.heads / md.kv_heads);
            const AttentionF64 ref = attention_f64_head(hq.data() + r * (q_dim + 2 * kv_dim) + h * md.d, hk.data(), hv.data(),
                                                        keys, md.d, kv_dim, kvh * md.d);
            for (int i = 0; i < md.d; ++i)
              for (int k = 0; k < 6; ++k) {
                if (!outputs[k]) continue;
                const unsigned short b = (*outputs[k])[static_cast<std::size_t>(r * q_dim + h * md.d + i)];
                const double err = std::abs(bf16_to_float(b) - ref.want[i]) / ((k == 0 && lib_grouped) || k == 5 ? ref.bound_tc[i] : ref.bound[i]);
                worst[k] = std::max(worst[k], std::isnan(err) ? 1e30 : err);
              }
          }
          for (const auto* hout : outputs)
            if (hout)
              for (const unsigned short b : *hout) finite = finite && (b & 0x7f80u) != 0x7f80u;
        }
        fill<<<64, 256, 0, s>>>(qkv.get(), rows, static_cast<int>(q_dim + 2 * kv_dim), 1.0f, -1, 0.0f, 99);
        const bool ok = finite && pipe_bits && lib_bits && tc_bits && *std::max_element(worst, worst + 6) <= 1.0;
        all_ok = all_ok && ok;
        const ProgrammaticLaunch programmatic(programmatic_launch_supported());
        const double us = time_graph(s, 20, layers, [&] {
          for (int l = 0; l < layers; ++l) launch(l);
        });
        const double us_split = time_graph(s, 20, layers, [&] {
          for (int l = 0; l < layers; ++l) launch_split(l);
        });
        const double us_group = group_fits ? time_graph(s, 20, layers, [&] {
          for (int l = 0; l < layers; ++l) launch_group(l);
        }) : 0.0;
        const double us_pipe = time_graph(s, 20, layers, [&] {
          for (int l = 0; l < layers; ++l) launch_pipe(l, false);
        });
        const double us_pipe3 = time_graph(s, 20, layers, [&] {
          for (int l = 0; l < layers; ++l) launch_pipe(l, true);
        });
        // Plain launches: each starts after the one before it ends, so nothing overlaps across
        // launches (a launch's own latency, plus the graph's launch gap): the candidates and the
        // library on equal terms, where the numbers above credit the library's early loads with the
        // previous launch's time.
        double plain[4] = {0, 0, 0, 0};  // library, split, pipe, pipe3
        {
          const ProgrammaticLaunch off(false);
          plain[0] = time_graph(s, 20, layers, [&] {
            for (int l = 0; l < layers; ++l) launch(l);
          });
          plain[1] = time_graph(s, 20, layers, [&] {
            for (int l = 0; l < layers; ++l) launch_split(l);
          });
          plain[2] = time_graph(s, 20, layers, [&] {
            for (int l = 0; l < layers; ++l) launch_pipe(l, false);
          });
          plain[3] = time_graph(s, 20, layers, [&] {
            for (int l = 0; l < layers; ++l) launch_pipe(l, true);
          });
        }
        const double us_tc = time_graph(s, 20, layers, [&] {
          for (int l = 0; l < layers; ++l) launch_tc(l);
        });
        char group_us[32] = "-";
        if (group_fits) std::snprintf(group_us, sizeof group_us, "%.2f", us_group);
        std::printf("%5d %6d %7d %10.2f %10.2f %8.0f %7.0f%% %10.2f %8.0f %8.2f %8.2f %8.0f %15s %8.2f %7.0f%% %11.2f / %5.2f / %5.2f / %5.2f  %s%s (worst error of its bound: %.2f / %.2f / %.2f / %.2f / %.2f / %.2f)\n",
                    rows, keys, layers, us, kv_bytes / 1e6, kv_bytes / us / 1e3, 100.0 * kv_bytes / us / 1e3 / copy,
                    us_split, kv_bytes / us_split / 1e3, us_pipe, us_pipe3, kv_bytes / std::min(us_pipe, us_pipe3) / 1e3,
                    group_us, us_tc, 100.0 * kv_bytes / us_tc / 1e3 / copy, plain[0], plain[1], plain[2], plain[3], ok ? "ok" : "FAIL",
                    !pipe_bits ? " (pipe's bits differ from the library's)"
                    : !lib_bits ? " (the library's bits differ from run to run)"
                    : !tc_bits ? " (tc's bits differ from run to run, or from the library's grouped rows)" : "",
                    worst[0], worst[1], worst[2], worst[3], worst[4], worst[5]);
      }
  }
  if (only_rows > 0 && shapes_run == 0) {  // the asked shape did not fit (max keys, max GB): nothing was measured
    std::fprintf(stderr, "twell_probe_decode_attention: the shape %d x %d ran on no model (too many keys, or past %.1f GB)\n",
                 only_rows, only_ctx, max_gb);
    return 1;
  }
  std::printf("\nchecks: %s\n", all_ok ? "pass" : "FAIL");
  return all_ok ? 0 : 1;
}
