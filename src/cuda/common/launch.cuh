#pragma once
// The kernels' side of programmatic dependent launches (launch.hpp): dev::pdl_begin(), the first
// statement of every kernel launched through launch_kernel, and launch_kernel itself. Before it a
// kernel may only read memory no kernel of the chain writes (weights: rmsnorm_project loads its
// first W window there; a step's inputs copied in before its first kernel); everything else waits.
#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/common/check.hpp"
#include "cuda/common/launch.hpp"

namespace twell::cuda {

namespace dev {
// Waits for the whole previous grid to finish and flush (a no-op unless this grid was launched
// programmatically): before it a kernel reads nothing another kernel writes.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Lets the next grid be scheduled once every CTA of this one has called it (or ended): its CTAs
// may then run their part before its own pdl_wait beside this grid's work.
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// The usual order: wait for the previous grid, then let the next one be scheduled.
__device__ __forceinline__ void pdl_begin() {
  pdl_wait();
  pdl_trigger();
}
}  // namespace dev

// kernel<<<grid, block, smem, stream>>>(args...), programmatic inside a ProgrammaticLaunch scope and
// with the carveout of a LaunchCarveout scope.
// The kernel's own parameter types, not deduced from the arguments (they convert as in a call).
template <class T>
struct NonDeduced {
  using type = T;
};

template <typename... P>
void launch_kernel(void (*kernel)(P...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t stream,
                   typename NonDeduced<P>::type... args) {
  cudaLaunchAttribute attr[2];
  const int n = launch_attributes(attr, programmatic_launch_active());
  if (n == 0) {
    kernel<<<grid, block, smem, stream>>>(args...);
    return;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = static_cast<unsigned>(n);
  TWELL_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

}  // namespace twell::cuda
