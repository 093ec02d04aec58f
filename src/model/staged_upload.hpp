#pragma once
// Host → device copies of large host buffers (a checkpoint's weights viewed in its mapped file)
// through page-locked staging. The host copies a chunk into one of two pinned buffers (several
// threads, under io::read_guarded: a file truncated meanwhile is an Error, not a SIGBUS) while the
// copy engine moves the other chunk to the device. The driver's own copies from pageable memory
// stage through its buffers with one host thread (measured 5.6–7.6 GB/s: 4.4 GB in 0.58–0.79 s on
// an H100 host); these run at the lesser of the host threads' copy rate and the link's.
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

namespace twell::model {

class StagedUpload {
 public:
  // chunk_bytes: each staging buffer's size (two, pinned, allocated at the first copy).
  explicit StagedUpload(cudaStream_t stream, std::size_t chunk_bytes = std::size_t{32} << 20);
  ~StagedUpload();  // waits for the stream if copies are in flight, then frees the staging buffers
  StagedUpload(const StagedUpload&) = delete;
  StagedUpload& operator=(const StagedUpload&) = delete;

  // Queues device dst[0, n) = host src[0, n) on the stream. When it returns, src has been read (it
  // may be freed or unmapped); dst is written once the stream reaches the copy (finish()). A fault
  // reading src is ErrorCode::io naming `what`.
  void copy(void* dst, const void* src, std::size_t n, const std::string& what);
  // Waits until every queued copy has reached the device.
  void finish();

 private:
  void allocate();
  void release() noexcept;

  struct Slot {
    void* host = nullptr;
    cudaEvent_t done = nullptr;
    bool busy = false;
  };
  cudaStream_t stream_;
  std::size_t chunk_;
  Slot slots_[2];
  int next_ = 0;
  int threads_ = 1;
};

}  // namespace twell::model
