#pragma once
// out[r, c] = bf16(in[r, c]) (round to nearest even) for in [rows, cols] fp32 with row strides
// ld_in ≥ cols and ld_out ≥ cols (in elements): weight gradients handed to bf16 parameters.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace twell::cuda {

void launch_convert_f32_to_bf16(const float* in, std::int64_t ld_in, std::int64_t rows, std::int64_t cols,
                                __nv_bfloat16* out, std::int64_t ld_out, cudaStream_t stream);

}  // namespace twell::cuda
