#pragma once
// The element type of an FFN layer's weights in device memory (DeviceWeights::type). C++17, no CUDA
// types: the library's .cu files include it too.

namespace twell::cuda {

// bf16, or fp32 (a trainer's master weights), which a layer rounds to bf16 (to nearest, ties to
// even, as PyTorch's .to(torch.bfloat16)) while it copies them into its layouts: one pass, no bf16
// temporary.
enum class WeightType { bf16, f32 };

}  // namespace twell::cuda
