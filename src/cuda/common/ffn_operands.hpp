#pragma once
// The operands every sparse FFN kernel of the inference path shares (the fused up+down, the split
// remainder's sliced down, the decode kernel): their parameter structs derive from this one, so a
// context fills these fields once (FfnContext::operands).
#include <cuda_bf16.h>

#include <cstdint>

namespace twell::cuda {

struct FfnOperands {
  const __nv_bfloat16* x = nullptr;         // [M, K], row stride ld_x (gated only)
  std::int64_t ld_x = 0;
  const __nv_bfloat16* w_up = nullptr;      // [N, K], row stride K (gated only)
  const __nv_bfloat16* w_down_t = nullptr;  // [N, K] = Wdᵀ, row stride K
  __nv_bfloat16* y = nullptr;               // [M, K], row stride ld_y
  std::int64_t ld_y = 0;
  std::int64_t m = 0, n = 0, k = 0;
  bool gated = true;
};

}  // namespace twell::cuda
