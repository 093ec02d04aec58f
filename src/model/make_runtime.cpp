// make_runtime: the CPU runtime, or the CUDA one where this build has it.
#include "twell/error.hpp"
#include "twell/model/runtime.hpp"
#if defined(TWELL_MODEL_CUDA)
#include "model/cuda_runtime.hpp"
#include "twell/cuda/ffn_cuda.hpp"
#endif

namespace twell::model {

bool cuda_usable(std::string* why) {
#if defined(TWELL_MODEL_CUDA)
  const cuda::DeviceInfo d = cuda::query_device();
  if (why) *why = d.available ? d.name : d.reason;
  return d.available;
#else
  if (why) *why = "this twell was built without CUDA";
  return false;
#endif
}

std::unique_ptr<Runtime> make_runtime(const Model& model, const std::string& device, RuntimeOptions opt,
                                      const RuntimeTuning& tuning) {
  if (device == "cpu") return std::make_unique<CpuRuntime>(model, opt, tuning);
  if (device == "cuda") {
#if defined(TWELL_MODEL_CUDA)
    return make_cuda_runtime(model, opt, tuning);
#else
    fail(ErrorCode::unsupported, "this twell was built without CUDA: use the cpu device, or rebuild with nvcc present");
#endif
  }
  fail(ErrorCode::invalid_argument, "unknown device '{}' (cpu or cuda)", device);
}

}  // namespace twell::model
