#pragma once
// An FFN layer's weights, from nn.Linear's layouts in device memory (bf16, or fp32 master weights),
// into the layouts the kernels read, in one pass over the sources:
//   gu     [(gated ? 2 : 1) · ldn, k]: Wg's rows at row 0, Wu's at row ldn (gated) or 0 (non-gated)
//   down   [k, ldn]: Wd as it is, row stride ldn
//   down_t [n, k]:   Wdᵀ
// fp32 values are rounded to bf16 to nearest, ties to even (the host upload's to_bf16 and
// PyTorch's .to(torch.bfloat16) give the same bits); bf16 values are copied. Padding rows of gu
// (n ≤ r < ldn) and padding columns of down are never written.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace twell::cuda {

struct WeightLoadParams {
  const void* w_gate = nullptr;  // [n, k], row stride k; null: non-gated
  const void* w_up = nullptr;    // [n, k], row stride k
  const void* w_down = nullptr;  // [k, n], row stride n
  bool fp32 = false;              // sources fp32 (else bf16); a plain flag: .cu files build as C++17
  std::int64_t n = 0, k = 0, ldn = 0;  // k a multiple of 8; ldn ≥ n
  __nv_bfloat16* gu = nullptr;
  __nv_bfloat16* down = nullptr;
  __nv_bfloat16* down_t = nullptr;
};

void launch_load_ffn_weights(const WeightLoadParams& p, cudaStream_t stream);

}  // namespace twell::cuda
