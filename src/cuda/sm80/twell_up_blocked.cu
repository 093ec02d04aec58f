// Blocked up product (twell_up_blocked.hpp).
#include "cuda/sm80/twell_up_blocked.hpp"

#include <cub/block/block_scan.cuh>

#include <algorithm>

#include "cuda/common/check.hpp"
#include "cuda/common/device_math.cuh"
#include "cuda/sm80/twell_kernels.hpp"

namespace twell::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kPer = 16;                                    // entries per thread per pass
constexpr int kBlocks = kUpBlockedRows * kUpBlockedTiles;   // (row, tile) blocks per CTA
constexpr int kItems = kBlocks / kThreads;                  // counts per thread in the scan
constexpr int kWRows = kUpBlockedTiles * kTwellTile;        // Wu rows per CTA
constexpr int kStageRows = kUpBlockedRows + kWRows;         // x rows, then Wu rows
constexpr int kKc = 16;                                     // K per stage: 32 bytes per row
constexpr int kStageBytes = kStageRows * 32;
constexpr int kStages = 3;
constexpr int kCopies = kStageRows * 2 / kThreads;          // 16-byte copies per thread per stage
static_assert(kBlocks % kThreads == 0 && (kStageRows * 2) % kThreads == 0, "even split over the threads");
static_assert(kUpBlockedRows <= 1024 && kStageRows < 2048, "row indices packed in 10 and 11 bits");

using Scan = cub::BlockScan<int, kThreads>;
constexpr std::size_t kSmemBytes =
    static_cast<std::size_t>(kStages) * kStageBytes + (kBlocks + 1) * sizeof(int) + sizeof(typename Scan::TempStorage);

// Staged row r holds 32 bytes (16 bf16 of K) as two 16-byte units; unit u sits at u ^ ((r >> 2) & 1),
// so any 8 consecutive rows reading the same unit hit 8 different 16-byte bank groups.
__device__ __forceinline__ int unit_offset(int r, int u) { return r * 32 + ((u ^ ((r >> 2) & 1)) << 4); }

// The last block b with pref[b] ≤ e (pref: exclusive prefix of the blocks' counts, e < total).
__device__ __forceinline__ int find_block(const int* pref, int e) {
  int lo = 0, hi = kBlocks - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (pref[mid] <= e) lo = mid; else hi = mid - 1;
  }
  return lo;
}

__global__ void __launch_bounds__(kThreads, 1) twell_up_blocked_kernel(TwellUpBlockedParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  int* pref = reinterpret_cast<int*>(smem + kStages * kStageBytes);  // [kBlocks + 1]
  auto& scan_tmp = *reinterpret_cast<typename Scan::TempStorage*>(pref + kBlocks + 1);
  const int tid = threadIdx.x;
  const int S = p.words_per_tile, cap = S - 1;
  const std::int64_t nt = (p.n + kTwellTile - 1) / kTwellTile;
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.x) * kUpBlockedRows;
  const std::int64_t t0 = static_cast<std::int64_t>(blockIdx.y) * kUpBlockedTiles;
  const std::int64_t n0 = t0 * kTwellTile;
  auto block_word = [&](int b) {  // word 0 of block b = (row row0 + b / tiles, tile t0 + b % tiles)
    return ((row0 + b / kUpBlockedTiles) * nt + t0 + b % kUpBlockedTiles) * S;
  };

  // Counts of the CTA's blocks (0 for rows past M, tiles past N and flagged rows); word 0 of h.
  int c[kItems];
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int b = tid * kItems + i;
    const std::int64_t row = row0 + b / kUpBlockedTiles, tile = t0 + b % kUpBlockedTiles;
    c[i] = 0;
    if (row < p.m && tile < nt && p.row_overflow[row] == 0u) {
      const std::uint32_t w0 = p.words[block_word(b)];
      c[i] = static_cast<int>(min(w0, static_cast<std::uint32_t>(cap)));  // ≤ cap: the row is not flagged
      p.h_words[block_word(b)] = w0;
    }
  }
  int total = 0;
  Scan(scan_tmp).ExclusiveSum(c, c, total);
#pragma unroll
  for (int i = 0; i < kItems; ++i) pref[tid * kItems + i] = c[i];
  if (tid == 0) pref[kBlocks] = total;

  const int kchunks = static_cast<int>((p.k + kKc - 1) / kKc);
  const std::uint32_t smem_base = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  // Stage s ← K columns [16 q, 16 q + 16) of the CTA's x rows and Wu rows; zeros past M, N or K.
  auto issue = [&](int q, int s) {
#pragma unroll
    for (int j = 0; j < kCopies; ++j) {
      const int cidx = tid + j * kThreads, r = cidx >> 1, u = cidx & 1;
      const std::int64_t kcol = static_cast<std::int64_t>(q) * kKc + 8 * u;
      const __nv_bfloat16* src;
      bool valid = kcol < p.k;
      if (r < kUpBlockedRows) {
        valid = valid && row0 + r < p.m;
        src = p.x + (valid ? (row0 + r) * p.ld_x + kcol : 0);
      } else {
        valid = valid && n0 + (r - kUpBlockedRows) < p.n;
        src = p.w_up + (valid ? (n0 + (r - kUpBlockedRows)) * p.k + kcol : 0);
      }
      dev::cp_async16(smem_base + s * kStageBytes + unit_offset(r, u), src, valid);
    }
  };
  __syncthreads();  // pref complete

  for (int e0 = 0; e0 < total; e0 += kPer * kThreads) {  // passes of kPer · kThreads entries
    // This thread's entries e0 + tid + j · kThreads: their staged rows (x row | Wu row << 10).
    // Block and slot are found again for the epilogue rather than held through the K loop.
    std::uint32_t rows[kPer];
    float acc[kPer];
    int mine = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int e = e0 + tid + j * kThreads;
      rows[j] = 0;
      acc[j] = 0.0f;
      if (e < total) {
        const int b = find_block(pref, e);
        const std::uint32_t w = p.words[block_word(b) + 1 + (e - pref[b])];
        const int wr = kUpBlockedRows + (b % kUpBlockedTiles) * kTwellTile + static_cast<int>(w & 0xffu);
        rows[j] = static_cast<std::uint32_t>(b / kUpBlockedTiles) | static_cast<std::uint32_t>(wr) << 10;
        mine = j + 1;
      }
    }

    // K in chunks of 16 through a 3-stage cp.async ring.
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < kchunks) issue(s, s);
      dev::cp_async_commit();
    }
    for (int q = 0; q < kchunks; ++q) {
      dev::cp_async_wait<kStages - 2>();
      __syncthreads();  // chunk q landed for all; every thread is done with chunk q − 1's stage
      if (q + kStages - 1 < kchunks) issue(q + kStages - 1, (q + kStages - 1) % kStages);
      dev::cp_async_commit();
      const unsigned char* st = smem + (q % kStages) * kStageBytes;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        if (j < mine) {
          const int xr = static_cast<int>(rows[j] & 0x3ffu), wr = static_cast<int>(rows[j] >> 10);
          const uint4 xa = *reinterpret_cast<const uint4*>(st + unit_offset(xr, 0));
          const uint4 xb = *reinterpret_cast<const uint4*>(st + unit_offset(xr, 1));
          const uint4 wa = *reinterpret_cast<const uint4*>(st + unit_offset(wr, 0));
          const uint4 wb = *reinterpret_cast<const uint4*>(st + unit_offset(wr, 1));
          acc[j] += dev::dot8(xa, wa) + dev::dot8(xb, wb);
        }
      }
    }
    dev::cp_async_wait<0>();
    __syncthreads();  // the next pass refills the stages

    // h = g · u, rounded to bf16 once, with its local column (the word of g carries both).
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (j < mine) {
        const int e = e0 + tid + j * kThreads, b = find_block(pref, e);
        const std::int64_t at = block_word(b) + 1 + (e - pref[b]);
        const std::uint32_t w = p.words[at];
        const std::uint32_t hb = static_cast<std::uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(dev::hi_bf16(w) * acc[j])));
        p.h_words[at] = hb << 16 | (w & 0xffffu);
      }
    }
  }
}

}  // namespace

std::size_t up_blocked_smem_bytes() { return kSmemBytes; }

void launch_twell_up_blocked(const TwellUpBlockedParams& p, cudaStream_t stream) {
  TWELL_CU_REQUIRE(p.x && p.w_up && p.words && p.row_overflow && p.h_words, ErrorCode::invalid_argument,
                   "twell up blocked: null pointer");
  TWELL_CU_REQUIRE(p.m >= 1 && p.m <= 0x7fffffff && p.n >= 1 && p.k >= 8 && p.k % 8 == 0, ErrorCode::unsupported,
                   "twell up blocked: needs M ≥ 1, N ≥ 1 and K a positive multiple of 8 (got M = {}, N = {}, K = {})", p.m,
                   p.n, p.k);
  TWELL_CU_REQUIRE(p.ld_x % 8 == 0 && (reinterpret_cast<std::uintptr_t>(p.x) & 15) == 0 &&
                       (reinterpret_cast<std::uintptr_t>(p.w_up) & 15) == 0,
                   ErrorCode::unsupported, "twell up blocked: x and Wu need 16-byte aligned rows");
  TWELL_CU_REQUIRE(p.words_per_tile >= 2 && p.words_per_tile <= 128 && kTwellTile % p.words_per_tile == 0,
                   ErrorCode::unsupported, "twell up blocked: S = {} not supported (S in [2, 128])", p.words_per_tile);
  const std::int64_t nt = (p.n + kTwellTile - 1) / kTwellTile;
  const dim3 grid(static_cast<unsigned>((p.m + kUpBlockedRows - 1) / kUpBlockedRows),
                  static_cast<unsigned>((nt + kUpBlockedTiles - 1) / kUpBlockedTiles));
  TWELL_CU_REQUIRE(grid.y <= 65535, ErrorCode::unsupported, "twell up blocked: N = {} too large", p.n);
  TWELL_CUDA_CHECK(cudaFuncSetAttribute(twell_up_blocked_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(kSmemBytes)));
  twell_up_blocked_kernel<<<grid, kThreads, kSmemBytes, stream>>>(p);
  TWELL_CUDA_CHECK_LAUNCH("twell_up_blocked_kernel");
}

}  // namespace twell::cuda
