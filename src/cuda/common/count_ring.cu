#include "cuda/common/count_ring.hpp"

#include "cuda/common/check.hpp"

namespace twell::cuda {
namespace {

__global__ void publish_count_kernel(const unsigned long long* count, const unsigned long long* extra,
                                     unsigned long long* slot) {
  slot[0] = *count;  // mapped host memory; visible to the host once the kernel has completed
  if (extra != nullptr)
    for (int i = 0; i < CountRing::kExtraWords; ++i) slot[1 + i] = extra[i];
}

}  // namespace

CountRing::CountRing(int slots) : slots_(static_cast<std::size_t>(slots < 1 ? 1 : slots)) {
  TWELL_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&values_),
                                 (slots_.size() + 1) * kWords * sizeof(unsigned long long), cudaHostAllocMapped));
  cudaError_t e = cudaHostGetDevicePointer(reinterpret_cast<void**>(&sink_), values_ + slots_.size() * kWords, 0);
  for (std::size_t i = 0; i < slots_.size() && e == cudaSuccess; ++i) {
    slots_[i].value = values_ + i * kWords;
    e = cudaHostGetDevicePointer(reinterpret_cast<void**>(&slots_[i].device_value), slots_[i].value, 0);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&slots_[i].done, cudaEventDisableTiming);
  }
  if (e != cudaSuccess) {
    for (Slot& s : slots_)
      if (s.done) cudaEventDestroy(s.done);
    cudaFreeHost(values_);
    TWELL_CUDA_CHECK(e);
  }
}

CountRing::~CountRing() {
  for (Slot& s : slots_)
    if (s.done) {
      if (s.busy) cudaEventSynchronize(s.done);  // its kernel writes this slot's pinned memory
      cudaEventDestroy(s.done);
    }
  cudaFreeHost(values_);
}

bool CountRing::capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  TWELL_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

namespace {
// Event queries are refused while this thread captures a graph in the global or thread-local
// mode; the events queried here were recorded outside any capture, so relaxed mode is safe.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};
}  // namespace

void CountRing::harvest(bool wait_oldest) {
  const RelaxedCaptureMode relaxed;
  if (wait_oldest) {
    Slot* oldest = nullptr;
    for (Slot& s : slots_)
      if (s.busy && (!oldest || s.seq < oldest->seq)) oldest = &s;
    if (oldest) TWELL_CUDA_CHECK(cudaEventSynchronize(oldest->done));
  }
  for (Slot& s : slots_) {
    if (!s.busy) continue;
    const cudaError_t q = cudaEventQuery(s.done);
    if (q == cudaErrorNotReady) continue;
    TWELL_CUDA_CHECK(q);
    s.busy = false;
    if (s.seq > newest_seq_) {
      newest_seq_ = s.seq;
      newest_ = static_cast<double>(s.value[0]) / s.scale;
      newest_extra_.present = s.extra;
      for (int i = 0; i < kExtraWords; ++i) newest_extra_.words[i] = s.extra ? s.value[1 + i] : 0;
      newest_extra_.tag = s.tag;
      newest_extra_.scale = s.extra_scale;
      fresh_ = true;
    }
  }
}

CountRing::Slot& CountRing::acquire() {
  harvest(false);
  for (Slot& s : slots_)
    if (!s.busy) return s;
  harvest(true);
  for (Slot& s : slots_)
    if (!s.busy) return s;
  throw Error(ErrorCode::internal, "CountRing: no slot free after waiting for the oldest");
}

void CountRing::commit(Slot& s, double scale, cudaStream_t stream, std::int64_t tag) {
  TWELL_CUDA_CHECK(cudaEventRecord(s.done, stream));
  s.scale = scale;
  s.tag = tag;
  s.seq = next_seq_++;
  s.busy = true;
}

void CountRing::push(const unsigned long long* count, double scale, cudaStream_t stream,
                     const unsigned long long* extra, std::int64_t tag, double extra_scale) {
  if (capturing(stream)) return;  // nothing to publish from inside a graph
  Slot& s = acquire();
  s.extra = extra != nullptr;
  s.extra_scale = extra_scale;
  publish_count_kernel<<<1, 1, 0, stream>>>(count, extra, s.device_value);
  TWELL_CUDA_CHECK_LAUNCH("publish_count_kernel");
  commit(s, scale, stream, tag);
}

bool CountRing::poll(double* value, Extra* extra) {
  harvest(false);
  if (!fresh_) return false;
  *value = newest_;
  if (extra != nullptr) *extra = newest_extra_;
  fresh_ = false;
  return true;
}

void CountRing::reset() {
  for (Slot& s : slots_)
    if (s.busy) {
      TWELL_CUDA_CHECK(cudaEventSynchronize(s.done));
      s.busy = false;
    }
  newest_seq_ = next_seq_ - 1;  // pushes after the reset have larger sequence numbers
  fresh_ = false;
}

}  // namespace twell::cuda
