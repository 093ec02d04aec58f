#include "cuda/common/side_stream.hpp"

#include "cuda/common/check.hpp"

namespace twell::cuda {

SideStream::~SideStream() {
  if (forked_) cudaEventDestroy(forked_);
  if (joined_) cudaEventDestroy(joined_);
  if (side_) cudaStreamDestroy(side_);
}

void SideStream::create() {
  int least = 0, greatest = 0;
  TWELL_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  TWELL_CUDA_CHECK(
      cudaStreamCreateWithPriority(&side_, cudaStreamNonBlocking, priority_ == Priority::highest ? greatest : least));
  TWELL_CUDA_CHECK(cudaEventCreateWithFlags(&forked_, cudaEventDisableTiming));
  TWELL_CUDA_CHECK(cudaEventCreateWithFlags(&joined_, cudaEventDisableTiming));
}

cudaStream_t SideStream::fork(cudaStream_t main) {
  if (!side_) create();
  TWELL_CUDA_CHECK(cudaEventRecord(forked_, main));
  TWELL_CUDA_CHECK(cudaStreamWaitEvent(side_, forked_));
  return side_;
}

void SideStream::join(cudaStream_t main) {
  TWELL_CU_REQUIRE(side_ != nullptr, ErrorCode::internal, "SideStream::join without a fork");
  TWELL_CUDA_CHECK(cudaEventRecord(joined_, side_));
  TWELL_CUDA_CHECK(cudaStreamWaitEvent(main, joined_));
}

}  // namespace twell::cuda
