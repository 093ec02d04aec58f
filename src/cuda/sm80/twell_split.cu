// The split sparse remainder: the plan of the h list and the weight-stationary down kernel
// (formats and invariants in twell_split.hpp; the up half is twell_up_down with hl_words).
#include "cuda/sm80/twell_split.hpp"

#include <cub/block/block_scan.cuh>

#include <algorithm>

#include "cuda/common/check.hpp"
#include "cuda/common/device_math.cuh"

namespace twell::cuda {
namespace {

// ---------------------------------------------------------------------------------------------
// Plan: one CTA. Per class c = token mod 4, a counting sort by count (counts ≥ kPlanBins − 1 share
// the last bin); the i-th token of class c (ascending count) goes to group i / 4, position
// 4·(i mod 4) + c. A group's length is its longest member's count rounded up to 4 (atomicMax
// into len, zeroed first), then a block scan gives the offsets. The order within a bin follows
// the atomics (not reproducible), which changes the grouping only: a token's entries and their
// order depend on the token alone.
constexpr int kPlanThreads = 512;  // 128 registers per thread: the 64-bit scan does not spill
constexpr int kPlanBins = 2 * kPlanThreads;

__global__ void __launch_bounds__(kPlanThreads) split_plan_kernel(SplitPlanParams p) {
  using BlockScanInt = cub::BlockScan<int, kPlanThreads>;
  using BlockScanLong = cub::BlockScan<long long, kPlanThreads>;
  __shared__ int hist[4][kPlanBins];
  __shared__ union {
    typename BlockScanInt::TempStorage i;
    typename BlockScanLong::TempStorage l;
  } scan_tmp;
  const int tid = threadIdx.x;
  const std::int64_t groups = split_groups(p.m);
  for (int c = 0; c < 4; ++c) hist[c][2 * tid] = hist[c][2 * tid + 1] = 0;
  for (std::int64_t r = tid; r < groups * kHListGroup; r += kPlanThreads) p.tok[r] = -1;
  for (std::int64_t g = tid; g < groups; g += kPlanThreads) p.len[g] = 0;
  __syncthreads();
  for (std::int64_t t = tid; t < p.m; t += kPlanThreads)
    atomicAdd(&hist[t & 3][min(p.row_nnz[t], static_cast<std::uint32_t>(kPlanBins - 1))], 1);
  __syncthreads();
  for (int c = 0; c < 4; ++c) {
    int v[2] = {hist[c][2 * tid], hist[c][2 * tid + 1]};
    BlockScanInt(scan_tmp.i).ExclusiveSum(v, v);
    __syncthreads();
    hist[c][2 * tid] = v[0];
    hist[c][2 * tid + 1] = v[1];
  }
  __syncthreads();
  for (std::int64_t t = tid; t < p.m; t += kPlanThreads) {
    const std::uint32_t cnt = p.row_nnz[t];
    const int c = static_cast<int>(t & 3);
    const int i = atomicAdd(&hist[c][min(cnt, static_cast<std::uint32_t>(kPlanBins - 1))], 1);
    const int g = i / 4, r = g * kHListGroup + 4 * (i % 4) + c;
    p.pos[t] = r;
    p.tok[r] = static_cast<int>(t);
    atomicMax(p.len + g, static_cast<int>((cnt + 3) / 4 * 4));
  }
  __syncthreads();  // the block's global writes (len) are visible to the block after this
  long long carry = 0;
  for (std::int64_t g0 = 0; g0 < groups; g0 += kPlanThreads) {
    const std::int64_t g = g0 + tid;
    const long long words = g < groups ? static_cast<long long>(__ldcg(p.len + g)) * kHListGroup : 0;
    long long ex = 0, agg = 0;
    BlockScanLong(scan_tmp.l).ExclusiveSum(words, ex, agg);
    __syncthreads();
    if (g < groups) p.base[g] = carry + ex;
    carry += agg;
  }
  if (tid == 0) {
    *p.enable = carry <= p.capacity ? 1u : 0u;
    if (p.words_needed) *p.words_needed = static_cast<unsigned long long>(carry);
  }
}

// ---------------------------------------------------------------------------------------------
// Down: one CTA per (slice of 16 columns of K, split). Wdᵀ[:, slice] is staged in shared memory
// at the slots of twell_split.hpp (N·32 bytes, padded to Q·128). Each warp takes whole groups:
// lane 2q + half serves the token at position q, columns [8·half, 8·half + 8) of the slice, with
// 8 fp32 accumulators; a step reads 4 entries per token (one 16-byte load, 256 contiguous bytes
// per warp) and, per non-zero entry, one 16-byte shared-memory read and 8 FMAs.
constexpr int kDownThreads = 1024;
constexpr int kSliceCols = 16;

__device__ __forceinline__ void down_entry(std::uint32_t e, const unsigned char* sbase, float* acc) {
  if (e == 0u) return;  // padding (or h = +0 at slot 0: no contribution either way)
  const uint4 w = *reinterpret_cast<const uint4*>(sbase + (e & ((1u << kHListSlotBits) - 1u)) * 32u);
  dev::axpy8(__uint_as_float(e & ~((1u << kHListSlotBits) - 1u)), w, acc);
}

__global__ void __launch_bounds__(kDownThreads, 1) twell_down_sliced_kernel(TwellDownSlicedParams p, int splits) {
  if (p.enable && *p.enable == 0u) return;
  extern __shared__ __align__(16) unsigned char smem[];
  const int slices = static_cast<int>((p.k + kSliceCols - 1) / kSliceCols);
  const int slice = static_cast<int>(blockIdx.x) % slices, split = static_cast<int>(blockIdx.x) / slices;
  const std::int64_t col0 = static_cast<std::int64_t>(slice) * kSliceCols;
  const int quarter = split_quarter_tiles(p.n) * kTwellTile;

  // Stage the slice: row n's halves at slot (n mod Q)·4 + n / Q; columns ≥ K read as zero.
  for (std::int64_t i = threadIdx.x; i < 2 * p.n; i += kDownThreads) {
    const int n = static_cast<int>(i >> 1), half = static_cast<int>(i & 1);
    const std::int64_t c = col0 + half * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (c < p.k) v = __ldg(reinterpret_cast<const uint4*>(p.w_down_t + static_cast<std::int64_t>(n) * p.k + c));
    const int slot = (n % quarter) * 4 + n / quarter;
    *reinterpret_cast<uint4*>(smem + slot * 32 + half * 16) = v;
  }
  __syncthreads();

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int q = lane >> 1, half = lane & 1;
  const unsigned char* sbase = smem + half * 16;
  const std::int64_t c_out = col0 + half * 8;
  constexpr int kWarps = kDownThreads / 32;
  for (std::int64_t g = static_cast<std::int64_t>(split) * kWarps + warp; g < p.groups;
       g += static_cast<std::int64_t>(splits) * kWarps) {
    const int tok = p.tok[g * kHListGroup + q];
    const int steps = tok >= 0 ? p.len[g] / 4 : 0;  // empty positions read nothing
    const uint4* src = reinterpret_cast<const uint4*>(p.words + p.base[g]) + q;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    // Two steps in flight ahead of the one being used.
    uint4 e0 = steps > 0 ? __ldg(src) : make_uint4(0, 0, 0, 0);
    uint4 e1 = steps > 1 ? __ldg(src + kHListGroup) : make_uint4(0, 0, 0, 0);
    for (int i = 0; i < steps; ++i) {
      const uint4 cur = e0;
      e0 = e1;
      if (i + 2 < steps) e1 = __ldg(src + static_cast<std::int64_t>(i + 2) * kHListGroup);
      down_entry(cur.x, sbase, acc);
      down_entry(cur.y, sbase, acc);
      down_entry(cur.z, sbase, acc);
      down_entry(cur.w, sbase, acc);
    }
    if (tok >= 0 && c_out < p.k)
      __stcs(reinterpret_cast<uint4*>(p.y + static_cast<std::int64_t>(tok) * p.ld_y + c_out), dev::pack8_bf16(acc));
  }
}

}  // namespace

void launch_split_plan(const SplitPlanParams& p, cudaStream_t stream) {
  TWELL_CU_REQUIRE(p.row_nnz && p.pos && p.tok && p.base && p.len && p.enable, ErrorCode::invalid_argument,
                   "split plan: null pointer");
  TWELL_CU_REQUIRE(p.m >= 1 && split_groups(p.m) * kHListGroup <= 0x7fffffff, ErrorCode::unsupported,
                   "split plan: M = {} out of range", p.m);
  split_plan_kernel<<<1, kPlanThreads, 0, stream>>>(p);
  TWELL_CUDA_CHECK_LAUNCH("split_plan_kernel");
}

void launch_twell_down_sliced(const TwellDownSlicedParams& p, cudaStream_t stream) {
  TWELL_CU_REQUIRE(p.words && p.tok && p.base && p.len && p.w_down_t && p.y, ErrorCode::invalid_argument,
                   "twell down (sliced): null pointer");
  TWELL_CU_REQUIRE(p.m >= 1 && p.k >= 8 && p.k % 8 == 0 && p.ld_y % 8 == 0 && p.groups == split_groups(p.m),
                   ErrorCode::invalid_argument, "twell down (sliced): bad shape m={} k={} ld_y={}", p.m, p.k, p.ld_y);
  TWELL_CU_REQUIRE(split_supported(p.n), ErrorCode::unsupported,
                   "twell down (sliced): N = {} too large for a shared-memory slice (N ≤ {})", p.n,
                   kSplitMaxQuarterTiles * 4 * kTwellTile);
  const std::int64_t slices = (p.k + kSliceCols - 1) / kSliceCols;
  const int splits = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(p.sm_count / slices, p.groups)));
  const std::size_t smem = split_smem_bytes(p.n);
  TWELL_CUDA_CHECK(cudaFuncSetAttribute(twell_down_sliced_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
  twell_down_sliced_kernel<<<static_cast<unsigned>(slices * splits), kDownThreads, smem, stream>>>(p, splits);
  TWELL_CUDA_CHECK_LAUNCH("twell_down_sliced_kernel");
}

}  // namespace twell::cuda
