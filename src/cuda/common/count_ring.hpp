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

  // Enqueues on `stream` a copy of *count (device); it is read back as *count / scale.
  void push(const unsigned long long* count, double scale, cudaStream_t stream);
  // The same for work that stores the count itself: enqueue(dst) must enqueue on `stream` work
  // that writes the count to dst (a device pointer into this ring's mapped memory).
  template <typename Enqueue>
  void push_by(double scale, cudaStream_t stream, Enqueue&& enqueue) {
    if (capturing(stream)) {
      enqueue(sink_);
      return;
    }
    Slot& s = acquire();
    enqueue(s.device_value);
    commit(s, scale, stream);
  }
  // True, with the value of the newest completed push, if one completed since the last poll that
  // returned true and is newer than the value it returned. Never waits.
  bool poll(double* value);
  // Waits for every push in flight and forgets all values.
  void reset();

 private:
  struct Slot {
    cudaEvent_t done = nullptr;
    unsigned long long* value = nullptr;         // this slot's element of values_ (host view)
    unsigned long long* device_value = nullptr;  // the same element as the device writes it
    double scale = 1;
    std::uint64_t seq = 0;
    bool busy = false;
  };
  static bool capturing(cudaStream_t stream);              // a CUDA graph is being captured on it
  void harvest(bool wait_oldest);
  Slot& acquire();                                      // a free slot (waits for the oldest if none)
  void commit(Slot& s, double scale, cudaStream_t stream);  // records its event, marks it in flight

  unsigned long long* values_ = nullptr;  // mapped pinned memory, one element per slot, then the sink
  unsigned long long* sink_ = nullptr;    // device view of the last element: captured work's counts
  std::vector<Slot> slots_;
  std::uint64_t next_seq_ = 1, newest_seq_ = 0;
  double newest_ = 0;
  bool fresh_ = false;
};

}  // namespace twell::cuda
