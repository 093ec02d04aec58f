// StagedUpload (staged_upload.hpp).
#include "model/staged_upload.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>

#include "cuda/common/check.hpp"
#include "twell/error.hpp"
#include "twell/io/mapped_reads.hpp"

namespace twell::model {
namespace {

// Host copy threads: enough to outrun the link (≈ 5–10 GB/s a thread from the page cache against
// 25–50 GB/s of PCIe 5), no more than the machine has.
constexpr int kMaxThreads = 8;
// Bytes below which one thread copies a chunk alone (a thread team costs microseconds).
constexpr std::size_t kMinPerThread = std::size_t{1} << 20;

}  // namespace

StagedUpload::StagedUpload(cudaStream_t stream, std::size_t chunk_bytes)
    : stream_(stream), chunk_(std::max<std::size_t>(chunk_bytes, 4096)),
      threads_(std::clamp(omp_get_max_threads(), 1, kMaxThreads)) {}

StagedUpload::~StagedUpload() {
  bool busy = false;
  for (const Slot& s : slots_) busy = busy || s.busy;
  if (busy) cudaStreamSynchronize(stream_);  // the copy engine may still read a buffer
  release();
}

void StagedUpload::release() noexcept {
  for (Slot& s : slots_) {
    if (s.done) cudaEventDestroy(s.done);
    if (s.host) cudaFreeHost(s.host);
    s = Slot{};
  }
}

void StagedUpload::allocate() {
  try {
    for (Slot& s : slots_) {
      TWELL_CUDA_CHECK(cudaHostAlloc(&s.host, chunk_, cudaHostAllocDefault));
      TWELL_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
    }
  } catch (...) {
    release();
    throw;
  }
}

void StagedUpload::copy(void* dst, const void* src, std::size_t n, const std::string& what) {
  auto* d = static_cast<std::byte*>(dst);
  const auto* h = static_cast<const std::byte*>(src);
  if (n > 0 && !slots_[0].host) allocate();  // the first copy pins the buffers (none for none)
  for (std::size_t off = 0; off < n; off += chunk_) {
    Slot& s = slots_[next_];
    next_ ^= 1;
    if (s.busy) TWELL_CUDA_CHECK(cudaEventSynchronize(s.done));  // its previous chunk has left it
    s.busy = false;
    const std::size_t len = std::min(chunk_, n - off);
    const int team = static_cast<int>(std::clamp<std::size_t>(len / kMinPerThread, 1, static_cast<std::size_t>(threads_)));
    const std::size_t part = (len + static_cast<std::size_t>(team) - 1) / static_cast<std::size_t>(team);
    std::atomic<bool> faulted{false};
#pragma omp parallel for num_threads(team) schedule(static) if (team > 1)
    for (int t = 0; t < team; ++t) {
      const std::size_t b = static_cast<std::size_t>(t) * part, e = std::min(len, b + part);
      if (b < e && !io::copy_guarded(static_cast<std::byte*>(s.host) + b, h + off + b, e - b))
        faulted.store(true, std::memory_order_relaxed);
    }
    if (faulted.load()) {
      // The copies in flight finish before the error unwinds the caller's device buffers.
      cudaStreamSynchronize(stream_);
      for (Slot& o : slots_) o.busy = false;
      fail(ErrorCode::io, "{} changed while it was read for the upload (truncated in place?): load the model again", what);
    }
    TWELL_CUDA_CHECK(cudaMemcpyAsync(d + off, s.host, len, cudaMemcpyHostToDevice, stream_));
    s.busy = true;  // before the record: a failed record still leaves the destructor waiting
    TWELL_CUDA_CHECK(cudaEventRecord(s.done, stream_));
  }
}

void StagedUpload::finish() {
  for (Slot& s : slots_)
    if (s.busy) {
      TWELL_CUDA_CHECK(cudaEventSynchronize(s.done));
      s.busy = false;
    }
}

}  // namespace twell::model
