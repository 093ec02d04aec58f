// gemv_bf16 (the CPU runtime's decode products on bf16 weight copies) against a float64 product, at
// every row count it takes and ragged n (not a multiple of its 4 rows a step) and k (not a multiple
// of 16: the scalar tail); exact_bf16 keeps bf16 values and refuses anything else.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>

#include "cpu/gemv_bf16.hpp"
#include "test_util.hpp"
#include "twell/bf16.hpp"

using namespace twell;

namespace {

TEST(CpuGemvBf16, MatchesFloat64) {
  test::Rng rng(test::fresh_seed());
  for (std::int64_t rows = 1; rows <= cpu::kGemvBf16MaxRows; ++rows)
    for (const auto& [n, k] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {3, 15}, {4, 16}, {5, 17}, {130, 576},
                              {7, 1000}, {64, 33}}) {
      SCOPED_TRACE(::testing::Message() << "rows " << rows << " n " << n << " k " << k);
      std::vector<float> x(static_cast<std::size_t>(rows * k)), w(static_cast<std::size_t>(n * k));
      for (auto& e : x) e = static_cast<float>(rng.normal());
      for (auto& e : w) e = round_bf16(static_cast<float>(rng.normal()));
      const std::vector<std::uint16_t> w16 = cpu::exact_bf16(w);
      ASSERT_EQ(w16.size(), w.size());
      std::vector<float> y(static_cast<std::size_t>(rows * n), std::nanf(""));
      cpu::gemv_bf16(x.data(), rows, w16.data(), n, k, y.data());
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t j = 0; j < n; ++j) {
          double want = 0, mag = 0;
          for (std::int64_t i = 0; i < k; ++i) {
            const double t = static_cast<double>(x[static_cast<std::size_t>(r * k + i)]) * w[static_cast<std::size_t>(j * k + i)];
            want += t;
            mag += std::fabs(t);
          }
          // fp32 sums of k products (each exact in fp32: bf16 × fp32 has ≤ 32 significant bits,
          // rounded once): |error| ≤ k · 2⁻²⁴ · Σ|terms|, with slack for the lanes' final adds.
          const double bound = 2.0 * static_cast<double>(k + 16) * std::ldexp(mag, -24) + 1e-30;
          const double got = y[static_cast<std::size_t>(r * n + j)];
          EXPECT_LE(std::fabs(got - want), bound) << "row " << r << " column " << j;  // NaN (unwritten) fails
        }
    }
}

TEST(CpuGemvBf16, ExactBf16KeepsBf16ValuesOnly) {
  const std::vector<float> exact = {0.0f, -1.5f, round_bf16(3.14159f), std::ldexp(1.0f, -100)};
  const auto bits = cpu::exact_bf16(exact);
  ASSERT_EQ(bits.size(), exact.size());
  for (std::size_t i = 0; i < exact.size(); ++i)
    EXPECT_EQ(std::bit_cast<float>(static_cast<std::uint32_t>(bits[i]) << 16), exact[i]);
  EXPECT_TRUE(cpu::exact_bf16({1.0f, 1.0f + std::ldexp(1.0f, -10)}).empty());  // 2⁻¹⁰ needs more than bf16's 7 bits
}

}  // namespace
