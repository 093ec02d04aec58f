// The thread's programmatic-launch policy, and whether the device's loaded code waits (launch.hpp).
#include "cuda/common/launch.cuh"

#include <map>
#include <mutex>
#include <utility>

namespace twell::cuda {
namespace {
thread_local bool t_programmatic = false;
thread_local int t_carveout = -1;

// Built with the same flags as every kernel launch_kernel launches: its loaded code's PTX version
// says whether theirs has the wait (sm_90 code) or not (a JIT of the compute_80 PTX).
__global__ void pdl_probe_kernel() { dev::pdl_begin(); }
}  // namespace

bool programmatic_launch_active() noexcept { return t_programmatic; }

ProgrammaticLaunch::ProgrammaticLaunch(bool enabled) noexcept : previous_(t_programmatic) { t_programmatic = enabled; }
ProgrammaticLaunch::~ProgrammaticLaunch() { t_programmatic = previous_; }

int launch_carveout() noexcept { return t_carveout; }

LaunchCarveout::LaunchCarveout(int percent) noexcept : previous_(t_carveout) {
  t_carveout = percent >= 0 && percent <= 100 ? percent : -1;
}
LaunchCarveout::~LaunchCarveout() { t_carveout = previous_; }

int launch_attributes(cudaLaunchAttribute* attrs, bool programmatic) noexcept {
  int n = 0;
  if (programmatic) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (t_carveout >= 0) {
    attrs[n].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
    attrs[n].val.sharedMemCarveout = static_cast<unsigned>(t_carveout);
    ++n;
  }
  return n;
}

bool programmatic_launch_supported(const void* kernel) {
  if (!kernel) kernel = reinterpret_cast<const void*>(pdl_probe_kernel);
  int dev = 0;
  TWELL_CUDA_CHECK(cudaGetDevice(&dev));
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, bool> asked;
  const std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(dev, kernel);
  if (const auto it = asked.find(key); it != asked.end()) return it->second;
  int major = 0;
  TWELL_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  cudaFuncAttributes fa{};
  TWELL_CUDA_CHECK(cudaFuncGetAttributes(&fa, kernel));
  return asked[key] = major >= 9 && fa.ptxVersion >= 90;
}

}  // namespace twell::cuda
