// The split sparse remainder: the plan of the h list and the weight-stationary down kernel
// (formats and invariants in twell_split.hpp; the up half is twell_up_down with hl_words).
#include "cuda/sm80/twell_split.hpp"

#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>

#include <algorithm>

#include "cuda/common/check.hpp"
#include "cuda/common/device_math.cuh"

namespace twell::cuda {
namespace {

// ---------------------------------------------------------------------------------------------
// Plan (see SplitPlanParams): one CTA per chunk; thread t holds the chunk's tokens 4t … 4t + 3,
// which are one token of each class (chunks start at multiples of 4). Keys are class · 2¹² +
// min(count, 4095), invalid tokens (past M) class 4, so they sort last.
constexpr int kPlanThreads = 512;
constexpr int kPlanItems = kSplitChunk / kPlanThreads;
static_assert(kPlanItems == 4, "a thread holds one token of each class");
constexpr int kCountBits = 12;

__global__ void __launch_bounds__(kPlanThreads) split_plan_kernel(SplitPlanParams p) {
  using Sort = cub::BlockRadixSort<std::uint32_t, kPlanThreads, kPlanItems, int>;
  using ScanInt = cub::BlockScan<int, kPlanThreads>;
  using ScanLong = cub::BlockScan<long long, kPlanThreads>;
  __shared__ union {
    typename Sort::TempStorage sort;
    typename ScanInt::TempStorage scan_i;
    typename ScanLong::TempStorage scan_l;
  } tmp;
  __shared__ std::uint32_t s_cnt[kSplitChunk];
  __shared__ int s_tok[kSplitChunk];
  __shared__ int s_len[kSplitChunkGroups];
  __shared__ bool s_last;
  const int tid = threadIdx.x;
  const std::int64_t chunk = blockIdx.x, t0 = chunk * kSplitChunk;
  const int valid = static_cast<int>(p.m - t0 < kSplitChunk ? p.m - t0 : kSplitChunk);

  std::uint32_t keys[kPlanItems];
  int vals[kPlanItems];
#pragma unroll
  for (int k = 0; k < kPlanItems; ++k) {
    const int i = tid * kPlanItems + k;
    const std::uint32_t cnt = i < valid ? p.row_nnz[t0 + i] : 0u;
    s_cnt[i] = cnt;
    s_tok[i] = -1;
    keys[k] = (static_cast<std::uint32_t>(i < valid ? k : 4) << kCountBits) | min(cnt, (1u << kCountBits) - 1u);
    vals[k] = i;
  }
  if (tid < kSplitChunkGroups) s_len[tid] = 0;
  __syncthreads();
  Sort(tmp.sort).Sort(keys, vals, 0, kCountBits + 3);  // blocked: thread t holds sorted ranks 4t … 4t + 3
  // Class c occupies sorted ranks [start_c, start_c + size_c), size_c = ⌈(valid − c) / 4⌉.
#pragma unroll
  for (int k = 0; k < kPlanItems; ++k) {
    const int c = static_cast<int>(keys[k] >> kCountBits);
    if (c >= 4) continue;
    int start = 0;
    for (int cc = 0; cc < c; ++cc) start += (valid - cc + 3) / 4;
    const int i = tid * kPlanItems + k - start, lg = i / 4, q = 4 * (i % 4) + c;
    s_tok[lg * kHListGroup + q] = static_cast<int>(t0) + vals[k];
    p.pos[t0 + vals[k]] = static_cast<int>((chunk * kSplitChunkGroups + lg) * kHListGroup + q);
    atomicMax(s_len + lg, static_cast<int>((s_cnt[vals[k]] + 3) / 4 * 4));
  }
  __syncthreads();
  int* tok_out = p.tok + chunk * kSplitChunk;
#pragma unroll
  for (int k = 0; k < kPlanItems; ++k) tok_out[k * kPlanThreads + tid] = s_tok[k * kPlanThreads + tid];
  const int len = tid < kSplitChunkGroups ? s_len[tid] : 0;
  long long ex = 0, total = 0;
  ScanLong(tmp.scan_l).ExclusiveSum(static_cast<long long>(len) * kHListGroup, ex, total);
  if (tid < kSplitChunkGroups) {
    p.len[chunk * kSplitChunkGroups + tid] = len;
    p.base[chunk * kSplitChunkGroups + tid] = ex;  // chunk-local; the last CTA adds the chunk's offset
  }
  if (tid == 0) p.chunk_words[chunk] = total;
  __threadfence();
  __syncthreads();
  if (tid == 0) s_last = atomicAdd(p.ticket, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!s_last) return;

  // Last CTA: exclusive prefix over the chunks (in place), then every group's base += its chunk's.
  __threadfence();
  const std::int64_t chunks = gridDim.x;
  long long carry = 0;
  for (std::int64_t c0 = 0; c0 < chunks; c0 += kPlanThreads) {
    const std::int64_t c = c0 + tid;
    const long long w = c < chunks ? __ldcg(p.chunk_words + c) : 0;
    long long cex = 0, agg = 0;
    __syncthreads();
    ScanLong(tmp.scan_l).ExclusiveSum(w, cex, agg);
    if (c < chunks) p.chunk_words[c] = carry + cex;
    carry += agg;
  }
  __syncthreads();
  const std::int64_t groups = chunks * kSplitChunkGroups;
  for (std::int64_t g = tid; g < groups; g += kPlanThreads)
    p.base[g] = __ldcg(p.base + g) + __ldcg(p.chunk_words + g / kSplitChunkGroups);
  if (tid == 0) {
    *p.enable = carry <= p.capacity ? 1u : 0u;
    if (p.words_needed) *p.words_needed = static_cast<unsigned long long>(carry);
    *p.ticket = 0u;  // ready for the next launch
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

__device__ __forceinline__ void down_entry(std::uint32_t e, const uint4* srow, float* acc) {
  const uint4 w = srow[(e & kHListSlotMask) * 2u];
  dev::axpy8(split_entry_h(e), w, acc);
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
    smem_rows[split_slot(n, quarter) * 2 + half] = v;
  }
  if (threadIdx.x < 2) smem_rows[split_pad_word(p.n) * 2 + threadIdx.x] = make_uint4(0, 0, 0, 0);
  __syncthreads();

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int q = lane >> 1, half = lane & 1;
  const uint4* srow = smem_rows + half;
  const std::int64_t c_out = col0 + half * 8;
  constexpr int kWarps = kDownThreads / 32;
  // Warp j of the grid's `stride` warps takes group stride·k + j for even k, stride·k + stride − 1 − j
  // for odd k: a chunk's groups are sorted by length, so the snake order evens the warps' work.
  // A group's metadata (token, length, offset) is loaded one group ahead, so that only the first
  // entry load of a group waits for L2 (instead of three dependent loads in a row).
  // The slices start at different points of the group order (rotated by the slice), so the
  // CTAs do not all read the same stretch of the h list at the same moment.
  const std::int64_t stride = static_cast<std::int64_t>(splits) * kWarps;
  const std::int64_t j = static_cast<std::int64_t>(split) * kWarps + warp;
  const std::int64_t rounds = (p.groups + stride - 1) / stride;
  const std::int64_t k0 = rounds * slice / slices;
  auto group_of = [&](std::int64_t k) {
    if (k >= rounds) return p.groups;  // past the end
    const std::int64_t kr = (k + k0) % rounds;
    return stride * kr + ((kr & 1) ? stride - 1 - j : j);
  };
  std::int64_t g = group_of(0);
  int tok_next = g < p.groups ? p.tok[g * kHListGroup + q] : -1;
  int len_next = g < p.groups ? p.len[g] : 0;
  std::int64_t base_next = g < p.groups ? p.base[g] : 0;
  for (std::int64_t k = 0; k < rounds; ++k) {
    const int tok = tok_next;
    const int steps = tok >= 0 ? len_next / 4 : 0;  // empty positions (and g past the end) read nothing
    const uint4* src = reinterpret_cast<const uint4*>(p.words + base_next) + q;
    // Two steps in flight ahead of the one being used.
    uint4 e0 = steps > 0 ? __ldg(src) : make_uint4(0, 0, 0, 0);
    uint4 e1 = steps > 1 ? __ldg(src + kHListGroup) : make_uint4(0, 0, 0, 0);
    const std::int64_t gn = group_of(k + 1);
    tok_next = gn < p.groups ? p.tok[gn * kHListGroup + q] : -1;
    len_next = gn < p.groups ? p.len[gn] : 0;
    base_next = gn < p.groups ? p.base[gn] : 0;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < steps; ++i) {
      const uint4 cur = e0;
      e0 = e1;
      if (i + 2 < steps) e1 = __ldg(src + static_cast<std::int64_t>(i + 2) * kHListGroup);
      down_entry(cur.x, srow, acc);
      down_entry(cur.y, srow, acc);
      down_entry(cur.z, srow, acc);
      down_entry(cur.w, srow, acc);
    }
    if (tok >= 0 && c_out < p.k)
      __stcs(reinterpret_cast<uint4*>(p.y + static_cast<std::int64_t>(tok) * p.ld_y + c_out), dev::pack8_bf16(acc));
  }
}

}  // namespace

void launch_split_plan(const SplitPlanParams& p, cudaStream_t stream) {
  TWELL_CU_REQUIRE(p.row_nnz && p.pos && p.tok && p.base && p.len && p.chunk_words && p.ticket && p.enable,
                   ErrorCode::invalid_argument,
                   "split plan: null pointer");
  TWELL_CU_REQUIRE(p.m >= 1 && split_groups(p.m) * kHListGroup <= 0x7fffffff, ErrorCode::unsupported,
                   "split plan: M = {} out of range", p.m);
  split_plan_kernel<<<static_cast<unsigned>(split_chunks(p.m)), kPlanThreads, 0, stream>>>(p);
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
