#pragma once
// out[c, r] = in[r, c]: a matrix transpose through 32 × 32 shared-memory tiles, for any shape
// (rows ≤ 65535 · 32) and any row strides (ld_in ≥ cols, ld_out ≥ rows, in elements).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace twell::cuda {

void launch_transpose_f32(const float* in, std::int64_t ld_in, std::int64_t rows, std::int64_t cols, float* out,
                          std::int64_t ld_out, cudaStream_t stream);
void launch_transpose_bf16(const __nv_bfloat16* in, std::int64_t ld_in, std::int64_t rows, std::int64_t cols,
                           __nv_bfloat16* out, std::int64_t ld_out, cudaStream_t stream);

}  // namespace twell::cuda
