// The decode-size GEMV (gemv.hpp).
#include "cuda/ops/gemv.hpp"

#include "cuda/common/check.hpp"
#include "cuda/ops/gemv_kernel.cuh"
#include "cuda/ops/gemv_mma_kernel.cuh"

namespace twell::cuda {

using detail::kGemvWarpRows;
using detail::kGemvWarps;
using detail::kGemvMmaRows;
using detail::kGemvMmaWarps;
using detail::twell_gemv_kernel;
using detail::twell_gemv_mma_kernel;

namespace {

// One token, the CUDA-core kernel (gemv_kernel.cuh; the same bits whatever its shape): 4 rows a
// warp, 2 chunk steps a window where N is large enough to fill the GPU that way, else 1 row a warp,
// 4 or 8 steps a window — at N = 2048 4.95 against 5.28 µs (K = 2048) and 10.6 against 11.9
// (K = 5632); at N = 5632 / 6144: 9.9 / 10.6 against 9.5 / 10.1 (H100, twell_probe_gemv,
// bench/results/2026-11-27-h100-cuda-91ad801-probe-gemv.txt). kGated (TwellGemvParams::h): the same
// shapes with each neuron's gate and up rows in one warp, so twice the rows a warp where N is
// small (4 rows, 2 neurons, where N = 2 · up_row is wide; else 2 rows, 1 neuron), one output (a
// neuron's product, formed once by one lane) for every two rows.
template <bool kGated>
void launch_one_token(const TwellGemvParams& p, cudaStream_t stream) {
  constexpr int kNarrowRows = kGated ? 2 : 1;   // rows a warp where N is small
  constexpr int kRowsPerOut = kGated ? 2 : 1;   // rows behind one output
  const bool wide = p.n > 4096;
  const std::int64_t outs = kGated ? p.up_row : p.n;
  const std::int64_t per_cta = kGemvWarps * (wide ? kGemvWarpRows : kNarrowRows) / kRowsPerOut;
  const std::int64_t ctas = (outs + per_cta - 1) / per_cta;
  TWELL_CU_REQUIRE(ctas <= 0x7fffffff, ErrorCode::unsupported, "twell gemv: N = {} too large", p.n);
  const dim3 grid(static_cast<unsigned>(ctas)), block(kGemvWarps * 32);
  if (wide)
    launch_kernel(twell_gemv_kernel<kGemvWarpRows, detail::kGemvWindow, kGated>, grid, block, 0, stream, p);
  else if (p.w_before_wait)  // the whole row (K ≤ 2048) in flight before the wait
    launch_kernel(twell_gemv_kernel<kNarrowRows, 8, kGated>, grid, block, 0, stream, p);
  else
    launch_kernel(twell_gemv_kernel<kNarrowRows, 4, kGated>, grid, block, 0, stream, p);
  if constexpr (kGated)
    TWELL_CUDA_CHECK_LAUNCH("twell_gemv_kernel (gated epilogue)");
  else
    TWELL_CUDA_CHECK_LAUNCH("twell_gemv_kernel");
}

}  // namespace

void launch_twell_gemv(const TwellGemvParams& p, cudaStream_t stream) {
  TWELL_CU_REQUIRE(p.x && p.w && (p.g || p.g32), ErrorCode::invalid_argument, "twell gemv: null pointer");
  TWELL_CU_REQUIRE(p.m >= 1 && p.m <= kGemvMaxRows && p.n >= 1 && gemv_takes_k(p.k) &&
                       p.ld_x % 8 == 0 && (reinterpret_cast<std::uintptr_t>(p.x) & 15) == 0 &&
                       (reinterpret_cast<std::uintptr_t>(p.w) & 15) == 0 && p.ld_g >= p.n,
                   ErrorCode::unsupported,
                   "twell gemv: needs M ≤ {} (got {}), K a multiple of 8 ≤ {} (got {}), 16-byte aligned rows", kGemvMaxRows,
                   p.m, kGemvMaxK, p.k);
  TWELL_CU_REQUIRE(!p.residual || (p.m == 1 && p.g && !p.g32), ErrorCode::invalid_argument,
                   "twell gemv: the residual add needs one token and bf16 output");
  TWELL_CU_REQUIRE(!p.residual_first_fixed || p.residual, ErrorCode::invalid_argument,
                   "twell gemv: a fixed-point first term without the residual add");
  TWELL_CU_REQUIRE(!p.store_r || (p.m == 1 && p.g && !p.g32 && !p.residual && !p.h && p.store_delta),
                   ErrorCode::invalid_argument,
                   "twell gemv: the folded norm's residual store needs one token, bf16 output, a delta, and neither the "
                   "residual add nor the gated epilogue");
  if (p.h) {
    TWELL_CU_REQUIRE(p.m == 1 && p.g && !p.g32 && !p.residual && !p.relu, ErrorCode::invalid_argument,
                     "twell gemv: the gated epilogue needs one token, bf16 [g | u] output, no ReLU and no residual add");
    TWELL_CU_REQUIRE(p.up_row >= 1 && p.n == 2 * p.up_row && p.h_n >= 1 && p.h_n <= p.up_row && p.act >= 0 && p.act <= 3,
                     ErrorCode::invalid_argument,
                     "twell gemv: the gated epilogue needs N = 2 · up_row (got N {}, up_row {}), 1 ≤ h_n ≤ up_row "
                     "(got {}) and an activation 0–3 (got {})",
                     p.n, p.up_row, p.h_n, p.act);
    launch_one_token<true>(p, stream);
    return;
  }
  if (p.m >= 2) {
    // Two or more tokens: the tensor-core kernel (gemv_mma_kernel.cuh), 16 outputs a CTA. The
    // CUDA-core kernel's math grows with M per weight byte: at 8 tokens it read a 131 MB LM head at
    // 1.0 TB/s (H200); lab/probes/probe_gemv.cu times both against cuBLASLt.
    const std::int64_t ctas = (p.n + kGemvMmaRows - 1) / kGemvMmaRows;
    TWELL_CU_REQUIRE(ctas <= 0x7fffffff, ErrorCode::unsupported, "twell gemv: N = {} too large", p.n);
    const dim3 grid(static_cast<unsigned>(ctas)), block(kGemvMmaWarps * 32);
    if (p.m <= 8)
      launch_kernel(twell_gemv_mma_kernel<1>, grid, block, 0, stream, p);
    else
      launch_kernel(twell_gemv_mma_kernel<2>, grid, block, 0, stream, p);
    TWELL_CUDA_CHECK_LAUNCH("twell_gemv_mma_kernel");
    return;
  }
  launch_one_token<false>(p, stream);
}

}  // namespace twell::cuda
