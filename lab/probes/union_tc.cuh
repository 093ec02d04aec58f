#pragma once
// The decode FFN's union on tensor cores, for 17–64 rows (docs/runtime.md, plan step 2): after the
// cuBLASLt ReLU gate g [m, n], each neuron that some row fired has its Wu and Wdᵀ rows read once for
// the whole batch, where the decode kernel reads them once a row that fired them. Second form (the
// first, 08a0aac, scanned g in every up CTA and read x and h by small loads; docs/runtime.md):
//   union_list_kernel a CTA a tile of 256 neurons, a thread a neuron: every row's g loaded at once;
//                     the tile's fired neurons in ascending order at slots t · 256 + i, padded to a
//                     multiple of 16 with −1, and the tile's count.
//   union_up_kernel   a CTA GPC groups of 16 listed neurons (the groups in tile order, a prefix of
//                     the tiles' counts; CTAs past the last group leave): h[row, slot] =
//                     bf16(g[row, n] · ⟨x[row], Wu[n]⟩) on tensor cores. K in chunks of 128 through
//                     shared memory (cp.async, kUpStages in flight, 16-byte chunks stored at
//                     chunk ^ (row & 7) for ldmatrix): the chunk's Wu rows as mma's A, x's rows as B;
//                     warp w takes the batch's rows 8w … 8w + 7 for all of K, so each h is one warp's
//                     sum in k order.
//   union_down_kernel a CTA CW columns of y, 8 warps: the union's groups of 16 in tile order, group
//                     i to warp i % 8; a warp streams its groups' h [rows × 16] and Wdᵀ rows [16 ×
//                     CW] through shared memory (cp.async, kDownStages in flight, zero-filled past the
//                     list) and adds h · Wdᵀ on tensor cores; the warps' sums are added in warp
//                     order and y rounded to bf16 once. No partial sums leave the CTA, no tickets.
// h is rounded to bf16 as the dense FFN rounds it. The order of every sum is fixed by the union, so
// replays give the same bits; a row's bits depend on which neurons the other rows fired (its 16-slot
// groups, its sums' grouping), as the dense path's do on M. Requires m ≤ 64, n ≤ 8192, k a multiple
// of 128.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/device_math.cuh"

namespace twell::probe {

namespace cdev = twell::cuda::dev;

constexpr int kUnionTile = 256;       // neurons a list tile (a thread each)
constexpr int kUnionGroup = 16;       // listed neurons a group: an up m-tile, a down k-step
constexpr int kUnionMaxRows = 64;
constexpr int kUnionMaxTiles = 32;    // n ≤ 8192
constexpr int kUnionMaxGroups = kUnionMaxTiles * (kUnionTile / kUnionGroup);
constexpr int kUnionWarps = 8;        // up and down
constexpr int kUpChunk = 128;         // k a stage of the up kernel (256 bytes a row: 16 chunks)
constexpr int kUpStages = 4;
constexpr int kDownStages = 3;        // a down warp's groups in flight
constexpr int kUnionHRowBytes = 48;   // a staged h row: 16 slots (32 bytes) + 16 of padding (ldmatrix without bank conflicts)

struct UnionParams {
  const __nv_bfloat16* x = nullptr;         // [m, k], rows k apart
  const __nv_bfloat16* g = nullptr;         // [m, n] the gate after ReLU
  const __nv_bfloat16* w_up = nullptr;      // [n, k]
  const __nv_bfloat16* w_down_t = nullptr;  // [n, k]
  int* list = nullptr;                      // [tiles · 256] a slot's neuron (−1: padding)
  int* counts = nullptr;                    // [tiles] the tile's listed neurons
  __nv_bfloat16* h = nullptr;               // [64, tiles · 256], rows hs apart
  __nv_bfloat16* y = nullptr;               // [m, k]
  int m = 0, k = 0;
  long long n = 0, hs = 0;
};

__global__ void __launch_bounds__(kUnionTile) union_list_kernel(UnionParams p) {
  __shared__ int s_warp[kUnionTile / 32];
  const int t = static_cast<int>(blockIdx.x), tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const long long nrn = static_cast<long long>(t) * kUnionTile + tid;
  bool fired = false;
  if (nrn < p.n) {
    float v[kUnionMaxRows];  // every row's load in flight at once
#pragma unroll
    for (int r = 0; r < kUnionMaxRows; ++r) v[r] = r < p.m ? __bfloat162float(p.g[static_cast<long long>(r) * p.n + nrn]) : 0.0f;
#pragma unroll
    for (int r = 0; r < kUnionMaxRows; ++r) fired |= v[r] > 0.0f;
  }
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
}

// Warp 0: the union's groups in tile order (s_grp[i]: group i's first slot), their number in *s_ngrp.
__device__ __forceinline__ void union_groups(const UnionParams& p, int* s_grp, int* s_ngrp) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int tiles = static_cast<int>((p.n + kUnionTile - 1) / kUnionTile);
  int base = 0;
  for (int t0 = 0; t0 < tiles; t0 += 32) {
    const int t = t0 + lane;
    const int ng = t < tiles ? (p.counts[t] + kUnionGroup - 1) / kUnionGroup : 0;
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

template <int NT, int GPC>
constexpr std::size_t union_up_smem() {
  return static_cast<std::size_t>(kUpStages) * (kUnionGroup * GPC + 8 * NT) * kUpChunk * 2;
}

// NT: 8-row blocks of the batch (m ≤ 8 · NT); GPC: groups a CTA.
template <int NT, int GPC>
__global__ void __launch_bounds__(kUnionWarps * 32) union_up_kernel(UnionParams p) {
  constexpr int kARows = kUnionGroup * GPC, kRows = kARows + 8 * NT, kRowBytes = kUpChunk * 2, kCh = kUpChunk / 8;
  constexpr int kStage = kRows * kRowBytes;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int s_grp[kUnionMaxGroups];
  __shared__ int s_ngrp;
  __shared__ int s_nrn[kARows];
  __shared__ long long s_slot0[GPC];
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  if (warp == 0) union_groups(p, s_grp, &s_ngrp);
  __syncthreads();
  const int g0 = static_cast<int>(blockIdx.x) * GPC;
  if (g0 >= s_ngrp) return;  // the CTA's: every thread leaves
  if (tid < kARows) {
    const int gi = g0 + tid / kUnionGroup;
    s_nrn[tid] = gi < s_ngrp ? p.list[s_grp[gi] + tid % kUnionGroup] : -1;
    if (tid % kUnionGroup == 0) s_slot0[tid / kUnionGroup] = gi < s_ngrp ? s_grp[gi] : -1;
  }
  __syncthreads();
  const auto sbase = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  // Chunk c into stage st: rows 0 … kARows − 1 the groups' Wu rows, then x's rows (zero past m).
  const auto load = [&](int c, int st) {
    for (int e = tid; e < kRows * kCh; e += kUnionWarps * 32) {
      const int row = e / kCh, ch = e % kCh;
      const __nv_bfloat16* src;
      bool in;
      if (row < kARows) {
        const int nrn = s_nrn[row];
        in = nrn >= 0;
        src = p.w_up + static_cast<long long>(in ? nrn : 0) * p.k;
      } else {
        const int r = row - kARows;
        in = r < p.m;
        src = p.x + static_cast<long long>(in ? r : 0) * p.k;
      }
      cdev::cp_async16(sbase + st * kStage + row * kRowBytes + ((ch ^ (row & 7)) << 4), src + c * kUpChunk + ch * 8, in);
    }
  };
  const int chunks = p.k / kUpChunk;
#pragma unroll
  for (int st = 0; st < kUpStages - 1; ++st) {
    if (st < chunks) load(st, st);
    cdev::cp_async_commit();
  }
  float acc[GPC][4] = {};
  const int mi = lane / 8, rr = lane % 8;
  for (int c = 0; c < chunks; ++c) {
    if (c + kUpStages - 1 < chunks) load(c + kUpStages - 1, (c + kUpStages - 1) % kUpStages);
    cdev::cp_async_commit();
    cdev::cp_async_wait<kUpStages - 1>();
    __syncthreads();
    if (warp < NT) {
      const std::uint32_t st = sbase + (c % kUpStages) * kStage;
      const int xrow = kARows + 8 * warp + rr;
#pragma unroll
      for (int kp = 0; kp < kUpChunk / 32; ++kp) {  // two k-steps: B's four matrices are their k 0–7, 8–15
        unsigned b[4];
        cdev::ldmatrix_x4(st + xrow * kRowBytes + (((4 * kp + mi) ^ (xrow & 7)) << 4), b[0], b[1], b[2], b[3]);
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2)
#pragma unroll
          for (int q = 0; q < GPC; ++q) {  // A: matrix mi rows + 8 (mi & 1), k + 8 (mi >> 1)
            const int arow = kUnionGroup * q + rr + (mi & 1) * 8, ch = 2 * (2 * kp + h2) + (mi >> 1);
            unsigned a0, a1, a2, a3;
            cdev::ldmatrix_x4(st + arow * kRowBytes + ((ch ^ (arow & 7)) << 4), a0, a1, a2, a3);
            cdev::mma_16816_bf16(acc[q], a0, a1, a2, a3, b[2 * h2], b[2 * h2 + 1]);
          }
      }
    }
    __syncthreads();  // every warp done with this stage before a later load refills it
  }
  cdev::cp_async_wait<0>();
  // D: acc[q][0..1] neuron g of group q, rows 8 · warp + 2t, + 1; acc[q][2..3] neuron g + 8.
  if (warp < NT) {
    const int g = lane / 4, t4 = lane % 4;
#pragma unroll
    for (int q = 0; q < GPC; ++q) {
      if (s_slot0[q] < 0) continue;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = g + (e >> 1) * 8, row = 8 * warp + 2 * t4 + (e & 1), nrn = s_nrn[kUnionGroup * q + i];
        if (row >= p.m) continue;
        const float hv = nrn >= 0 ? __bfloat162float(p.g[static_cast<long long>(row) * p.n + nrn]) * acc[q][e] : 0.0f;
        p.h[row * p.hs + s_slot0[q] + i] = __float2bfloat16_rn(hv);
      }
    }
  }
}

template <int CW, int MT>
constexpr int union_stage_bytes() {
  return kUnionGroup * (CW * 2 + 16) + 16 * MT * kUnionHRowBytes;
}
template <int CW, int MT>
constexpr std::size_t union_down_smem(long long n) {
  constexpr std::size_t stages = static_cast<std::size_t>(kUnionWarps) * kDownStages * union_stage_bytes<CW, MT>();
  constexpr std::size_t red = static_cast<std::size_t>(kUnionWarps) * 16 * MT * CW * sizeof(float);
  return (stages > red ? stages : red) + static_cast<std::size_t>((n + kUnionTile - 1) / kUnionTile) * kUnionTile * sizeof(int);
}

// CW columns of y a CTA (16, 32 or 64), MT 16-row blocks of the batch (m ≤ 16 · MT).
template <int CW, int MT>
__global__ void __launch_bounds__(kUnionWarps * 32) union_down_kernel(UnionParams p) {
  constexpr int kRowW = CW * 2 + 16;  // a staged Wdᵀ row (bytes): CW columns + 16 of padding
  constexpr int kStage = union_stage_bytes<CW, MT>(), kWBytes = kUnionGroup * kRowW;
  constexpr int kRed = kUnionWarps * 16 * MT * CW * static_cast<int>(sizeof(float));
  constexpr int kStagesBytes = kUnionWarps * kDownStages * kStage;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int s_grp[kUnionMaxGroups];
  __shared__ int s_ngrp;
  int* s_list = reinterpret_cast<int*>(smem + (kStagesBytes > kRed ? kStagesBytes : kRed));  // [group · 16 + i] its neurons
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int c0 = static_cast<int>(blockIdx.x) * CW;
  if (warp == 0) union_groups(p, s_grp, &s_ngrp);
  __syncthreads();
  const int groups = s_ngrp;
  for (int e = tid; e < groups * kUnionGroup; e += kUnionWarps * 32) s_list[e] = p.list[s_grp[e / kUnionGroup] + e % kUnionGroup];
  __syncthreads();
  const auto sbase = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem)) + warp * kDownStages * kStage;
  // Group gi into stage st: its 16 Wdᵀ rows' CW columns, then h's rows × its 16 slots.
  const auto load = [&](int gi, int st) {
    const std::uint32_t d = sbase + st * kStage;
    for (int c = lane; c < kUnionGroup * (CW / 8); c += 32) {
      const int i = c / (CW / 8), ch = c % (CW / 8), nrn = s_list[gi * kUnionGroup + i];
      cdev::cp_async16(d + i * kRowW + ch * 16, p.w_down_t + static_cast<long long>(nrn < 0 ? 0 : nrn) * p.k + c0 + ch * 8,
                       nrn >= 0);
    }
    const long long slot0 = s_grp[gi];
    for (int c = lane; c < 16 * MT * 2; c += 32) {
      const int row = c / 2, ch = c % 2;
      const __nv_bfloat16* src = p.h + static_cast<long long>(row < p.m ? row : 0) * p.hs + slot0 + ch * 8;
      cdev::cp_async16(d + kWBytes + row * kUnionHRowBytes + ch * 16, src, row < p.m);
    }
  };
  float acc[MT][CW / 8][4] = {};
  const int g = lane / 4, t4 = lane % 4, mi = lane / 8, rr = lane % 8;
#pragma unroll
  for (int st = 0; st < kDownStages - 1; ++st) {
    const int gi = warp + kUnionWarps * st;
    if (gi < groups) load(gi, st);
    cdev::cp_async_commit();
  }
  for (int gi = warp, i = 0; gi < groups; gi += kUnionWarps, ++i) {
    const int nx = gi + kUnionWarps * (kDownStages - 1);
    if (nx < groups) load(nx, (i + kDownStages - 1) % kDownStages);
    cdev::cp_async_commit();
    cdev::cp_async_wait<kDownStages - 1>();
    __syncwarp();
    const std::uint32_t st = sbase + (i % kDownStages) * kStage;
    unsigned a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)  // A = h rows 16mt … (matrix mi: rows + 8 (mi & 1), slots + 8 (mi >> 1))
      cdev::ldmatrix_x4(st + kWBytes + (16 * mt + rr + (mi & 1) * 8) * kUnionHRowBytes + (mi >> 1) * 16, a[mt][0], a[mt][1],
                        a[mt][2], a[mt][3]);
#pragma unroll
    for (int j = 0; j < CW / 16; ++j) {  // B = the Wdᵀ rows, columns 16j … 16j + 15
      unsigned v0, v1, v2, v3;
      cdev::ldmatrix_x4_trans(st + (rr + (mi & 1) * 8) * kRowW + (2 * j + (mi >> 1)) * 16, v0, v1, v2, v3);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        cdev::mma_16816_bf16(acc[mt][2 * j], a[mt][0], a[mt][1], a[mt][2], a[mt][3], v0, v1);
        cdev::mma_16816_bf16(acc[mt][2 * j + 1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], v2, v3);
      }
    }
    __syncwarp();  // the warp done with the stage before a later load refills it
  }
  cdev::cp_async_wait<0>();
  __syncthreads();  // every warp done with its stages: the area holds the warps' sums now
  float* red = reinterpret_cast<float*>(smem);  // [warp][row][column]
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nb = 0; nb < CW / 8; ++nb) {
      float* r0 = red + (warp * 16 * MT + 16 * mt + g) * CW + 8 * nb + 2 * t4;
      r0[0] = acc[mt][nb][0];
      r0[1] = acc[mt][nb][1];
      r0[8 * CW] = acc[mt][nb][2];
      r0[8 * CW + 1] = acc[mt][nb][3];
    }
  __syncthreads();
  for (int o = tid; o < p.m * CW; o += kUnionWarps * 32) {
    const int row = o / CW, col = o % CW;
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kUnionWarps; ++w) v += red[(w * 16 * MT + row) * CW + col];
    p.y[static_cast<long long>(row) * p.k + c0 + col] = __float2bfloat16_rn(v);
  }
}

namespace union_detail {
// The opt-in on every launch: the kernels' static shared memory counts against the 48 KB a launch
// gets without it, so a dynamic size at or just below 48 KB needs it too.
inline cudaError_t go(const void* kernel, dim3 grid, std::size_t smem, const UnionParams& p, cudaStream_t s) {
  if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      e != cudaSuccess)
    return e;
  void* args[] = {const_cast<UnionParams*>(&p)};
  return cudaLaunchKernel(kernel, grid, dim3(kUnionWarps * 32), args, smem, s);
}
template <int NT, int GPC>
cudaError_t up(const UnionParams& p, cudaStream_t s) {
  const int tiles = static_cast<int>((p.n + kUnionTile - 1) / kUnionTile);
  const dim3 grid(static_cast<unsigned>((tiles * (kUnionTile / kUnionGroup) + GPC - 1) / GPC));
  return go(reinterpret_cast<const void*>(union_up_kernel<NT, GPC>), grid, union_up_smem<NT, GPC>(), p, s);
}
template <int GPC>
cudaError_t up_rows(const UnionParams& p, cudaStream_t s) {
  switch ((p.m + 7) / 8) {
    case 1: return up<1, GPC>(p, s);
    case 2: return up<2, GPC>(p, s);
    case 3: return up<3, GPC>(p, s);
    case 4: return up<4, GPC>(p, s);
    case 5: return up<5, GPC>(p, s);
    case 6: return up<6, GPC>(p, s);
    case 7: return up<7, GPC>(p, s);
    default: return up<8, GPC>(p, s);
  }
}
template <int CW, int MT>
cudaError_t down(const UnionParams& p, cudaStream_t s) {
  return go(reinterpret_cast<const void*>(union_down_kernel<CW, MT>), dim3(static_cast<unsigned>(p.k / CW)),
            union_down_smem<CW, MT>(p.n), p, s);
}
template <int CW>
cudaError_t down_rows(const UnionParams& p, cudaStream_t s) {
  switch ((p.m + 15) / 16) {
    case 1: return down<CW, 1>(p, s);
    case 2: return down<CW, 2>(p, s);
    case 3: return down<CW, 3>(p, s);
    default: return down<CW, 4>(p, s);
  }
}
}  // namespace union_detail

// parts: bit 0 the list and up kernels, bit 1 the down kernel (one alone: the timing split).
// gpc: groups an up CTA (1, 2 or 4: fewer CTAs, each x byte staged for more neurons); cw: columns a
// down CTA (16, 32 or 64). Anything else, or a shape past the limits above: cudaErrorInvalidValue.
inline cudaError_t launch_union(const UnionParams& p, int gpc, int cw, int parts, cudaStream_t s) {
  if (p.m < 1 || p.m > kUnionMaxRows || p.n < 1 || p.n > static_cast<long long>(kUnionMaxTiles) * kUnionTile || p.k < kUpChunk ||
      p.k % kUpChunk != 0 || (gpc != 1 && gpc != 2 && gpc != 4) || (cw != 16 && cw != 32 && cw != 64))
    return cudaErrorInvalidValue;
  if (parts & 1) {
    const int tiles = static_cast<int>((p.n + kUnionTile - 1) / kUnionTile);
    union_list_kernel<<<static_cast<unsigned>(tiles), kUnionTile, 0, s>>>(p);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    if (const cudaError_t e = gpc == 1   ? union_detail::up_rows<1>(p, s)
                              : gpc == 2 ? union_detail::up_rows<2>(p, s)
                                         : union_detail::up_rows<4>(p, s);
        e != cudaSuccess)
      return e;
  }
  if (!(parts & 2)) return cudaSuccess;
  if (cw == 16) return union_detail::down_rows<16>(p, s);
  if (cw == 32) return union_detail::down_rows<32>(p, s);
  return union_detail::down_rows<64>(p, s);
}

}  // namespace twell::probe
