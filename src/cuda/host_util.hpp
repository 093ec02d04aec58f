#pragma once
// Helpers of the host-facing entry points (host_api.cpp, host_train.cpp) and the engine's benchmarks:
// the device check, event timing and NaN poison. Their streams and fp32 ⇄ bf16 transfers are
// cuda/common/'s (stream.hpp, transfer.hpp).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "cuda/common/check.hpp"
#include "twell/cuda/ffn_cuda.hpp"

namespace twell::cuda::host {

class Events {
 public:
  Events() {
    TWELL_CUDA_CHECK(cudaEventCreate(&a_));
    TWELL_CUDA_CHECK(cudaEventCreate(&b_));
  }
  ~Events() {
    cudaEventDestroy(a_);
    cudaEventDestroy(b_);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  cudaEvent_t a() const noexcept { return a_; }
  cudaEvent_t b() const noexcept { return b_; }

 private:
  cudaEvent_t a_ = nullptr, b_ = nullptr;
};

inline void require_device() {
  const DeviceInfo d = query_device();
  TWELL_CHECK(d.available, ErrorCode::unsupported, "no usable CUDA device: {}", d.reason);
  TWELL_CHECK(d.cc_major >= 8, ErrorCode::unsupported,
              "the CUDA path needs compute capability ≥ 8.0 (found {}.{} on {}); use --device cpu", d.cc_major,
              d.cc_minor, d.name);
}

inline void poison(__nv_bfloat16* p, std::size_t count, cudaStream_t stream) {
  // 0xFFFF is a bf16 NaN: any element a kernel fails to write stays NaN and fails the checks.
  TWELL_CUDA_CHECK(cudaMemsetAsync(p, 0xff, count * sizeof(__nv_bfloat16), stream));
}

template <typename F>
double median_ms(int warmup, int reps, cudaStream_t stream, F&& body) {
  Events ev;
  for (int i = 0; i < warmup; ++i) body();
  TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> t;
  for (int i = 0; i < std::max(1, reps); ++i) {
    TWELL_CUDA_CHECK(cudaEventRecord(ev.a(), stream));
    body();
    TWELL_CUDA_CHECK(cudaEventRecord(ev.b(), stream));
    TWELL_CUDA_CHECK(cudaEventSynchronize(ev.b()));
    float ms = 0;
    TWELL_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.a(), ev.b()));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Medians of bodies a and b timed alternately, rep by rep (after `warmup` untimed rounds of both),
// so that clock or thermal drift over the run affects both alike. Returns {median a, median b}.
template <typename A, typename B>
std::pair<double, double> alternating_medians_ms(int warmup, int reps, cudaStream_t stream, A&& a, B&& b) {
  for (int i = 0; i < warmup; ++i) {
    a();
    b();
  }
  std::vector<double> ta, tb;
  for (int i = 0; i < std::max(1, reps); ++i) {
    ta.push_back(median_ms(0, 1, stream, a));
    tb.push_back(median_ms(0, 1, stream, b));
  }
  std::sort(ta.begin(), ta.end());
  std::sort(tb.begin(), tb.end());
  return {ta[ta.size() / 2], tb[tb.size() / 2]};
}

}  // namespace twell::cuda::host
