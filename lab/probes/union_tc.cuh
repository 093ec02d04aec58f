#pragma once
// The decode FFN's union on tensor cores, for 17–64 rows (docs/runtime.md, plan step 2): after the
// cuBLASLt ReLU gate g [m, n], each neuron that some row fired has its Wu and Wdᵀ rows read once for
// the whole batch, where the decode kernel reads them once a row that fired them.
//   union_up_kernel   a CTA (tile t of 256 neurons, group s of 16): scans its tile's g for the
//                     neurons some row fired (ascending: the tile's list), keeps list entries
//                     16s … 16s + 15 (a CTA past the tile's count leaves at once), and forms
//                     h[tok, slot] = bf16(g[tok, n] · ⟨x[tok], Wu[n]⟩) for its 16 neurons and every
//                     row on tensor cores: Wu's rows as mma's A, x's rows as B, the 8 warps over K in
//                     eighths, summed in warp order. Writes the tile's count (group 0), its list and h
//                     at slots t · 256 + 16s + i (padding slots past the count: neuron −1, h 0).
//   union_down_kernel a CTA CW columns of y, 4 warps: the union's groups of 16 in tile order, group
//                     i to warp i % 4; a warp streams its groups' h [rows × 16] and Wdᵀ rows [16 × CW]
//                     through shared memory (cp.async, kStages in flight, zero-filled past the list)
//                     and adds h · Wdᵀ on tensor cores; the warps' sums are added in warp order and y
//                     rounded to bf16 once. No partial sums leave the CTA, no tickets.
// h is rounded to bf16 as the dense FFN rounds it. The order of every sum is fixed by the union, so
// replays give the same bits; a row's bits depend on which neurons the other rows fired (its 16-slot
// groups, its sums' grouping), as the dense path's do on M. Requires m ≤ 64, n ≤ 8192, k a multiple
// of 512 (8 warps × 4 k-steps of 16).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/device_math.cuh"

namespace twell::probe {

namespace cdev = twell::cuda::dev;

constexpr int kUnionTile = 256;       // neurons a list tile (a CTA's scan, a thread each)
constexpr int kUnionGroup = 16;       // listed neurons an up CTA, and a down step's k
constexpr int kUnionMaxRows = 64;
constexpr int kUnionMaxTiles = 32;    // n ≤ 8192
constexpr int kUnionDownWarps = 4;
constexpr int kUnionStages = 4;       // a down warp's groups in flight
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

__device__ __forceinline__ unsigned ld32(const __nv_bfloat16* p) { return __ldg(reinterpret_cast<const unsigned*>(p)); }

// NT: 8-row blocks of the batch (m ≤ 8 · NT).
template <int NT>
__global__ void __launch_bounds__(256) union_up_kernel(UnionParams p) {
  constexpr int kWarps = 8, kRows = 8 * NT;
  __shared__ int s_warp[kWarps];
  __shared__ int s_nrn[kUnionGroup];
  __shared__ float s_u[kWarps][kUnionGroup][kRows + 1];
  const int t = static_cast<int>(blockIdx.x), s = static_cast<int>(blockIdx.y);
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const long long nrn = static_cast<long long>(t) * kUnionTile + tid;
  // The scan: thread tid's neuron fired by any row (8 rows' loads in flight at a time).
  bool fired = false;
  if (nrn < p.n)
    for (int r0 = 0; r0 < p.m; r0 += 8) {
      bool f = false;
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (r0 + i < p.m) f |= __bfloat162float(p.g[static_cast<long long>(r0 + i) * p.n + nrn]) > 0.0f;
      fired |= f;
    }
  const unsigned b = __ballot_sync(0xffffffffu, fired);
  if (lane == 0) s_warp[warp] = __popc(b);
  __syncthreads();
  int before = 0, count = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    before += w < warp ? s_warp[w] : 0;
    count += s_warp[w];
  }
  if (s == 0 && tid == 0) p.counts[t] = count;
  if (kUnionGroup * s >= count) return;  // count is the CTA's: every thread leaves
  const int pos = before + __popc(b & ((1u << lane) - 1u)) - kUnionGroup * s;
  if (fired && pos >= 0 && pos < kUnionGroup) s_nrn[pos] = static_cast<int>(nrn);
  if (tid < kUnionGroup && kUnionGroup * s + tid >= count) s_nrn[tid] = -1;
  __syncthreads();
  const long long slot0 = static_cast<long long>(t) * kUnionTile + kUnionGroup * s;
  if (tid < kUnionGroup) p.list[slot0 + tid] = s_nrn[tid];
  // u = Wu · xᵀ: A = the 16 Wu rows (row g: neuron s_nrn[g]), B = x's rows (column g of n-block j: row 8j + g).
  const int g = lane / 4, t4 = lane % 4;
  const int na = s_nrn[g], nb = s_nrn[g + 8];
  const __nv_bfloat16* wa = p.w_up + static_cast<long long>(na < 0 ? 0 : na) * p.k + 2 * t4;
  const __nv_bfloat16* wb = p.w_up + static_cast<long long>(nb < 0 ? 0 : nb) * p.k + 2 * t4;
  const __nv_bfloat16* xr[NT];
  bool xin[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    xin[j] = 8 * j + g < p.m;
    xr[j] = p.x + static_cast<long long>(xin[j] ? 8 * j + g : 0) * p.k + 2 * t4;
  }
  float acc[NT][4] = {};
  const int kw = p.k / kWarps, kbeg = warp * kw;
  for (int k0 = kbeg; k0 < kbeg + kw; k0 += 64) {  // 4 k-steps: their loads first, then the mma
    unsigned a[4][4], bx[4][NT][2];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int kk = k0 + 16 * q;
      a[q][0] = na >= 0 ? ld32(wa + kk) : 0u;
      a[q][1] = nb >= 0 ? ld32(wb + kk) : 0u;
      a[q][2] = na >= 0 ? ld32(wa + kk + 8) : 0u;
      a[q][3] = nb >= 0 ? ld32(wb + kk + 8) : 0u;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        bx[q][j][0] = xin[j] ? ld32(xr[j] + kk) : 0u;
        bx[q][j][1] = xin[j] ? ld32(xr[j] + kk + 8) : 0u;
      }
    }
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int j = 0; j < NT; ++j) cdev::mma_16816_bf16(acc[j], a[q][0], a[q][1], a[q][2], a[q][3], bx[q][j][0], bx[q][j][1]);
  }
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    s_u[warp][g][8 * j + 2 * t4] = acc[j][0];
    s_u[warp][g][8 * j + 2 * t4 + 1] = acc[j][1];
    s_u[warp][g + 8][8 * j + 2 * t4] = acc[j][2];
    s_u[warp][g + 8][8 * j + 2 * t4 + 1] = acc[j][3];
  }
  __syncthreads();
  // h = g · u (the warps' sums in warp order), bf16 once; 0 at padding slots.
  for (int o = tid; o < kUnionGroup * p.m; o += 256) {
    const int i = o % kUnionGroup, row = o / kUnionGroup, n_i = s_nrn[i];
    float u = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) u += s_u[w][i][row];
    const float hv = n_i >= 0 ? __bfloat162float(p.g[static_cast<long long>(row) * p.n + n_i]) * u : 0.0f;
    p.h[row * p.hs + slot0 + i] = __float2bfloat16_rn(hv);
  }
}

template <int CW, int MT>
constexpr int union_stage_bytes() {
  return kUnionGroup * (CW * 2 + 16) + 16 * MT * kUnionHRowBytes;
}
template <int CW, int MT>
constexpr std::size_t union_down_smem(long long n) {
  constexpr std::size_t stages = static_cast<std::size_t>(kUnionDownWarps) * kUnionStages * union_stage_bytes<CW, MT>();
  constexpr std::size_t red = static_cast<std::size_t>(kUnionDownWarps) * 16 * MT * CW * sizeof(float);
  return (stages > red ? stages : red) + static_cast<std::size_t>((n + kUnionTile - 1) / kUnionTile) * kUnionTile * sizeof(int);
}

// CW columns of y a CTA (16 or 32), MT 16-row blocks of the batch (m ≤ 16 · MT).
template <int CW, int MT>
__global__ void __launch_bounds__(kUnionDownWarps * 32) union_down_kernel(UnionParams p) {
  constexpr int kRowW = CW * 2 + 16;  // a staged Wdᵀ row (bytes): CW columns + 16 of padding
  constexpr int kStage = union_stage_bytes<CW, MT>(), kWBytes = kUnionGroup * kRowW;
  constexpr int kRed = kUnionDownWarps * 16 * MT * CW * static_cast<int>(sizeof(float));
  constexpr int kStagesBytes = kUnionDownWarps * kUnionStages * kStage;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int s_grp[kUnionMaxTiles * (kUnionTile / kUnionGroup)];  // a group's first slot
  __shared__ int s_ngrp;
  int* s_list = reinterpret_cast<int*>(smem + (kStagesBytes > kRed ? kStagesBytes : kRed));  // [group · 16 + i] its neurons
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int c0 = static_cast<int>(blockIdx.x) * CW;
  const int tiles = static_cast<int>((p.n + kUnionTile - 1) / kUnionTile);
  if (warp == 0) {  // the groups in tile order: a prefix sum of the tiles' group counts
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
    if (lane == 0) s_ngrp = base;
  }
  __syncthreads();
  const int groups = s_ngrp;
  for (int e = tid; e < groups * kUnionGroup; e += kUnionDownWarps * 32)
    s_list[e] = p.list[s_grp[e / kUnionGroup] + e % kUnionGroup];
  __syncthreads();
  const auto sbase = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem)) + warp * kUnionStages * kStage;
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
      cdev::cp_async16(d + kWBytes + row * kUnionHRowBytes + ch * 16, p.h + static_cast<long long>(row < p.m ? row : 0) * p.hs + slot0 + ch * 8,
                       row < p.m);
    }
  };
  float acc[MT][CW / 8][4] = {};
  const int g = lane / 4, t4 = lane % 4, mi = lane / 8, rr = lane % 8;
#pragma unroll
  for (int st = 0; st < kUnionStages - 1; ++st) {
    const int gi = warp + kUnionDownWarps * st;
    if (gi < groups) load(gi, st);
    cdev::cp_async_commit();
  }
  for (int gi = warp, i = 0; gi < groups; gi += kUnionDownWarps, ++i) {
    const int nx = gi + kUnionDownWarps * (kUnionStages - 1);
    if (nx < groups) load(nx, (i + kUnionStages - 1) % kUnionStages);
    cdev::cp_async_commit();
    cdev::cp_async_wait<kUnionStages - 1>();
    __syncwarp();
    const std::uint32_t st = sbase + (i % kUnionStages) * kStage;
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
  for (int o = tid; o < p.m * CW; o += kUnionDownWarps * 32) {
    const int row = o / CW, col = o % CW;
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kUnionDownWarps; ++w) v += red[(w * 16 * MT + row) * CW + col];
    p.y[static_cast<long long>(row) * p.k + c0 + col] = __float2bfloat16_rn(v);
  }
}

// parts: bit 0 the up kernel, bit 1 the down kernel (one alone: the timing split). CW: 16 or 32.
inline cudaError_t launch_union(const UnionParams& p, int cw, int parts, cudaStream_t s) {
  const int tiles = static_cast<int>((p.n + kUnionTile - 1) / kUnionTile);
  if (parts & 1) {
    const dim3 grid(static_cast<unsigned>(tiles), kUnionTile / kUnionGroup);
    switch ((p.m + 7) / 8) {
      case 1: union_up_kernel<1><<<grid, 256, 0, s>>>(p); break;
      case 2: union_up_kernel<2><<<grid, 256, 0, s>>>(p); break;
      case 3: union_up_kernel<3><<<grid, 256, 0, s>>>(p); break;
      case 4: union_up_kernel<4><<<grid, 256, 0, s>>>(p); break;
      case 5: union_up_kernel<5><<<grid, 256, 0, s>>>(p); break;
      case 6: union_up_kernel<6><<<grid, 256, 0, s>>>(p); break;
      case 7: union_up_kernel<7><<<grid, 256, 0, s>>>(p); break;
      default: union_up_kernel<8><<<grid, 256, 0, s>>>(p); break;
    }
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  if (!(parts & 2)) return cudaSuccess;
  const auto go = [&](auto kernel, std::size_t smem, int width) {
    if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
        e != cudaSuccess)
      return e;
    kernel<<<static_cast<unsigned>(p.k / width), kUnionDownWarps * 32, smem, s>>>(p);
    return cudaGetLastError();
  };
  const int mt = (p.m + 15) / 16;
  if (cw == 16) {
    if (mt == 1) return go(union_down_kernel<16, 1>, union_down_smem<16, 1>(p.n), 16);
    if (mt == 2) return go(union_down_kernel<16, 2>, union_down_smem<16, 2>(p.n), 16);
    if (mt == 3) return go(union_down_kernel<16, 3>, union_down_smem<16, 3>(p.n), 16);
    return go(union_down_kernel<16, 4>, union_down_smem<16, 4>(p.n), 16);
  }
  if (mt == 1) return go(union_down_kernel<32, 1>, union_down_smem<32, 1>(p.n), 32);
  if (mt == 2) return go(union_down_kernel<32, 2>, union_down_smem<32, 2>(p.n), 32);
  if (mt == 3) return go(union_down_kernel<32, 3>, union_down_smem<32, 3>(p.n), 32);
  return go(union_down_kernel<32, 4>, union_down_smem<32, 4>(p.n), 32);
}

}  // namespace twell::probe
