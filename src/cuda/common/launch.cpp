// The thread's programmatic-launch policy (see launch.hpp).
#include "cuda/common/launch.hpp"

#include "cuda/common/check.hpp"

namespace twell::cuda {
namespace {
thread_local bool t_programmatic = false;
}  // namespace

bool programmatic_launch_active() noexcept { return t_programmatic; }

ProgrammaticLaunch::ProgrammaticLaunch(bool enabled) noexcept : previous_(t_programmatic) { t_programmatic = enabled; }
ProgrammaticLaunch::~ProgrammaticLaunch() { t_programmatic = previous_; }

bool programmatic_launch_supported() {
  int dev = 0, major = 0;
  TWELL_CUDA_CHECK(cudaGetDevice(&dev));
  TWELL_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major == 9;
}

}  // namespace twell::cuda
