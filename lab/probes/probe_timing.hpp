#pragma once
// The probes' timing on the host side (the CUDA runtime API only: host probes include it too): a
// checked CUDA call that exits on failure (a probe is a lab tool, not the library), µs per launch of
// a body of launches captured once into a CUDA graph and replayed (events around a body:
// elapsed_ms), and the device-to-device copy bandwidth.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <functional>

namespace twell::probe {

#define CK(e)                                                                              \
  do {                                                                                     \
    cudaError_t err_ = (e);                                                                \
    if (err_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(err_)); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

// Milliseconds between two events on s around what body enqueues there (events freed after).
inline double elapsed_ms(cudaStream_t s, const std::function<void()>& body) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a, s));
  body();
  CK(cudaEventRecord(b, s));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return ms;
}

// Captures body (its `launches` kernel launches on s) into a graph, replays it 3 times to warm up,
// then `reps` times between events: µs per launch.
inline double time_graph(cudaStream_t s, int reps, int launches, const std::function<void()>& body) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  body();
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, s));
  const double ms = elapsed_ms(s, [&] {
    for (int i = 0; i < reps; ++i) CK(cudaGraphLaunch(ge, s));
  });
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  return 1000.0 * ms / (reps * launches);
}

// The device-to-device copy bandwidth in GB/s, bytes read + written a second (as twell bench model
// reports it): 10 copies of 1 GiB after 2 to warm up.
inline double copy_gbps(cudaStream_t s) {
  const std::size_t bytes = 1ull << 30;
  void *a = nullptr, *b = nullptr;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  CK(cudaMemsetAsync(a, 1, bytes, s));
  for (int i = 0; i < 2; ++i) CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
  const double ms = elapsed_ms(s, [&] {
    for (int i = 0; i < 10; ++i) CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
  });
  CK(cudaFree(a));
  CK(cudaFree(b));
  return 2.0 * bytes * 10 / (ms * 1e-3) / 1e9;
}

}  // namespace twell::probe
