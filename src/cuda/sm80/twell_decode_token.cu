// One-token decode FFN kernel (see twell_decode_token.hpp).
#include "cuda/sm80/twell_decode_token.hpp"

#include "cuda/common/check.hpp"
#include "cuda/common/device_math.cuh"

namespace twell::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;  // = neurons per CTA
constexpr int kWin = 8;                // 16-byte chunks per lane in flight: a 2048-wide row at once
constexpr int kListCap = 2048;         // entries of the last CTA's ordered list per pass
constexpr int kWordsPerThread = 4;     // bitmap words per thread per round (contiguous: the scan's order)

// ⟨x, w_r⟩ for R consecutive rows w_r = w + r · K (K = 8 · kchunks) by one warp, every row's
// loads in flight together (every lane gets the sums). STREAM: the rows are read once
// (evict-first), else kept (rows read again soon).
template <int R, bool STREAM>
__device__ __forceinline__ void warp_rows_dot(const __nv_bfloat16* w, std::int64_t k, const __nv_bfloat16* x,
                                              int kchunks, int lane, float (&s)[R]) {
  const uint4* xr = reinterpret_cast<const uint4*>(x);
#pragma unroll
  for (int r = 0; r < R; ++r) s[r] = 0.0f;
  for (int c0 = 0; c0 < kchunks; c0 += 32 * kWin) {
    uint4 wv[R][kWin];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int i = 0; i < kWin; ++i) {
        const int c = c0 + i * 32 + lane;
        const uint4* wr = reinterpret_cast<const uint4*>(w + r * k);
        wv[r][i] = c < kchunks ? (STREAM ? __ldcs(wr + c) : __ldg(wr + c)) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
    for (int i = 0; i < kWin; ++i) {
      const int c = c0 + i * 32 + lane;
      if (c < kchunks) {
        const uint4 xv = __ldg(xr + c);
#pragma unroll
        for (int r = 0; r < R; ++r) s[r] += dev::dot8(xv, wv[r][i]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) s[r] = dev::warp_sum(s[r]);
}

// CH: 16-byte chunks of y per thread in the last CTA (K ≤ 8 · kThreads · CH); R: neurons per
// warp; TAIL: false only in the lab (no last-CTA phase: the weight stream's own time).
template <int CH, int R, bool TAIL>
__global__ void __launch_bounds__(kThreads, (CH == 1 && R == 1) ? 4 : 2)
    twell_decode_token_kernel(TwellDecodeTokenParams p) {
  __shared__ int s_n[kListCap];
  __shared__ float s_h[kListCap];
  __shared__ int s_warp[kWarps];
  __shared__ bool s_last;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int kchunks = static_cast<int>(p.k / 8);
  const std::int64_t words = (p.n + 31) / 32;
  unsigned int* ticket = p.active + words;

  // 1. This warp's R neurons: g, and for an active one h, its bit and its Wdᵀ row on its way to L2.
  const std::int64_t n0 = (static_cast<std::int64_t>(blockIdx.x) * kWarps + warp) * R;
  if (n0 < p.n) {
    float s[R];
    // Rows past N: the last row again (R consecutive rows from a start clamped inside [0, N)).
    const std::int64_t start = n0 + R <= p.n ? n0 : p.n - R >= 0 ? p.n - R : 0;
    warp_rows_dot<R, true>(p.w_first + start * p.k, p.k, p.x, kchunks, lane, s);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const std::int64_t n = start + r;
      const float g = __bfloat162float(__float2bfloat16_rn(fmaxf(s[r], 0.0f)));
      if (n >= n0 && n < p.n && g > 0.0f) {  // rows before n0 belong to another warp
        const char* drow = reinterpret_cast<const char*>(p.w_down_t + n * p.k);
        for (std::int64_t b = static_cast<std::int64_t>(lane) * 128; b < p.k * 2; b += 32 * 128)
          asm volatile("prefetch.global.L2 [%0];" ::"l"(drow + b));
        float u[1] = {1.0f};
        if (p.gated) warp_rows_dot<1, false>(p.w_up + n * p.k, p.k, p.x, kchunks, lane, u);
        if (lane == 0) {
          p.h[n] = p.gated ? g * u[0] : g;
          atomicOr(p.active + (n >> 5), 1u << (n & 31));
          __threadfence();  // h and the bit visible before this CTA's ticket
        }
      }
    }
  }
  if constexpr (!TAIL) return;
  __syncthreads();
  if (tid == 0) s_last = atomicAdd(ticket, 1u) == gridDim.x - 1u;
  __syncthreads();
  if (!s_last) return;
  __threadfence();

  // 2. The last CTA: y over the marked neurons in ascending order. Thread tid owns y's chunks
  // {tid + kThreads · i}; rounds of kThreads · kWordsPerThread bitmap words, each listed in passes
  // of kListCap entries.
  float acc[CH][8];
#pragma unroll
  for (int i = 0; i < CH; ++i)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[i][e] = 0.0f;
  unsigned long long total = 0;
  for (std::int64_t w0 = 0; w0 < words; w0 += kThreads * kWordsPerThread) {
    const std::int64_t my = w0 + static_cast<std::int64_t>(tid) * kWordsPerThread;
    unsigned bits[kWordsPerThread];
    int cnt = 0;
#pragma unroll
    for (int i = 0; i < kWordsPerThread; ++i) {
      bits[i] = my + i < words ? __ldcg(p.active + my + i) : 0u;
      cnt += __popc(bits[i]);
    }
#pragma unroll
    for (int i = 0; i < kWordsPerThread; ++i)
      if (bits[i]) p.active[my + i] = 0u;  // left zero for the next launch
    // Exclusive scan of the counts over the CTA (thread order = neuron order).
    const int incl = dev::warp_inclusive_scan(cnt, lane);
    if (lane == 31) s_warp[warp] = incl;
    __syncthreads();
    int off = incl - cnt, round_total = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      off += w < warp ? s_warp[w] : 0;
      round_total += s_warp[w];
    }
    __syncthreads();  // s_warp is rewritten next round
    total += static_cast<unsigned long long>(round_total);
    for (int base = 0; base < round_total; base += kListCap) {
      int e = off;
#pragma unroll
      for (int i = 0; i < kWordsPerThread; ++i)
        for (unsigned b = bits[i]; b; b &= b - 1u, ++e)
          if (e >= base && e < base + kListCap) {
            const std::int64_t nn = (my + i) * 32 + __ffs(static_cast<int>(b)) - 1;
            s_n[e - base] = static_cast<int>(nn);
            s_h[e - base] = __ldcg(p.h + nn);
          }
      __syncthreads();
      const int len = min(kListCap, round_total - base);
#pragma unroll(CH == 1 ? 4 : 2)  // rows in flight (more would spill at CH > 1)
      for (int j = 0; j < len; ++j) {
        const float hv = s_h[j];
        const uint4* row = reinterpret_cast<const uint4*>(p.w_down_t + static_cast<std::int64_t>(s_n[j]) * p.k);
#pragma unroll
        for (int i = 0; i < CH; ++i) {
          const int c = i * kThreads + tid;
          if (c < kchunks) dev::axpy8(hv, __ldg(row + c), acc[i]);
        }
      }
      __syncthreads();  // the list is rewritten next pass
    }
  }
#pragma unroll
  for (int i = 0; i < CH; ++i) {
    const int c = i * kThreads + tid;
    if (c < kchunks) *reinterpret_cast<uint4*>(p.y + static_cast<std::int64_t>(c) * 8) = dev::pack8_bf16(acc[i]);
  }
  if (tid == 0) {
    if (p.nnz_out) *p.nnz_out = total;
    *ticket = 0u;
  }
}

}  // namespace

void launch_twell_decode_token(const TwellDecodeTokenParams& p, cudaStream_t stream) {
  launch_twell_decode_token_lab(p, 1, true, stream);
}

void launch_twell_decode_token_lab(const TwellDecodeTokenParams& p, int rows_per_warp, bool tail, cudaStream_t stream) {
  TWELL_CU_REQUIRE(p.x && p.w_first && p.w_down_t && p.y && p.h && p.active && (!p.gated || p.w_up),
                   ErrorCode::invalid_argument, "twell decode_token: null pointer");
  TWELL_CU_REQUIRE(p.m == 1 && p.n >= 1 && p.k >= 8 && p.k % 8 == 0 && p.k <= kDecodeTokenMaxK &&
                       (reinterpret_cast<std::uintptr_t>(p.x) & 15) == 0 &&
                       (reinterpret_cast<std::uintptr_t>(p.y) & 15) == 0,
                   ErrorCode::unsupported,
                   "twell decode_token: needs M = 1 (got {}), K a multiple of 8 ≤ {} (got {}), 16-byte aligned x and y",
                   p.m, kDecodeTokenMaxK, p.k);
  TWELL_CU_REQUIRE(rows_per_warp == 1 || rows_per_warp == 2, ErrorCode::invalid_argument,
                   "twell decode_token: rows per warp 1 or 2");
  const std::int64_t per_cta = kWarps * rows_per_warp;
  const std::int64_t ctas = (p.n + per_cta - 1) / per_cta;
  TWELL_CU_REQUIRE(ctas <= 0x7fffffff && p.n <= 0x7fffffff && p.n >= rows_per_warp, ErrorCode::unsupported,
                   "twell decode_token: N = {} not supported", p.n);
  const std::int64_t kchunks = p.k / 8;
  const dim3 grid(static_cast<unsigned>(ctas)), block(kThreads);
  const int ch = kchunks <= kThreads ? 1 : kchunks <= 2 * kThreads ? 2 : 4;
  auto go = [&](auto kernel) { kernel<<<grid, block, 0, stream>>>(p); };
  if (rows_per_warp == 1 && tail) {
    if (ch == 1) go(twell_decode_token_kernel<1, 1, true>);
    else if (ch == 2) go(twell_decode_token_kernel<2, 1, true>);
    else go(twell_decode_token_kernel<4, 1, true>);
  } else if (tail) {
    if (ch == 1) go(twell_decode_token_kernel<1, 2, true>);
    else if (ch == 2) go(twell_decode_token_kernel<2, 2, true>);
    else go(twell_decode_token_kernel<4, 2, true>);
  } else if (rows_per_warp == 1) {
    go(twell_decode_token_kernel<1, 1, false>);
  } else {
    go(twell_decode_token_kernel<1, 2, false>);
  }
  TWELL_CUDA_CHECK_LAUNCH("twell_decode_token_kernel");
}

}  // namespace twell::cuda
