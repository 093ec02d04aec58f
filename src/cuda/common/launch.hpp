#pragma once
// Kernel launches that may be programmatic dependent launches (PDL, Hopper): such a kernel may be
// scheduled while the kernel before it in the stream still runs; it waits (dev::pdl_begin(), its
// first statement) until that one has finished and its writes are visible, and only then touches
// memory, so results are those of ordinary launches. What it saves is the launch's own latency
// between dependent kernels. Off unless a ProgrammaticLaunch scope is active on the calling thread
// (the model runtime's forward, RuntimeTuning::programmatic_launch) — and that scope must only be
// opened on a device whose code has the wait (compute capability 9.x: twell's sm_90a code; a JIT of
// its compute_80 PTX has no wait). The kernels' side is launch.cuh: every kernel launched through
// launch_kernel starts with dev::pdl_begin(). This header is the host's (no device code).
#include <cuda_runtime.h>

namespace twell::cuda {

bool programmatic_launch_active() noexcept;

// Programmatic launches for launch_kernel on this thread while the scope lives (on: `enabled`).
class ProgrammaticLaunch {
 public:
  explicit ProgrammaticLaunch(bool enabled) noexcept;
  ~ProgrammaticLaunch();
  ProgrammaticLaunch(const ProgrammaticLaunch&) = delete;
  ProgrammaticLaunch& operator=(const ProgrammaticLaunch&) = delete;

 private:
  bool previous_;
};

// Whether the current device runs twell's sm_90 code, whose kernels wait: compute capability ≥ 9
// and the loaded code of `kernel` built for sm_90 or later (not a JIT of the compute_80 PTX, which
// has no wait). Without a kernel: a probe compiled with the flags of every launch_kernel kernel.
// Asked once per device and kernel (cached), so a launch path may call it every time.
bool programmatic_launch_supported(const void* kernel = nullptr);

}  // namespace twell::cuda
