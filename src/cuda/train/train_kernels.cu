// Training kernels (see train_kernels.hpp for the math).
#include "cuda/train/train_kernels.hpp"

#include <algorithm>

#include "cuda/common/check.hpp"
#include "cuda/common/device_math.cuh"

namespace twell::cuda {
namespace {

using dev::axpy8;
using dev::dot8;
using dev::hi_bf16;
using dev::lo_bf16;

// Token-major kernels: one CTA per token row; thread t owns the 16-byte K-chunks {i·blockDim + t}
// (dev::load_chunks), so a weight row is read as contiguous 512-byte runs per warp. A row's
// entries are processed in windows of kWindow held in shared memory.
constexpr int kWindow = 256;
constexpr int kMaxThreads = 512;
constexpr int kUnroll = 4;  // weight rows in flight per thread
// Blocks of at most kSmallThreads (K ≤ 2048 at two chunks per thread) can run a variant compiled
// for MINB resident blocks per SM (fewer registers, more warps to hide the L2 round trips).
constexpr int kSmallThreads = 128;

__device__ __forceinline__ float sign_of(float v) { return v > 0.0f ? 1.0f : (v < 0.0f ? -1.0f : 0.0f); }

__device__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  v = dev::warp_sum(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = 0.0f;
  if (threadIdx.x == 0)
    for (int w = 0; w < nwarps; ++w) s += red[w];
  return s;  // valid in thread 0
}

// For entries j of the window: part[warp · kWindow + j] = this warp's K-slice of ⟨a, W[col_j]⟩.
template <int CH>
__device__ __forceinline__ void window_partial_dots(const uint4 (&a)[CH], const __nv_bfloat16* w, const int* lcol,
                                                    int cnt, std::int64_t k, int kchunks, float* part) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, nthreads = blockDim.x;
  for (int j0 = 0; j0 < cnt; j0 += kUnroll) {
    uint4 wr[kUnroll][CH];
    dev::load_row_group<kUnroll, CH>(w, lcol, j0, cnt, k, tid, nthreads, kchunks, wr);
#pragma unroll
    for (int q = 0; q < kUnroll; ++q) {
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < CH; ++i) s += dot8(a[i], wr[q][i]);
      s = dev::warp_sum(s);
      if (lane == 0 && j0 + q < cnt) part[warp * kWindow + j0 + q] = s;
    }
  }
}

// acc += Σ_{j in [j0, j0 + kUnroll) ∩ [0, cnt)} coef[j] · W[col_j], kUnroll weight rows in flight.
template <int CH>
__device__ __forceinline__ void axpy_group(const __nv_bfloat16* w, const float* coef, const int* lcol, int j0, int cnt,
                                           std::int64_t k, int kchunks, float (&acc)[CH][8]) {
  const int tid = threadIdx.x, nthreads = blockDim.x;
  uint4 wr[kUnroll][CH];
  float c[kUnroll];
#pragma unroll
  for (int q = 0; q < kUnroll; ++q) c[q] = j0 + q < cnt ? coef[j0 + q] : 0.0f;
  dev::load_row_group<kUnroll, CH>(w, lcol, j0, cnt, k, tid, nthreads, kchunks, wr);
#pragma unroll
  for (int q = 0; q < kUnroll; ++q)
#pragma unroll
    for (int i = 0; i < CH; ++i) axpy8(c[q], wr[q][i], acc[i]);
}

// acc += Σ_j coef[j] · W[col_j] (+ Σ_j coef2[j] · W2[col_j] when W2 is given).
template <int CH>
__device__ __forceinline__ void window_axpys(const __nv_bfloat16* w, const float* coef, const __nv_bfloat16* w2,
                                             const float* coef2, const int* lcol, int cnt, std::int64_t k, int kchunks,
                                             float (&acc)[CH][8]) {
  for (int j0 = 0; j0 < cnt; j0 += kUnroll) {
    axpy_group<CH>(w, coef, lcol, j0, cnt, k, kchunks, acc);
    if (w2 != nullptr) axpy_group<CH>(w2, coef2, lcol, j0, cnt, k, kchunks, acc);
  }
}

template <int CH>
__device__ __forceinline__ void store_row_bf16(__nv_bfloat16* row, const float (&acc)[CH][8], int kchunks) {
#pragma unroll
  for (int i = 0; i < CH; ++i) {
    const int c = i * blockDim.x + threadIdx.x;
    if (c < kchunks) __stcs(reinterpret_cast<uint4*>(row) + c, dev::pack8_bf16(acc[i]));
  }
}

template <int CH>
__device__ __forceinline__ void zero_acc(float (&acc)[CH][8]) {
#pragma unroll
  for (int i = 0; i < CH; ++i)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[i][e] = 0.0f;
}

// Shared memory of the token-major kernels: lcol [kWindow] i32, la, lb [kWindow] f32,
// part [nwarps, kWindow] f32, red [32] f32.
std::size_t token_smem_bytes(int threads) {
  return sizeof(int) * kWindow + 2 * sizeof(float) * kWindow + sizeof(float) * (threads / 32) * kWindow +
         sizeof(float) * 32;
}

template <int CH, int MINB>
__global__ void __launch_bounds__(MINB > 0 ? kSmallThreads : kMaxThreads, MINB > 0 ? MINB : 1) sparse_train_forward_kernel(SparseTrainForwardParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int tid = threadIdx.x, nthreads = blockDim.x, nwarps = nthreads / 32;
  int* lcol = reinterpret_cast<int*>(smem_raw);
  float* lt = reinterpret_cast<float*>(lcol + kWindow);  // p, then t = p·u
  float* part = lt + 2 * kWindow;
  float* red = part + nwarps * kWindow;
  const int kchunks = static_cast<int>(p.k / 8);
  const std::int64_t row = blockIdx.x;
  const std::int64_t beg = p.offsets[row], end = p.offsets[row + 1];

  uint4 xr[CH];  // this thread's chunks of x[row]
  if (p.gated) dev::load_chunks_stream<CH>(p.x + row * p.ld, tid, nthreads, kchunks, xr);
  float acc[CH][8];
  zero_acc<CH>(acc);
  float l1 = 0.0f;
  for (std::int64_t w0 = beg; w0 < end; w0 += kWindow) {
    const int cnt = static_cast<int>(end - w0 < kWindow ? end - w0 : kWindow);
    for (int j = tid; j < cnt; j += nthreads) {
      lcol[j] = p.cols[w0 + j];
      lt[j] = __bfloat162float(p.p[w0 + j]);
    }
    __syncthreads();
    if (p.gated) {
      window_partial_dots<CH>(xr, p.w_up, lcol, cnt, p.k, kchunks, part);
      __syncthreads();
      for (int j = tid; j < cnt; j += nthreads) {
        float u = 0.0f;
        for (int q = 0; q < nwarps; ++q) u += part[q * kWindow + j];
        p.u[w0 + j] = u;
        lt[j] *= u;
      }
      __syncthreads();
    }
    for (int j = tid; j < cnt; j += nthreads) l1 += fabsf(lt[j]);
    window_axpys<CH>(p.w_down_t, lt, nullptr, nullptr, lcol, cnt, p.k, kchunks, acc);
    __syncthreads();  // the next window overwrites lcol / lt
  }
  store_row_bf16<CH>(p.y + row * p.ld, acc, kchunks);
  const float s = block_sum(l1, red);
  if (tid == 0) p.row_l1[row] = s;
}

template <int CH, int MINB>
__global__ void __launch_bounds__(MINB > 0 ? kSmallThreads : kMaxThreads, MINB > 0 ? MINB : 1) sparse_train_backward_kernel(SparseTrainBackwardParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int tid = threadIdx.x, nthreads = blockDim.x, nwarps = nthreads / 32;
  int* lcol = reinterpret_cast<int*>(smem_raw);
  float* la = reinterpret_cast<float*>(lcol + kWindow);  // p, then d_up
  float* lb = la + kWindow;                             // u, then d_gate
  float* part = lb + kWindow;
  const int kchunks = static_cast<int>(p.k / 8);
  const std::int64_t row = blockIdx.x;
  const std::int64_t beg = p.offsets[row], end = p.offsets[row + 1];
  const float c1 = p.c1_scale != nullptr ? p.c1 * *p.c1_scale : p.c1;

  uint4 dyr[CH];
  dev::load_chunks_stream<CH>(p.dy + row * p.ld, tid, nthreads, kchunks, dyr);
  float acc[CH][8];
  zero_acc<CH>(acc);
  for (std::int64_t w0 = beg; w0 < end; w0 += kWindow) {
    const int cnt = static_cast<int>(end - w0 < kWindow ? end - w0 : kWindow);
    for (int j = tid; j < cnt; j += nthreads) {
      lcol[j] = p.cols[w0 + j];
      la[j] = __bfloat162float(p.p[w0 + j]);
      lb[j] = p.gated ? p.u[w0 + j] : 0.0f;
    }
    __syncthreads();
    window_partial_dots<CH>(dyr, p.w_down_t, lcol, cnt, p.k, kchunks, part);
    __syncthreads();
    for (int j = tid; j < cnt; j += nthreads) {
      float dt = 0.0f;
      for (int q = 0; q < nwarps; ++q) dt += part[q * kWindow + j];
      const float pv = la[j];
      if (p.gated) {
        const float uv = lb[j];
        dt += c1 * sign_of(pv * uv);
        la[j] = dt * pv;  // d_up
        lb[j] = dt * uv;  // d_gate
        p.d_gate[w0 + j] = lb[j];
      } else {
        dt += c1 * sign_of(pv);
        la[j] = dt;
      }
      p.d_up[w0 + j] = la[j];
    }
    __syncthreads();
    window_axpys<CH>(p.w_up, la, p.gated ? p.w_gate : nullptr, lb, lcol, cnt, p.k, kchunks, acc);
    __syncthreads();
  }
  store_row_bf16<CH>(p.dx + row * p.ld, acc, kchunks);
}

// (lo, hi) += the 8 floats at q.
__device__ __forceinline__ void add8(const float4* q, float4& lo, float4& hi) {
  const float4 q0 = q[0], q1 = q[1];
  lo = make_float4(lo.x + q0.x, lo.y + q0.y, lo.z + q0.z, lo.w + q0.w);
  hi = make_float4(hi.x + q1.x, hi.y + q1.y, hi.z + q1.z, hi.w + q1.w);
}

__global__ void weight_grad_entries_kernel(WeightGradEntriesParams p) {
  for (std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < p.nnz;
       j += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int32_t e = p.order[j];
    const float pv = __bfloat162float(p.p[e]);
    p.out[j] = make_float4(__int_as_float(p.entry_rows[e]), p.d_up[e], p.gated ? p.d_gate[e] : 0.0f,
                           p.gated ? pv * p.u[e] : pv);
  }
}

// A work item's entries [beg, end): run `sub` of neuron n's entries (ascending rows), restricted
// to the token block [row_begin, row_end).
struct ItemRange {
  std::int64_t beg, end;
};
__device__ __forceinline__ ItemRange item_range(const SparseWeightGradParams& p, std::int64_t n, std::int64_t sub) {
  auto first_at_or_after = [&](std::int64_t lo, std::int64_t hi, std::int64_t row) {
    while (lo < hi) {
      const std::int64_t mid = (lo + hi) / 2;
      if (__float_as_int(p.entries[mid].x) < row) lo = mid + 1; else hi = mid;
    }
    return lo;
  };
  const std::int64_t seg_beg = p.col_offsets[n] + sub * p.run;
  const std::int64_t seg_end = min(p.col_offsets[n + 1], seg_beg + p.run);
  const std::int64_t beg = p.row_begin <= 0 ? seg_beg : first_at_or_after(seg_beg, seg_end, p.row_begin);
  return {beg, first_at_or_after(beg, seg_end, p.row_end)};
}

// Chunk c (8 columns from col_begin) of an item's three sums: item 0 stores (or accumulates) into
// the gradient rows, item s > 0 into its partials block. Every item writes, even with no entries
// in this token block: the fix-up adds every partial.
__device__ __forceinline__ void store_item_sums(const SparseWeightGradParams& p, std::int64_t n, std::int64_t sub, int c,
                                                const float (&au)[8], const float (&ag)[8], const float (&ad)[8]) {
  const std::int64_t slot = p.item_offsets[n] - n + sub - 1;
  auto store = [&](float* rows, int which, const float (&a)[8]) {
    const bool to_rows = sub == 0;
    float* dst = (to_rows ? rows + n * p.k + p.col_begin : p.partials + (slot * 3 + which) * kWeightGradMaxSlice) +
                 static_cast<std::int64_t>(c) * 8;
    float4* o = reinterpret_cast<float4*>(dst);
    float4 lo = make_float4(a[0], a[1], a[2], a[3]), hi = make_float4(a[4], a[5], a[6], a[7]);
    if (to_rows && p.accumulate) add8(o, lo, hi);
    o[0] = lo;
    o[1] = hi;
  };
  store(p.dw_up, 0, au);
  if (p.gated) store(p.dw_gate, 1, ag);
  store(p.dw_down_t, 2, ad);
}

// Neuron-major weight gradients: one warp per (work item, part of the slice of 32 chunks of 8
// columns); a work item is a run of at most p.run of one neuron's entries, lane l owns chunk l of
// its part. Per entry (token m) the part of x[m] and dy[m] is read and the three gradient parts
// accumulate in registers, written once as fp32 (item 0: to the gradient rows; others: to their
// partials block). A warp's L2 reads are dependent round trips, so the pass is latency-bound
// unless many tokens are in flight: the x and dy chunks of the next kGradStages − 1 tokens are
// copied by cp.async into a per-warp shared-memory ring, and the registers stay few (≤ 64: eight
// CTAs of four warps per SM, as many as 8 · 25 KB of ring allows). Warps count more than stages
// (H200, 0.5 %, the passes of one step: registers with 4 tokens per round trip 0.57 ms; 8 stages,
// 6 CTAs 0.51; 12 stages, 4 CTAs 0.61; 6 stages, 8 CTAs 0.49; lab/notes/2026-11-cuda-perf-log.md). Each lane
// copies and reads back only its own 16-byte chunks, so the ring needs no warp synchronisation;
// stage (t mod kGradStages) is refilled only after the token that used it has been summed. The
// entries (row, coefficients) arrive 32 at a time, one float4 per lane, broadcast by shuffles.
// Per token the loop is what an issue-bound pass can afford (ncu: eligible warps in 74 % of the
// cycles at 108 warp-instructions per entry): the token loop is unrolled by kGradStages so that
// every ring address is a constant offset, a token's source address is one 32 × 32-bit
// multiply-add (row · row bytes, both < 2³¹, checked on the host), and gated is a template
// parameter.
constexpr int kGradWarps = 4;
constexpr int kGradStages = 6;
template <bool kGated>
__global__ void __launch_bounds__(kGradWarps * 32, 8) sparse_weight_grad_kernel(SparseWeightGradParams p) {
  __shared__ uint4 ring[kGradWarps][kGradStages][2][32];  // [warp][stage][x, dy][lane]: 24 KB
  constexpr unsigned kFull = 0xffffffffu;
  const int lane = threadIdx.x % 32, wib = threadIdx.x / 32;
  const int slice_chunks = static_cast<int>((p.col_end - p.col_begin + 7) / 8);
  const int parts = (slice_chunks + 31) / 32;
  const std::int64_t warp_id = static_cast<std::int64_t>(blockIdx.x) * kGradWarps + wib;
  const std::int64_t item = warp_id / parts;
  const int part0 = static_cast<int>(warp_id % parts) * 32;
  if (item >= p.items_bound || item >= p.item_offsets[p.n]) return;  // whole warps only
  // n < 2³¹ and sub ≤ nnz / run < 2³¹ (checked on the host): 32 bits keep them in fewer registers
  // across the token loop.
  const int n = p.item_neuron[item], sub = static_cast<int>(item - p.item_offsets[n]);
  const int schunks = min(32, slice_chunks - part0);
  const bool active = lane < schunks;
  // Inactive lanes copy nothing (zero fill) from a valid address.
  const std::int64_t chunk = part0 + min(lane, schunks - 1);
  const char* x = reinterpret_cast<const char*>(reinterpret_cast<const uint4*>(p.x) + chunk);
  // dy's chunk at a fixed distance from x's (one pointer live across the loop, not two)
  const long long dy_delta = reinterpret_cast<const char*>(p.dy) - reinterpret_cast<const char*>(p.x);
  const int row_bytes = static_cast<int>(p.ld * 2);
  const ItemRange range = item_range(p, n, sub);
  const int total = static_cast<int>(range.end - range.beg);  // ≤ p.run < 2^31
  const float4* entries = p.entries + range.beg;
  const float4 none = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const std::uint32_t ring0 = static_cast<std::uint32_t>(__cvta_generic_to_shared(&ring[wib][0][0][lane]));
  constexpr std::uint32_t kStageBytes = 2 * 32 * sizeof(uint4);
  float4 ahead = none;  // entries [t & ~31, +32) of the token being issued, one per lane
  // Token t into stage `stage` (= t mod kGradStages, a constant wherever the loops unroll).
  auto issue = [&](int t, int stage) {
    if (t < total) {  // warp-uniform
      if ((t & 31) == 0) ahead = t + lane < total ? entries[t + lane] : none;
      const int row = __shfl_sync(kFull, __float_as_int(ahead.x), t & 31);
      const long long off = static_cast<long long>(row) * row_bytes;
      const std::uint32_t dst = ring0 + static_cast<std::uint32_t>(stage) * kStageBytes;
      dev::cp_async16(dst, x + off, active);
      dev::cp_async16(dst + 32 * sizeof(uint4), x + off + dy_delta, active);
    }
    dev::cp_async_commit();  // one group per token slot, empty past the end: the counts stay uniform
  };
  float au[8] = {}, ag[8] = {}, ad[8] = {};
  float4 cur = none;  // entries [j & ~31, +32) of the token being summed
#pragma unroll
  for (int t = 0; t < kGradStages - 1; ++t) issue(t, t);
#pragma unroll 1
  for (int j0 = 0; j0 < total; j0 += kGradStages) {
#pragma unroll
    for (int s = 0; s < kGradStages; ++s) {
      const int j = j0 + s;
      if (j >= total) break;  // warp-uniform
      // Issue runs kGradStages − 2 < 32 tokens ahead, so it loaded this batch and has not left it.
      if ((j & 31) == 0) cur = ahead;
      dev::cp_async_wait<kGradStages - 2>();  // token j's group (groups complete in order)
      const uint4 xv = ring[wib][s][0][lane], dv = ring[wib][s][1][lane];
      const float cu = __shfl_sync(kFull, cur.y, j & 31), ct = __shfl_sync(kFull, cur.w, j & 31);
      axpy8(cu, xv, au);
      if constexpr (kGated) axpy8(__shfl_sync(kFull, cur.z, j & 31), xv, ag);
      axpy8(ct, dv, ad);
      issue(j + kGradStages - 1, (s + kGradStages - 1) % kGradStages);  // the stage of token j − 1, summed before
    }
  }
  dev::cp_async_wait<0>();
  if (active) store_item_sums(p, n, sub, part0 + lane, au, ag, ad);
}

// One warp per neuron: gradient slice += the partials of items 1, 2, … in order.
__global__ void __launch_bounds__(kGradWarps * 32) weight_grad_fixup_kernel(SparseWeightGradParams p) {
  const int lane = threadIdx.x % 32;
  const std::int64_t n = static_cast<std::int64_t>(blockIdx.x) * kGradWarps + threadIdx.x / 32;
  if (n >= p.n) return;
  const std::int64_t first = p.item_offsets[n], items = p.item_offsets[n + 1] - first;
  if (items <= 1) return;
  const std::int64_t slot0 = first - n;  // slot of item 1
  const int schunks = static_cast<int>((p.col_end - p.col_begin + 7) / 8);
  float* rows[3] = {p.dw_up, p.dw_gate, p.dw_down_t};
  for (int which = 0; which < 3; ++which) {
    if (which == 1 && !p.gated) continue;
    for (int c = lane; c < schunks; c += 32) {
      float4* o = reinterpret_cast<float4*>(rows[which] + n * p.k + p.col_begin + static_cast<std::int64_t>(c) * 8);
      float4 lo = o[0], hi = o[1];
      for (std::int64_t s = 1; s < items; ++s) {
        const float4* q = reinterpret_cast<const float4*>(p.partials + ((slot0 + s - 1) * 3 + which) * kWeightGradMaxSlice +
                                                          static_cast<std::int64_t>(c) * 8);
        add8(q, lo, hi);
      }
      o[0] = lo;
      o[1] = hi;
    }
  }
}

// One block per row.
__global__ void scatter_rows_f32_kernel(const float* src, std::int64_t ld_src, const std::int32_t* idx, std::int64_t cols,
                                        float* dst, std::int64_t ld_dst) {
  const float* s = src + static_cast<std::int64_t>(blockIdx.x) * ld_src;
  float* d = dst + static_cast<std::int64_t>(idx[blockIdx.x]) * ld_dst;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) d[c] = s[c];
}

__global__ void sum_rows_kernel(const float* v, std::int64_t m, double* out) {
  __shared__ double red[32];
  double s = 0;
  for (std::int64_t i = threadIdx.x; i < m; i += blockDim.x) s += v[i];
  s = dev::warp_sum(s);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) t += red[w];
    *out = t;
  }
}

// Dense elementwise: one thread per 8 columns, one 16-byte load/store per operand when every
// stride is a multiple of 8 and the 8 columns are all real (c0 + 8 ≤ n); scalar otherwise.
struct Vec8 {
  float v[8];
};
__device__ __forceinline__ Vec8 load8(const __nv_bfloat16* row, std::int64_t c0, std::int64_t n, bool vec) {
  Vec8 o;
  if (vec && c0 + 8 <= n) {
    dev::unpack8_bf16(__ldcs(reinterpret_cast<const uint4*>(row + c0)), o.v);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) o.v[e] = c0 + e < n ? __bfloat162float(row[c0 + e]) : 0.0f;
  }
  return o;
}
// Stores columns [c0, min(c0 + 8, ldn)); values of columns ≥ n must already be 0.
__device__ __forceinline__ void store8(__nv_bfloat16* row, std::int64_t c0, std::int64_t ldn, const Vec8& a, bool vec) {
  if (vec && c0 + 8 <= ldn) {
    *reinterpret_cast<uint4*>(row + c0) = dev::pack8_bf16(a.v);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e)
      if (c0 + e < ldn) row[c0 + e] = __float2bfloat16_rn(a.v[e]);
  }
}

// The saved h of a gated block: bf16(ReLU(g)·u), no FMA. The only definition: the backward's
// recompute_h relies on writing the same bits as the forward.
__device__ __forceinline__ float gated_h(float g, float u) {
  return __bfloat162float(__float2bfloat16_rn(fmaxf(g, 0.0f) * u));
}

__global__ void dense_train_forward_kernel(DenseTrainElementwiseParams p) {
  const std::int64_t per_row = (p.ldn + 7) / 8, total = p.m * per_row;
  const bool vec = p.ld_h % 8 == 0 && (!p.gated || (p.ld_g % 8 == 0 && p.ld_u % 8 == 0));
  float l1 = 0.0f;
  unsigned long long active = 0;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / per_row, c0 = (i % per_row) * 8;
    const bool skip = p.row_skip != nullptr && p.row_skip[r] != 0;
    if (p.gated) {
      const Vec8 g = load8(p.g + r * p.ld_g, c0, skip ? 0 : p.n, vec), u = load8(p.u + r * p.ld_u, c0, skip ? 0 : p.n, vec);
      Vec8 h;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        active += g.v[e] > 0.0f;  // columns ≥ n (every column of a skipped row) read as 0: never active
        h.v[e] = gated_h(g.v[e], u.v[e]);
        l1 += fabsf(h.v[e]);
      }
      store8(p.h + r * p.ld_h, c0, p.ldn, h, vec);
    } else {
      const Vec8 h = load8(p.h + r * p.ld_h, c0, skip ? 0 : p.n, vec);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        active += h.v[e] > 0.0f;
        l1 += fabsf(h.v[e]);
      }
      if (skip || c0 + 8 > p.n) store8(p.h + r * p.ld_h, c0, p.ldn, h, vec);  // zero the padding columns (or the row)
    }
  }
  __shared__ float rl[32];
  __shared__ unsigned long long ra[32];
  l1 = dev::warp_sum(l1);
  active = dev::warp_sum(active);
  if (threadIdx.x % 32 == 0) {
    rl[threadIdx.x / 32] = l1;
    ra[threadIdx.x / 32] = active;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0;
    unsigned long long a = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) {
      s += rl[w];
      a += ra[w];
    }
    atomicAdd(&p.scalars->l1_sum, s);
    atomicAdd(&p.scalars->active, a);
  }
}

__global__ void dense_train_backward_kernel(DenseTrainElementwiseParams p) {
  const std::int64_t per_row = (p.ldn + 7) / 8, total = p.m * per_row;
  const bool vec = p.ld_h % 8 == 0 && p.ld_dh % 8 == 0 && p.ld_d % 8 == 0 &&
                   (!p.gated || (p.ld_g % 8 == 0 && p.ld_u % 8 == 0));
  const float c1 = p.c1_scale != nullptr ? p.c1 * *p.c1_scale : p.c1;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / per_row, c0 = (i % per_row) * 8;
    const std::int64_t n = p.row_skip != nullptr && p.row_skip[r] != 0 ? 0 : p.n;  // a skipped row: every gradient 0
    const Vec8 dh = load8(p.dh + r * p.ld_dh, c0, n, vec);
    Vec8 dup, dgate;
    if (p.gated) {
      const Vec8 g = load8(p.g + r * p.ld_g, c0, n, vec), u = load8(p.u + r * p.ld_u, c0, n, vec);
      Vec8 h;
      if (p.recompute_h) {
#pragma unroll
        for (int e = 0; e < 8; ++e) h.v[e] = gated_h(g.v[e], u.v[e]);
        store8(p.h + r * p.ld_h, c0, p.ldn, h, vec);  // as dense_train_forward_kernel writes it
      } else {
        h = load8(p.h + r * p.ld_h, c0, n, vec);
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float dt = dh.v[e] + c1 * sign_of(h.v[e]);
        const bool on = g.v[e] > 0.0f;  // columns ≥ n read as 0: their gradients are 0
        dup.v[e] = on ? dt * g.v[e] : 0.0f;
        dgate.v[e] = on ? dt * u.v[e] : 0.0f;
      }
      store8(p.d_gate + r * p.ld_d, c0, p.ldn, dgate, vec);
    } else {
      const Vec8 h = load8(p.h + r * p.ld_h, c0, n, vec);
#pragma unroll
      for (int e = 0; e < 8; ++e) dup.v[e] = h.v[e] > 0.0f ? dh.v[e] + c1 * sign_of(h.v[e]) : 0.0f;
    }
    store8(p.d_up + r * p.ld_d, c0, p.ldn, dup, vec);
  }
}

template <typename Params>
void check_token_kernel(const Params& p, const char* what) {
  TWELL_CU_REQUIRE(p.m >= 1 && p.m <= 0x7fffffff, ErrorCode::unsupported, "{}: M = {} out of range", what, p.m);
  TWELL_CU_REQUIRE(p.k >= 8 && p.k % 8 == 0 && p.k <= 16384, ErrorCode::unsupported,
                   "{}: K must be a multiple of 8 in [8, 16384] (got {})", what, p.k);
  TWELL_CU_REQUIRE(p.ld % 8 == 0 && p.ld >= p.k, ErrorCode::unsupported, "{}: row stride {} must be a multiple of 8 ≥ K",
                   what, p.ld);
}

// Threads for a K of kchunks 16-byte chunks at CH chunks per thread (a whole number of warps).
int threads_for(std::int64_t k, int ch) { return static_cast<int>(((k / 8 + ch - 1) / ch + 31) / 32 * 32); }

template <typename Kernel, typename Params>
void launch_token(Kernel kernel, unsigned blocks, int threads, std::size_t smem, cudaStream_t stream, const char* name,
                  const Params& params) {
  if (smem > 48 * 1024)
    TWELL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<blocks, threads, smem, stream>>>(params);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) detail::throw_cuda(e, name, __FILE__, __LINE__);
}

// Picks 2 chunks per thread when K / 16 threads fit one CTA (K ≤ 8192), else 4, and launches the
// matching instantiation with the token-window shared memory.
template <template <int, int> class K, typename Params>
void launch_by_chunks(const Params& p, std::int64_t k, std::int64_t blocks, cudaStream_t stream, const char* name) {
  const bool ch2 = threads_for(k, 2) <= kMaxThreads;
  const int threads = threads_for(k, ch2 ? 2 : 4);
  void (*kernel)(Params) = ch2 ? K<2, 0>::fn : K<4, 0>::fn;
  if (ch2 && threads <= kSmallThreads && p.min_blocks == 6) kernel = K<2, 6>::fn;
  if (ch2 && threads <= kSmallThreads && p.min_blocks == 8) kernel = K<2, 8>::fn;
  launch_token(kernel, static_cast<unsigned>(blocks), threads, token_smem_bytes(threads), stream, name, p);
}
template <int CH, int MINB>
struct ForwardKernel {
  static constexpr auto fn = sparse_train_forward_kernel<CH, MINB>;
};
template <int CH, int MINB>
struct BackwardKernel {
  static constexpr auto fn = sparse_train_backward_kernel<CH, MINB>;
};

}  // namespace

void launch_sparse_train_forward(const SparseTrainForwardParams& p, cudaStream_t stream) {
  check_token_kernel(p, "sparse train forward");
  TWELL_CU_REQUIRE(p.offsets && p.cols && p.p && p.w_down_t && p.y && p.row_l1 && (!p.gated || (p.x && p.w_up && p.u)),
                   ErrorCode::invalid_argument, "sparse train forward: null pointer");
  launch_by_chunks<ForwardKernel>(p, p.k, p.m, stream, "sparse_train_forward_kernel");
}

void launch_sparse_train_backward(const SparseTrainBackwardParams& p, cudaStream_t stream) {
  check_token_kernel(p, "sparse train backward");
  TWELL_CU_REQUIRE(p.dy && p.offsets && p.cols && p.p && p.w_up && p.w_down_t && p.d_up && p.dx &&
                       (!p.gated || (p.u && p.w_gate && p.d_gate)),
                   ErrorCode::invalid_argument, "sparse train backward: null pointer");
  launch_by_chunks<BackwardKernel>(p, p.k, p.m, stream, "sparse_train_backward_kernel");
}

void launch_weight_grad_entries(const WeightGradEntriesParams& p, cudaStream_t stream) {
  TWELL_CU_REQUIRE(p.nnz >= 0 && p.nnz <= 0x7fffffff, ErrorCode::unsupported, "weight grad entries: nnz = {} out of range",
                   p.nnz);
  if (p.nnz == 0) return;
  TWELL_CU_REQUIRE(p.entry_rows && p.order && p.p && p.d_up && p.out && (!p.gated || (p.u && p.d_gate)),
                   ErrorCode::invalid_argument, "weight grad entries: null pointer");
  weight_grad_entries_kernel<<<grid_stride_blocks(p.nnz, 256), 256, 0, stream>>>(p);
  TWELL_CUDA_CHECK_LAUNCH("weight_grad_entries_kernel");
}

void launch_sparse_weight_grads(const SparseWeightGradParams& p, cudaStream_t stream) {
  TWELL_CU_REQUIRE(p.n >= 1 && p.n <= 0x7fffffff, ErrorCode::unsupported, "sparse weight grads: N = {} out of range", p.n);
  TWELL_CU_REQUIRE(p.k >= 8 && p.k % 8 == 0 && p.ld % 8 == 0 && p.ld >= p.col_end - p.col_begin, ErrorCode::unsupported,
                   "sparse weight grads: K = {} / slice stride {} not supported", p.k, p.ld);
  TWELL_CU_REQUIRE(p.col_begin >= 0 && p.col_begin % 8 == 0 && p.col_end > p.col_begin && p.col_end <= p.k &&
                       p.col_end - p.col_begin <= kWeightGradMaxSlice,
                   ErrorCode::invalid_argument, "sparse weight grads: column slice [{}, {}) invalid for K = {}",
                   p.col_begin, p.col_end, p.k);
  TWELL_CU_REQUIRE(p.x && p.dy && p.entries && p.col_offsets && p.item_offsets && p.item_neuron && p.dw_up &&
                       p.dw_down_t && (!p.gated || p.dw_gate) && (p.partials || p.items_bound == p.n),
                   ErrorCode::invalid_argument, "sparse weight grads: null pointer");
  TWELL_CU_REQUIRE(p.run >= 1 && p.items_bound >= p.n, ErrorCode::invalid_argument,
                   "sparse weight grads: run {} / item bound {} invalid for N = {}", p.run, p.items_bound, p.n);
  const std::int64_t slice_chunks = (p.col_end - p.col_begin) / 8;
  const std::int64_t parts = (slice_chunks + 31) / 32;
  const std::int64_t blocks = (p.items_bound * parts + kGradWarps - 1) / kGradWarps;
  TWELL_CU_REQUIRE(blocks <= 0x7fffffff, ErrorCode::unsupported, "sparse weight grads: {} items exceed one launch",
                   p.items_bound);
  TWELL_CU_REQUIRE(p.ld <= 0x3fffffff, ErrorCode::unsupported, "sparse weight grads: row stride {} too large", p.ld);
  if (p.gated) {
    sparse_weight_grad_kernel<true><<<static_cast<unsigned>(blocks), kGradWarps * 32, 0, stream>>>(p);
  } else {
    sparse_weight_grad_kernel<false><<<static_cast<unsigned>(blocks), kGradWarps * 32, 0, stream>>>(p);
  }
  TWELL_CUDA_CHECK_LAUNCH("sparse_weight_grad_kernel");
}

void launch_weight_grad_fixup(const SparseWeightGradParams& p, cudaStream_t stream) {
  if (p.items_bound == p.n) return;  // one item per neuron
  TWELL_CU_REQUIRE(p.partials && p.item_offsets && p.dw_up && p.dw_down_t && (!p.gated || p.dw_gate) && p.n >= 1 &&
                       p.col_begin >= 0 && p.col_end > p.col_begin && p.col_end <= p.k &&
                       p.col_end - p.col_begin <= kWeightGradMaxSlice,
                   ErrorCode::invalid_argument, "weight grad fix-up: bad parameters");
  weight_grad_fixup_kernel<<<static_cast<unsigned>((p.n + kGradWarps - 1) / kGradWarps), kGradWarps * 32, 0, stream>>>(p);
  TWELL_CUDA_CHECK_LAUNCH("weight_grad_fixup_kernel");
}

void launch_scatter_rows_f32(const float* src, std::int64_t ld_src, const std::int32_t* idx, std::int64_t rows,
                             std::int64_t cols, float* dst, std::int64_t ld_dst, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  TWELL_CU_REQUIRE(rows <= 0x7fffffff, ErrorCode::unsupported, "scatter rows: {} rows", rows);
  scatter_rows_f32_kernel<<<static_cast<unsigned>(rows), 256, 0, stream>>>(src, ld_src, idx, cols, dst, ld_dst);
  TWELL_CUDA_CHECK_LAUNCH("scatter_rows_f32_kernel");
}

__global__ void train_scalars_f32_kernel(const DenseTrainScalars* s, std::int64_t m, float* l1, float* l0) {
  *l1 = static_cast<float>(s->l1_sum / static_cast<double>(m));
  *l0 = static_cast<float>(static_cast<double>(s->active) / static_cast<double>(m));
}

void launch_train_scalars_f32(const DenseTrainScalars* s, std::int64_t m, float* l1, float* l0, cudaStream_t stream) {
  train_scalars_f32_kernel<<<1, 1, 0, stream>>>(s, m, l1, l0);
  TWELL_CUDA_CHECK_LAUNCH("train_scalars_f32_kernel");
}

void launch_sum_rows(const float* row_l1, std::int64_t m, double* l1_sum, cudaStream_t stream) {
  sum_rows_kernel<<<1, 1024, 0, stream>>>(row_l1, m, l1_sum);
  TWELL_CUDA_CHECK_LAUNCH("sum_rows_kernel");
}

void launch_dense_train_forward(const DenseTrainElementwiseParams& p, cudaStream_t stream) {
  TWELL_CU_REQUIRE(p.h && p.scalars && (!p.gated || (p.g && p.u)) && p.m >= 1 && p.ldn >= p.n, ErrorCode::invalid_argument,
                   "dense train forward: bad parameters");
  dense_train_forward_kernel<<<grid_stride_blocks(p.m * ((p.ldn + 7) / 8), 256), 256, 0, stream>>>(p);
  TWELL_CUDA_CHECK_LAUNCH("dense_train_forward_kernel");
}

void launch_dense_train_backward(const DenseTrainElementwiseParams& p, cudaStream_t stream) {
  TWELL_CU_REQUIRE(p.h && p.dh && p.d_up && (!p.gated || (p.g && p.u && p.d_gate)) && (p.gated || !p.recompute_h) &&
                       p.m >= 1 && p.ldn >= p.n,
                   ErrorCode::invalid_argument, "dense train backward: bad parameters");
  dense_train_backward_kernel<<<grid_stride_blocks(p.m * ((p.ldn + 7) / 8), 256), 256, 0, stream>>>(p);
  TWELL_CUDA_CHECK_LAUNCH("dense_train_backward_kernel");
}

}  // namespace twell::cuda
