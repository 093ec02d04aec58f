#pragma once
// Helpers the GPU probes share: seeded normal weights filled on the device; with them the host-side
// timing (probe_timing.hpp) and checks (probe_check.hpp), which host probes include alone.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "probe_check.hpp"
#include "probe_timing.hpp"

namespace twell::probe {


static __device__ float hash_normal(unsigned long long i, unsigned seed) {
  // Two uniforms from a 64-bit mix, Box–Muller.
  unsigned long long z = (i + 1) * 0x9e3779b97f4a7c15ull ^ (static_cast<unsigned long long>(seed) << 32);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  const float u1 = (static_cast<float>(z & 0xffffff) + 1.0f) / 16777217.0f;
  const float u2 = static_cast<float>((z >> 24) & 0xffffff) / 16777216.0f;
  return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

// w[r, c] = N(0, 1) · scale; column `bias_col` (if ≥ 0) = bias.
static __global__ void fill(__nv_bfloat16* w, long long rows, int cols, float scale, int bias_col, float bias, unsigned seed) {
  for (long long i = blockIdx.x * 256ll + threadIdx.x; i < rows * cols; i += 256ll * gridDim.x) {
    const int c = static_cast<int>(i % cols);
    w[i] = __float2bfloat16_rn(c == bias_col ? bias : hash_normal(i, seed) * scale);
  }
}

// Wg's column 0 = −z(d_n) (x's column 0 being 1): neuron n fires where N(0, σ≈1) > z(d_n),
// d_n = density · e^(skew·u − skew²/2), u ~ N(0, 1) by neuron (log-normal popularity; skew 0: every
// neuron alike), capped at 0.5.
static __global__ void set_gate_thresholds(__nv_bfloat16* wg, long long n, int k, float density, float skew, unsigned seed) {
  for (long long j = blockIdx.x * 256ll + threadIdx.x; j < n; j += 256ll * gridDim.x) {
    const float d = fminf(density * expf(skew * hash_normal(static_cast<unsigned long long>(j), seed) - 0.5f * skew * skew), 0.5f);
    wg[j * k] = __float2bfloat16_rn(-sqrtf(2.0f) * erfcinvf(2.0f * d));
  }
}

}  // namespace twell::probe
