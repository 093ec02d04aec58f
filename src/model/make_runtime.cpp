// make_runtime: the CPU runtime, or the CUDA one where this build has it.
#include "twell/error.hpp"
#include "twell/model/runtime.hpp"
#if defined(TWELL_MODEL_CUDA)
#include "model/cuda_runtime.hpp"
#endif

namespace twell::model {

std::unique_ptr<Runtime> make_runtime(const Model& model, const std::string& device, RuntimeOptions opt) {
  if (device == "cpu") return std::make_unique<CpuRuntime>(model, opt);
  if (device == "cuda") {
#if defined(TWELL_MODEL_CUDA)
    return make_cuda_runtime(model, opt);
#else
    fail(ErrorCode::unsupported, "this twell was built without CUDA: use the cpu device, or rebuild with nvcc present");
#endif
  }
  fail(ErrorCode::invalid_argument, "unknown device '{}' (cpu or cuda)", device);
}

}  // namespace twell::model
