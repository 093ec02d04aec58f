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

// The SM's L1 / shared-memory split, as a percentage of the most shared memory an SM takes, that
// twell's launchers ask for on this thread while the scope lives (0–100; -1: none asked, the
// driver's choice per kernel, as outside every scope). A hint (the driver may configure more where
// a launch needs it). An SM runs one split for all its CTAs: a kernel whose CTAs need more shared
// memory than the split the kernel before it runs under waits, on each SM, for that kernel's CTAs
// to leave before the split changes, which forfeits a programmatic launch's overlap there. One
// split for every kernel of a decode step keeps the chain from changing it (RuntimeTuning::smem_carveout).
int launch_carveout() noexcept;
class LaunchCarveout {
 public:
  explicit LaunchCarveout(int percent) noexcept;
  ~LaunchCarveout();
  LaunchCarveout(const LaunchCarveout&) = delete;
  LaunchCarveout& operator=(const LaunchCarveout&) = delete;

 private:
  int previous_;
};

// This thread's launch attributes into attrs (room for 2): programmatic stream serialization where
// `programmatic`, the carveout where a LaunchCarveout scope asks for one. Returns how many it wrote.
int launch_attributes(cudaLaunchAttribute* attrs, bool programmatic) noexcept;

}  // namespace twell::cuda
