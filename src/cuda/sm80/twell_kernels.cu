// Portable TwELL kernels (sm_80+; also the fallback on Hopper for shapes the sm90 path rejects).
#include "cuda/sm80/twell_kernels.hpp"

#include <algorithm>
#include <type_traits>

#include "cuda/common/check.hpp"
#include "cuda/common/device_math.cuh"
#include "cuda/sm80/twell_dense_rows.hpp"

namespace twell::cuda {
namespace {

using dev::hi_bf16;
using dev::lo_bf16;
using dev::warp_inclusive_scan;
using dev::warp_sum;
using dev::dot8;
using dev::axpy8;

// ---------------------------------------------------------------------------------------------
// Packing: one warp per (row, run of kPackTilesPerWarp tiles), so that small M still fills the GPU.
// Lane l owns columns [8l, 8l + 8) of a tile, so a tile is one 512-byte coalesced read (all of the
// warp's tiles are loaded before the first is packed); a warp scan over the lanes' keep counts gives
// each kept value its slot in ascending column order.
constexpr int kPackWarps = 8;
constexpr int kPackTilesPerWarp = 4;

__global__ void __launch_bounds__(kPackWarps * 32) twell_pack_kernel(TwellPackParams p) {
  if (p.enable && *p.enable == 0) return;  // dispatch chose the dense remainder
  // [kPackWarps, 256] u32: one block's words per warp (S ≤ 128); slot i valid iff 1 ≤ i ≤ min(count, S − 1)
  __shared__ std::uint32_t stage[kPackWarps][kTwellTile];
  __shared__ unsigned long long s_nnz, s_ovt, s_ovr;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) s_nnz = s_ovt = s_ovr = 0;
  __syncthreads();

  const int S = p.words_per_tile, cap = S - 1;
  const std::int64_t tiles = (p.n + kTwellTile - 1) / kTwellTile;
  const std::int64_t runs = (tiles + kPackTilesPerWarp - 1) / kPackTilesPerWarp;
  const std::int64_t item = static_cast<std::int64_t>(blockIdx.x) * kPackWarps + warp;
  const std::int64_t row = item / runs;
  if (row < p.m) {
    const std::int64_t t0 = (item % runs) * kPackTilesPerWarp;
    const __nv_bfloat16* src = p.src + row * p.ld_src;
    std::uint32_t* out = p.words + row * tiles * S;
    const bool vec_ok = (p.ld_src % 8 == 0) && ((reinterpret_cast<std::uintptr_t>(p.src) & 15) == 0);
    uint4 v[kPackTilesPerWarp];
#pragma unroll
    for (int i = 0; i < kPackTilesPerWarp; ++i) v[i] = dev::load8_bf16(src, (t0 + i) * kTwellTile + lane * 8, p.n, vec_ok);

    unsigned long long my_nnz = 0;
    int my_ovt = 0;
#pragma unroll
    for (int i = 0; i < kPackTilesPerWarp; ++i) {
      const std::int64_t t = t0 + i;
      if (t >= tiles) break;  // warp-uniform
      const unsigned mask = dev::keep_mask8(v[i], p.relu);
      const int cnt = __popc(mask);
      const int incl = warp_inclusive_scan(cnt, lane);
      const int total = __shfl_sync(0xffffffffu, incl, 31);
      int pos = incl - cnt;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (mask & (1u << e)) {
          if (pos < cap) stage[warp][1 + pos] = (dev::bf16_bits(v[i], e) << 16) | std::uint32_t(lane * 8 + e);
          ++pos;
        }
      }
      __syncwarp();
      const int lim = min(total, cap);
      std::uint32_t* blk = out + t * S;
      for (int j = lane; j < S; j += 32) blk[j] = (j == 0) ? std::uint32_t(total) : (j <= lim ? stage[warp][j] : 0u);
      __syncwarp();
      my_nnz += static_cast<unsigned long long>(total);
      my_ovt += (total > cap) ? 1 : 0;
    }
    if (lane == 0) {
      atomicAdd(&s_nnz, my_nnz);
      if (p.row_nnz && my_nnz) atomicAdd(p.row_nnz + row, static_cast<std::uint32_t>(my_nnz));
      if (my_ovt > 0) {
        atomicAdd(&s_ovt, static_cast<unsigned long long>(my_ovt));
        // First warp to flag the row counts it (row_overflow was zeroed by the launcher).
        if (atomicExch(p.row_overflow + row, 1u) == 0u) atomicAdd(&s_ovr, 1ull);
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    if (s_nnz) atomicAdd(&p.counters->nnz, s_nnz);
    if (s_ovt) atomicAdd(&p.counters->overflow_tiles, s_ovt);
    if (s_ovr) atomicAdd(&p.counters->overflow_rows, s_ovr);
  }
}

// Sampled count for dispatch: one warp per sampled row, 16-byte loads.
__global__ void __launch_bounds__(256) twell_sample_count_kernel(TwellSampleParams p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int64_t sampled = (p.m + p.stride - 1) / p.stride;
  const std::int64_t srow = static_cast<std::int64_t>(blockIdx.x) * 8 + warp;
  unsigned long long c = 0;
  if (srow < sampled) {
    const __nv_bfloat16* src = p.src + srow * p.stride * p.ld_src;
    const bool vec_ok = (p.ld_src % 8 == 0) && ((reinterpret_cast<std::uintptr_t>(p.src) & 15) == 0);
    for (std::int64_t c0 = static_cast<std::int64_t>(lane) * 8; c0 < p.n; c0 += 256) {
      c += static_cast<unsigned long long>(__popc(dev::keep_mask8(dev::load8_bf16(src, c0, p.n, vec_ok))));
    }
  }
  c = warp_sum(c);
  if (lane == 0) {  // a row the sparse path runs dense counts at its dense cost
    const unsigned long long weight = dense_row_weight(c, p.row_cap, p.row_cost);
    if (weight) atomicAdd(p.count, weight);
    if (p.hot && dense_row_hot(c, p.row_cap)) atomicAdd(p.hot, 1ull);
    if (p.nnz && c) atomicAdd(p.nnz, c);
  }
}

__global__ void twell_decide_kernel(TwellSampleParams p) {
  const std::int64_t sampled = (p.m + p.stride - 1) / p.stride;
  *p.decision = static_cast<double>(*p.count) <= p.max_density * static_cast<double>(sampled) * static_cast<double>(p.n) ? 1u : 0u;
}

// ---------------------------------------------------------------------------------------------
// Fused up+down: one CTA per token row. The CTA's threads split K into 16-byte chunks (8 bf16);
// thread t owns chunks {i·blockDim + t : i < CH}, so each warp reads contiguous 512-byte runs of a
// weight row. Per window of ≤ kListCap non-zeros: (1) the row's TwELL blocks are expanded into a
// list in shared memory, (2) every warp computes its K-slice of ⟨x, Wu[n]⟩ for all entries (many
// independent loads in flight), (3) partial sums are combined into h = g·u, (4) y += h·Wdᵀ[n].
constexpr int kListCap = kTwellTile;  // a single tile (≤ 256 non-zeros) always fits one window
constexpr int kMaxUpDownThreads = 512;  // caps registers at 128/thread: no spills for CH ≤ 4
// Variants 3 and 4 (K ≤ 2048: at most this many threads) are compiled for MINB resident blocks
// per SM: fewer registers, more warps to hide the L2 round trips.
constexpr int kSmallUpDownThreads = 128;

// CH: 16-byte chunks of K per thread; kUnroll: entries whose weight rows are in flight together.
// One tile of a dense bf16 row (columns [t·256, t·256 + 256) of `src`, length n) expanded into the
// list at `off` in ascending columns, at most `c` entries (the tile's count): lane l reads columns
// [8l, 8l + 8) in one 16-byte load, a warp scan of the lanes' keep counts places each value.
__device__ __forceinline__ void expand_dense_tile(const __nv_bfloat16* src, std::int64_t n, bool vec_ok, int t, int off,
                                                  int c, bool relu, int lane, int* lcol, float* lval) {
  const std::int64_t c0 = static_cast<std::int64_t>(t) * kTwellTile + lane * 8;
  const uint4 v = dev::load8_bf16<false>(src, c0, n, vec_ok);
  float f[8];
  dev::unpack8_bf16(v, f);
  const unsigned mask = dev::keep_mask8(v, relu);
  const int cnt = __popc(mask);
  int pos = warp_inclusive_scan(cnt, lane) - cnt;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    if (mask & (1u << e)) {
      if (pos < c) {
        lcol[off + pos] = static_cast<int>(c0) + e;
        lval[off + pos] = f[e];
      }
      ++pos;
    }
  }
}

template <int CH, bool GATED, int kUnroll, int MINB>
__global__ void __launch_bounds__(MINB > 0 ? kSmallUpDownThreads : kMaxUpDownThreads, MINB > 0 ? MINB : 1)
    twell_up_down_kernel(TwellUpDownParams p) {
  static_assert(CH >= 1 && CH <= 4, "CH: 16-byte chunks per thread");
  if (p.row_filter && (p.row_filter[blockIdx.x] != 0u) != p.filter_keep_flagged) return;  // CTA-uniform
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int nthreads = blockDim.x, nwarps = nthreads / 32;
  const int S = p.words_per_tile, cap = S - 1;
  const int tiles = static_cast<int>((p.n + kTwellTile - 1) / kTwellTile);
  const int kchunks = static_cast<int>(p.k / 8);
  const std::int64_t row = blockIdx.x;

  // Shared memory: lcol [kListCap] i32 (global neuron of entry j), lval [kListCap] f32 (g, then h),
  // part [nwarps, kListCap] f32 (per-warp partial ⟨x, Wu[n]⟩), pref [tiles + 1] i32 (prefix of the
  // true counts; an overflowed block contributes its true count, read from the backup).
  int* lcol = reinterpret_cast<int*>(smem_raw);
  float* lval = reinterpret_cast<float*>(lcol + kListCap);
  float* part = lval + kListCap;
  int* pref = reinterpret_cast<int*>(part + (GATED ? nwarps * kListCap : 0));

  const std::uint32_t* wrow = p.words + row * static_cast<std::int64_t>(tiles) * S;
  const __nv_bfloat16* brow = p.backup + row * p.ld_backup;
  const bool b_vec = (p.ld_backup % 8 == 0) && ((reinterpret_cast<std::uintptr_t>(p.backup) & 15) == 0);
  if (warp == 0) {
    int carry = 0;
    for (int t0 = 0; t0 < tiles; t0 += 32) {
      const int t = t0 + lane;
      int c = 0;
      if (t < tiles) c = static_cast<int>(__ldcs(wrow + static_cast<std::int64_t>(t) * S));
      const int incl = warp_inclusive_scan(c, lane);
      if (t < tiles) pref[t + 1] = carry + incl;
      carry += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) pref[0] = 0;
  }

  uint4 xr[CH];  // this thread's chunks of x[row, :]
  if constexpr (GATED) dev::load_chunks_stream<CH>(p.x + row * p.ld_x, tid, nthreads, kchunks, xr);
  float acc[CH][8];
#pragma unroll
  for (int i = 0; i < CH; ++i)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[i][e] = 0.0f;
  __syncthreads();

  for (int ts = 0; ts < tiles;) {
    const int base0 = pref[ts];
    int te = ts + 1;
    while (te < tiles && pref[te + 1] - base0 <= kListCap) ++te;
    const int cnt = pref[te] - base0;
    if (cnt > 0) {
      // (1) expand blocks [ts, te) into the list, ascending columns
      for (int t = ts + warp; t < te; t += nwarps) {
        const int c = pref[t + 1] - pref[t];
        const int off = pref[t] - base0;
        if (c <= cap) {
          const std::uint32_t* blk = wrow + static_cast<std::int64_t>(t) * S + 1;
          for (int i = lane; i < c; i += 32) {
            const std::uint32_t w = __ldcs(blk + i);
            lcol[off + i] = t * kTwellTile + static_cast<int>(w & 0xffffu);
            lval[off + i] = hi_bf16(w);
          }
        } else {  // an overflowed block: read it whole from the dense backup
          expand_dense_tile(brow, p.n, b_vec, t, off, c, p.relu, lane, lcol, lval);
        }
      }
      __syncthreads();

      if constexpr (GATED) {
        // (2) partial up products over this thread's chunks, kUnroll rows in flight
        for (int j0 = 0; j0 < cnt; j0 += kUnroll) {
          uint4 w[kUnroll][CH];
          dev::load_row_group<kUnroll, CH>(p.w_up, lcol, j0, cnt, p.k, tid, nthreads, kchunks, w);
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) {
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < CH; ++i) s += dot8(xr[i], w[u][i]);
            s = warp_sum(s);
            if (lane == 0 && j0 + u < cnt) part[warp * kListCap + j0 + u] = s;
          }
        }
        __syncthreads();
        // (3) h = g · u
        for (int j = tid; j < cnt; j += nthreads) {
          float u = 0.0f;
          for (int q = 0; q < nwarps; ++q) u += part[q * kListCap + j];
          lval[j] *= u;
        }
        __syncthreads();
      }

      // (4) y += h · Wdᵀ[n, :]
      for (int j0 = 0; j0 < cnt; j0 += kUnroll) {
        uint4 w[kUnroll][CH];
        float h[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) h[u] = j0 + u < cnt ? lval[j0 + u] : 0.0f;
        dev::load_row_group<kUnroll, CH>(p.w_down_t, lcol, j0, cnt, p.k, tid, nthreads, kchunks, w);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
#pragma unroll
          for (int i = 0; i < CH; ++i) axpy8(h[u], w[u][i], acc[i]);
      }
      __syncthreads();  // the next window overwrites the list
    }
    ts = te;
  }

  __nv_bfloat16* yrow = p.y + row * p.ld_y;
#pragma unroll
  for (int i = 0; i < CH; ++i) {
    const int c = i * nthreads + tid;
    if (c < kchunks) {
      __nv_bfloat162 o[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) o[e] = __floats2bfloat162_rn(acc[i][2 * e], acc[i][2 * e + 1]);
      __stcs(reinterpret_cast<uint4*>(yrow + static_cast<std::int64_t>(c) * 8), *reinterpret_cast<const uint4*>(o));
    }
  }
}

template <int CH, bool GATED, int U, int MINB = 0>
void launch_up_down_t(const TwellUpDownParams& p, int threads, cudaStream_t stream) {
  const int tiles = static_cast<int>((p.n + kTwellTile - 1) / kTwellTile);
  const int nwarps = threads / 32;
  const std::size_t smem = sizeof(int) * kListCap + sizeof(float) * kListCap +
                           (GATED ? sizeof(float) * nwarps * kListCap : 0) + sizeof(int) * (tiles + 1);
  auto kernel = twell_up_down_kernel<CH, GATED, U, MINB>;
  if (smem > 48 * 1024)
    TWELL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<static_cast<unsigned>(p.m), threads, smem, stream>>>(p);
  TWELL_CUDA_CHECK_LAUNCH("twell_up_down_kernel");
}

}  // namespace

void launch_twell_pack(const TwellPackParams& p, cudaStream_t stream) {
  TWELL_CU_REQUIRE(p.src && p.words && p.counters && p.row_overflow, ErrorCode::invalid_argument, "twell pack: null pointer");
  TWELL_CU_REQUIRE(p.m >= 1 && p.n >= 1 && p.ld_src >= p.n, ErrorCode::invalid_argument,
              "twell pack: bad shape m={} n={} ld={}", p.m, p.n, p.ld_src);
  TWELL_CU_REQUIRE(p.words_per_tile >= 2 && p.words_per_tile <= 128 && kTwellTile % p.words_per_tile == 0,
              ErrorCode::unsupported, "twell pack: the CUDA path needs T = 256 and S = T/C in [2, 128]; got S = {}",
              p.words_per_tile);
  if (p.reset_counters) TWELL_CUDA_CHECK(cudaMemsetAsync(p.counters, 0, sizeof(TwellCounters), stream));
  TWELL_CUDA_CHECK(cudaMemsetAsync(p.row_overflow, 0, static_cast<std::size_t>(p.m) * sizeof(std::uint32_t), stream));
  if (p.row_nnz) TWELL_CUDA_CHECK(cudaMemsetAsync(p.row_nnz, 0, static_cast<std::size_t>(p.m) * sizeof(std::uint32_t), stream));
  const std::int64_t tiles = (p.n + kTwellTile - 1) / kTwellTile;
  const std::int64_t items = p.m * ((tiles + kPackTilesPerWarp - 1) / kPackTilesPerWarp);
  const std::int64_t blocks = (items + kPackWarps - 1) / kPackWarps;
  TWELL_CU_REQUIRE(blocks <= 0x7fffffff, ErrorCode::unsupported, "twell pack: M = {} too large", p.m);
  twell_pack_kernel<<<static_cast<unsigned>(blocks), kPackWarps * 32, 0, stream>>>(p);
  TWELL_CUDA_CHECK_LAUNCH("twell_pack_kernel");
}

void launch_twell_sample_decide(const TwellSampleParams& p, cudaStream_t stream) {
  TWELL_CU_REQUIRE(p.src && p.count && p.decision && p.stride >= 1 && p.m >= 1 && p.n >= 1, ErrorCode::invalid_argument,
                   "twell sample: bad parameters");
  TWELL_CUDA_CHECK(cudaMemsetAsync(p.count, 0, sizeof(unsigned long long), stream));
  if (p.hot) TWELL_CUDA_CHECK(cudaMemsetAsync(p.hot, 0, sizeof(unsigned long long), stream));
  if (p.nnz) TWELL_CUDA_CHECK(cudaMemsetAsync(p.nnz, 0, sizeof(unsigned long long), stream));
  const std::int64_t sampled = (p.m + p.stride - 1) / p.stride;
  twell_sample_count_kernel<<<static_cast<unsigned>((sampled + 7) / 8), 256, 0, stream>>>(p);
  TWELL_CUDA_CHECK_LAUNCH("twell_sample_count_kernel");
  twell_decide_kernel<<<1, 1, 0, stream>>>(p);
  TWELL_CUDA_CHECK_LAUNCH("twell_decide_kernel");
}

void launch_twell_up_down(const TwellUpDownParams& p, cudaStream_t stream) {
  TWELL_CU_REQUIRE(p.words && p.backup && p.w_down_t && p.y && (!p.gated || (p.x && p.w_up)), ErrorCode::invalid_argument,
              "twell up/down: null pointer");
  TWELL_CU_REQUIRE(p.m >= 1 && p.n >= 1 && p.k >= 8 && p.k % 8 == 0, ErrorCode::unsupported,
              "twell up/down: K must be a positive multiple of 8 (got K = {})", p.k);
  TWELL_CU_REQUIRE(p.ld_y % 8 == 0 && (!p.gated || p.ld_x % 8 == 0), ErrorCode::unsupported,
              "twell up/down: row strides of x and y must be multiples of 8 elements");
  TWELL_CU_REQUIRE(p.words_per_tile >= 2 && p.words_per_tile <= 128 && kTwellTile % p.words_per_tile == 0,
              ErrorCode::unsupported, "twell up/down: S = {} not supported (T = 256, S in [2, 128])", p.words_per_tile);
  TWELL_CU_REQUIRE(p.m <= 0x7fffffff && p.n < (std::int64_t{1} << 31), ErrorCode::unsupported, "twell up/down: M or N too large");
  const std::int64_t kchunks = p.k / 8;
  auto threads_for = [&](int ch) { return static_cast<int>(((kchunks + ch - 1) / ch + 31) / 32 * 32); };
  const bool ch2 = threads_for(2) <= kMaxUpDownThreads && p.variant != 2;
  auto launch = [&](auto ch, auto unroll, int threads) {
    constexpr int C = decltype(ch)::value, U = decltype(unroll)::value;
    p.gated ? launch_up_down_t<C, true, U>(p, threads, stream) : launch_up_down_t<C, false, U>(p, threads, stream);
  };
  using I2 = std::integral_constant<int, 2>;
  using I4 = std::integral_constant<int, 4>;
  using I8 = std::integral_constant<int, 8>;
  const bool small = ch2 && threads_for(2) <= kSmallUpDownThreads;
  if (small && p.variant == 3) {
    p.gated ? launch_up_down_t<2, true, 4, 6>(p, threads_for(2), stream)
            : launch_up_down_t<2, false, 4, 6>(p, threads_for(2), stream);
  } else if (small && p.variant == 4) {
    p.gated ? launch_up_down_t<2, true, 4, 8>(p, threads_for(2), stream)
            : launch_up_down_t<2, false, 4, 8>(p, threads_for(2), stream);
  } else if (ch2 && p.variant == 1) {
    launch(I2{}, I8{}, threads_for(2));
  } else if (ch2) {
    launch(I2{}, I4{}, threads_for(2));
  } else if (threads_for(4) <= kMaxUpDownThreads) {
    launch(I4{}, I2{}, threads_for(4));
  } else {
    detail::raise(ErrorCode::unsupported, "twell up/down: K = {} exceeds the supported 16384", p.k);
  }
}

}  // namespace twell::cuda
