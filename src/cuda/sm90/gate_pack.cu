// Hopper gate GEMM + TwELL epilogue (gate_pack.hpp).
#include "cuda/sm90/gate_pack.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <type_traits>

#include "cuda/common/check.hpp"
#include "cuda/common/device_math.cuh"
#include "cuda/common/launch.hpp"
#include "cuda/sm90/hopper_ptx.cuh"

namespace twell::cuda {
namespace {

constexpr int kBM = 128;                      // CTA tile rows (two consumer warpgroups × 64)
constexpr int kBN = 256;                      // CTA tile columns = one TwELL tile
constexpr int kBK = 64;                       // K per stage: one 128-byte swizzle row of bf16
// A cluster of CM CTAs along M shares the W tile: CTA r loads rows [r·256/CM, (r + 1)·256/CM) of
// it and multicasts them to all, so each CTA reads 16 KB of x and 32/CM KB of W from L2 per stage
// instead of 48 KB.
constexpr int kStages = 3;                    // 3 × 48 KB: the 64 KB staging tile takes the 4th
constexpr int kConsumers = 2;                 // consumer warpgroups (wgmma)
constexpr int kPackWarps = 3;                 // warps 1..3 of warpgroup 0 pack (warp 0 lane 0 loads)
constexpr int kThreads = 128 * (1 + kConsumers);
constexpr int kABytes = kBM * kBK * 2;        // [128, 64] bf16, 128B swizzle
constexpr int kBBytes = kBN * kBK * 2;        // [256, 64] bf16, 128B swizzle
constexpr int kStageBytes = kABytes + kBBytes;
constexpr int kTileBytes = kBM * kBN * 2;     // staging: [128 rows, 128] u32 (bf16 pairs), swizzled
// Per packing warp, the words of the rows of one pass: R rows at a stride of S + 4 words (S + 1 for
// S = 2), with R = 32 for S ≤ 32, 1024 / S above (R · (S + 4) ≤ 1152 for every S = 4 … 128).
constexpr int kRowStageWords = 1152;
constexpr int kRowStageBytes = kPackWarps * kRowStageWords * 4;
// A heavy row packed by the whole warp costs about as much as this many 16-byte words of one lane's
// loop (a load, the keep rule, a 5-step warp scan and the stores against a load and the keep rule).
[[maybe_unused]] constexpr unsigned kHeavyRowWords = 4;
constexpr int kBarBytes = (2 * kStages + 2) * 8;
// Word masks (GatePackParams::word_masks): per tile row, 4 u32 (one per quad lane q of the consumer
// fragment): bit w of mask q = the row's 16-byte word w has a non-zero magnitude among the two
// columns 8w + 2q, 8w + 2q + 1. The OR of the four is the row's non-zero-word mask.
constexpr int kMaskBytes = kBM * 4 * 4;
static_assert(kBN == kTwellTile, "one CTA tile column block is one TwELL tile");
static_assert(kABytes % 1024 == 0 && kBBytes % 1024 == 0, "128B-swizzled tiles need 1024-byte alignment");
static_assert(1024 + kStages * kStageBytes + kTileBytes + kRowStageBytes + kBarBytes + kMaskBytes <=
                  static_cast<int>(kGatePackSmemBytes),
              "shared-memory budget");
// Registers: warpgroup 0 (producer + packers, 4 rows per batch) 104, consumers 200: 104·128 + 200·256
// = 64512, no spills (88/208, 80/216 and 72/216 spill in the packers).
constexpr int kRegsLoad = 104, kRegsMma = 200;
// setmaxnreg.inc only takes registers that a dealloc in the same CTA gave back, out of the
// 168 · 384 = 64512 the CTA received at launch (__launch_bounds__(384, 1)): a budget above that
// blocks the consumers forever (96/208 = 65536 hung).
static_assert(kRegsLoad * 128 + kRegsMma * 256 <= 168 * kThreads, "register budget of the CTA");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Staging tile: row i holds the 128 bf16 pairs of its 256 columns; word w of row i sits at
// i·128 + (w ^ 4·(i mod 8)), so the consumers' fragment stores (8 rows × 4 consecutive words per
// warp instruction) and the packers' row reads (lane l: words 4l..4l+3) are free of bank conflicts.
__device__ __forceinline__ int stage_index(int row, int word) { return row * 128 + (word ^ ((row & 7) * 4)); }

// stmatrix.x4 addressing of the staging tile for the 16 rows row16 .. row16 + 15 of a consumer
// warp: per instruction the warp's 16 rows × columns 8j .. 8j + 15 (j even) as four 8×8 matrices:
// rows 0–7 / 8–15 of group j, then of group j + 1; lane l addresses row l % 8 of matrix l / 8,
// i.e. group g = j + h (h = l / 16) of staging row srow, whose 16 bytes sit at byte
// srow·512 + 16·(g ^ (srow % 8)) (stage_index). With j = 8a + 2b and t = h ^ (l % 8) (< 8),
// g ^ (srow % 8) = j ^ t = 8a + (2b ^ t): the instruction for (a, b) stores at off[b] + 128·a.
__device__ __forceinline__ void stage_offsets(const std::uint32_t* tile_buf, int row16, int lane, std::uint32_t (&off)[4]) {
  const int mi = lane >> 3, srow = row16 + (mi & 1) * 8 + (lane & 7);
  const int t = (mi >> 1) ^ (lane & 7);
  const std::uint32_t rowb = sm90::smem_u32(tile_buf) + static_cast<std::uint32_t>(srow) * 512u;
#pragma unroll
  for (int b = 0; b < 4; ++b) off[b] = rowb + 16u * static_cast<std::uint32_t>((2 * b) ^ t);
}

// Bit j iff the bf16 pair v has a non-zero magnitude.
__device__ __forceinline__ std::uint32_t nz_bit(std::uint32_t v, int j) {
  return ((v & 0x7fff7fffu) != 0u ? 1u : 0u) << j;
}

__device__ __forceinline__ std::uint32_t relu_bf16x2(float lo, float hi) {
  std::uint32_t r;
  asm("cvt.rn.relu.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
#endif

// GP: the gated-product epilogue (launch_gated_product_sm90) instead of the TwELL packing. Its
// outputs travel in fields the packing would use, so that GatePackParams (the kernel's parameter)
// keeps its size (one more field there made ptxas spill 40 bytes in the TwELL kernels): h in
// `gate`, ld_h in `ld_gate`, h_cols in `words_per_tile`.
// LAB: the diagnostics build (timing_mode, profile: launch_twell_gate_pack_sm90_lab); the
// production instantiation has neither, compiled out.
template <int CM, bool STM, bool GP, bool LAB>
__global__ void __launch_bounds__(kThreads, 1)
    twell_gate_pack_sm90_kernel(const __grid_constant__ CUtensorMap tmap_x, const __grid_constant__ CUtensorMap tmap_w,
                                GatePackParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace sm90;
  extern __shared__ unsigned char smem_raw[];
  // [kStages] × { A [128, 64] bf16 | B [256, 64] bf16 } (128B swizzle), the staging tile, the
  // packers' row stages [kPackWarps][kRowStageWords] u32, then the mbarriers full[kStages],
  // empty[kStages], staged, freed.
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<std::uintptr_t>(smem_raw) + 1023) & ~std::uintptr_t{1023});
  std::uint32_t* tile_buf = reinterpret_cast<std::uint32_t*>(smem + kStages * kStageBytes);
  std::uint32_t* row_stage = reinterpret_cast<std::uint32_t*>(smem + kStages * kStageBytes + kTileBytes);
  unsigned long long* bars = reinterpret_cast<unsigned long long*>(smem + kStages * kStageBytes + kTileBytes + kRowStageBytes);
  std::uint32_t* masks =
      reinterpret_cast<std::uint32_t*>(smem + kStages * kStageBytes + kTileBytes + kRowStageBytes + kBarBytes);
  const std::uint32_t smem_base = smem_u32(smem);
  const std::uint32_t full0 = smem_u32(bars), empty0 = smem_u32(bars + kStages);
  const std::uint32_t staged = smem_u32(bars + 2 * kStages), freed = smem_u32(bars + 2 * kStages + 1);

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full0 + 8 * s, 1);                    // the local producer's arrive + 48 KB of TMA bytes
      mbar_init(empty0 + 8 * s, CM * kConsumers * 4);  // one arrive per consumer warp of every CTA of the cluster
    }
    mbar_init(staged, kConsumers * 128);  // every consumer thread, after writing its part of the tile
    mbar_init(freed, kPackWarps * 32);    // every packing thread, after reading the tile
    mbar_fence_init();
  }
  cluster_sync();  // every CTA's barriers exist before any multicast or remote arrive
  const long long t_start = LAB && p.profile ? clock64() : 0;

  // Work: groups of CM row tiles (one per CTA of the cluster) × N tiles, dealt n-fastest to the
  // clusters. A CTA whose row tile is past M still loads and multicasts its share of W (its peers
  // need it); its packers skip the rows past M.
  const std::int64_t mt = (p.m + kBM - 1) / kBM, nt = (p.n + kBN - 1) / kBN;
  const std::int64_t groups = (mt + CM - 1) / CM * nt;
  const std::int64_t cluster = blockIdx.x / CM, clusters = gridDim.x / CM;
  const int rank = CM > 1 ? static_cast<int>(cluster_rank()) : 0;
  const int kblocks = static_cast<int>((p.k + kBK - 1) / kBK);
  const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;

  if (wg == 0) {
    reg_dealloc<kRegsLoad>();
    if (warp == 0) {
      if (lane == 0) {  // producer
        int s = 0;
        std::uint32_t phase = 0;
        for (std::int64_t g = cluster; g < groups; g += clusters) {
          const int m0 = static_cast<int>(((g / nt) * CM + rank) * kBM), n0 = static_cast<int>((g % nt) * kBN);
          for (int kb = 0; kb < kblocks; ++kb) {
            mbar_wait(empty0 + 8 * s, phase ^ 1);  // free in every CTA (the first pass finds it free)
            mbar_arrive_expect_tx(full0 + 8 * s, kStageBytes);
            const std::uint32_t a = smem_base + s * kStageBytes;
            tma_load_2d(a, &tmap_x, kb * kBK, m0, full0 + 8 * s);
            constexpr int kPart = kBN / CM;  // rows of W this CTA loads for the cluster
            if constexpr (CM == 1)
              tma_load_2d(a + kABytes, &tmap_w, kb * kBK, n0, full0 + 8 * s);
            else
              tma_load_2d_multicast(a + kABytes + rank * kPart * kBK * 2, &tmap_w, kb * kBK, n0 + rank * kPart,
                                    full0 + 8 * s, static_cast<std::uint16_t>((1u << CM) - 1));
            if (++s == kStages) {
              s = 0;
              phase ^= 1;
            }
          }
        }
      }
    } else if constexpr (GP) {  // warps 1..3 copy the staged h tile out, rows of 256 bytes
      // Lane l: tile rows i ≡ 2·(warp − 1) + l / 16 (mod 2·kPackWarps), 16-byte chunk c = l % 16,
      // i.e. h columns hcol0 + 8c .. + 7; a chunk is stored iff it starts below h_cols (then it
      // ends by round_up(h_cols, 8) ≤ ld_h).
      const int c = lane & 15;
      std::uint32_t phase = 0;
      for (std::int64_t g = cluster; g < groups; g += clusters) {
        const std::int64_t tm = (g / nt) * CM + rank, hcol = (g % nt) * (kBN / 2) + 8 * c;
        mbar_wait(staged, phase);
        if (hcol < p.words_per_tile)
          for (int i = 2 * (warp - 1) + (lane >> 4); i < kBM; i += 2 * kPackWarps) {
            const std::int64_t row = tm * kBM + i;
            if (row >= p.m) break;
            *reinterpret_cast<uint4*>(p.gate + row * p.ld_gate + hcol) =
                *reinterpret_cast<const uint4*>(tile_buf + stage_index(i, 4 * c));
          }
        mbar_arrive(freed);  // this thread's reads of the tile are done
        phase ^= 1;
      }
    } else if (!LAB || p.timing_mode != 1) {  // packers: one lane per row
      const int S = p.words_per_tile, cap = S - 1;
      const int R = S <= 32 ? 32 : 1024 / S;  // rows per pass; a multiple of 32 / S, so R · S % 32 == 0
      const int log2s = __ffs(S) - 1;          // S is a power of two (it divides 256)
      // S ≥ 4: each lane's finished block leaves by one bulk copy (S · 4 bytes, a multiple of 16)
      // from its stage row (stride S + 4: 16-byte aligned, quarter-warps on distinct bank groups).
      // S = 2: the warp stores the pass's blocks word by word (stride S + 1).
      const bool bulk = S >= 4;
      const int stride = bulk ? S + 4 : S + 1;
      std::uint32_t* st = row_stage + (warp - 1) * kRowStageWords;
      std::uint32_t* srow = st + lane * stride;  // this lane's stage row: word 0 = count, then entries
      // Invariant (bulk): stage slots past a row's entries are zero; slots 1 .. lim of srow hold the
      // previous pass's entries until they are cleared.
      for (int j = lane; j < kRowStageWords; j += 32) st[j] = 0u;
      __syncwarp();
      unsigned lim = 0;
      std::uint32_t phase = 0;
      for (std::int64_t g = cluster; g < groups; g += clusters) {
        const std::int64_t tm = (g / nt) * CM + rank, tn = g % nt, n0 = tn * kBN;
        const int ncols = static_cast<int>(p.n - n0 < kBN ? p.n - n0 : kBN);  // this tile's columns < N
        const std::int64_t col0 = n0 + 8 * lane;                              // lane's 8 columns in row copies
        const unsigned word_cols = ncols >= kBN ? 0xffffffffu : (1u << ((ncols + 7) / 8)) - 1u;  // words < N
        const long long t_wait = LAB && p.profile ? clock64() : 0;
        mbar_wait(staged, phase);
        const long long t_busy = LAB && p.profile ? clock64() : 0;
        unsigned tile_nnz = 0;  // this lane's rows
        // Passes of R consecutive tile rows, dealt round-robin to the packing warps; lane l packs
        // row i0 + l alone, so no cross-lane work is spent on the (mostly empty) rows.
        for (int i0 = (warp - 1) * R; i0 < kBM && (!LAB || p.timing_mode != 2); i0 += kPackWarps * R) {
          const std::int64_t row0 = tm * kBM + i0;
          if (row0 >= p.m) break;  // warp-uniform; later passes are past the end too
          const int i = i0 + lane;
          const bool mine = lane < R && row0 + lane < p.m;
          // (1) Which 16-byte words of the row hold any non-zero magnitude (a superset of the kept
          // ones): the OR of the consumers' four masks, or (word_masks off) one load and three ORs
          // per word of the staged row; no keep rule yet.
          unsigned nzw = 0;
          if (mine && p.word_masks) {  // the consumers' masks: one 16-byte read instead of 32
            const uint4 qm = *reinterpret_cast<const uint4*>(masks + 4 * i);
            nzw = (qm.x | qm.y | qm.z | qm.w) & word_cols;
          } else if (mine) {
#pragma unroll 8
            for (int w = 0; w < 32; ++w) {
              const uint4 v = *reinterpret_cast<const uint4*>(tile_buf + stage_index(i, 4 * w));
              nzw |= ((v.x | v.y | v.z | v.w) & 0x7fff7fffu) ? (1u << w) : 0u;
            }
            nzw &= word_cols;
          }
          // (1b) Heavy rows go to the whole warp (step 2b). The lane loop of step 2 costs the warp
          // its longest row (in words), the warp pass about kHeavyRowWords words per row, so the
          // rows with more than T non-zero words are heavy for the T in {1, 2, 4, …, 32} that
          // minimises (longest light row) + kHeavyRowWords · (heavy rows). Nothing is heavy
          // unless some row has more than kHeavyRowWords words (no split can pay then).
          unsigned heavy = 0;
          if (p.heavy_rows) {
            const unsigned c = __popc(nzw);
            unsigned best = __reduce_max_sync(0xffffffffu, c);
            if (best > kHeavyRowWords) {
              for (unsigned t = 16; t >= 1; t >>= 1) {
                const unsigned h = __ballot_sync(0xffffffffu, c > t);
                const unsigned cost = __reduce_max_sync(0xffffffffu, c > t ? 0u : c) + kHeavyRowWords * __popc(h);
                if (cost < best) {
                  best = cost;
                  heavy = h;
                }
              }
              if ((heavy >> lane) & 1u) nzw = 0;  // packed in step 2b
            }
          }
          if (bulk) {  // the previous pass's copy has read srow: clear its entries
            bulk_wait_read_all();
            for (unsigned j = 1; j <= lim; ++j) srow[j] = 0u;
          }
          // (2) The keep rule on those words only, entries in ascending column order into slots
          // 1 .. min(count, S − 1) of the lane's stage row; cnt is the true count.
          unsigned cnt = 0;
          std::uint32_t* mine_st = srow + 1;
          while (nzw) {
            const int w = __ffs(nzw) - 1;
            nzw &= nzw - 1;
            const uint4 v = *reinterpret_cast<const uint4*>(tile_buf + stage_index(i, 4 * w));
            const int left = ncols - 8 * w;
            unsigned m = dev::keep_mask8(v) & (left >= 8 ? 0xffu : (1u << left) - 1u);
            while (m) {
              const int e = __ffs(m) - 1;
              m &= m - 1;
              if (cnt < static_cast<unsigned>(cap)) mine_st[cnt] = (dev::bf16_bits(v, e) << 16) | static_cast<std::uint32_t>(8 * w + e);
              ++cnt;
            }
          }
          // (2b) Each heavy row by the whole warp: lane l applies the keep rule to the row's word l
          // (columns 8l .. 8l + 7), a warp scan of the counts places its entries in ascending
          // column order in the row's stage slots, and the row's lane takes the true count.
          if (heavy) {
            __syncwarp();  // the heavy rows' lanes have cleared their stage slots (above)
            const int left = ncols - 8 * lane;
            const unsigned cols = left >= 8 ? 0xffu : left > 0 ? (1u << left) - 1u : 0u;
            for (unsigned h = heavy; h; h &= h - 1) {
              const int r = __ffs(h) - 1;
              const uint4 v = *reinterpret_cast<const uint4*>(tile_buf + stage_index(i0 + r, 4 * lane));
              unsigned m = dev::keep_mask8(v) & cols;
              const int c = __popc(m);
              const int incl = dev::warp_inclusive_scan(c, lane);
              std::uint32_t* rst = st + r * stride + 1;
              for (unsigned slot = static_cast<unsigned>(incl - c); m; ++slot) {
                const int e = __ffs(m) - 1;
                m &= m - 1;
                if (slot < static_cast<unsigned>(cap))
                  rst[slot] = (dev::bf16_bits(v, e) << 16) | static_cast<std::uint32_t>(8 * lane + e);
              }
              const unsigned total = static_cast<unsigned>(__shfl_sync(0xffffffffu, incl, 31));
              if (lane == r) cnt = total;
            }
            fence_proxy_async_shared();  // this lane's entry writes, before a peer's bulk copy reads them
            __syncwarp();
          }
          lim = min(cnt, static_cast<unsigned>(cap));
          // (3) The blocks leave: word 0 = count, then the entries, then zeros (the same words as
          // twell_pack).
          if (!LAB || p.timing_mode != 3) {
            if (bulk) {
              if (mine) {
                srow[0] = cnt;
                fence_proxy_async_shared();
                bulk_store_s2g(p.words + ((row0 + lane) * nt + tn) * S, smem_u32(srow), static_cast<std::uint32_t>(S) * 4u);
                bulk_commit();
              }
            } else {  // lane l of step q writes word (32q + l) mod S of row (32q + l) / S
              __syncwarp();
              for (int idx = lane; idx < R * S; idx += 32) {
                const int r = idx >> log2s, j = idx & (S - 1);
                const unsigned t = __shfl_sync(0xffffffffu, cnt, r);
                if (row0 + r < p.m) {
                  const std::uint32_t word = j == 0 ? t : (static_cast<unsigned>(j) <= min(t, static_cast<unsigned>(cap)) ? st[r * stride + j] : 0u);
                  p.words[((row0 + r) * nt + tn) * S + j] = word;
                }
              }
              __syncwarp();  // every lane has read the stage before the next pass rewrites it
              lim = 0;       // this path reads slots 1 .. count only: nothing to clear
            }
            if (mine) {
              tile_nnz += cnt;
              const std::int64_t row = row0 + lane;
              if (p.row_nnz && cnt) atomicAdd(p.row_nnz + row, cnt);
              if (cnt > static_cast<unsigned>(cap)) {
                atomicAdd(&p.counters->overflow_tiles, 1ull);
                if (atomicExch(p.row_overflow + row, 1u) == 0u) atomicAdd(&p.counters->overflow_rows, 1ull);  // first block to flag the row counts it
              }
            }
            // (4) Values of the overflowed blocks (every block with store_gate) go to the gate
            // buffer, one row per warp step: lane l copies columns 8l .. 8l + 7.
            unsigned copy = __ballot_sync(0xffffffffu, mine && (p.store_gate || cnt > static_cast<unsigned>(cap)));
            while (copy) {
              const int r = __ffs(copy) - 1;
              copy &= copy - 1;
              if (col0 < p.n)  // col0 + 8 ≤ ld_gate
                *reinterpret_cast<uint4*>(p.gate + (row0 + r) * p.ld_gate + col0) =
                    *reinterpret_cast<const uint4*>(tile_buf + stage_index(i0 + r, 4 * lane));
            }
          }
          __syncwarp();  // every lane has read the stage before the next pass rewrites it
        }
        mbar_arrive(freed);  // this thread's reads of the tile are done
        if (LAB && p.profile && lane == 0) {
          unsigned long long* pr = p.profile + blockIdx.x * kGatePackProfileSlots;
          pr[warp - 1] += static_cast<unsigned long long>(clock64() - t_busy);
          if (warp == 1) pr[3] += static_cast<unsigned long long>(t_busy - t_wait);
        }
        tile_nnz = __reduce_add_sync(0xffffffffu, tile_nnz);
        if (lane == 0 && tile_nnz) atomicAdd(&p.counters->nnz, static_cast<unsigned long long>(tile_nnz));
        phase ^= 1;
      }
      bulk_wait_all();  // this lane's block copies have landed before the CTA (and its stage) goes
    }
  } else {
    reg_alloc<kRegsMma>();
    const int cw = wg - 1;  // consumer warpgroup: tile rows 64·cw .. 64·cw + 63
    // Stage st is free for the producers once every consumer warp of every CTA has finished with it.
    auto release = [&](int st) {
      if constexpr (CM == 1) {
        mbar_arrive(empty0 + 8 * st);
      } else {
#pragma unroll
        for (int r = 0; r < CM; ++r) mbar_arrive_cluster(empty0 + 8 * st, static_cast<std::uint32_t>(r));
      }
    };
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.0f;  // the first wgmma of a tile overwrites (scale_d = 0)
    int s = 0;
    std::uint32_t phase = 0, tphase = 0;
    for (std::int64_t g = cluster; g < groups; g += clusters) {
      int prev = 0;
      for (int kb = 0; kb < kblocks; ++kb) {
        mbar_wait(full0 + 8 * s, phase);
        const std::uint32_t a = smem_base + s * kStageBytes + cw * 64 * 128;  // this warpgroup's 64 rows
        const std::uint32_t b = smem_base + s * kStageBytes + kABytes;
        const std::uint64_t da = desc_k128(a), db = desc_k128(b);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) wgmma_m64n256k16_bf16(acc, da + 2 * kk, db + 2 * kk, (kb > 0 || kk > 0) ? 1 : 0);
        wgmma_commit();
        if (kb > 0) {  // the previous stage's wgmmas are done: hand its buffers back to the producer
          wgmma_wait<1>();
          if (lane == 0) release(prev);
        }
        prev = s;
        if (++s == kStages) {
          s = 0;
          phase ^= 1;
        }
      }
      wgmma_wait<0>();
      if (lane == 0) release(prev);
#pragma unroll
      for (int i = 0; i < 128; ++i) fence_operand(acc[i]);
      if (LAB && p.timing_mode == 1) continue;
      // Hand the tile to the packers: ReLU + bf16 into the staging tile once they have read the
      // previous one (the first tile finds it free); they pack while this warpgroup runs the next
      // tile's wgmmas. Fragment half h of this warp: local rows 64·cw + 16·warp + 8h + lane/4.
      const long long t_wait = LAB && p.profile ? clock64() : 0;
      mbar_wait(freed, tphase ^ 1);
      if (LAB && p.profile && threadIdx.x == 128) {
        p.profile[blockIdx.x * kGatePackProfileSlots + 4] += static_cast<unsigned long long>(clock64() - t_wait);
        p.profile[blockIdx.x * kGatePackProfileSlots + 5] += 1;
      }
      // This lane's fragment rows r0 and r0 + 8, columns 8j + 2q and 8j + 2q + 1 (j = 0 … 31): bit j
      // of nz[h] says whether the pair of row r0 + 8h has a non-zero magnitude (word masks).
      const int q = lane & 3, r0 = cw * 64 + warp * 16 + (lane >> 2);
      std::uint32_t nz[2] = {0u, 0u};
      if constexpr (GP) {
        // h = ReLU(g) ⊙ u for the tile's 128 neurons, g in columns 0..127 and u in 128..255 of the
        // accumulators (group j of g and group j + 16 of u: the same neurons), each rounded to
        // bf16 first, then the product in fp32 rounded once: the same arithmetic as
        // ops::gated_product (ReLU) on the bf16 [g | u] of a GEMM. Staged by stmatrix into words 0..63
        // of the staging rows, as the TwELL path stages groups 0..15 (the same addresses).
        std::uint32_t off[4];
        stage_offsets(tile_buf, cw * 64 + warp * 16, lane, off);
        auto hpair = [&](int i) {  // accumulator pair i of g (i + 64 is u's pair of the same neurons)
          const float g0 = __bfloat162float(__float2bfloat16_rn(acc[i])), g1 = __bfloat162float(__float2bfloat16_rn(acc[i + 1]));
          const float u0 = __bfloat162float(__float2bfloat16_rn(acc[i + 64]));
          const float u1 = __bfloat162float(__float2bfloat16_rn(acc[i + 65]));
          const __nv_bfloat162 h = __floats2bfloat162_rn(fmaxf(g0, 0.0f) * u0, fmaxf(g1, 0.0f) * u1);
          return *reinterpret_cast<const std::uint32_t*>(&h);
        };
#pragma unroll
        for (int a = 0; a < 2; ++a)
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            const int j = 8 * a + 2 * b;
            stmatrix_x4(off[b] + 128u * static_cast<std::uint32_t>(a), hpair(4 * j), hpair(4 * j + 2), hpair(4 * j + 4),
                        hpair(4 * j + 6));
          }
      } else if constexpr (STM) {
        // The 64 pairs by 16 stmatrix.x4 (stage_offsets). (The fourteenth session's build spilled
        // 24 bytes here, all in the packing warp's profiling branch; the builds since spill none.)
        std::uint32_t off[4];
        stage_offsets(tile_buf, cw * 64 + warp * 16, lane, off);
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            const int j = 8 * a + 2 * b;
            const std::uint32_t v0 = relu_bf16x2(acc[4 * j], acc[4 * j + 1]);
            const std::uint32_t v1 = relu_bf16x2(acc[4 * j + 2], acc[4 * j + 3]);
            const std::uint32_t v2 = relu_bf16x2(acc[4 * j + 4], acc[4 * j + 5]);
            const std::uint32_t v3 = relu_bf16x2(acc[4 * j + 6], acc[4 * j + 7]);
            stmatrix_x4(off[b] + 128u * static_cast<std::uint32_t>(a), v0, v1, v2, v3);
            nz[0] |= nz_bit(v0, j) | nz_bit(v2, j + 1);  // v0, v2: this lane's row r0; v1, v3: row r0 + 8
            nz[1] |= nz_bit(v1, j) | nz_bit(v3, j + 1);
          }
      } else {
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int j = 0; j < 32; ++j) {
            const std::uint32_t v = relu_bf16x2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
            tile_buf[stage_index(r0 + 8 * h, 4 * j + q)] = v;
            nz[h] |= nz_bit(v, j);
          }
      }
      if (!GP && p.word_masks) {  // rows r0, r0 + 8: 32 consecutive words per warp instruction
        masks[4 * r0 + q] = nz[0];
        masks[4 * (r0 + 8) + q] = nz[1];
      }
      mbar_arrive(staged);
      tphase ^= 1;
    }
  }
  // No CTA leaves while a peer may still multicast into its shared memory or arrive on its barriers.
  cluster_sync();
  if (LAB && p.profile && threadIdx.x == 0) p.profile[blockIdx.x * kGatePackProfileSlots + 6] = static_cast<unsigned long long>(clock64() - t_start);
#else
  __trap();  // launched only where gate_pack_sm90_available() (sm_90a code present)
#endif
}

// cuTensorMapEncodeTiled through the runtime's driver entry point (nothing links libcuda).
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    TWELL_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
    TWELL_CU_REQUIRE(q == cudaDriverEntryPointSuccess && f, ErrorCode::cuda,
                     "gate pack sm90: the driver has no cuTensorMapEncodeTiled (needs CUDA 12 drivers)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// [rows, k] bf16 row-major (row stride k), boxes of [box_rows, 64] with 128-byte swizzle; rows and
// columns past the end read as zero.
CUtensorMap tile_map(const __nv_bfloat16* base, std::int64_t rows, std::int64_t k, int box_rows) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k) * 2};
  const cuuint32_t box[2] = {kBK, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r = encode_fn()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<__nv_bfloat16*>(base), dims, strides,
                                 box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TWELL_CU_REQUIRE(r == CUDA_SUCCESS, ErrorCode::cuda, "gate pack sm90: cuTensorMapEncodeTiled failed ({}) for [{}, {}]",
                   static_cast<int>(r), rows, k);
  return map;
}

}  // namespace

bool gate_pack_sm90_available(int device) {
  int major = 0, minor = 0, optin = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
    return false;
  if (major != 9 || minor != 0 || static_cast<std::size_t>(optin) < kGatePackSmemBytes) return false;
  cudaFuncAttributes fa{};
  if (cudaFuncGetAttributes(&fa, twell_gate_pack_sm90_kernel<1, false, false, false>) != cudaSuccess) return false;
  return fa.binaryVersion == 90;  // the sm_90a cubin (a build without it would run the sm_80 stub)
}

namespace {

// Validation common to both epilogues; then the launch of kernel<CM, STM, GP> as chosen.
void check_gemm_shape(const __nv_bfloat16* x, const __nv_bfloat16* w, std::int64_t m, std::int64_t n, std::int64_t k,
                      int sm_count, int cluster) {
  TWELL_CU_REQUIRE(x && w, ErrorCode::invalid_argument, "gate pack sm90: null x or W");
  TWELL_CU_REQUIRE(m >= 1 && m <= 0x7fffffff && n >= 1 && n <= 0x7fffffff, ErrorCode::invalid_argument,
                   "gate pack sm90: bad shape m={} n={}", m, n);
  TWELL_CU_REQUIRE(k >= 8 && k % 8 == 0, ErrorCode::unsupported,
                   "gate pack sm90: K must be a positive multiple of 8 (16-byte TMA row strides); got K = {}", k);
  TWELL_CU_REQUIRE((reinterpret_cast<std::uintptr_t>(x) & 15) == 0 && (reinterpret_cast<std::uintptr_t>(w) & 15) == 0,
                   ErrorCode::invalid_argument, "gate pack sm90: x and W must be 16-byte aligned");
  TWELL_CU_REQUIRE(sm_count >= 1, ErrorCode::invalid_argument, "gate pack sm90: sm_count must be set");
  TWELL_CU_REQUIRE(cluster == 1 || cluster == 2 || cluster == 4, ErrorCode::invalid_argument,
                   "gate pack sm90: cluster size must be 1, 2 or 4 (got {})", cluster);
}

template <bool STM, bool GP, bool LAB = false>
void launch_kernel(const GatePackParams& p, cudaStream_t stream) {
  const int cm = p.cluster;
  auto kernel = cm == 1 ? twell_gate_pack_sm90_kernel<1, STM, GP, LAB>
                : cm == 2 ? twell_gate_pack_sm90_kernel<2, STM, GP, LAB> : twell_gate_pack_sm90_kernel<4, STM, GP, LAB>;
  // Per launch: the attribute belongs to the current device (a host-side call, no synchronisation).
  TWELL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kGatePackSmemBytes)));
  const CUtensorMap mx = tile_map(p.x, p.m, p.k, kBM);
  const CUtensorMap mw = tile_map(p.w, p.n, p.k, kBN / cm);
  // Persistent: at most one CTA per SM; clusters that do not fit at once simply run later.
  const std::int64_t groups = ((p.m + kBM - 1) / kBM + cm - 1) / cm * ((p.n + kBN - 1) / kBN);
  const std::int64_t clusters = std::max<std::int64_t>(1, std::min<std::int64_t>(groups, p.sm_count / cm));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(clusters * cm));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kGatePackSmemBytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[3];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(cm);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1 + static_cast<unsigned>(launch_attributes(attr + 1, false));  // a LaunchCarveout scope's
  TWELL_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, mx, mw, p));
  TWELL_CUDA_CHECK_LAUNCH("twell_gate_pack_sm90_kernel");
}

// The checks and resets both launchers share.
void prepare_gate_pack(const GatePackParams& p, cudaStream_t stream) {
  check_gemm_shape(p.x, p.w, p.m, p.n, p.k, p.sm_count, p.cluster);
  TWELL_CU_REQUIRE(p.words && p.row_overflow && p.counters && p.gate, ErrorCode::invalid_argument,
                   "gate pack sm90: null pointer");
  TWELL_CU_REQUIRE(p.ld_gate >= (p.n + 7) / 8 * 8 && p.ld_gate % 8 == 0, ErrorCode::invalid_argument,
                   "gate pack sm90: gate row stride {} must be ≥ round_up(N, 8) and a multiple of 8", p.ld_gate);
  TWELL_CU_REQUIRE(p.words_per_tile >= 2 && p.words_per_tile <= 128 && kTwellTile % p.words_per_tile == 0,
                   ErrorCode::unsupported, "gate pack sm90: needs S = 256/C in [2, 128]; got S = {}", p.words_per_tile);
  TWELL_CU_REQUIRE((reinterpret_cast<std::uintptr_t>(p.gate) & 15) == 0 && (reinterpret_cast<std::uintptr_t>(p.words) & 15) == 0,
                   ErrorCode::invalid_argument, "gate pack sm90: the words and the gate buffer must be 16-byte aligned");
  TWELL_CUDA_CHECK(cudaMemsetAsync(p.counters, 0, sizeof(TwellCounters), stream));
  TWELL_CUDA_CHECK(cudaMemsetAsync(p.row_overflow, 0, static_cast<std::size_t>(p.m) * sizeof(std::uint32_t), stream));
  if (p.row_nnz) TWELL_CUDA_CHECK(cudaMemsetAsync(p.row_nnz, 0, static_cast<std::size_t>(p.m) * sizeof(std::uint32_t), stream));
}

}  // namespace

void launch_twell_gate_pack_sm90(const GatePackParams& p, cudaStream_t stream) {
  TWELL_CU_REQUIRE(p.timing_mode == 0 && p.profile == nullptr, ErrorCode::invalid_argument,
                   "gate pack sm90: timing_mode and profile are diagnostics: launch_twell_gate_pack_sm90_lab");
  prepare_gate_pack(p, stream);
  if (p.stage_stmatrix)
    launch_kernel<true, false>(p, stream);
  else
    launch_kernel<false, false>(p, stream);
}

void launch_twell_gate_pack_sm90_lab(const GatePackParams& p, cudaStream_t stream) {
  TWELL_CU_REQUIRE(p.timing_mode >= 0 && p.timing_mode <= 3, ErrorCode::invalid_argument,
                   "gate pack sm90: timing_mode is 0..3 (got {})", p.timing_mode);
  prepare_gate_pack(p, stream);
  if (p.stage_stmatrix)
    launch_kernel<true, false, true>(p, stream);
  else
    launch_kernel<false, false, true>(p, stream);
}

void pack_gated_product_weights(const __nv_bfloat16* wg, const __nv_bfloat16* wu, std::int64_t hot, std::int64_t k,
                                __nv_bfloat16* dst, cudaStream_t stream) {
  TWELL_CU_REQUIRE(wg && wu && dst && hot >= 1 && k >= 1, ErrorCode::invalid_argument,
                   "gated product weights: null pointer or empty shape (hot = {}, k = {})", hot, k);
  TWELL_CUDA_CHECK(cudaMemsetAsync(dst, 0, static_cast<std::size_t>(gated_product_rows(hot) * k) * sizeof(__nv_bfloat16), stream));
  for (std::int64_t b = 0; 128 * b < hot; ++b) {
    const std::size_t bytes = static_cast<std::size_t>(std::min<std::int64_t>(128, hot - 128 * b) * k) * sizeof(__nv_bfloat16);
    TWELL_CUDA_CHECK(cudaMemcpyAsync(dst + 256 * b * k, wg + 128 * b * k, bytes, cudaMemcpyDeviceToDevice, stream));
    TWELL_CUDA_CHECK(cudaMemcpyAsync(dst + (256 * b + 128) * k, wu + 128 * b * k, bytes, cudaMemcpyDeviceToDevice, stream));
  }
}

void launch_gated_product_sm90(const GatedProductParams& q, cudaStream_t stream) {
  check_gemm_shape(q.x, q.w, q.m, q.n, q.k, q.sm_count, q.cluster);
  TWELL_CU_REQUIRE(q.h && q.n % kBN == 0 && q.h_cols >= 1 && q.h_cols <= q.n / 2, ErrorCode::invalid_argument,
                   "gated product sm90: needs h, W in blocks of 128 gate + 128 up rows (n = {} a multiple of 256) and "
                   "1 ≤ h_cols = {} ≤ n / 2",
                   q.n, q.h_cols);
  TWELL_CU_REQUIRE(q.ld_h >= (q.h_cols + 7) / 8 * 8 && q.ld_h % 8 == 0 && (reinterpret_cast<std::uintptr_t>(q.h) & 15) == 0,
                   ErrorCode::invalid_argument,
                   "gated product sm90: h row stride {} must be ≥ round_up(h_cols, 8) and a multiple of 8, h 16-byte aligned",
                   q.ld_h);
  GatePackParams p;  // the kernel's parameter: h in gate, ld_h in ld_gate, h_cols in words_per_tile
  p.x = q.x;
  p.w = q.w;
  p.m = q.m;
  p.n = q.n;
  p.k = q.k;
  p.gate = q.h;
  p.ld_gate = q.ld_h;
  p.words_per_tile = static_cast<int>(q.h_cols);
  p.sm_count = q.sm_count;
  p.cluster = q.cluster;
  launch_kernel<true, true>(p, stream);
}

}  // namespace twell::cuda
