#pragma once
// Helpers of the host-facing entry points (host_api.cpp, host_train.cpp): a private stream, event
// timing, fp32 ⇄ bf16 transfers and NaN poison.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "cuda/common/check.hpp"
#include "cuda/common/device_buffer.hpp"
#include "twell/bf16.hpp"
#include "twell/cuda/ffn_cuda.hpp"
#include "twell/tensor.hpp"

namespace twell::cuda::host {

class Stream {
 public:
  Stream() { TWELL_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const noexcept { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

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

inline DeviceBuffer<__nv_bfloat16> upload_x(CMatrixF x, cudaStream_t stream) {
  std::vector<std::uint16_t> xb(static_cast<std::size_t>(x.rows * x.cols));
  for (std::int64_t r = 0; r < x.rows; ++r)
    for (std::int64_t c = 0; c < x.cols; ++c) xb[static_cast<std::size_t>(r * x.cols + c)] = to_bf16(x(r, c)).bits;
  DeviceBuffer<__nv_bfloat16> d(xb.size());
  TWELL_CUDA_CHECK(cudaMemcpyAsync(d.get(), xb.data(), xb.size() * 2, cudaMemcpyHostToDevice, stream));
  TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
  return d;
}

inline std::vector<float> download_y(const __nv_bfloat16* y, std::int64_t m, std::int64_t k, cudaStream_t stream) {
  std::vector<std::uint16_t> yb(static_cast<std::size_t>(m * k));
  TWELL_CUDA_CHECK(cudaMemcpyAsync(yb.data(), y, yb.size() * 2, cudaMemcpyDeviceToHost, stream));
  TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> out(yb.size());
  for (std::size_t i = 0; i < yb.size(); ++i) out[i] = to_float(bf16{yb[i]});
  return out;
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
