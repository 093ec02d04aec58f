// CSR of a ReLU output and its transposed index, built on the GPU (see csr_kernels.hpp).
#include "cuda/train/csr_kernels.hpp"

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>

#include "cuda/common/check.hpp"
#include "cuda/common/device_math.cuh"
#include "cuda/sm80/twell_kernels.hpp"

namespace twell::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

// The skip bits of columns [c, c + 8) (c a multiple of 8); 0 without a mask or past n.
__device__ __forceinline__ unsigned skip_bits(const CsrBuildParams& p, std::int64_t c) {
  return p.skip8 != nullptr && c < p.n ? p.skip8[c / 8] : 0u;
}

// A left-out column's place in a row's staged run of left-out values is hot_base8[its group of 8]
// plus this: the left-out columns below column e of the group (skip: the group's skip bits).
__device__ __forceinline__ int hot_rank(unsigned skip, int e) { return __popc(skip & ((1u << e) - 1u)); }

// The count of one lane's 8 columns [c, c + 8) of a row (values v) that the pattern keeps, after
// staging the left-out ones (skip bits) at their places in the warp's slice of shared memory: as
// they are, or (kept_only, the TwELL source's rule) the kept ones and 0 for the rest.
__device__ __forceinline__ int count_gather8(const CsrBuildParams& p, const uint4& v, std::int64_t c,
                                             __nv_bfloat16* stage, bool kept_only) {
  const unsigned skip = skip_bits(p, c);
  // Loaded beside skip, not after it: the places are base + the set bits below each one.
  const int base = p.hot_out != nullptr && c < p.n ? p.hot_base8[c / 8] : 0;
  const unsigned keep = dev::keep_mask8(v);
  if (p.hot_out != nullptr && skip != 0) {
#pragma unroll
    for (int e = 0; e < 8; ++e)
      if (skip & (1u << e)) {
        const bool zero = kept_only && !(keep & (1u << e));
        stage[base + hot_rank(skip, e)] =
            __ushort_as_bfloat16(static_cast<unsigned short>(zero ? 0u : dev::bf16_bits(v, e)));
      }
  }
  return __popc(keep & ~skip);
}

// The row's count (reduced over the warp) and dense-row flag by lane 0, then the staged left-out
// values out as one contiguous run of 16-byte stores.
__device__ __forceinline__ void count_finish(const CsrBuildParams& p, std::int64_t row, int lane, int cnt,
                                             const __nv_bfloat16* stage, int hot_words) {
  cnt = dev::warp_sum(cnt);
  if (lane == 0) {
    p.row_counts[row] = cnt;
    if (p.row_flags) p.row_flags[row] = p.dense_row_cap >= 0 && cnt > p.dense_row_cap;
  }
  if (p.hot_out != nullptr) {
    __syncwarp();
    uint4* out = reinterpret_cast<uint4*>(p.hot_out + row * p.ld_hot);
    const uint4* in = reinterpret_cast<const uint4*>(stage);
    for (int w = lane; w < hot_words; w += 32) out[w] = in[w];
  }
}

// One warp per row; lane l reads columns [c0 + 8l, c0 + 8l + 8) of each 256-column chunk. With
// hot_out, the row's left-out values go to the warp's slice of shared memory (round_up(hot_count,
// 8) bf16) by place, then out as one contiguous run of 16-byte stores (scattered 2-byte global
// stores measured 0.09 ms more than a separate gather at 358 columns, H200).
__global__ void __launch_bounds__(kWarpsPerBlock * 32) csr_count_kernel(CsrBuildParams p) {
  extern __shared__ uint4 hot_stage[];
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= p.m) return;
  const int hot_words = static_cast<int>((p.hot_count + 7) / 8);  // 16-byte words per row
  __nv_bfloat16* stage = reinterpret_cast<__nv_bfloat16*>(hot_stage + (threadIdx.x / 32) * hot_words);
  if (p.hot_out != nullptr && lane < hot_words * 8 - p.hot_count) stage[p.hot_count + lane] = __float2bfloat16(0.0f);
  const __nv_bfloat16* src = p.src + row * p.ld_src;
  const bool vec_ok = (p.ld_src % 8 == 0) && ((reinterpret_cast<std::uintptr_t>(p.src) & 15) == 0);
  int cnt = 0;
  for (std::int64_t c0 = 0; c0 < p.n; c0 += 4 * 256) {
    uint4 v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = dev::load8_bf16(src, c0 + i * 256 + lane * 8, p.n, vec_ok);
#pragma unroll
    for (int i = 0; i < 4; ++i) cnt += count_gather8(p, v[i], c0 + i * 256 + lane * 8, stage, false);
  }
  count_finish(p, row, lane, cnt, stage, hot_words);
}

// The TwELL source, one warp per row and one lane per block (32 blocks at a time): each lane
// loads its block's head, words 0..7 (one 32-byte sector: the count and up to 7 entries, all a
// block holds at ≤ 2.7 % density), so a row's blocks are all in flight at once; a lane reads the
// rest of its block's words only when the count says so. Overflowed blocks (count > S − 1) are
// read afterwards by the whole warp from src, like a chunk of the dense source. (One warp walking
// a row's blocks in turn measured 55 µs at M = 16384, N = 5632, 0.5 %, latency-bound; H100.)
constexpr int kTwellHead = 8;

// Words 0..7 of a block (0 past S, or when !mine).
__device__ __forceinline__ void load_twell_head(const std::uint32_t* blk, int S, bool mine,
                                                std::uint32_t (&h)[kTwellHead]) {
  if (mine && S >= kTwellHead) {  // 32-byte aligned: the row stride and S · 4 bytes are multiples of 32
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(blk)), b = __ldg(reinterpret_cast<const uint4*>(blk) + 1);
    h[0] = a.x, h[1] = a.y, h[2] = a.z, h[3] = a.w, h[4] = b.x, h[5] = b.y, h[6] = b.z, h[7] = b.w;
    return;
  }
#pragma unroll
  for (int q = 0; q < kTwellHead; ++q) h[q] = mine && q < S ? __ldg(blk + q) : 0u;
}

// Lane `lane`'s block of the 32 from tile t0 of a row (rw: the row's words): its head loaded, its
// count c, and whether it overflowed (c > S − 1: its values are in src).
struct LaneBlock {
  std::int64_t t;
  const std::uint32_t* blk;
  std::uint32_t h[kTwellHead];
  int c;
  bool mine, ovf;
};
__device__ __forceinline__ LaneBlock lane_block(const std::uint32_t* rw, std::int64_t t0, std::int64_t tiles, int S,
                                                int lane) {
  LaneBlock b;
  b.t = t0 + lane;
  b.mine = b.t < tiles;
  b.blk = rw + b.t * S;
  load_twell_head(b.blk, S, b.mine, b.h);
  b.c = static_cast<int>(b.h[0]);
  b.ovf = b.mine && b.c > S - 1;
  return b;
}

// Calls f(entry word) for the entries 1..c of a block (c ≤ S − 1): the head's, then loaded.
template <typename F>
__device__ __forceinline__ void for_each_entry(const std::uint32_t* blk, const std::uint32_t (&h)[kTwellHead], int c,
                                               F&& f) {
#pragma unroll
  for (int q = 1; q < kTwellHead; ++q)
    if (q <= c) f(h[q]);
  for (int q = kTwellHead; q <= c; ++q) f(__ldg(blk + q));
}

// The column of an entry word of tile t, and whether the mask leaves it out.
__device__ __forceinline__ std::int64_t entry_col(std::int64_t t, std::uint32_t e) {
  return t * kTwellTile + (e & 0xffffu);
}
__device__ __forceinline__ bool entry_skipped(const CsrBuildParams& p, std::int64_t col) {
  return (skip_bits(p, col) >> (col & 7)) & 1u;
}

// The stage is zeroed first: a left-out column is 0 unless an entry (or an overflowed block)
// stages its value.
__global__ void __launch_bounds__(kWarpsPerBlock * 32) csr_count_twell_kernel(CsrBuildParams p) {
  extern __shared__ uint4 hot_stage[];
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= p.m) return;
  const int hot_words = static_cast<int>((p.hot_count + 7) / 8);
  __nv_bfloat16* stage = reinterpret_cast<__nv_bfloat16*>(hot_stage + (threadIdx.x / 32) * hot_words);
  if (p.hot_out != nullptr) {
    for (int w = lane; w < hot_words; w += 32) reinterpret_cast<uint4*>(stage)[w] = make_uint4(0, 0, 0, 0);
    __syncwarp();
  }
  const int S = p.words_per_tile;
  const std::int64_t tiles = (p.n + kTwellTile - 1) / kTwellTile;
  const std::uint32_t* rw = p.words + row * tiles * S;
  const __nv_bfloat16* src = p.src + row * p.ld_src;
  const bool vec_ok = (p.ld_src % 8 == 0) && ((reinterpret_cast<std::uintptr_t>(p.src) & 15) == 0);
  int cnt = 0;
  for (std::int64_t t0 = 0; t0 < tiles; t0 += 32) {
    const LaneBlock b = lane_block(rw, t0, tiles, S, lane);
    if (b.mine && !b.ovf) {
      for_each_entry(b.blk, b.h, b.c, [&](std::uint32_t e) {
        const std::int64_t col = entry_col(b.t, e);
        if (!entry_skipped(p, col)) {
          ++cnt;
        } else if (p.hot_out != nullptr) {
          stage[p.hot_base8[col / 8] + hot_rank(skip_bits(p, col), static_cast<int>(col & 7))] =
              __ushort_as_bfloat16(static_cast<unsigned short>(e >> 16));
        }
      });
    }
    for (unsigned o = __ballot_sync(0xffffffffu, b.ovf); o != 0; o &= o - 1) {  // every value of the block from src
      const std::int64_t col = (t0 + __ffs(o) - 1) * kTwellTile + lane * 8;
      cnt += count_gather8(p, dev::load8_bf16(src, col, p.n, vec_ok), col, stage, true);
    }
  }
  count_finish(p, row, lane, cnt, stage, hot_words);
}

// After the selection: enough dense rows → their counts 0; too few → no flags (see CsrBuildParams).
__global__ void dense_rows_apply_kernel(CsrBuildParams p) {
  const bool use = *p.n_dense >= p.dense_rows_min;
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; r < p.m;
       r += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    if (!p.row_flags[r]) continue;
    if (use) {
      p.row_counts[r] = 0;
    } else {
      p.row_flags[r] = 0;
    }
  }
}

// Writes the kept values of one 256-column chunk read densely (lane: 8 columns at c0 + 8·lane)
// at `at` on, ascending (lanes in order, bits in order); returns `at` past them.
__device__ __forceinline__ std::int64_t fill_dense8(const CsrBuildParams& p, const uint4& v, std::int64_t c0, int lane,
                                                    std::int64_t at) {
  const unsigned mask = dev::keep_mask8(v) & ~skip_bits(p, c0 + lane * 8);
  const int cnt = __popc(mask);
  const int incl = dev::warp_inclusive_scan(cnt, lane);
  std::int64_t pos = at + (incl - cnt);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    if (mask & (1u << e)) {
      p.cols[pos] = static_cast<std::int32_t>(c0 + lane * 8 + e);
      p.vals[pos] = __ushort_as_bfloat16(static_cast<unsigned short>(dev::bf16_bits(v, e)));
      ++pos;
    }
  }
  return at + __shfl_sync(0xffffffffu, incl, 31);
}

__global__ void __launch_bounds__(kWarpsPerBlock * 32) csr_fill_kernel(CsrBuildParams p) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= p.m || (p.row_flags && p.row_flags[row])) return;  // a dense row has no entries
  const __nv_bfloat16* src = p.src + row * p.ld_src;
  const bool vec_ok = (p.ld_src % 8 == 0) && ((reinterpret_cast<std::uintptr_t>(p.src) & 15) == 0);
  std::int64_t at = p.offsets[row];
  for (std::int64_t c0 = 0; c0 < p.n; c0 += 256)
    at = fill_dense8(p, dev::load8_bf16(src, c0 + lane * 8, p.n, vec_ok), c0, lane, at);
}

// The TwELL source (see csr_count_twell_kernel): each lane's block's kept entries go to the
// place the warp's scan of the block counts gives it, in word order, which is column order; an
// overflowed block's count and entries come from src by the whole warp.
__global__ void __launch_bounds__(kWarpsPerBlock * 32) csr_fill_twell_kernel(CsrBuildParams p) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= p.m || (p.row_flags && p.row_flags[row])) return;
  const int S = p.words_per_tile;
  const std::int64_t tiles = (p.n + kTwellTile - 1) / kTwellTile;
  const std::uint32_t* rw = p.words + row * tiles * S;
  const __nv_bfloat16* src = p.src + row * p.ld_src;
  const bool vec_ok = (p.ld_src % 8 == 0) && ((reinterpret_cast<std::uintptr_t>(p.src) & 15) == 0);
  std::int64_t at = p.offsets[row];
  for (std::int64_t t0 = 0; t0 < tiles; t0 += 32) {
    const LaneBlock b = lane_block(rw, t0, tiles, S, lane);
    int kc = 0;  // this lane's block's kept entries
    if (b.mine && !b.ovf)
      for_each_entry(b.blk, b.h, b.c, [&](std::uint32_t e) { kc += !entry_skipped(p, entry_col(b.t, e)); });
    const unsigned ovf_lanes = __ballot_sync(0xffffffffu, b.ovf);
    for (unsigned o = ovf_lanes; o != 0; o &= o - 1) {
      const int l = __ffs(o) - 1;
      const std::int64_t col = (t0 + l) * kTwellTile + lane * 8;
      int n = __popc(dev::keep_mask8(dev::load8_bf16(src, col, p.n, vec_ok)) & ~skip_bits(p, col));
      n = dev::warp_sum(n);
      if (lane == l) kc = n;
    }
    const int incl = dev::warp_inclusive_scan(kc, lane);
    std::int64_t pos = at + (incl - kc);
    if (b.mine && !b.ovf) {
      for_each_entry(b.blk, b.h, b.c, [&](std::uint32_t e) {
        const std::int64_t col = entry_col(b.t, e);
        if (entry_skipped(p, col)) return;
        p.cols[pos] = static_cast<std::int32_t>(col);
        p.vals[pos] = __ushort_as_bfloat16(static_cast<unsigned short>(e >> 16));
        ++pos;
      });
    }
    for (unsigned o = ovf_lanes; o != 0; o &= o - 1) {
      const int l = __ffs(o) - 1;
      const std::int64_t c0 = (t0 + l) * kTwellTile;
      fill_dense8(p, dev::load8_bf16(src, c0 + lane * 8, p.n, vec_ok), c0, lane, __shfl_sync(0xffffffffu, pos, l));
    }
    at += __shfl_sync(0xffffffffu, incl, 31);
  }
}

__global__ void publish_totals_kernel(const std::int64_t* total, const int* n_dense, const unsigned long long* overflow,
                                      std::int64_t* out) {
  out[0] = *total;
  out[1] = n_dense != nullptr ? *n_dense : 0;
  out[2] = overflow != nullptr ? static_cast<std::int64_t>(overflow[0]) : -1;
  out[3] = overflow != nullptr ? static_cast<std::int64_t>(overflow[1]) : -1;
}

// One warp per row: entry_rows[offsets[r] .. offsets[r+1]) = r.
__global__ void __launch_bounds__(kWarpsPerBlock * 32) entry_rows_kernel(CscParams p) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= p.m) return;
  for (std::int64_t e = p.offsets[row] + threadIdx.x % 32; e < p.offsets[row + 1]; e += 32)
    p.entry_rows[e] = static_cast<std::int32_t>(row);
}

__global__ void iota_kernel(std::int32_t* v, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    v[i] = static_cast<std::int32_t>(i);
}

// From the sorted columns: col_offsets[c] = first i with key[i] ≥ c. Position i writes the
// offsets of the columns in (key[i−1], key[i]]; the last position also those in (key[nnz−1], n].
__global__ void col_offsets_kernel(const std::int32_t* keys, std::int64_t nnz, std::int64_t n, std::int64_t* off) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < nnz;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t prev = i == 0 ? -1 : keys[i - 1];
    for (std::int64_t c = prev + 1; c <= keys[i]; ++c) off[c] = i;
    if (i == nnz - 1)
      for (std::int64_t c = keys[i] + 1; c <= n; ++c) off[c] = nnz;
  }
}

__global__ void item_counts_kernel(WeightGradItemsParams p) {
  for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < p.n;
       c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t cnt = p.col_offsets[c + 1] - p.col_offsets[c];
    p.item_counts[c] = cnt <= p.run ? 1 : (cnt + p.run - 1) / p.run;
  }
}

__global__ void item_neuron_kernel(WeightGradItemsParams p) {
  for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < p.n;
       c += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    for (std::int64_t i = p.item_offsets[c]; i < p.item_offsets[c + 1]; ++i) p.item_neuron[i] = static_cast<std::int32_t>(c);
}

unsigned blocks_for(std::int64_t items, int per_block) {
  const std::int64_t b = (items + per_block - 1) / per_block;
  TWELL_CU_REQUIRE(b <= 0x7fffffff, ErrorCode::unsupported, "CSR build: {} items exceed one launch", items);
  return static_cast<unsigned>(std::max<std::int64_t>(b, 1));
}

// offsets[0] = 0, offsets[i + 1] = counts[0] + … + counts[i] for i < n (CUB's two-call scan).
void offsets_from_counts(const std::int64_t* counts, std::int64_t* offsets, std::int64_t n,
                         DeviceBuffer<unsigned char>& scratch, cudaStream_t stream) {
  TWELL_CUDA_CHECK(cudaMemsetAsync(offsets, 0, sizeof(std::int64_t), stream));
  std::size_t bytes = 0;
  TWELL_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, bytes, counts, offsets + 1, n, stream));
  scratch.reserve(bytes);
  TWELL_CUDA_CHECK(cub::DeviceScan::InclusiveSum(scratch.get(), bytes, counts, offsets + 1, n, stream));
}

void check_twell_source(const CsrBuildParams& p) {
  TWELL_CU_REQUIRE(!p.words || (p.words_per_tile >= 2 && p.words_per_tile <= 128 && kTwellTile % p.words_per_tile == 0),
                   ErrorCode::invalid_argument, "CSR build from TwELL: words per tile {} must divide 256, in [2, 128]",
                   p.words_per_tile);
  TWELL_CU_REQUIRE(!p.words || (reinterpret_cast<std::uintptr_t>(p.words) & 31) == 0, ErrorCode::invalid_argument,
                   "CSR build from TwELL: the words must be 32-byte aligned (a block's head is one 32-byte load)");
}

}  // namespace

void csr_count_and_scan(const CsrBuildParams& p, DeviceBuffer<unsigned char>& scratch, cudaStream_t stream) {
  TWELL_CU_REQUIRE(p.src && p.row_counts && p.offsets, ErrorCode::invalid_argument, "CSR count: null pointer");
  TWELL_CU_REQUIRE(p.m >= 1 && p.n >= 1 && p.ld_src >= p.n, ErrorCode::invalid_argument,
                   "CSR count: bad shape m={} n={} ld={}", p.m, p.n, p.ld_src);
  TWELL_CU_REQUIRE(p.dense_row_cap < 0 || (p.row_flags && p.dense_rows && p.n_dense), ErrorCode::invalid_argument,
                   "CSR count: dense rows need row_flags, dense_rows and n_dense");
  TWELL_CU_REQUIRE(!p.hot_out || (p.skip8 && p.hot_base8 && csr_count_can_gather(p.hot_count, p.ld_hot, p.hot_out)),
                   ErrorCode::invalid_argument,
                   "CSR count: gathering {} left-out columns (row stride {}) needs skip8, hot_base8, at most {} columns, "
                   "16-byte rows",
                   p.hot_count, p.ld_hot, kCsrMaxGatheredCols);
  check_twell_source(p);
  // ≤ 8 warps · 2048 columns · 2 bytes = 32 KB: within the default 48 KB of dynamic shared memory
  const std::size_t smem = p.hot_out ? static_cast<std::size_t>(kWarpsPerBlock * ((p.hot_count + 7) / 8) * 16) : 0;
  if (p.words) {
    csr_count_twell_kernel<<<blocks_for(p.m, kWarpsPerBlock), kWarpsPerBlock * 32, smem, stream>>>(p);
    TWELL_CUDA_CHECK_LAUNCH("csr_count_twell_kernel");
  } else {
    csr_count_kernel<<<blocks_for(p.m, kWarpsPerBlock), kWarpsPerBlock * 32, smem, stream>>>(p);
    TWELL_CUDA_CHECK_LAUNCH("csr_count_kernel");
  }
  if (p.dense_row_cap >= 0) {  // the flagged rows, ascending (CUB's selection keeps input order)
    const thrust::counting_iterator<std::int32_t> rows(0);
    std::size_t bytes = 0;
    TWELL_CUDA_CHECK(cub::DeviceSelect::Flagged(nullptr, bytes, rows, p.row_flags, p.dense_rows, p.n_dense, p.m, stream));
    scratch.reserve(bytes);
    TWELL_CUDA_CHECK(cub::DeviceSelect::Flagged(scratch.get(), bytes, rows, p.row_flags, p.dense_rows, p.n_dense, p.m, stream));
    dense_rows_apply_kernel<<<blocks_for(p.m, 256), 256, 0, stream>>>(p);
    TWELL_CUDA_CHECK_LAUNCH("dense_rows_apply_kernel");
  }
  offsets_from_counts(p.row_counts, p.offsets, p.m, scratch, stream);
}

void launch_csr_fill(const CsrBuildParams& p, cudaStream_t stream) {
  TWELL_CU_REQUIRE(p.src && p.offsets && p.cols && p.vals, ErrorCode::invalid_argument, "CSR fill: null pointer");
  TWELL_CU_REQUIRE(p.n < (std::int64_t{1} << 31), ErrorCode::unsupported, "CSR fill: N = {} needs 64-bit columns", p.n);
  check_twell_source(p);
  if (p.words) {
    csr_fill_twell_kernel<<<blocks_for(p.m, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream>>>(p);
    TWELL_CUDA_CHECK_LAUNCH("csr_fill_twell_kernel");
  } else {
    csr_fill_kernel<<<blocks_for(p.m, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream>>>(p);
    TWELL_CUDA_CHECK_LAUNCH("csr_fill_kernel");
  }
}

void launch_csr_publish_totals(const std::int64_t* total, const int* n_dense, const unsigned long long* overflow,
                               std::int64_t* out, cudaStream_t stream) {
  TWELL_CU_REQUIRE(total && out, ErrorCode::invalid_argument, "CSR totals: null pointer");
  publish_totals_kernel<<<1, 1, 0, stream>>>(total, n_dense, overflow, out);
  TWELL_CUDA_CHECK_LAUNCH("publish_totals_kernel");
}

void build_csc(const CscParams& p, DeviceBuffer<unsigned char>& scratch, cudaStream_t stream) {
  TWELL_CU_REQUIRE(p.offsets && p.col_offsets && p.m >= 1 && p.n >= 1 && p.nnz >= 0, ErrorCode::invalid_argument,
                   "CSC build: bad parameters");
  TWELL_CU_REQUIRE(p.nnz <= 0x7fffffff, ErrorCode::unsupported,
                   "CSC build: {} non-zeros exceed the 2^31 − 1 that 32-bit entry indices address; split the batch",
                   p.nnz);
  if (p.nnz == 0) {
    TWELL_CUDA_CHECK(cudaMemsetAsync(p.col_offsets, 0, static_cast<std::size_t>(p.n + 1) * sizeof(std::int64_t), stream));
    return;
  }
  TWELL_CU_REQUIRE(p.cols && p.entry_rows && p.order && p.tmp_keys && p.tmp_vals, ErrorCode::invalid_argument,
                   "CSC build: null pointer");
  entry_rows_kernel<<<blocks_for(p.m, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream>>>(p);
  TWELL_CUDA_CHECK_LAUNCH("entry_rows_kernel");
  iota_kernel<<<grid_stride_blocks(p.nnz, 256), 256, 0, stream>>>(p.tmp_vals, p.nnz);
  TWELL_CUDA_CHECK_LAUNCH("iota_kernel");
  int end_bit = 1;
  while (end_bit < 31 && (std::int64_t{1} << end_bit) < p.n) ++end_bit;
  const int items = static_cast<int>(p.nnz);
  std::size_t bytes = 0;
  TWELL_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, p.cols, p.tmp_keys, p.tmp_vals, p.order, items, 0,
                                                   end_bit, stream));
  scratch.reserve(bytes);
  TWELL_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(scratch.get(), bytes, p.cols, p.tmp_keys, p.tmp_vals, p.order, items,
                                                   0, end_bit, stream));
  col_offsets_kernel<<<grid_stride_blocks(p.nnz, 256), 256, 0, stream>>>(p.tmp_keys, p.nnz, p.n, p.col_offsets);
  TWELL_CUDA_CHECK_LAUNCH("col_offsets_kernel");
}

void build_weight_grad_items(const WeightGradItemsParams& p, DeviceBuffer<unsigned char>& scratch, cudaStream_t stream) {
  TWELL_CU_REQUIRE(p.col_offsets && p.item_counts && p.item_offsets && p.item_neuron && p.n >= 1 && p.n <= 0x7fffffff &&
                       p.run >= 1,
                   ErrorCode::invalid_argument, "weight-gradient items: bad parameters");
  item_counts_kernel<<<grid_stride_blocks(p.n, 256), 256, 0, stream>>>(p);
  TWELL_CUDA_CHECK_LAUNCH("item_counts_kernel");
  offsets_from_counts(p.item_counts, p.item_offsets, p.n, scratch, stream);
  item_neuron_kernel<<<grid_stride_blocks(p.n, 256), 256, 0, stream>>>(p);
  TWELL_CUDA_CHECK_LAUNCH("item_neuron_kernel");
}

}  // namespace twell::cuda
