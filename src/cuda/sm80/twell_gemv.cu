// Decode-size gate GEMV (twell_gemv.hpp).
#include "cuda/sm80/twell_gemv.hpp"

#include "cuda/common/check.hpp"
#include "cuda/common/launch.cuh"
#include "cuda/common/device_math.cuh"

namespace twell::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kRows = 4;                                         // W rows per warp
constexpr int kWin = 2;                                          // chunk steps per load window

// MT ≥ M tokens (a power of two); lane l owns the row chunks l, l + 32, …; the warp's kRows rows
// are n0 .. n0 + 3. Sums of kRows · MT values per lane, then a butterfly over the lanes.
template <int MT>
__global__ void __launch_bounds__(kWarps * 32) twell_gemv_kernel(TwellGemvParams p) {
  dev::pdl_begin();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const std::int64_t n0 = (static_cast<std::int64_t>(blockIdx.x) * kWarps + warp) * kRows;
  if (n0 >= p.n) return;
  const int kchunks = static_cast<int>(p.k / 8);
  const uint4* wrow[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r)  // rows past N read row n0 (their sums are dropped)
    wrow[r] = reinterpret_cast<const uint4*>(p.w + (n0 + r < p.n ? n0 + r : n0) * p.k);
  float acc[kRows][MT];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < MT; ++t) acc[r][t] = 0.0f;
  // Windows of kWin chunk steps: the window's kRows · kWin loads are issued together, then used
  // for every token (the unrolled loop lets the next window's loads overlap this one's math).
  for (int s0 = 0; s0 * 32 < kchunks; s0 += kWin) {
    uint4 wv[kRows][kWin];
#pragma unroll
    for (int s = 0; s < kWin; ++s)
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int c = (s0 + s) * 32 + lane;
        wv[r][s] = c < kchunks ? __ldcs(wrow[r] + c) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
    for (int s = 0; s < kWin; ++s) {
      const int c = (s0 + s) * 32 + lane;
      if (c < kchunks) {
        float wf[kRows][8];  // the rows' chunk in fp32, converted once for all tokens
#pragma unroll
        for (int r = 0; r < kRows; ++r) dev::unpack8_bf16(wv[r][s], wf[r]);
#pragma unroll
        for (int t = 0; t < MT; ++t) {
          if (t < p.m) {
            float xf[8];
            dev::unpack8_bf16(__ldg(reinterpret_cast<const uint4*>(p.x + t * p.ld_x) + c), xf);
#pragma unroll
            for (int r = 0; r < kRows; ++r)
#pragma unroll
              for (int e = 0; e < 8; ++e) acc[r][t] = fmaf(xf[e], wf[r][e], acc[r][t]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < MT; ++t) acc[r][t] = dev::warp_sum(acc[r][t]);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int t = 0; t < MT; ++t)
        if (t < p.m && n0 + r < p.n) {
          const float v = p.relu ? fmaxf(acc[r][t], 0.0f) : acc[r][t];
          if (p.g32)
            p.g32[t * p.ld_g + n0 + r] = v;
          else
            p.g[t * p.ld_g + n0 + r] = __float2bfloat16_rn(v);
        }
  }
}

}  // namespace

void launch_twell_gemv(const TwellGemvParams& p, cudaStream_t stream) {
  TWELL_CU_REQUIRE(p.x && p.w && (p.g || p.g32), ErrorCode::invalid_argument, "twell gemv: null pointer");
  TWELL_CU_REQUIRE(p.m >= 1 && p.m <= kGemvMaxRows && p.n >= 1 && p.k >= 8 && p.k % 8 == 0 && p.k <= kGemvMaxK &&
                       p.ld_x % 8 == 0 && (reinterpret_cast<std::uintptr_t>(p.x) & 15) == 0 &&
                       (reinterpret_cast<std::uintptr_t>(p.w) & 15) == 0 && p.ld_g >= p.n,
                   ErrorCode::unsupported,
                   "twell gemv: needs M ≤ {} (got {}), K a multiple of 8 ≤ {} (got {}), 16-byte aligned rows", kGemvMaxRows,
                   p.m, kGemvMaxK, p.k);
  const std::int64_t ctas = (p.n + kWarps * kRows - 1) / (kWarps * kRows);
  TWELL_CU_REQUIRE(ctas <= 0x7fffffff, ErrorCode::unsupported, "twell gemv: N = {} too large", p.n);
  const dim3 grid(static_cast<unsigned>(ctas)), block(kWarps * 32);
  if (p.m <= 1)
    launch_kernel(twell_gemv_kernel<1>, grid, block, 0, stream, p);
  else if (p.m <= 2)
    launch_kernel(twell_gemv_kernel<2>, grid, block, 0, stream, p);
  else if (p.m <= 4)
    launch_kernel(twell_gemv_kernel<4>, grid, block, 0, stream, p);
  else if (p.m <= 8)
    launch_kernel(twell_gemv_kernel<8>, grid, block, 0, stream, p);
  else
    launch_kernel(twell_gemv_kernel<16>, grid, block, 0, stream, p);
  TWELL_CUDA_CHECK_LAUNCH("twell_gemv_kernel");
}

}  // namespace twell::cuda
