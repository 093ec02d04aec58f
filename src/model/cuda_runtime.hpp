#pragma once
// The CUDA runtime's factory (defined only in CUDA builds: TWELL_MODEL_CUDA).
#include <memory>

#include "twell/model/runtime.hpp"

namespace twell::model {

// Uploads the model's weights as bf16 to the current GPU and returns a runtime over them.
std::unique_ptr<Runtime> make_cuda_runtime(const Model& model, RuntimeOptions opt, const RuntimeTuning& tuning);

}  // namespace twell::model
