#pragma once
// Helpers shared by the CUDA benchmark's inference and training sweeps.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/common/check.hpp"
#include "twell/bf16.hpp"

namespace twell::cuda::bench {

// Median of `reps` CUDA-event intervals of body() on stream s, after `warmup` untimed runs.
template <typename F>
inline double median_ms(int warmup, int reps, cudaStream_t s, F&& body) {
  cudaEvent_t a, b;
  TWELL_CUDA_CHECK(cudaEventCreate(&a));
  TWELL_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) body();
  TWELL_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    TWELL_CUDA_CHECK(cudaEventRecord(a, s));
    body();
    TWELL_CUDA_CHECK(cudaEventRecord(b, s));
    TWELL_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    TWELL_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

inline std::vector<float> download(const __nv_bfloat16* p, std::size_t n) {
  std::vector<std::uint16_t> b(n);
  TWELL_CUDA_CHECK(cudaMemcpy(b.data(), p, n * 2, cudaMemcpyDeviceToHost));
  std::vector<float> f(n);
  for (std::size_t i = 0; i < n; ++i) f[i] = to_float(bf16{b[i]});
  return f;
}

// The commit being measured: $TWELL_COMMIT (the device copy has no .git), else git.
inline std::string git_commit() {
  if (const char* e = std::getenv("TWELL_COMMIT")) return e;
  std::string c = "unknown";
  if (FILE* f = popen("git rev-parse --short HEAD 2>/dev/null", "r")) {
    char buf[64] = {0};
    if (fgets(buf, sizeof buf, f)) c = std::string(buf, strcspn(buf, "\n"));
    pclose(f);
  }
  return c;
}


}  // namespace twell::cuda::bench
