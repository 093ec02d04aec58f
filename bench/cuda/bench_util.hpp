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
#include "twell/sparsity_gen.hpp"

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


// A generated FFN (twell::generate_ffn) with every tensor rounded to bf16 on the host, so the
// float64 reference sees exactly what the GPU sees.
struct RoundedFfn {
  std::vector<float> x, dy, wg, wu, wd;
  std::int64_t m = 0, k = 0, n = 0;
  bool gated = true;
  FfnWeights weights() const { return ffn_weights(gated ? wg.data() : nullptr, wu.data(), wd.data(), n, k); }
};
inline RoundedFfn generate_rounded(std::int64_t m, std::int64_t k, std::int64_t n, double density, double hot_rows,
                                   double hot_density, bool gated, std::uint64_t seed) {
  const GeneratedFfn g = generate_ffn({.m = m, .k = k, .n = n, .density = density, .hot_rows = hot_rows,
                                       .hot_density = hot_density, .gated = gated, .seed = seed});
  auto rounded = [](const HostTensor& t) {
    std::vector<float> v(static_cast<std::size_t>(t.numel()));
    const float* p = t.data<float>();
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = round_bf16(p[i]);
    return v;
  };
  RoundedFfn r;
  r.m = m;
  r.k = k;
  r.n = n;
  r.gated = gated;
  r.x = rounded(g.x);
  r.dy = rounded(g.dy);
  r.wu = rounded(g.w_up);
  r.wd = rounded(g.w_down);
  if (gated) r.wg = rounded(g.w_gate);
  return r;
}

}  // namespace twell::cuda::bench
