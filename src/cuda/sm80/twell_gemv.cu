// Decode-size gate GEMV (twell_gemv.hpp).
#include "cuda/sm80/twell_gemv.hpp"

#include "cuda/common/check.hpp"
#include "cuda/sm80/twell_gemv_kernel.cuh"

namespace twell::cuda {

using detail::kGemvWarpRows;
using detail::kGemvWarps;
using detail::twell_gemv_kernel;

void launch_twell_gemv(const TwellGemvParams& p, cudaStream_t stream) {
  TWELL_CU_REQUIRE(p.x && p.w && (p.g || p.g32), ErrorCode::invalid_argument, "twell gemv: null pointer");
  TWELL_CU_REQUIRE(p.m >= 1 && p.m <= kGemvMaxRows && p.n >= 1 && p.k >= 8 && p.k % 8 == 0 && p.k <= kGemvMaxK &&
                       p.ld_x % 8 == 0 && (reinterpret_cast<std::uintptr_t>(p.x) & 15) == 0 &&
                       (reinterpret_cast<std::uintptr_t>(p.w) & 15) == 0 && p.ld_g >= p.n,
                   ErrorCode::unsupported,
                   "twell gemv: needs M ≤ {} (got {}), K a multiple of 8 ≤ {} (got {}), 16-byte aligned rows", kGemvMaxRows,
                   p.m, kGemvMaxK, p.k);
  const std::int64_t ctas = (p.n + kGemvWarps * kGemvWarpRows - 1) / (kGemvWarps * kGemvWarpRows);
  TWELL_CU_REQUIRE(ctas <= 0x7fffffff, ErrorCode::unsupported, "twell gemv: N = {} too large", p.n);
  const dim3 grid(static_cast<unsigned>(ctas)), block(kGemvWarps * 32);
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
