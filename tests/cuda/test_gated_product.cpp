// The sm90 gated-product kernel (sm90/gate_pack.hpp, launch_gated_product_sm90: the hot neurons'
// [g | u] GEMM with h = ReLU(g) ⊙ u in its epilogue), on W laid out by pack_gated_product_weights,
// against float64 on random bf16 inputs: every value of h within the bound of its roundings (g, u
// and the product to bf16, fp32 sums), the columns past round_up(h_cols, 8) of a poisoned h
// untouched, at M tails (1, 7, 255, 257, 2049 rows), hot counts that leave a partial 128-neuron
// block (1, 100, 200, 300, 513) and K from 8 to 2048.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda/common/device_buffer.hpp"
#include "cuda/sm90/gate_pack.hpp"
#include "cuda_test_util.hpp"

namespace twell::cuda::test {
namespace {

TEST(CudaGatedProductSm90, MatchesFloat64WithinBound) {
  TWELL_REQUIRE_GPU();
  int dev = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  if (!gate_pack_sm90_available(dev)) GTEST_SKIP() << "not a compute-capability-9.0 device (or no sm_90a code)";
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), cudaSuccess);
  struct Shape {
    std::int64_t m, hot, k;
    int cluster;
  };
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  std::mt19937_64 rng(20261121);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const Shape sh : {Shape{1, 100, 2048, 2}, Shape{7, 1, 8, 2}, Shape{255, 300, 520, 2}, Shape{257, 128, 264, 1},
                         Shape{130, 513, 1024, 4}, Shape{2049, 200, 1024, 2}}) {
    SCOPED_TRACE(::testing::Message() << "m " << sh.m << " hot " << sh.hot << " k " << sh.k << " cluster " << sh.cluster);
    const std::int64_t n = gated_product_rows(sh.hot);
    std::vector<float> x(static_cast<std::size_t>(sh.m * sh.k)), wg(static_cast<std::size_t>(sh.hot * sh.k)),
        wu(wg.size());
    for (float& v : x) v = round_bf16(nd(rng));
    const float ws = 1.0f / std::sqrt(static_cast<float>(sh.k));
    for (float& v : wg) v = round_bf16(nd(rng) * ws);
    for (float& v : wu) v = round_bf16(nd(rng) * ws);
    const auto xb = to_bf16_bits(x), gb = to_bf16_bits(wg), ub = to_bf16_bits(wu);
    const std::int64_t written = (sh.hot + 7) / 8 * 8, ldh = written + 16;  // 16 columns must stay poisoned
    DeviceBuffer<__nv_bfloat16> dx(xb.size()), dg(gb.size()), du(ub.size()), dw(static_cast<std::size_t>(n * sh.k)),
        dh(static_cast<std::size_t>(sh.m * ldh));
    ASSERT_EQ(cudaMemcpy(dx.get(), xb.data(), xb.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dg.get(), gb.data(), gb.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(du.get(), ub.data(), ub.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    // W in the kernel's layout by the context's own helper, over a poisoned buffer (its zero rows
    // past hot are what the padding columns of h are checked against).
    ASSERT_EQ(cudaMemset(dw.get(), 0xff, dw.bytes()), cudaSuccess);
    pack_gated_product_weights(dg.get(), du.get(), sh.hot, sh.k, dw.get(), s);
    ASSERT_EQ(cudaMemset(dh.get(), 0xff, dh.bytes()), cudaSuccess);
    GatedProductParams p;
    p.x = dx.get();
    p.w = dw.get();
    p.m = sh.m;
    p.n = n;
    p.k = sh.k;
    p.h = dh.get();
    p.ld_h = ldh;
    p.h_cols = sh.hot;
    p.sm_count = sms;
    p.cluster = sh.cluster;
    launch_gated_product_sm90(p, s);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    std::vector<std::uint16_t> hb(static_cast<std::size_t>(sh.m * ldh));
    ASSERT_EQ(cudaMemcpy(hb.data(), dh.get(), hb.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    std::int64_t bad = 0, pad_nonzero = 0, touched = 0;
    double worst = 0;
    for (std::int64_t r = 0; r < sh.m; ++r) {
      const float* xr = x.data() + r * sh.k;
      for (std::int64_t j = 0; j < sh.hot; ++j) {
        double g = 0, u = 0, gm = 0, um = 0;
        for (std::int64_t kk = 0; kk < sh.k; ++kk) {
          const double a = xr[kk], tg = a * wg[static_cast<std::size_t>(j * sh.k + kk)],
                       tu = a * wu[static_cast<std::size_t>(j * sh.k + kk)];
          g += tg;
          u += tu;
          gm += std::abs(tg);
          um += std::abs(tu);
        }
        // fp32 sums in any order: |error| ≤ K · 2⁻²⁴ · Σ|terms|; then g, u and the product each
        // rounded to bf16 (8 significant bits: ≤ 2⁻⁸ relative each, (1 + 2⁻⁸)³ − 1 < 3.02 · 2⁻⁸ for
        // the three); a g whose sign the sum's error can flip gives at most eg · |u| where the
        // reference has 0.
        const double eg = static_cast<double>(sh.k) * std::ldexp(gm, -24), eu = static_cast<double>(sh.k) * std::ldexp(um, -24);
        const double ref = std::max(g, 0.0) * u;
        const double bound = 3.02 * std::ldexp(std::abs(ref), -8) + 1.02 * (eg * (std::abs(u) + eu) + std::abs(g) * eu) + 1e-30;
        const double got = to_float(bf16{hb[static_cast<std::size_t>(r * ldh + j)]});
        worst = std::max(worst, std::abs(got - ref) / bound);
        bad += !(std::abs(got - ref) <= bound);  // NaN (never written) counts as bad
      }
      for (std::int64_t j = sh.hot; j < written; ++j) pad_nonzero += (hb[static_cast<std::size_t>(r * ldh + j)] & 0x7fffu) != 0;
      for (std::int64_t j = written; j < ldh; ++j) touched += hb[static_cast<std::size_t>(r * ldh + j)] != 0xffffu;
    }
    EXPECT_EQ(bad, 0) << "h outside the bound (worst ratio " << worst << ")";
    EXPECT_EQ(pad_nonzero, 0) << "h not zero where W's rows are zero (columns hot .. round_up(hot, 8))";
    EXPECT_EQ(touched, 0) << "h written past round_up(hot, 8)";
  }
  // What it refuses: W not in whole 256-row blocks, h_cols over n / 2, an unaligned h row stride.
  {
    DeviceBuffer<__nv_bfloat16> dx(64 * 64), dw(512 * 64), dh(64 * 264);
    GatedProductParams p;
    p.x = dx.get();
    p.w = dw.get();
    p.m = 64;
    p.n = 512;
    p.k = 64;
    p.h = dh.get();
    p.ld_h = 264;
    p.h_cols = 256;
    p.sm_count = sms;
    GatedProductParams q = p;
    q.n = 500;
    EXPECT_THROW(launch_gated_product_sm90(q, s), Error);
    q = p;
    q.h_cols = 257;
    EXPECT_THROW(launch_gated_product_sm90(q, s), Error);
    q = p;
    q.ld_h = 260;
    q.h_cols = 256;
    EXPECT_THROW(launch_gated_product_sm90(q, s), Error);
    q = p;
    q.k = 60;
    EXPECT_THROW(launch_gated_product_sm90(q, s), Error);
  }
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace twell::cuda::test
