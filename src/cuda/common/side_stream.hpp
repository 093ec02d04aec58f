#pragma once
// A second stream for work that can run beside the caller's: tensor-core GEMMs (the hot neurons,
// compute-bound) next to the sparse kernels (bound by L2 bandwidth on CUDA cores). fork(main)
// returns the side stream after making it wait for everything enqueued on `main` so far;
// join(main) makes `main` wait for everything enqueued on the side since. fork may be called
// again before the join: a dependency in the middle of the side's work. The stream is created
// on first use, by default with the device's highest priority: the side's few, large CTAs then
// take SMs as the main stream's many small ones leave them, instead of queueing behind all of
// them. Work of many small CTAs beside a GEMM on the main stream wants the default priority
// instead (Priority::normal), or its CTAs take the SMs ahead of the GEMM's.
// Graph-capture safe (events only).
#include <cuda_runtime.h>

namespace twell::cuda {

class SideStream {
 public:
  enum class Priority { highest, normal };
  explicit SideStream(Priority priority = Priority::highest) : priority_(priority) {}
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  cudaStream_t fork(cudaStream_t main);
  void join(cudaStream_t main);

 private:
  void create();
  Priority priority_;
  cudaStream_t side_ = nullptr;
  cudaEvent_t forked_ = nullptr, joined_ = nullptr;
};

}  // namespace twell::cuda
