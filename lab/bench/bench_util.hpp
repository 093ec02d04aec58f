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
#include "cuda/host_util.hpp"
#include "twell/bf16.hpp"
#include "twell/ffn.hpp"

namespace twell::cuda::bench {

// CUDA-event timing shared with the library's host API (median_ms, alternating_medians_ms).
using host::alternating_medians_ms;
using host::median_ms;

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
