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
// Plan: one CTA. Per class c = token mod 4, a counting sort by count (counts ≥ kTopBin share the
// last bin); the i-th token of class c (ascending count) goes to group i / 4, position
// 4·(i mod 4) + c. Shared-memory counters take warp-aggregated atomics (many tokens share a
// count). A group's length is its longest member's count rounded up to 4: below the top bin it is
// the bin of each class's last member in the group (a binary search over the bin ends), in the
// top bin a global atomicMax over those members. Then a block scan gives the offsets. The order
// within a bin follows the atomics (not reproducible); that changes the grouping only: a token's
// entries and their order depend on the token alone.
constexpr int kPlanThreads = 512;
constexpr int kPlanBins = 2 * kPlanThreads;
constexpr std::uint32_t kTopBin = kPlanBins - 1;

// Adds 1 to counter[key] for every active lane; returns the lane's rank among all adds to that
// counter (the counter's old value plus the lane's place among its warp peers).
__device__ __forceinline__ int aggregated_increment(int* counter, int key, bool active) {
  const unsigned mask = __ballot_sync(0xffffffffu, active);
  if (!active) return 0;
  const unsigned peers = __match_any_sync(mask, key);
  const int lane = static_cast<int>(threadIdx.x % 32), leader = __ffs(peers) - 1;
  int base = 0;
  if (lane == leader) base = atomicAdd(counter + key, __popc(peers));
  base = __shfl_sync(peers, base, leader);
  return base + __popc(peers & ((1u << lane) - 1u));
}

__global__ void __launch_bounds__(kPlanThreads) split_plan_kernel(SplitPlanParams p) {
  using BlockScanInt = cub::BlockScan<int, kPlanThreads>;
  using BlockScanLong = cub::BlockScan<long long, kPlanThreads>;
  __shared__ int hist[4 * kPlanBins];  // [class][bin]: counts, then starts, then (after the scatter) ends
  __shared__ union {
    typename BlockScanInt::TempStorage i;
    typename BlockScanLong::TempStorage l;
  } scan_tmp;
  const int tid = threadIdx.x;
  const std::int64_t groups = split_groups(p.m);
  for (int b = tid; b < 4 * kPlanBins; b += kPlanThreads) hist[b] = 0;
  for (std::int64_t g = tid; g < groups; g += kPlanThreads) p.len[g] = 0;
  __syncthreads();
  for (std::int64_t t0 = 0; t0 < p.m; t0 += kPlanThreads) {  // uniform trip count: whole warps
    const std::int64_t t = t0 + tid;
    const bool active = t < p.m;
    const int key = active ? static_cast<int>(t & 3) * kPlanBins + static_cast<int>(min(p.row_nnz[t], kTopBin)) : 0;
    aggregated_increment(hist, key, active);
  }
  __syncthreads();
  for (int c = 0; c < 4; ++c) {
    int v[2] = {hist[c * kPlanBins + 2 * tid], hist[c * kPlanBins + 2 * tid + 1]};
    BlockScanInt(scan_tmp.i).ExclusiveSum(v, v);
    __syncthreads();
    hist[c * kPlanBins + 2 * tid] = v[0];
    hist[c * kPlanBins + 2 * tid + 1] = v[1];
  }
  __syncthreads();
  for (std::int64_t t0 = 0; t0 < p.m; t0 += kPlanThreads) {
    const std::int64_t t = t0 + tid;
    const bool active = t < p.m;
    const std::uint32_t cnt = active ? p.row_nnz[t] : 0u;
    const int c = static_cast<int>(t & 3);
    const int i = aggregated_increment(hist, c * kPlanBins + static_cast<int>(min(cnt, kTopBin)), active);
    if (active) {
      const int g = i / 4, r = g * kHListGroup + 4 * (i % 4) + c;
      p.pos[t] = r;
      p.tok[r] = static_cast<int>(t);
      if (cnt >= kTopBin) atomicMax(p.len + g, static_cast<int>((cnt + 3) / 4 * 4));
    }
  }
  __syncthreads();  // hist holds each bin's end; the block's global writes (len) are visible
  long long carry = 0;
  for (std::int64_t g0 = 0; g0 < groups; g0 += kPlanThreads) {
    const std::int64_t g = g0 + tid;
    int len = 0;
    if (g < groups) {
      bool top = false;
      for (int c = 0; c < 4; ++c) {
        const std::int64_t size = split_class_size(p.m, c);
        if (4 * g >= size) continue;
        const int i = static_cast<int>(min(4 * g + 3, size - 1));  // the class's last member in g
        const int* ends = hist + c * kPlanBins;
        int lo = 0, hi = kPlanBins - 1;  // the first bin whose end exceeds i
        while (lo < hi) {
          const int mid = (lo + hi) / 2;
          if (ends[mid] > i) hi = mid; else lo = mid + 1;
        }
        if (lo == static_cast<int>(kTopBin)) top = true; else len = max(len, (lo + 3) / 4 * 4);
      }
      if (top) len = max(len, __ldcg(p.len + g));
    }
    long long ex = 0, agg = 0;
    BlockScanLong(scan_tmp.l).ExclusiveSum(static_cast<long long>(len) * kHListGroup, ex, agg);
    __syncthreads();
    if (g < groups) {
      p.len[g] = len;
      p.base[g] = carry + ex;
    }
    carry += agg;
  }
  if (tid == 0) {
    *p.enable = carry <= p.capacity ? 1u : 0u;
    if (p.words_needed) *p.words_needed = static_cast<unsigned long long>(carry);
  }
}

// ---------------------------------------------------------------------------------------------
// Down: one CTA per (slice of 16 columns of K, split). Wdᵀ[:, slice] is staged in shared memory
// at the slots of twell_split.hpp (N·32 bytes, padded to Q·128, then a zero row for the padding
// words). Each warp takes whole groups: lane 2q + half serves the token at position q, columns
// [8·half, 8·half + 8) of the slice, with 8 fp32 accumulators; a step reads 4 entries per token
// (one 16-byte load, 256 contiguous bytes per warp) and, per entry, one 16-byte shared-memory read
// and 8 FMAs, without a branch (padding reads the zero row).
constexpr int kDownThreads = 1024;
constexpr int kSliceCols = 16;
constexpr std::uint32_t kSlotMask = (1u << kHListSlotBits) - 1u;

__device__ __forceinline__ void down_entry(std::uint32_t e, const uint4* srow, float* acc) {
  const uint4 w = srow[(e & kSlotMask) * 2u];
  dev::axpy8(__uint_as_float(e & ~kSlotMask), w, acc);
}

__global__ void __launch_bounds__(kDownThreads, 1) twell_down_sliced_kernel(TwellDownSlicedParams p, int splits) {
  if (p.enable && *p.enable == 0u) return;
  extern __shared__ __align__(16) uint4 smem_rows[];  // [slot][2 halves]
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
    smem_rows[((n % quarter) * 4 + n / quarter) * 2 + half] = v;
  }
  if (threadIdx.x < 2) smem_rows[split_pad_word(p.n) * 2 + threadIdx.x] = make_uint4(0, 0, 0, 0);
  __syncthreads();

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int q = lane >> 1, half = lane & 1;
  const uint4* srow = smem_rows + half;
  const std::int64_t c_out = col0 + half * 8;
  const std::int64_t class_size = split_class_size(p.m, q % 4);
  constexpr int kWarps = kDownThreads / 32;
  for (std::int64_t g = static_cast<std::int64_t>(split) * kWarps + warp; g < p.groups;
       g += static_cast<std::int64_t>(splits) * kWarps) {
    const bool valid = 4 * g + q / 4 < class_size;
    const int tok = valid ? p.tok[g * kHListGroup + q] : 0;
    const int steps = valid ? p.len[g] / 4 : 0;  // empty positions read nothing
    const uint4* src = reinterpret_cast<const uint4*>(p.words + p.base[g]) + q;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    // Two steps in flight ahead of the one being used.
    uint4 e0 = steps > 0 ? __ldg(src) : make_uint4(0, 0, 0, 0);
    uint4 e1 = steps > 1 ? __ldg(src + kHListGroup) : make_uint4(0, 0, 0, 0);
    for (int i = 0; i < steps; ++i) {
      const uint4 cur = e0;
      e0 = e1;
      if (i + 2 < steps) e1 = __ldg(src + static_cast<std::int64_t>(i + 2) * kHListGroup);
      down_entry(cur.x, srow, acc);
      down_entry(cur.y, srow, acc);
      down_entry(cur.z, srow, acc);
      down_entry(cur.w, srow, acc);
    }
    if (valid && c_out < p.k)
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
