// One-token decode FFN kernels (see twell_decode_token.hpp).
#include "cuda/sm80/twell_decode_token.hpp"

#include "cuda/common/check.hpp"
#include "cuda/common/device_math.cuh"
#include "cuda/common/fixed_point.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/ops/norm_row.cuh"

namespace twell::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;  // = neurons per CTA of the first kernel
// 16-byte chunks per lane in flight: a 2048-wide row at once. (2 neurons a warp with 4-step windows,
// 352 CTAs at N = 5632 in one wave against 704 in 1.33 waves, decoded 1.8 % slower a token on the
// synthetic 2B: H100, lab/notes/2026-11-runtime-log.md.)
constexpr int kWin = 8;
constexpr int kSlots = 8;              // second kernel: 16-byte y chunks per CTA (64 columns) ...
constexpr int kGroups = kThreads / kSlots;  // ... and thread groups sharing them
constexpr int kListCap = 2048;         // entries of the ordered list per pass
constexpr int kFlagsPerThread = 32;    // neurons whose flags a thread lists per round (two 16-byte loads)

// ⟨x, w⟩ over K = 8 · kchunks by one warp, the row's loads in flight together (every lane gets
// the sum). STREAM: the row is read once (evict-first), else kept.
// x in shared memory (kSharedX) or global (read through the read-only path).
template <bool kSharedX>
__device__ __forceinline__ uint4 load_x(const uint4* x, int c) {
  if constexpr (kSharedX)
    return x[c];
  else
    return __ldg(x + c);
}

template <bool STREAM, bool kSharedX = false>
__device__ __forceinline__ float warp_row_dot(const __nv_bfloat16* w, const __nv_bfloat16* x, int kchunks, int lane) {
  const uint4* wr = reinterpret_cast<const uint4*>(w);
  const uint4* xr = reinterpret_cast<const uint4*>(x);
  float s = 0.0f;
  for (int c0 = 0; c0 < kchunks; c0 += 32 * kWin) {
    uint4 wv[kWin];
#pragma unroll
    for (int i = 0; i < kWin; ++i) {
      const int c = c0 + i * 32 + lane;
      wv[i] = c < kchunks ? (STREAM ? __ldcs(wr + c) : __ldg(wr + c)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < kWin; ++i) {
      const int c = c0 + i * 32 + lane;
      if (c < kchunks) s += dev::dot8(load_x<kSharedX>(xr, c), wv[i]);
    }
  }
  return dev::warp_sum(s);
}

// Programmatic dependent launch (sm_90, launch.cuh): the first kernel lets the next one be
// scheduled at its start (dev::pdl_trigger; the down kernel, or the next layer's QKV, then starts
// beside its work), and each waits for the whole grid before it to finish (dev::pdl_wait) before
// reading what that grid wrote. Elsewhere a plain stream dependency.

// Warp w of CTA b owns neuron n = order[i] of slot i = b · kWarps + w (n = i without an order; the
// order is read before the wait, as no kernel of the chain writes it). Its row's first window (kWin
// chunk steps) is loaded before the wait for the previous kernel: weights, which no kernel writes,
// stream in while the norm before the FFN runs (programmatic launches). A lane sums chunks lane, lane + 32, … in order
// whatever the window, so g has the bits of warp_row_dot (and of the decode GEMV).
// kNorm: x formed from the residual stream in shared memory (DecodeTokenNorm); every warp of the
// CTA takes part in the norm, those past N included. kFixed: an active neuron's warp adds its
// h · Wdᵀ[n, :] into y_fixed itself (no flags, no h, no down kernel): lane l loads the Wdᵀ chunks
// l, l + 32, … (8 columns each) and, after a transpose through shared memory, reduces columns
// 32e + l of each 256-column step.
template <bool kNorm, bool kFixed>
__global__ void __launch_bounds__(kThreads) twell_decode_token_kernel(TwellDecodeTokenParams p, float fixed_limit) {
  extern __shared__ uint4 xs_raw[];  // kNorm: the normalised row, bf16 [k]; then the norm's staged weights
  static_assert(kThreads == ops::detail::kNormThreads, "the norm's threads are the CTA's");
  dev::pdl_trigger();
  const int lane = threadIdx.x % 32;
  const int kchunks = static_cast<int>(p.k / 8);
  const std::int64_t slot = static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (!kNorm && slot >= p.n) {
    dev::pdl_wait();
    return;
  }
  const bool has_row = slot < p.n;
  const std::int64_t n = has_row && p.order ? static_cast<std::int64_t>(__ldcg(p.order + slot)) : slot;
  const uint4* wrow = reinterpret_cast<const uint4*>(p.w_first + n * p.k);  // read only where has_row
  uint4 wv[kWin];
  const auto load_window = [&](int s0) {
#pragma unroll
    for (int s = 0; s < kWin; ++s) {
      const int c = (s0 + s) * 32 + lane;
      wv[s] = has_row && c < kchunks ? __ldcs(wrow + c) : make_uint4(0, 0, 0, 0);
    }
  };
  load_window(0);  // before the wait: weights only
  float4* norm_stage = reinterpret_cast<float4*>(xs_raw + kchunks);
  if constexpr (kNorm) ops::detail::stage_norm_weights(p.norm.w, p.k, norm_stage);  // weights too
  dev::pdl_wait();
  const uint4* xr = reinterpret_cast<const uint4*>(p.x);
  if constexpr (kNorm) {
    // r is only read here; the weight window stays in registers across the norm
    ops::detail::norm_row_reread(p.norm.r, p.norm.first, p.norm.delta, p.k, p.norm.w, p.norm.eps,
                                 reinterpret_cast<__nv_bfloat16*>(xs_raw), norm_stage);
    __syncthreads();
    if (!has_row) return;
    xr = xs_raw;
  }
  float acc = 0.0f;
  for (int s0 = 0; s0 * 32 < kchunks; s0 += kWin) {
    if (s0 > 0) load_window(s0);
#pragma unroll
    for (int s = 0; s < kWin; ++s) {
      const int c = (s0 + s) * 32 + lane;
      if (c < kchunks) acc += dev::dot8(load_x<kNorm>(xr, c), wv[s]);
    }
  }
  const float g = __bfloat162float(__float2bfloat16_rn(fmaxf(dev::warp_sum(acc), 0.0f)));
  const bool active = g > 0.0f;
  if (active) {
    if (p.hits && lane == 0) atomicAdd(p.hits + n, 1u);
    const char* drow = reinterpret_cast<const char*>(p.w_down_t + n * p.k);
    for (std::int64_t b = static_cast<std::int64_t>(lane) * 128; b < p.k * 2; b += 32 * 128)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(drow + b));
    const float h =
        p.gated ? g * warp_row_dot<false, kNorm>(p.w_up + n * p.k, reinterpret_cast<const __nv_bfloat16*>(xr), kchunks, lane)
                : g;
    if constexpr (kFixed) {
      // Wdᵀ[n, :] in windows of kWin chunk steps (2048 columns), every load in flight before the
      // window's reductions (dev::fixed_add_step, a step's 256 columns).
      __shared__ float s_terms[kWarps][32 * 8];
      float* terms = s_terms[threadIdx.x / 32];
      const uint4* dr = reinterpret_cast<const uint4*>(p.w_down_t + n * p.k);
      bool in_range = true;
      dev::down_row_steps<kWin>(dr, kchunks, lane, [&](int step0, const float(&wf)[8]) {
        in_range &= dev::fixed_add_step(p.y_fixed, 8ll * step0, p.k, h, wf, terms, lane, fixed_limit);
      });
      if (!in_range) atomicOr(p.overflow, 1u);
    } else {
      if (lane == 0) p.h[n] = h;
    }
  }
  if (!kFixed && lane == 0) p.flags[n] = active ? 1 : 0;
}

// y's chunks [blockIdx.x · kSlots, + kSlots): thread (group q = tid / kSlots, slot s) adds the
// listed neurons q, q + kGroups, … of its chunk; then the groups' sums in group order.
__global__ void __launch_bounds__(kThreads) twell_decode_token_down_kernel(TwellDecodeTokenParams p) {
  __shared__ int s_n[kListCap];
  __shared__ float s_h[kListCap];
  __shared__ float s_red[kGroups][kSlots][8];
  __shared__ int s_warp[kWarps];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, q = tid / kSlots, slot = tid % kSlots;
  dev::pdl_trigger();  // the next kernel (it waits for this grid) may stream its weights meanwhile
  dev::pdl_wait();
  if (p.norm.w) {  // r' = r + first + delta for this CTA's columns (norm_row's adds, in its order)
    for (int e = tid; e < kSlots * 8; e += kThreads) {
      const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * kSlots * 8 + e;
      if (col < p.k) {
        float v = p.norm.r[col];
        if (p.norm.first) v += __bfloat162float(p.norm.first[col]);
        v += __bfloat162float(p.norm.delta[col]);
        p.norm.r[col] = v;
      }
    }
    // Ordered before this CTA's y stores (after the barriers below): y may alias `first`.
  }
  const int kchunks = static_cast<int>(p.k / 8);
  const int c = blockIdx.x * kSlots + slot;
  float acc[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
  unsigned long long total = 0;
  for (std::int64_t r0 = 0; r0 < p.n; r0 += static_cast<std::int64_t>(kThreads) * kFlagsPerThread) {
    // This thread's 32 flags (bytes 0 or 1), as 8 words: a word's popcount counts them. Bytes past
    // N are masked off here, whatever the buffer holds there.
    const std::int64_t nb = r0 + static_cast<std::int64_t>(tid) * kFlagsPerThread;
    unsigned w[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (nb < p.n) {
      const uint4 a = __ldcg(reinterpret_cast<const uint4*>(p.flags + nb));
      const uint4 b = __ldcg(reinterpret_cast<const uint4*>(p.flags + nb) + 1);
      w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
      const std::int64_t valid = p.n - nb;  // bytes of these 32 that are neurons
      if (valid < kFlagsPerThread) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const std::int64_t left = valid - 4 * i;  // this word's bytes that are neurons
          w[i] &= left >= 4 ? 0xffffffffu : left <= 0 ? 0u : (1u << (8 * left)) - 1u;
        }
      }
    }
    int cnt = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) cnt += __popc(w[i]);
    const int incl = dev::warp_inclusive_scan(cnt, lane);
    if (lane == 31) s_warp[warp] = incl;
    __syncthreads();
    int off = incl - cnt, round_total = 0;
#pragma unroll
    for (int i = 0; i < kWarps; ++i) {
      off += i < warp ? s_warp[i] : 0;
      round_total += s_warp[i];
    }
    __syncthreads();  // s_warp is rewritten next round
    total += static_cast<unsigned long long>(round_total);
    for (int base = 0; base < round_total; base += kListCap) {
      int e = off;
#pragma unroll
      for (int i = 0; i < 8; ++i)
        for (unsigned bits = w[i]; bits; bits &= bits - 1u, ++e)
          if (e >= base && e < base + kListCap) {
            const std::int64_t nn = nb + i * 4 + (__ffs(static_cast<int>(bits)) - 1) / 8;
            s_n[e - base] = static_cast<int>(nn);
            s_h[e - base] = __ldcg(p.h + nn);
          }
      __syncthreads();
      const int len = min(kListCap, round_total - base);
      if (c < kchunks) {
#pragma unroll 4
        for (int j = q; j < len; j += kGroups)
          dev::axpy8(s_h[j], __ldg(reinterpret_cast<const uint4*>(p.w_down_t + static_cast<std::int64_t>(s_n[j]) * p.k) + c),
                     acc);
      }
      __syncthreads();  // the list is rewritten next pass
    }
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) s_red[q][slot][e] = acc[e];
  __syncthreads();
  if (tid < kSlots) {
    const int cc = blockIdx.x * kSlots + tid;
    float sum[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) sum[e] = 0.0f;
    for (int g = 0; g < kGroups; ++g)
#pragma unroll
      for (int e = 0; e < 8; ++e) sum[e] += s_red[g][tid][e];
    if (cc < kchunks) *reinterpret_cast<uint4*>(p.y + static_cast<std::int64_t>(cc) * 8) = dev::pack8_bf16(sum);
  }
  if (blockIdx.x == 0 && tid == 0 && p.nnz_out) *p.nnz_out = total;
}

// decode_token_reorder: a stable counting sort over the activity classes, in one CTA. Pass 1
// counts each class; pass 2 places kReorderThreads neurons a round, each at its class's next free
// position plus its rank among the round's earlier neurons of the class (warp ranks by match_any,
// then the warps' counts in order), so neurons keep their index order within a class.
constexpr int kReorderThreads = 1024;
constexpr int kReorderWarps = kReorderThreads / 32;
constexpr int kClasses = 33;  // hits 0, then ⌊log2 hits⌋ = 0 … 31

__device__ __forceinline__ int activity_class(unsigned h) { return h == 0 ? 0 : 32 - __clz(static_cast<int>(h)); }

__global__ void __launch_bounds__(kReorderThreads) decode_token_reorder_kernel(const unsigned* hits, int* order, int n) {
  __shared__ unsigned s_next[kClasses];                  // the class's next free position
  __shared__ unsigned s_round[kClasses];                 // the class's neurons: all (pass 1), then this round's
  __shared__ unsigned s_warp[kReorderWarps][kClasses];   // a round's count per warp, then its exclusive prefix
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  if (tid < kClasses) s_round[tid] = 0;
  __syncthreads();
  for (int i = tid; i < n; i += kReorderThreads) atomicAdd(&s_round[activity_class(hits[i])], 1u);
  __syncthreads();
  if (tid == 0) {  // the most active class first
    unsigned pos = 0;
    for (int c = kClasses - 1; c >= 0; --c) {
      s_next[c] = pos;
      pos += s_round[c];
    }
  }
  __syncthreads();
  for (int r0 = 0; r0 < n; r0 += kReorderThreads) {
    const int i = r0 + tid;
    const bool valid = i < n;
    const int c = valid ? activity_class(hits[i]) : kClasses;  // kClasses: no neuron
    const unsigned peers = __match_any_sync(0xffffffffu, c);
    const unsigned rank = __popc(peers & ((1u << lane) - 1u));
    for (int e = tid; e < kReorderWarps * kClasses; e += kReorderThreads) (&s_warp[0][0])[e] = 0;
    __syncthreads();
    if (valid && rank == 0) s_warp[warp][c] = __popc(peers);
    __syncthreads();
    if (tid < kClasses) {
      unsigned acc = 0;
      for (int w = 0; w < kReorderWarps; ++w) {
        const unsigned k = s_warp[w][tid];
        s_warp[w][tid] = acc;
        acc += k;
      }
      s_round[tid] = acc;
    }
    __syncthreads();
    if (valid) order[s_next[c] + s_warp[warp][c] + rank] = i;
    __syncthreads();
    if (tid < kClasses) s_next[tid] += s_round[tid];
    // (the next round's first barrier orders this before s_next is read again)
  }
  // The order is performed before the grid ends: a programmatic launch after this one starts at its
  // end (no early trigger here), and the one-token kernel reads the order before its own wait.
  __threadfence();
}

// Whether this file's kernels, as loaded on the current device, wait for their prerequisite grid:
// the down kernel's image (which the first kernel shares) asked through launch.hpp.
bool down_kernel_waits() {
  return programmatic_launch_supported(reinterpret_cast<const void*>(twell_decode_token_down_kernel));
}

}  // namespace

void launch_twell_decode_token(const TwellDecodeTokenParams& p, cudaStream_t stream) {
  const bool norm = p.norm.w != nullptr;
  const bool fixed = p.y_fixed != nullptr;
  TWELL_CU_REQUIRE((norm ? p.norm.r != nullptr && (fixed || p.norm.delta != nullptr) : p.x != nullptr) && p.w_first &&
                       p.w_down_t && (fixed ? p.overflow != nullptr : p.y && p.h && p.flags) && (!p.gated || p.w_up),
                   ErrorCode::invalid_argument, "twell decode_token: null pointer");
  TWELL_CU_REQUIRE(!fixed || (!p.norm.first && !p.norm.delta && (reinterpret_cast<std::uintptr_t>(p.y_fixed) & 15) == 0),
                   ErrorCode::invalid_argument,
                   "twell decode_token: the fixed-point output needs a 16-byte aligned y_fixed and a norm without "
                   "first or delta (no down kernel stores r')");
  TWELL_CU_REQUIRE(!norm || ops::detail::norm_row_aligned(p.k, p.norm.r, p.norm.w, p.norm.first, p.norm.delta, nullptr),
                   ErrorCode::invalid_argument,
                   "twell decode_token: the norm needs r and w 16-byte aligned, first and delta 8-byte aligned");
  TWELL_CU_REQUIRE(p.m == 1 && p.n >= 1 && p.n <= 0x7fffffff && p.k >= 8 && p.k % 8 == 0 && p.k <= kDecodeTokenMaxK &&
                       (norm || (reinterpret_cast<std::uintptr_t>(p.x) & 15) == 0) &&
                       (fixed || ((reinterpret_cast<std::uintptr_t>(p.y) & 15) == 0 &&
                                  (reinterpret_cast<std::uintptr_t>(p.flags) & 15) == 0)),
                   ErrorCode::unsupported,
                   "twell decode_token: needs M = 1 (got {}), N < 2³¹, K a multiple of 8 ≤ {} (got {}), 16-byte "
                   "aligned x, y and flags",
                   p.m, kDecodeTokenMaxK, p.k);
  const bool pdl = down_kernel_waits();
  const float limit = fixed_term_limit(p.n);
  const auto launch = [&](auto kernel, std::int64_t ctas, bool programmatic, std::size_t smem, auto... extra) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(static_cast<unsigned>(ctas));
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[2];
    cfg.attrs = attr;
    cfg.numAttrs = static_cast<unsigned>(launch_attributes(attr, programmatic));
    TWELL_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, p, extra...));
  };
  // The first kernel overlaps the kernel before it only inside the caller's programmatic scope
  // (launch.hpp: the model runtime's forward, whose kernels all wait); the down kernel always
  // follows its own first kernel programmatically.
  const std::int64_t ctas = (p.n + kWarps - 1) / kWarps;
  const bool early = pdl && cuda::programmatic_launch_active();
  // kNorm: the normalised row (bf16 [k], ≤ 16 KB), then the norm's staged weights (≤ 16 KB).
  const std::size_t xs_bytes = norm ? static_cast<std::size_t>(ops::detail::norm_row_smem_bytes(p.k)) : 0;
  if (fixed) {  // the whole FFN in this one kernel
    if (norm)
      launch(twell_decode_token_kernel<true, true>, ctas, early, xs_bytes, limit);
    else
      launch(twell_decode_token_kernel<false, true>, ctas, early, xs_bytes, limit);
    TWELL_CUDA_CHECK_LAUNCH("twell_decode_token_kernel");
    return;
  }
  if (norm)  // the normalised row in shared memory
    launch(twell_decode_token_kernel<true, false>, ctas, early, xs_bytes, limit);
  else
    launch(twell_decode_token_kernel<false, false>, ctas, early, xs_bytes, limit);
  TWELL_CUDA_CHECK_LAUNCH("twell_decode_token_kernel");
  launch(twell_decode_token_down_kernel, (p.k / 8 + kSlots - 1) / kSlots, pdl, 0);
  TWELL_CUDA_CHECK_LAUNCH("twell_decode_token_down_kernel");
}

void launch_decode_token_reorder(const std::uint32_t* hits, std::int32_t* order, std::int64_t n, cudaStream_t stream) {
  TWELL_CU_REQUIRE(hits && order, ErrorCode::invalid_argument, "twell decode_token_reorder: null pointer");
  TWELL_CU_REQUIRE(n >= 1 && n <= 0x7fffffff, ErrorCode::invalid_argument, "twell decode_token_reorder: N = {} outside [1, 2³¹)", n);
  decode_token_reorder_kernel<<<1, kReorderThreads, 0, stream>>>(hits, order, static_cast<int>(n));
  TWELL_CUDA_CHECK_LAUNCH("decode_token_reorder_kernel");
}

}  // namespace twell::cuda
