// Dense rows of the sparse remainder (twell_dense_rows.hpp): plan, gather, h rows, scatter.
#include "cuda/sm80/twell_dense_rows.hpp"

#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>

#include "cuda/common/check.hpp"
#include "cuda/common/device_math.cuh"
#include "cuda/sm80/twell_kernels.hpp"

namespace twell::cuda {
namespace {

struct HotRow {
  const std::uint32_t* row_nnz;
  std::uint32_t row_cap;
  __device__ bool operator()(int r) const { return dense_row_hot(row_nnz[r], row_cap); }
};

// Per row: cost = count or row_cost (hot), hot = count > row_cap; warp sums, one atomic per warp.
__global__ void __launch_bounds__(256) dense_rows_stats_kernel(DenseRowsPlanParams p) {
  unsigned long long cost = 0, hot = 0, nnz = 0;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < p.m;
       r += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::uint32_t c = p.row_nnz[r];
    cost += dense_row_weight(c, p.row_cap, p.row_cost);
    hot += dense_row_hot(c, p.row_cap);
    nnz += c;
  }
  cost = dev::warp_sum(cost);
  hot = dev::warp_sum(hot);
  nnz = dev::warp_sum(nnz);
  if (threadIdx.x % 32 == 0) {
    if (cost) atomicAdd(&p.stats->cost, cost);
    if (hot) atomicAdd(&p.stats->hot, hot);
    if (nnz) atomicAdd(&p.stats->nnz, nnz);
  }
}

// Row i of the dense set, or −1 for a padding row (i ≥ min(selected, capacity)).
__device__ __forceinline__ int dense_row(const int* list, const int* selected, std::int64_t capacity, std::int64_t i) {
  const std::int64_t live = min(static_cast<std::int64_t>(*selected), capacity);
  return i < live ? list[i] : -1;
}

constexpr int kCopyThreads = 128;

__global__ void __launch_bounds__(kCopyThreads) dense_rows_gather_kernel(DenseRowsGatherParams p) {
  const std::int64_t i = blockIdx.x;
  const int r = dense_row(p.list, p.selected, p.capacity, i);
  if (threadIdx.x == 0) {
    if (r >= 0) p.row_dense[r] = 1u;
    if (i == 0) p.stats->dense = static_cast<unsigned long long>(min(static_cast<std::int64_t>(*p.selected), p.capacity));
  }
  if (!p.x) return;
  const bool vec_ok = (p.ld_x % 8 == 0) && ((reinterpret_cast<std::uintptr_t>(p.x) & 15) == 0);
  __nv_bfloat16* out = p.x_h + i * p.k;  // cudaMalloc'd, k % 8 == 0: 16-byte aligned
  for (std::int64_t c0 = static_cast<std::int64_t>(threadIdx.x) * 8; c0 < p.k; c0 += kCopyThreads * 8) {
    const uint4 v = r >= 0 ? dev::load8_bf16(p.x + static_cast<std::int64_t>(r) * p.ld_x, c0, p.k, vec_ok)
                           : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(out + c0) = v;
  }
}

// One warp per (dense row i, tile t); lane l owns columns [t·256 + 8l, +8). A non-overflowed block
// is scattered through the warp's 256 floats of shared memory; an overflowed one is read whole
// from the backup with the keep rule (the fused kernel's fallback, same values).
constexpr int kHWarps = 8;

__global__ void __launch_bounds__(kHWarps * 32) dense_rows_h_kernel(DenseRowsHParams p) {
  __shared__ float sg[kHWarps][kTwellTile];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int64_t tiles = (p.n + kTwellTile - 1) / kTwellTile;
  const std::int64_t tgroups = (tiles + kHWarps - 1) / kHWarps;
  const std::int64_t i = blockIdx.x / tgroups;
  const std::int64_t t = (blockIdx.x % tgroups) * kHWarps + warp;
  if (t >= tiles) return;  // warp-uniform; only warp-level synchronisation below
  const int r = dense_row(p.list, p.selected, p.capacity, i);
  const std::int64_t c0 = t * kTwellTile + lane * 8;
  const bool u_vec = (p.ld_u % 8 == 0) && ((reinterpret_cast<std::uintptr_t>(p.u) & 15) == 0);
  const uint4 uu = (p.u && r >= 0) ? dev::load8_bf16(p.u + i * p.ld_u, c0, p.n, u_vec) : make_uint4(0, 0, 0, 0);
  float g[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) g[e] = 0.0f;
  if (r >= 0) {
    const int S = p.words_per_tile;
    const std::uint32_t* blk = p.words + (static_cast<std::int64_t>(r) * tiles + t) * S;
    const std::uint32_t cnt = blk[0];
    if (cnt <= static_cast<std::uint32_t>(S - 1)) {
      float* s = sg[warp];
#pragma unroll
      for (int e = 0; e < 8; ++e) s[lane * 8 + e] = 0.0f;
      __syncwarp();
      for (std::uint32_t j = lane; j < cnt; j += 32) {
        const std::uint32_t w = blk[1 + j];
        s[w & 0xffu] = dev::hi_bf16(w);  // local column < 256
      }
      __syncwarp();
#pragma unroll
      for (int e = 0; e < 8; ++e) g[e] = s[lane * 8 + e];
    } else {
      const bool b_vec = (p.ld_backup % 8 == 0) && ((reinterpret_cast<std::uintptr_t>(p.backup) & 15) == 0);
      const uint4 b = dev::load8_bf16<false>(p.backup + static_cast<std::int64_t>(r) * p.ld_backup, c0, p.n, b_vec);
      const unsigned keep = dev::keep_mask8(b, p.relu);
      float f[8];
      dev::unpack8_bf16(b, f);
#pragma unroll
      for (int e = 0; e < 8; ++e) g[e] = (keep >> e) & 1u ? f[e] : 0.0f;
    }
  }
  if (p.u) {
    float u[8];
    dev::unpack8_bf16(uu, u);
#pragma unroll
    for (int e = 0; e < 8; ++e) g[e] *= u[e];
  }
  if (c0 < p.ld_h) {  // ld_h % 8 == 0, so the whole 16-byte word lies inside the row
#pragma unroll
    for (int e = 0; e < 8; ++e)
      if (c0 + e >= p.n) g[e] = 0.0f;
    *reinterpret_cast<uint4*>(p.h + i * p.ld_h + c0) = dev::pack8_bf16(g);
  }
}

__global__ void __launch_bounds__(kCopyThreads) dense_rows_scatter_kernel(DenseRowsScatterParams p) {
  const std::int64_t i = blockIdx.x;
  const int r = dense_row(p.list, p.selected, p.capacity, i);
  if (r < 0) return;
  const bool vec_ok = (p.ld_y % 8 == 0) && ((reinterpret_cast<std::uintptr_t>(p.y) & 15) == 0);
  const __nv_bfloat16* src = p.y_h + i * p.k;
  __nv_bfloat16* dst = p.y + static_cast<std::int64_t>(r) * p.ld_y;
  for (std::int64_t c0 = static_cast<std::int64_t>(threadIdx.x) * 8; c0 < p.k; c0 += kCopyThreads * 8) {
    const uint4 v = *reinterpret_cast<const uint4*>(src + c0);
    if (vec_ok) {
      *reinterpret_cast<uint4*>(dst + c0) = v;
    } else {
      const std::uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 8; ++e) dst[c0 + e] = __ushort_as_bfloat16(static_cast<unsigned short>(w[e / 2] >> (16 * (e % 2))));
    }
  }
}

unsigned capacity_blocks(std::int64_t capacity, std::int64_t per_row, const char* what) {
  const std::int64_t b = capacity * per_row;
  TWELL_CU_REQUIRE(capacity >= 1 && b <= 0x7fffffff, ErrorCode::unsupported, "{}: capacity {} out of range", what, capacity);
  return static_cast<unsigned>(b);
}

}  // namespace

std::size_t dense_rows_plan_temp_bytes(std::int64_t m) {
  // CUB's size query costs host time (≈ 10 µs at a repeated M, hundreds at a new one, measured by
  // lab/probes/probe_decode.cpp); every sparse call with dense rows asks it. The answer depends on M
  // and the device only: kept per thread for the last (device, M).
  thread_local int last_device = -1;
  thread_local std::int64_t last_m = -1;
  thread_local std::size_t last_bytes = 0;
  int device = 0;
  TWELL_CUDA_CHECK(cudaGetDevice(&device));
  if (device == last_device && m == last_m) return last_bytes;
  std::size_t bytes = 0;
  TWELL_CUDA_CHECK(cub::DeviceSelect::If(nullptr, bytes, thrust::counting_iterator<int>(0), static_cast<int*>(nullptr),
                                         static_cast<int*>(nullptr), static_cast<int>(m), HotRow{nullptr, 0}));
  last_device = device;
  last_m = m;
  last_bytes = bytes;
  return bytes;
}

void launch_dense_rows_plan(const DenseRowsPlanParams& p, cudaStream_t stream) {
  TWELL_CU_REQUIRE(p.row_nnz && p.stats, ErrorCode::invalid_argument, "dense rows plan: null pointer");
  TWELL_CU_REQUIRE(p.m >= 1 && p.m <= 0x7fffffff, ErrorCode::unsupported, "dense rows plan: M = {} out of range", p.m);
  TWELL_CUDA_CHECK(cudaMemsetAsync(p.stats, 0, sizeof(DenseRowsStats), stream));
  dense_rows_stats_kernel<<<std::min(grid_stride_blocks(p.m, 256), 264u), 256, 0, stream>>>(p);
  TWELL_CUDA_CHECK_LAUNCH("dense_rows_stats_kernel");
  if (!p.list) return;
  TWELL_CU_REQUIRE(p.selected && p.temp && p.temp_bytes >= dense_rows_plan_temp_bytes(p.m), ErrorCode::invalid_argument,
                   "dense rows plan: list without its count or scratch");
  std::size_t bytes = p.temp_bytes;
  TWELL_CUDA_CHECK(cub::DeviceSelect::If(p.temp, bytes, thrust::counting_iterator<int>(0), p.list, p.selected,
                                         static_cast<int>(p.m), HotRow{p.row_nnz, p.row_cap}, stream));
}

void launch_dense_rows_gather(const DenseRowsGatherParams& p, cudaStream_t stream) {
  TWELL_CU_REQUIRE(p.list && p.selected && p.row_dense && p.stats && (!p.x || p.x_h), ErrorCode::invalid_argument,
                   "dense rows gather: null pointer");
  TWELL_CU_REQUIRE(!p.x || (p.k >= 8 && p.k % 8 == 0), ErrorCode::unsupported, "dense rows gather: K = {} not a multiple of 8", p.k);
  TWELL_CUDA_CHECK(cudaMemsetAsync(p.row_dense, 0, static_cast<std::size_t>(p.m) * sizeof(std::uint32_t), stream));
  dense_rows_gather_kernel<<<capacity_blocks(p.capacity, 1, "dense rows gather"), kCopyThreads, 0, stream>>>(p);
  TWELL_CUDA_CHECK_LAUNCH("dense_rows_gather_kernel");
}

void launch_dense_rows_h(const DenseRowsHParams& p, cudaStream_t stream) {
  TWELL_CU_REQUIRE(p.list && p.selected && p.words && p.backup && p.h, ErrorCode::invalid_argument,
                   "dense rows h: null pointer");
  TWELL_CU_REQUIRE(p.n >= 1 && p.ld_h >= p.n && p.ld_h % 8 == 0 && (!p.u || p.ld_u >= p.n), ErrorCode::invalid_argument,
                   "dense rows h: bad shape n = {}, ld_h = {}", p.n, p.ld_h);
  TWELL_CU_REQUIRE(p.words_per_tile >= 2 && p.words_per_tile <= 128 && kTwellTile % p.words_per_tile == 0,
                   ErrorCode::unsupported, "dense rows h: S = {} not supported", p.words_per_tile);
  const std::int64_t tiles = (p.n + kTwellTile - 1) / kTwellTile;
  const std::int64_t tgroups = (tiles + kHWarps - 1) / kHWarps;
  dense_rows_h_kernel<<<capacity_blocks(p.capacity, tgroups, "dense rows h"), kHWarps * 32, 0, stream>>>(p);
  TWELL_CUDA_CHECK_LAUNCH("dense_rows_h_kernel");
}

void launch_dense_rows_scatter(const DenseRowsScatterParams& p, cudaStream_t stream) {
  TWELL_CU_REQUIRE(p.list && p.selected && p.y_h && p.y, ErrorCode::invalid_argument, "dense rows scatter: null pointer");
  TWELL_CU_REQUIRE(p.k >= 8 && p.k % 8 == 0, ErrorCode::unsupported, "dense rows scatter: K = {} not a multiple of 8", p.k);
  dense_rows_scatter_kernel<<<capacity_blocks(p.capacity, 1, "dense rows scatter"), kCopyThreads, 0, stream>>>(p);
  TWELL_CUDA_CHECK_LAUNCH("dense_rows_scatter_kernel");
}

}  // namespace twell::cuda
