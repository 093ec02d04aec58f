// rmsnorm_project (model_ops.hpp): one row's RMSNorm, then its projection, in one kernel — a decode
// step's attention input without the norm's own launch. Each CTA normalises the row into shared
// memory (norm_row: the bits add_rmsnorm writes), then its warps stream their W rows as the decode
// GEMV does (16-byte loads, a lane's chunks l, l + 32, … in order, fp32 sums, a butterfly over the
// lanes): the bits launch_twell_gemv writes. Every CTA reads the row (≈ 20 KB from L2 at K = 2048)
// and sums it again: cheaper than a kernel boundary at one token. The first window of W rows is
// loaded before the wait for the previous kernel (programmatic launches): weights, which no kernel
// writes, so their latency overlaps the previous kernel's tail and the norm.
#include "cuda/common/check.hpp"
#include "cuda/common/device_math.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/ops/model_ops.hpp"
#include "cuda/ops/norm_row.cuh"
#include "cuda/sm80/twell_gemv.hpp"

namespace twell::cuda::ops {
namespace {

using detail::kNormThreads;
using detail::norm_row;

constexpr int kWarps = kNormThreads / 32;
constexpr int kWarpRows = 2;  // W rows per warp: 16 a CTA (the synthetic 2B's 6144-row QKV: 384 CTAs)
constexpr int kWin = 4;       // chunk steps per load window: kWarpRows · kWin 16-byte loads in flight a lane

__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_project_kernel(const float* x, const __nv_bfloat16* delta, std::int64_t k, const float* wn, float eps,
                           const __nv_bfloat16* w, std::int64_t n, __nv_bfloat16* y) {
  extern __shared__ uint4 xs_raw[];  // the normalised row, bf16 [k] (16-byte aligned)
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(xs_raw);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const std::int64_t n0 = (static_cast<std::int64_t>(blockIdx.x) * kWarps + warp) * kWarpRows;
  const bool active = n0 < n;  // warps past n take part in the norm only
  const int kchunks = static_cast<int>(k / 8);
  const uint4* wrow[kWarpRows];
#pragma unroll
  for (int r = 0; r < kWarpRows; ++r)  // rows past n read row n0 (their sums are dropped)
    wrow[r] = reinterpret_cast<const uint4*>(w + (active && n0 + r < n ? n0 + r : active ? n0 : 0) * k);
  // Window s0 of chunk steps: kWarpRows · kWin loads issued together.
  uint4 wv[kWarpRows][kWin];
  const auto load_window = [&](int s0) {
#pragma unroll
    for (int s = 0; s < kWin; ++s)
#pragma unroll
      for (int r = 0; r < kWarpRows; ++r) {
        const int c = (s0 + s) * 32 + lane;
        wv[r][s] = active && c < kchunks ? __ldcs(wrow[r] + c) : make_uint4(0, 0, 0, 0);
      }
  };
  load_window(0);  // before the wait: weights only
  dev::pdl_begin();
  norm_row<false>(const_cast<float*>(x), delta, nullptr, k, wn, eps, xs);  // x is only read
  __syncthreads();
  if (!active) return;
  float acc[kWarpRows];
#pragma unroll
  for (int r = 0; r < kWarpRows; ++r) acc[r] = 0.0f;
  for (int s0 = 0; s0 * 32 < kchunks; s0 += kWin) {
    if (s0 > 0) load_window(s0);
#pragma unroll
    for (int s = 0; s < kWin; ++s) {
      const int c = (s0 + s) * 32 + lane;
      if (c < kchunks) {
        float xf[8];
        dev::unpack8_bf16(xs_raw[c], xf);
#pragma unroll
        for (int r = 0; r < kWarpRows; ++r) {
          float wf[8];
          dev::unpack8_bf16(wv[r][s], wf);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[r] = fmaf(xf[e], wf[e], acc[r]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kWarpRows; ++r) acc[r] = dev::warp_sum(acc[r]);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kWarpRows; ++r)
      if (n0 + r < n) y[n0 + r] = __float2bfloat16_rn(acc[r]);
  }
}

}  // namespace

void rmsnorm_project(const float* x, const __nv_bfloat16* delta, std::int64_t k, const float* w, float eps,
                     const __nv_bfloat16* wproj, std::int64_t n, __nv_bfloat16* y, cudaStream_t stream) {
  TWELL_CU_REQUIRE(x && w && wproj && y, ErrorCode::invalid_argument, "rmsnorm_project: null pointer");
  TWELL_CU_REQUIRE(n >= 1 && k >= 8 && k % 8 == 0 && k <= kGemvMaxK && (reinterpret_cast<std::uintptr_t>(wproj) & 15) == 0,
                   ErrorCode::unsupported,
                   "rmsnorm_project: needs K a multiple of 8 ≤ {} (got {}), n ≥ 1 (got {}), 16-byte aligned W", kGemvMaxK,
                   k, n);
  const std::int64_t ctas = (n + kWarps * kWarpRows - 1) / (kWarps * kWarpRows);
  TWELL_CU_REQUIRE(ctas <= 0x7fffffff, ErrorCode::unsupported, "rmsnorm_project: n = {} too large", n);
  launch_kernel(rmsnorm_project_kernel, dim3(static_cast<unsigned>(ctas)), dim3(kNormThreads),
                static_cast<std::size_t>(k) * sizeof(__nv_bfloat16), stream, x, delta, k, w, eps, wproj, n, y);
  TWELL_CUDA_CHECK_LAUNCH("rmsnorm_project_kernel");
}

}  // namespace twell::cuda::ops
