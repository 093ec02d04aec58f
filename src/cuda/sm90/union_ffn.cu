// The decode FFN's union on tensor cores (union_ffn.hpp): the list, up and down kernels.
#include "cuda/sm90/union_ffn.hpp"

#include <cooperative_groups.h>

#include <cstddef>

#include "cuda/common/check.hpp"
#include "cuda/common/device_math.cuh"
#include "cuda/common/launch.cuh"

namespace twell::cuda {

namespace {

namespace cdev = twell::cuda::dev;
namespace ucg = cooperative_groups;

constexpr int kUnionTile = static_cast<int>(kUnionTileNeurons);  // neurons a list tile
constexpr int kUnionGroup = 16;       // listed neurons a group: an mma m-tile (up), k-step (down)
constexpr int kUnionMaxTiles = static_cast<int>(kUnionMaxN / kUnionTileNeurons);
[[maybe_unused]] constexpr int kUnionMaxGroups = kUnionMaxTiles * (kUnionTile / kUnionGroup);
constexpr int kUnionThreads = 256;    // every kernel: 8 warps
[[maybe_unused]] constexpr int kUnionMaxSplit = 8;     // ranks a cluster (the portable limit)
constexpr int kUpSlots = 64;          // listed slots an up cluster (4 groups)
constexpr int kUpBK = 64;             // k a stage of the up kernel (128-byte rows: 8 chunks of 16)
constexpr int kUpStages = 4;
constexpr int kDownCols = 128;        // columns of y a down cluster
constexpr int kDownStages = 8;        // a down CTA's groups in flight
constexpr int kDownWRow = kDownCols * 2 + 16;  // a staged Wdᵀ row (bytes): 128 columns + 16 of padding (ldmatrix.trans without bank conflicts)
constexpr int kUnionHRowBytes = 48;   // a staged h row: 16 slots (32 bytes) + 16 of padding (the same for ldmatrix)


// Thread (q, rg) = (tid % 64, tid / 64) ORs neurons 4q … 4q + 3 over rows rg, rg + 4, …; neuron
// tid's bit then comes from the four row groups' masks. n % 4 == 0, so each 8-byte load is aligned
// and within its row.
__global__ void __launch_bounds__(kUnionThreads) union_list_kernel(UnionFfnParams p) {
  __shared__ unsigned s_or[4][64];
  __shared__ int s_warp[kUnionTile / 32];
  const int t = static_cast<int>(blockIdx.x), tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int q = tid % 64, rg = tid / 64;
  const long long n0 = static_cast<long long>(t) * kUnionTile, nq = n0 + 4 * q;
  cdev::pdl_begin();  // g is the gate's
  unsigned mask = 0, pairs = 0;
  if (nq < p.n) {
    uint2 v[kUnionMaxRows / 4];  // every load in flight at once
#pragma unroll
    for (int i = 0; i < kUnionMaxRows / 4; ++i) {
      const int r = rg + 4 * i;
      v[i] = r < p.m ? *reinterpret_cast<const uint2*>(p.g + static_cast<long long>(r) * p.ld_g + nq) : make_uint2(0u, 0u);
    }
#pragma unroll
    for (int i = 0; i < kUnionMaxRows / 4; ++i) {
      const unsigned w[2] = {v[i].x, v[i].y};
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // bf16 j of the four: > 0 as a float (a NaN is not)
        const unsigned bits = (w[j / 2] >> (16 * (j % 2))) & 0xFFFFu;
        const bool on = __uint_as_float(bits << 16) > 0.0f;
        mask |= on ? 1u << j : 0u;
        pairs += on ? 1u : 0u;
      }
    }
  }
  s_or[rg][q] = mask;
  __syncthreads();
  const long long nrn = n0 + tid;
  const unsigned m4 = s_or[0][tid / 4] | s_or[1][tid / 4] | s_or[2][tid / 4] | s_or[3][tid / 4];
  const bool fired = nrn < p.n && ((m4 >> (tid % 4)) & 1u) != 0;
  const unsigned b = __ballot_sync(0xffffffffu, fired);
  if (lane == 0) s_warp[warp] = __popc(b);
  __syncthreads();
  int before = 0, count = 0;
#pragma unroll
  for (int w = 0; w < kUnionTile / 32; ++w) {
    before += w < warp ? s_warp[w] : 0;
    count += s_warp[w];
  }
  int* list = p.list + static_cast<long long>(t) * kUnionTile;
  if (fired) list[before + __popc(b & ((1u << lane) - 1u))] = static_cast<int>(nrn);
  if (tid >= count && tid < (count + kUnionGroup - 1) / kUnionGroup * kUnionGroup) list[tid] = -1;
  if (tid == 0) p.counts[t] = count;
  if (!p.nnz) return;
  // The fired pairs: the CTA's sum joins the grid's count, a reduction nothing here waits on. The
  // down kernel publishes the total (it runs after the up kernel, which waited for this grid); a
  // ticketed last CTA here put a fence and two dependent atomics on the chain's path.
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) pairs += __shfl_xor_sync(0xffffffffu, pairs, off);
  __shared__ unsigned s_pairs[kUnionThreads / 32];
  if (lane == 0) s_pairs[warp] = pairs;
  __syncthreads();
  if (tid != 0) return;
  unsigned long long cta = 0;
  for (int w = 0; w < kUnionThreads / 32; ++w) cta += s_pairs[w];
  if (cta) atomicAdd(p.nnz, cta);
}

// The sm_80 image of this file holds traps only (clusters are sm_90's): the device helpers below
// exist for the sm_90 pass.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
// Warp 0: the union's groups in tile order (s_grp[i]: group i's first slot), their number in *s_ngrp.
__device__ __forceinline__ void union_groups(const UnionFfnParams& p, int* s_grp, int* s_ngrp) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int tiles = static_cast<int>((p.n + kUnionTile - 1) / kUnionTile);
  int base = 0;
  for (int t0 = 0; t0 < tiles; t0 += 32) {
    const int t = t0 + lane;
    const int ng = t < tiles ? (__ldcg(p.counts + t) + kUnionGroup - 1) / kUnionGroup : 0;
    int incl = ng;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += v;
    }
    for (int q = 0; q < ng; ++q) s_grp[base + incl - ng + q] = t * kUnionTile + kUnionGroup * q;
    base += __shfl_sync(0xffffffffu, incl, 31);
  }
  if (lane == 0) *s_ngrp = base;
}

// Element idx of the cluster's partial tiles (each rank's at the same shared-memory offset) added in
// rank order 0, 1, … (all loaded first): the order is the split's, never the timing's.
__device__ __forceinline__ float rank_sum(const ucg::cluster_group& cluster, float* part, int idx, int split) {
  float pv[kUnionMaxSplit];
#pragma unroll
  for (int r = 0; r < kUnionMaxSplit; ++r) pv[r] = r < split ? cluster.map_shared_rank(part, r)[idx] : 0.0f;
  float v = 0.0f;
#pragma unroll
  for (int r = 0; r < kUnionMaxSplit; ++r)
    if (r < split) v += pv[r];
  return v;
}

// Byte offset of 16-byte chunk ch (0 … 7) of row r in a [rows][64] bf16 tile: chunk ch ^ (r & 7),
// so ldmatrix's 8 rows at one chunk fall in 8 different bank groups.
__device__ __forceinline__ std::uint32_t union_swz(int r, int ch) {
  return static_cast<std::uint32_t>(r * 128 + ((ch ^ (r & 7)) << 4));
}
#endif

template <int NT>
constexpr std::size_t union_up_smem() {
  return static_cast<std::size_t>(kUpStages) * (kUpSlots + 8 * NT) * kUpBK * 2;
}

// NT 8-row token tiles (m ≤ 8 · NT; 4 or 8): warp w the slots 16 (w % 4) … + 15 and token tiles
// (w / 4) · NT / 2 … + NT / 2 − 1. Grid (split, slot blocks; kPasses: up_clusters), clusters (split, 1, 1).
template <int NT, bool kPasses>
__global__ void __launch_bounds__(kUnionThreads) union_up_kernel(UnionFfnParams p) {
  static_assert(NT == 4 || NT == 8, "two B tiles a ldmatrix, two token halves");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // clusters are sm_90's (launch_union refuses earlier devices)
#else
  constexpr int T = 8 * NT, kWBytes = kUpSlots * kUpBK * 2, kStage = kWBytes + T * kUpBK * 2, kHalf = NT / 2;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int s_grp[kUnionMaxGroups];
  __shared__ int s_ngrp;
  __shared__ int s_nrn[kUpSlots];   // a slot's neuron (−1: padding or no group)
  __shared__ int s_slot[kUpSlots];  // its slot in h (−1: no group)
  const ucg::cluster_group cluster = ucg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank()), split = static_cast<int>(cluster.num_blocks());
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32, mi = warp % 4, nh = warp / 4;
  const int kbs = p.k / kUpBK, kb_per = (kbs + split - 1) / split, kb0 = rank * kb_per;
  const int nkb = max(0, min(kb_per, kbs - kb0));
  const auto sbase = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  // A thread's chunks are the same in every stage: x's T · 8 (one or two), W's 512 (two).
  constexpr int kXPer = T * 8 / kUnionThreads;
  const __nv_bfloat16* xsrc[kXPer];
  bool xv[kXPer];
  std::uint32_t xoff[kXPer];
#pragma unroll
  for (int i = 0; i < kXPer; ++i) {
    const int c = tid + i * kUnionThreads, r = c / 8, ch = c % 8;
    xv[i] = r < p.m;  // rows past m: zeros
    xsrc[i] = p.x + static_cast<long long>(xv[i] ? r : 0) * p.ld_x + kb0 * kUpBK + ch * 8;
    xoff[i] = kWBytes + union_swz(r, ch);
  }
  const auto load_x = [&](int st, int kb) {  // the rank's k-block kb of x into stage st
#pragma unroll
    for (int i = 0; i < kXPer; ++i) cdev::cp_async16(sbase + st * kStage + xoff[i], xsrc[i] + kb * kUpBK, xv[i]);
  };
  // x's first blocks before the wait for the first pass (x was written before the gate; a later pass
  // stages them again at its start); commit group 0 of a pass then holds them and W's block 0, group
  // b (1 ≤ b < kUpStages − 1) W's block b, every later group a whole block.
#pragma unroll
  for (int st = 0; st < kUpStages - 1; ++st)
    if (st < nkb) load_x(st, st);
  cdev::pdl_begin();  // the counts and the list are the list kernel's
  if (warp == 0) union_groups(p, s_grp, &s_ngrp);
  __syncthreads();
  // Cluster y takes the slot blocks y, y + gridDim.y, … (kPasses; else block y alone: the grid holds
  // a cluster a block). Every CTA of the cluster (the same blockIdx.y, the same counts) leaves at the
  // same block. A pass starts with nothing in flight and every rank done with the last pass's tile.
  constexpr int kBlockGroups = kUpSlots / kUnionGroup;
  for (int g0 = static_cast<int>(blockIdx.y) * kBlockGroups, pass = 0;; g0 += static_cast<int>(gridDim.y) * kBlockGroups, ++pass) {
    if (g0 >= s_ngrp) {
      cdev::cp_async_commit();  // x's copies into this CTA's memory end before it does
      cdev::cp_async_wait<0>();
      return;
    }
    if (pass > 0) {  // x's first blocks again: the last pass's partial tile held the stages
#pragma unroll
      for (int st = 0; st < kUpStages - 1; ++st)
        if (st < nkb) load_x(st, st);
    }
    if (tid < kUpSlots) {
      const int gi = g0 + tid / kUnionGroup;
      const int slot = gi < s_ngrp ? s_grp[gi] + tid % kUnionGroup : -1;
      s_slot[tid] = slot;
      s_nrn[tid] = slot >= 0 ? __ldcg(p.list + slot) : -1;
    }
    __syncthreads();
    const __nv_bfloat16* wsrc[2];
    bool wv[2];
    std::uint32_t woff[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int c = tid + i * kUnionThreads, r = c / 8, ch = c % 8, nrn = s_nrn[r];
      wv[i] = nrn >= 0;
      wsrc[i] = p.w_up + static_cast<long long>(wv[i] ? nrn : 0) * p.k + kb0 * kUpBK + ch * 8;
      woff[i] = union_swz(r, ch);
    }
    const auto load_w = [&](int st, int kb) {
#pragma unroll
      for (int i = 0; i < 2; ++i) cdev::cp_async16(sbase + st * kStage + woff[i], wsrc[i] + kb * kUpBK, wv[i]);
    };
#pragma unroll
    for (int st = 0; st < kUpStages - 1; ++st) {
      if (st < nkb) load_w(st, st);
      cdev::cp_async_commit();
    }
    float acc[kHalf][4] = {};
    for (int i = 0; i < nkb; ++i) {
      cdev::cp_async_wait<kUpStages - 2>();  // block i is in (this thread's copies)
      __syncthreads();                       // ... every thread's, and block i − 1's buffer is read
      const int next = i + kUpStages - 1;
      if (next < nkb) {
        load_w(next % kUpStages, next);
        load_x(next % kUpStages, next);
      }
      cdev::cp_async_commit();  // (an empty group past the end keeps the count)
      const std::uint32_t ws = sbase + (i % kUpStages) * kStage, xs = ws + kWBytes;
#pragma unroll
      for (int kk = 0; kk < kUpBK / 16; ++kk) {
        // A (16 slots × 16 k): lanes 0–15 rows 0–15 at k 0, lanes 16–31 at k 8.
        const int ar = mi * 16 + (lane & 15);
        unsigned a0, a1, a2, a3;
        cdev::ldmatrix_x4(ws + union_swz(ar, 2 * kk + (lane >> 4)), a0, a1, a2, a3);
#pragma unroll
        for (int j = 0; j < kHalf; j += 2) {
          // B for tiles j, j + 1: matrices (tokens 8j…, k 0), (8j…, k 8), (8j + 8…, k 0), (8j + 8…, k 8).
          const int tok = (nh * kHalf + j) * 8 + (lane & 7) + ((lane >> 4) << 3);
          unsigned b0, b1, b2, b3;
          cdev::ldmatrix_x4(xs + union_swz(tok, 2 * kk + ((lane >> 3) & 1)), b0, b1, b2, b3);
          cdev::mma_16816_bf16(acc[j], a0, a1, a2, a3, b0, b1);
          cdev::mma_16816_bf16(acc[j + 1], a0, a1, a2, a3, b2, b3);
        }
      }
    }
    cdev::cp_async_wait<0>();
    __syncthreads();  // the stages are free: the partial tile reuses them
    float* part = reinterpret_cast<float*>(smem);  // [T][64]: token-major
    const int gq = lane / 4, t4 = lane % 4;
#pragma unroll
    for (int j = 0; j < kHalf; ++j) {
      const int tok = (nh * kHalf + j) * 8 + 2 * t4, row = mi * 16 + gq;
      part[tok * kUpSlots + row] = acc[j][0];
      part[(tok + 1) * kUpSlots + row] = acc[j][1];
      part[tok * kUpSlots + row + 8] = acc[j][2];
      part[(tok + 1) * kUpSlots + row + 8] = acc[j][3];
    }
    cluster.sync();  // every rank's partial tile is written
    // Rank q the outputs [q · per, (q + 1) · per) of the m · 64: the ranks' partials loaded, then added
    // in rank order 0, 1, …
    const int outs = p.m * kUpSlots, per = (outs + split - 1) / split;
    for (int idx = rank * per + tid; idx < min((rank + 1) * per, outs); idx += kUnionThreads) {
      const int row = idx / kUpSlots, col = idx % kUpSlots, slot = s_slot[col];
      const float v = rank_sum(cluster, part, idx, split);
      if (slot < 0) continue;
      const int nrn = s_nrn[col];
      const float hv = nrn >= 0 ? __bfloat162float(p.g[static_cast<long long>(row) * p.ld_g + nrn]) * v : 0.0f;
      p.h[row * union_list_size(p.n) + slot] = __float2bfloat16_rn(hv);
    }
    cluster.sync();  // no rank leaves, or stages the next pass, while another still reads its tile
    if constexpr (!kPasses) break;  // a cluster a block: one pass (and fewer registers: 63, not 78, at NT = 4)
  }
#endif
}

template <int MT>
constexpr int union_down_stage() {
  return kUnionGroup * kDownWRow + 16 * MT * kUnionHRowBytes;
}
// The stages (or the partial tile [16 MT][128] fp32 after them), then the rank's groups' neurons.
template <int MT>
std::size_t union_down_smem(long long n, int split) {
  constexpr std::size_t stages = static_cast<std::size_t>(kDownStages) * union_down_stage<MT>();
  constexpr std::size_t part = static_cast<std::size_t>(16) * MT * kDownCols * sizeof(float);
  const long long groups = (n + kUnionTile - 1) / kUnionTile * (kUnionTile / kUnionGroup);
  return (stages > part ? stages : part) + static_cast<std::size_t>((groups + split - 1) / split) * kUnionGroup * sizeof(int);
}

// MT 16-row blocks of the batch (m ≤ 16 · MT). Grid (split, k / 128), clusters (split, 1, 1).
template <int MT>
__global__ void __launch_bounds__(kUnionThreads) union_down_kernel(UnionFfnParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // clusters are sm_90's (launch_union refuses earlier devices)
#else
  constexpr int kStage = union_down_stage<MT>(), kWBytes = kUnionGroup * kDownWRow;
  constexpr int kPart = 16 * MT * kDownCols * static_cast<int>(sizeof(float));
  constexpr int kStagesBytes = kDownStages * kStage;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int s_grp[kUnionMaxGroups];
  __shared__ int s_ngrp;
  int* s_list = reinterpret_cast<int*>(smem + (kStagesBytes > kPart ? kStagesBytes : kPart));  // [j · 16 + i]: the rank's j-th group's neurons
  const ucg::cluster_group cluster = ucg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank()), split = static_cast<int>(cluster.num_blocks());
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int c0 = static_cast<int>(blockIdx.y) * kDownCols;
  if (warp == 0) union_groups(p, s_grp, &s_ngrp);
  __syncthreads();
  const int mine = s_ngrp > rank ? (s_ngrp - rank + split - 1) / split : 0;  // groups rank, rank + split, …
  for (int e = tid; e < mine * kUnionGroup; e += kUnionThreads)
    s_list[e] = __ldcg(p.list + s_grp[rank + (e / kUnionGroup) * split] + e % kUnionGroup);
  __syncthreads();
  const auto sbase = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  // The rank's j-th group into stage st: its 16 Wdᵀ rows' 128 columns (a chunk a thread), and h's
  // rows × its 16 slots (two chunks a row; zeros past m).
  const auto load_w = [&](int j, int st) {
    const int i = tid / 16, ch = tid % 16, nrn = s_list[j * kUnionGroup + i];
    cdev::cp_async16(sbase + st * kStage + i * kDownWRow + ch * 16,
                     p.w_down_t + static_cast<long long>(nrn < 0 ? 0 : nrn) * p.k + c0 + ch * 8, nrn >= 0);
  };
  const auto load_h = [&](int j, int st) {
    if (tid < 32 * MT) {
      const int row = tid / 2, hc = tid % 2;
      const long long slot0 = s_grp[rank + j * split];
      cdev::cp_async16(sbase + st * kStage + kWBytes + row * kUnionHRowBytes + hc * 16,
                       p.h + static_cast<long long>(row < p.m ? row : 0) * union_list_size(p.n) + slot0 + hc * 8, row < p.m);
    }
  };
  float acc[MT][2][4] = {};
  const int gq = lane / 4, t4 = lane % 4, mi = lane / 8, rr = lane % 8;
  // The first groups' Wdᵀ rows before the wait; commit group 0 then holds them and group 0's h,
  // commit group b (1 ≤ b < kDownStages − 1) group b's h, every later commit a whole group.
#pragma unroll
  for (int st = 0; st < kDownStages - 1; ++st)
    if (st < mine) load_w(st, st);
  cdev::pdl_begin();  // h is the up kernel's
#pragma unroll
  for (int st = 0; st < kDownStages - 1; ++st) {
    if (st < mine) load_h(st, st);
    cdev::cp_async_commit();
  }
  // The list kernel's count of fired pairs, complete now (the up kernel waited for that grid and
  // this one for the up kernel), published and zeroed for the next call by one thread while the
  // h copies are in flight.
  if (p.nnz && blockIdx.x == 0 && blockIdx.y == 0 && tid == 0) {
    const unsigned long long total = atomicExch(p.nnz, 0ull);
    if (p.nnz_out) *p.nnz_out = total;
  }
  for (int j = 0; j < mine; ++j) {
    cdev::cp_async_wait<kDownStages - 2>();  // group j is in (this thread's copies)
    __syncthreads();                         // ... every thread's, and group j − 1's buffer is read
    const int next = j + kDownStages - 1;
    if (next < mine) {
      load_w(next, next % kDownStages);
      load_h(next, next % kDownStages);
    }
    cdev::cp_async_commit();
    const std::uint32_t st = sbase + (j % kDownStages) * kStage;
    unsigned a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)  // A = h rows 16mt … (matrix mi: rows + 8 (mi & 1), slots + 8 (mi >> 1))
      cdev::ldmatrix_x4(st + kWBytes + (16 * mt + rr + (mi & 1) * 8) * kUnionHRowBytes + (mi >> 1) * 16, a[mt][0], a[mt][1],
                        a[mt][2], a[mt][3]);
    unsigned v0, v1, v2, v3;  // B = the Wdᵀ rows, columns 16 warp … + 15 (matrix mi: k + 8 (mi & 1), columns + 8 (mi >> 1))
    cdev::ldmatrix_x4_trans(st + (rr + (mi & 1) * 8) * kDownWRow + (2 * warp + (mi >> 1)) * 16, v0, v1, v2, v3);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      cdev::mma_16816_bf16(acc[mt][0], a[mt][0], a[mt][1], a[mt][2], a[mt][3], v0, v1);
      cdev::mma_16816_bf16(acc[mt][1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], v2, v3);
    }
  }
  cdev::cp_async_wait<0>();
  __syncthreads();  // every warp done with the stages: the area holds the partial tile now
  float* part = reinterpret_cast<float*>(smem);  // [row][column]
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nb = 0; nb < 2; ++nb) {
      float* r0 = part + (16 * mt + gq) * kDownCols + 16 * warp + 8 * nb + 2 * t4;
      r0[0] = acc[mt][nb][0];
      r0[1] = acc[mt][nb][1];
      r0[8 * kDownCols] = acc[mt][nb][2];
      r0[8 * kDownCols + 1] = acc[mt][nb][3];
    }
  cluster.sync();  // every rank's partial tile is written
  const int outs = p.m * kDownCols, per = (outs + split - 1) / split;
  for (int idx = rank * per + tid; idx < min((rank + 1) * per, outs); idx += kUnionThreads) {
    p.y[static_cast<long long>(idx / kDownCols) * p.ld_y + c0 + idx % kDownCols] =
        __float2bfloat16_rn(rank_sum(cluster, part, idx, split));
  }
  cluster.sync();  // no rank leaves while another still reads its tile
#endif
}

// A launch of `split` CTAs a cluster along x (1: clusters of one), programmatic inside a
// ProgrammaticLaunch scope. The shared-memory opt-in on every launch, at the kernel's largest size
// (smem_max: the same value from every caller, so that no thread's launch lowers another's): the
// kernels' static shared memory counts against the 48 KB a launch gets without it.
void go(const void* kernel, const char* name, dim3 grid, int split, std::size_t smem, std::size_t smem_max,
        const UnionFfnParams& p, cudaStream_t s) {
  TWELL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_max)));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(kUnionThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[3];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(split);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1 + static_cast<unsigned>(launch_attributes(attr + 1, programmatic_launch_active()));
  void* args[] = {const_cast<UnionFfnParams*>(&p)};
  const cudaError_t e = cudaLaunchKernelExC(&cfg, kernel, args);
  if (e != cudaSuccess) detail::throw_cuda(e, name, __FILE__, __LINE__);
}

template <int NT>
void up(const UnionFfnParams& p, cudaStream_t s) {
  const std::int64_t blocks = union_tiles(p.n) * (kUnionTile / kUpSlots);  // 64-slot blocks the list could fill
  if (p.up_clusters > 0 && p.up_clusters < blocks) {
    go(reinterpret_cast<const void*>(union_up_kernel<NT, true>), "union_up_kernel", dim3(static_cast<unsigned>(p.up_split),
       static_cast<unsigned>(p.up_clusters)), p.up_split, union_up_smem<NT>(), union_up_smem<NT>(), p, s);
  } else {
    go(reinterpret_cast<const void*>(union_up_kernel<NT, false>), "union_up_kernel", dim3(static_cast<unsigned>(p.up_split),
       static_cast<unsigned>(blocks)), p.up_split, union_up_smem<NT>(), union_up_smem<NT>(), p, s);
  }
}
template <int MT>
void down(const UnionFfnParams& p, cudaStream_t s) {
  go(reinterpret_cast<const void*>(union_down_kernel<MT>), "union_down_kernel",
     dim3(static_cast<unsigned>(p.down_split), static_cast<unsigned>(p.k / kDownCols)), p.down_split,
     union_down_smem<MT>(p.n, p.down_split), union_down_smem<MT>(kUnionMaxN, 1), p, s);
}

}  // namespace

bool union_ffn_available(int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
    return false;
  if (major != 9 || minor != 0) return false;
  cudaFuncAttributes fa{};
  if (cudaFuncGetAttributes(&fa, union_up_kernel<8, false>) != cudaSuccess) return false;
  return fa.binaryVersion == 90;  // the sm_90a cubin (a build without it would run the sm_80 stub)
}

void launch_union_ffn(const UnionFfnParams& p, cudaStream_t stream, int parts) {
  TWELL_CU_REQUIRE(p.x && p.w_up && p.w_down_t && p.y && p.g && p.list && p.counts && p.h,
                   ErrorCode::invalid_argument, "union FFN: null pointer");
  TWELL_CU_REQUIRE(!p.nnz || ((parts & 3) == 3 && !(parts & kUnionSkipList)), ErrorCode::invalid_argument,
                   "union FFN: nnz needs the list kernel (which counts) and the down kernel (which publishes) in one call");
  const auto aligned = [](const void* q, std::uintptr_t a) { return reinterpret_cast<std::uintptr_t>(q) % a == 0; };
  TWELL_CU_REQUIRE(aligned(p.x, 16) && aligned(p.w_up, 16) && aligned(p.w_down_t, 16) && aligned(p.h, 16) && aligned(p.g, 8) &&
                       aligned(p.y, 2),
                   ErrorCode::invalid_argument, "union FFN: x, Wu, Wdᵀ and h must be 16-byte aligned, g 8-byte (16-byte copies, 8-byte loads)");
  TWELL_CU_REQUIRE(union_ffn_fits(p.m, p.n, p.k, p.gated) && p.ld_g >= p.n && p.ld_g % 4 == 0 && p.ld_x >= p.k &&
                       p.ld_x % 8 == 0 && p.ld_y >= p.k && p.ld_y % 8 == 0 && union_shape_ok(p.up_split, p.down_split, p.up_clusters),
                   ErrorCode::unsupported,
                   "union FFN: M = {} (1 … {}), N = {} (4 … {}, a multiple of 4), K = {} (a multiple of 128), gated {}, "
                   "ld_g {} (a multiple of 4, ≥ N), ld_x {} and ld_y {} (multiples of 8, ≥ K), splits {} / {} (1, 2, 4, 8), "
                   "up clusters {} (≥ 0) not supported",
                   p.m, kUnionMaxRows, p.n, kUnionMaxN, p.k, p.gated, p.ld_g, p.ld_x, p.ld_y, p.up_split, p.down_split,
                   p.up_clusters);
  if (parts & 1) {
    if (!(parts & kUnionSkipList))
      go(reinterpret_cast<const void*>(union_list_kernel), "union_list_kernel", dim3(static_cast<unsigned>(union_tiles(p.n))), 1,
         0, 0, p, stream);
    if (p.m <= 32)
      up<4>(p, stream);
    else
      up<8>(p, stream);
  }
  if (!(parts & 2)) return;
  switch ((p.m + 15) / 16) {
    case 1: down<1>(p, stream); break;
    case 2: down<2>(p, stream); break;
    case 3: down<3>(p, stream); break;
    default: down<4>(p, stream); break;
  }
}

}  // namespace twell::cuda
