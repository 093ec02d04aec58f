#pragma once
// Asynchronous read-back of device counts without a host wait: each push enqueues a one-thread
// kernel that stores one 64-bit device counter into its own slot of mapped pinned memory, and
// records an event; poll() returns the newest count whose kernel has completed. Lets a call decide
// from the latest finished call's count while the host runs ahead of the GPU (back-to-back
// calls). A kernel rather than cudaMemcpyAsync: a device-to-host copy puts the copy engine on the
// stream's critical path (measured +6–10 µs per decode call on an H100). Only when all slots are
// still in flight does push wait, for the oldest.
// Under CUDA-graph capture (the stream given to push is capturing) nothing is published: the
// counting work a push_by enqueues writes into a sink that is never read, no event is recorded,
// and poll only reads what completed before (its event query is made in relaxed capture mode). A
// captured call so bakes the dispatch it was captured with, and its replays report no counts.
// A push may carry three more device words (a call's exact counters, e.g. TwellCounters' nnz,
// overflow tiles and rows), a host tag (e.g. its M) and a host scale for the first word (e.g. the
// cells it counted over); poll returns them with the count.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>


namespace twell::cuda {

class CountRing {
 public:
  explicit CountRing(int slots = 8);
  ~CountRing();
  CountRing(const CountRing&) = delete;
  CountRing& operator=(const CountRing&) = delete;

  static constexpr int kExtraWords = 3;
  // What travelled with the newest count: present when its push gave `extra`.
  struct Extra {
    bool present = false;
    unsigned long long words[kExtraWords] = {};
    std::int64_t tag = 0;
    double scale = 1;  // the push's extra_scale: words[0] / scale (e.g. a share of non-zeros)
  };
  // Enqueues on `stream` a copy of *count (device); it is read back as *count / scale. extra (null,
  // or kExtraWords consecutive device words), tag and extra_scale come back with it (poll's Extra).
  void push(const unsigned long long* count, double scale, cudaStream_t stream,
            const unsigned long long* extra = nullptr, std::int64_t tag = 0, double extra_scale = 1);
  // The same for work that stores the count itself: enqueue(dst) must enqueue on `stream` work
  // that writes the count to dst (a device pointer into this ring's mapped memory).
  template <typename Enqueue>
  void push_by(double scale, cudaStream_t stream, Enqueue&& enqueue) {
    if (capturing(stream)) {
      enqueue(sink_);
      return;
    }
    Slot& s = acquire();
    s.extra = false;
    enqueue(s.device_value);
    commit(s, scale, stream, 0);
  }
  // True, with the value of the newest completed push, if one completed since the last poll that
  // returned true and is newer than the value it returned. Never waits.
  bool poll(double* value, Extra* extra = nullptr);
  // Waits for every push in flight and forgets all values.
  void reset();

 private:
  struct Slot {
    cudaEvent_t done = nullptr;
    unsigned long long* value = nullptr;         // this slot's kWords elements of values_ (host view)
    unsigned long long* device_value = nullptr;  // the same elements as the device writes them
    double scale = 1;
    bool extra = false;                          // words [1, kWords) were written by its push
    std::int64_t tag = 0;
    double extra_scale = 1;
    std::uint64_t seq = 0;
    bool busy = false;
  };
  static bool capturing(cudaStream_t stream);              // a CUDA graph is being captured on it
  void harvest(bool wait_oldest);
  Slot& acquire();                                      // a free slot (waits for the oldest if none)
  void commit(Slot& s, double scale, cudaStream_t stream, std::int64_t tag);  // records its event, marks it in flight

  static constexpr int kWords = 1 + kExtraWords;  // per slot: the count, then the extra words
  unsigned long long* values_ = nullptr;  // mapped pinned memory, kWords elements per slot, then the sink's
  unsigned long long* sink_ = nullptr;    // device view of the sink: captured work's counts
  std::vector<Slot> slots_;
  std::uint64_t next_seq_ = 1, newest_seq_ = 0;
  double newest_ = 0;
  Extra newest_extra_;
  bool fresh_ = false;
};

}  // namespace twell::cuda
