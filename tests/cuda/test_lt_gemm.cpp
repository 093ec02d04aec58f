// LtGemm's autotune (the dense yardstick's, and the model runtime's under TWELL_TUNING=gemm-autotune=N):
// a shape first met outside a capture, of up to its max_m rows, is timed; one first met while its
// stream captures a CUDA graph takes cuBLASLt's first candidate untimed (the timing synchronises,
// which a capture refuses), and so does one past max_m rows. Every product against float64 sums
// within the fp32 accumulation bound and one bf16 step.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cuda/common/device_buffer.hpp"
#include "cuda/dense/lt_gemm.hpp"
#include "cuda_test_util.hpp"

namespace twell::cuda::test {
namespace {

// y [m, n] = x [m, k] · w [n, k]ᵀ on the host in float64 from the bf16 operands, with each output's
// bound: k · 2⁻²⁴ · Σ|x·w| (fp32 sums) + one bf16 step of |y| (the rounding of the result).
struct Reference {
  std::vector<double> y, bound;
};

Reference reference(const std::vector<std::uint16_t>& x, const std::vector<std::uint16_t>& w, int m, int n, int k) {
  Reference r;
  r.y.resize(static_cast<std::size_t>(m * n));
  r.bound.resize(r.y.size());
  for (int t = 0; t < m; ++t)
    for (int j = 0; j < n; ++j) {
      double acc = 0, mag = 0;
      for (int i = 0; i < k; ++i) {
        const double v = static_cast<double>(to_float(bf16{x[static_cast<std::size_t>(t * k + i)]})) *
                         to_float(bf16{w[static_cast<std::size_t>(j * k + i)]});
        acc += v;
        mag += std::abs(v);
      }
      const std::size_t o = static_cast<std::size_t>(t * n + j);
      r.y[o] = acc;
      r.bound[o] = k * std::ldexp(mag, -24) + std::ldexp(std::abs(acc), -8) + 1e-30;
    }
  return r;
}

// How many outputs of y (bf16 on the device) lie outside the reference's bounds (a NaN does).
int outside(const DeviceBuffer<__nv_bfloat16>& y, const Reference& r) {
  std::vector<std::uint16_t> h(r.y.size());
  EXPECT_EQ(cudaMemcpy(h.data(), y.get(), h.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  int bad = 0;
  for (std::size_t i = 0; i < h.size(); ++i) bad += !(std::abs(to_float(bf16{h[i]}) - r.y[i]) <= r.bound[i]);
  return bad;
}

// The plan line of shape m × n × k in describe_plans().
std::string plan_line(const LtGemm& g, int m, int n, int k) {
  const std::string all = g.describe_plans(), key = "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) + " ";
  const std::size_t at = all.find(key);
  return at == std::string::npos ? std::string() : all.substr(at, all.find('\n', at) - at);
}

TEST(LtGemm, AutotuneTimesOutsideACaptureOnlyAndUpToItsRows) {
  TWELL_REQUIRE_GPU();
  const int n = 1024, k = 512;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> xf(static_cast<std::size_t>(64 * k)), wf(static_cast<std::size_t>(n * k));
  for (float& v : xf) v = nd(rng);
  for (float& v : wf) v = 0.05f * nd(rng);
  const auto xb = to_bf16_bits(xf), wb = to_bf16_bits(wf);
  DeviceBuffer<__nv_bfloat16> x(xb.size()), w(wb.size()), y(static_cast<std::size_t>(64 * n));
  ASSERT_EQ(h2d(x.get(), xb.data(), xb.size() * 2), cudaSuccess);
  ASSERT_EQ(h2d(w.get(), wb.data(), wb.size() * 2), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  LtGemm tuned;
  tuned.set_autotune({.on = true, .candidates = 8, .max_m = 56});
  // y = x[:m] · wᵀ, eagerly or captured into a graph and replayed; NaN first, so a product never
  // written shows; then the product against float64.
  const auto product = [&](int m, bool captured) {
    ASSERT_EQ(cudaMemsetAsync(y.get(), 0xFF, y.bytes(), s), cudaSuccess);
    cudaGraph_t g = nullptr;
    cudaGraphExec_t ge = nullptr;
    if (captured) ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    EXPECT_NO_THROW(tuned.run({m, n, k, k, k, n}, w.get(), x.get(), y.get(), s));
    if (captured) {
      ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
      ASSERT_EQ(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(ge, s), cudaSuccess);
    }
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    const std::vector<std::uint16_t> xm(xb.begin(), xb.begin() + m * k);
    EXPECT_EQ(outside(y, reference(xm, wb, m, n, k)), 0) << "m = " << m << (captured ? ", captured" : ", eager");
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
  };
  // Eager, up to max_m rows: timed (the plan records the winner's time; cuBLASLt offers several
  // candidates for bf16 shapes like this one on sm_80 and sm_90).
  product(40, false);
  const std::string eager = plan_line(tuned, 40, n, k);
  ASSERT_FALSE(eager.empty()) << tuned.describe_plans();
  EXPECT_EQ(eager.find("tuned 0.0000 ms"), std::string::npos) << eager;
  // First met inside a capture: planned without timing (the timing would synchronise there), and
  // the graph's product is right.
  product(48, true);
  const std::string in_capture = plan_line(tuned, 48, n, k);
  ASSERT_FALSE(in_capture.empty()) << tuned.describe_plans();
  EXPECT_NE(in_capture.find("tuned 0.0000 ms"), std::string::npos) << in_capture;
  // Eager past max_m rows: not timed.
  product(64, false);
  const std::string past = plan_line(tuned, 64, n, k);
  ASSERT_FALSE(past.empty()) << tuned.describe_plans();
  EXPECT_NE(past.find("tuned 0.0000 ms"), std::string::npos) << past;
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace twell::cuda::test
