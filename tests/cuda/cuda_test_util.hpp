#pragma once
// Helpers shared by the CUDA tests: a GPU check that skips cleanly, the FFN case table's
// generator (bench/ffn/ffn_cases.hpp), and device buffers with NaN poison and guard sentinels.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "twell/bf16.hpp"
#include "twell/cuda/ffn_cuda.hpp"
#include "twell/ffn.hpp"
#include "ffn_cases.hpp"

namespace twell::cuda::test {

#define TWELL_REQUIRE_GPU()                                                         \
  do {                                                                              \
    const auto twell_dev_ = ::twell::cuda::query_device();                         \
    if (!twell_dev_.available) GTEST_SKIP() << "no CUDA device: " << twell_dev_.reason; \
  } while (0)

// A host-to-device copy whose bytes are on the device when it returns. cudaMemcpy from pageable
// memory returns once the bytes are staged, before their DMA lands, and a kernel on a non-blocking
// stream is not ordered after it (a 280 KB upload raced a decode_token_reorder launch on the H200:
// the kernel read zeros). The tests that launch on such streams copy through here.
inline cudaError_t h2d(void* dst, const void* src, std::size_t bytes) {
  const cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
  return e != cudaSuccess ? e : cudaDeviceSynchronize();
}

// The bf16 bit patterns of v (round to nearest even), for upload as __nv_bfloat16.
inline std::vector<std::uint16_t> to_bf16_bits(const std::vector<float>& v) {
  std::vector<std::uint16_t> o(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) o[i] = to_bf16(v[i]).bits;
  return o;
}

// The FFN case table and its generator (bench/ffn/ffn_cases.hpp), shared with the CPU tests.
using ::twell::test::FfnCase;
using ::twell::test::FfnData;
using ::twell::test::ffn_case;
using ::twell::test::ffn_cases;
using ::twell::test::inv_normal_cdf;
using ::twell::test::make_ffn;
using ::twell::test::rb;
using ::twell::test::sample_rows;

// An exact gate from 0/1 features for the hot-neuron calibration tests (M = 512, N = 100, K = 64):
//   feature 0 = 1 on every row, Wg[:, 0] = −0.5: a neuron fires only with one of its features;
//   feature 1 on rows 0..19 (hot tokens) fires neurons 0..59 (count 20);
//   feature 2 on every row fires neuron 90 (count 512);
//   feature 3 + r % 30 on row r fires neuron 60 + r % 30 (count 17 or 18; 16 or 17 without rows 0..9);
//   feature 33 on rows 0..9 fires neurons 91..99 (count 10: cold).
// Wu and Wd are bf16-exact normal values (seed 7). The expected choices are in each test.
struct CalibrationGate {
  static constexpr std::int64_t M = 512, N = 100, K = 64;
  std::vector<float> x, wg, wu, wd;
  FfnWeights weights() const { return ffn_weights(wg.data(), wu.data(), wd.data(), N, K); }
};
inline CalibrationGate make_calibration_gate() {
  constexpr std::int64_t M = CalibrationGate::M, N = CalibrationGate::N, K = CalibrationGate::K;
  CalibrationGate g{std::vector<float>(M * K, 0.0f), std::vector<float>(N * K, 0.0f), std::vector<float>(N * K),
                    std::vector<float>(K * N)};
  for (std::int64_t r = 0; r < M; ++r) {
    g.x[r * K + 0] = g.x[r * K + 2] = g.x[r * K + 3 + r % 30] = 1.0f;
    if (r < 20) g.x[r * K + 1] = 1.0f;
    if (r < 10) g.x[r * K + 33] = 1.0f;
  }
  for (std::int64_t n = 0; n < N; ++n) {
    g.wg[n * K + 0] = -0.5f;
    if (n < 60) g.wg[n * K + 1] = 1.0f;
    if (n >= 60 && n < 90) g.wg[n * K + 3 + (n - 60)] = 1.0f;
    if (n == 90) g.wg[n * K + 2] = 1.0f;
    if (n > 90) g.wg[n * K + 33] = 1.0f;
  }
  std::mt19937_64 rng(7);
  std::normal_distribution<double> nd(0.0, 1.0);
  for (auto& v : g.wu) v = rb(nd(rng));
  for (auto& v : g.wd) v = rb(nd(rng));
  return g;
}

}  // namespace twell::cuda::test
