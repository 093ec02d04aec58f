// The host's statement of the fixed-point FFN output's conversion (src/cuda/common/fixed_point.hpp:
// host code, so it runs on every machine; the GPU tests check the device's readers against it).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "cuda/common/fixed_point.hpp"
#include "test_util.hpp"
#include "twell/bf16.hpp"

namespace twell::test {
namespace {

// The host's conversion is the nearest bf16 of acc · 2⁻³² (ties to even): against to_bf16 (round
// to nearest even from a float) on values whose float is exact (24 significant bits), halfway
// cases included, and a few by hand.
TEST(FixedPoint, ConversionRoundsToNearestEven) {
  Rng rng(fresh_seed());
  for (int i = 0; i < 20000; ++i) {
    const auto m = static_cast<long long>(rng.below(1u << 24)) * (rng.below(2) ? 1 : -1);
    const long long v = m * (1ll << rng.below(39));  // < 2⁶³
    const float exact = static_cast<float>(std::ldexp(static_cast<double>(v), -32));
    ASSERT_EQ(cuda::fixed_to_float_bf16(v), to_float(to_bf16(exact))) << v;
  }
  EXPECT_EQ(cuda::fixed_to_float_bf16(0), 0.0f);
  EXPECT_EQ(cuda::fixed_to_float_bf16(3ll << 31), 1.5f);
  // 1 + 2⁻⁸ is halfway between 1 and 1 + 2⁻⁷: to even (1); 1 + 3 · 2⁻⁸ to 1 + 2⁻⁶.
  EXPECT_EQ(cuda::fixed_to_float_bf16((1ll << 32) + (1ll << 24)), 1.0f);
  EXPECT_EQ(cuda::fixed_to_float_bf16((1ll << 32) + 3 * (1ll << 24)), 1.0f + 0.015625f);
  EXPECT_EQ(cuda::fixed_to_float_bf16(-((1ll << 32) + 3 * (1ll << 24))), -(1.0f + 0.015625f));
  // Past 2⁵³ the double rounds first (both sides alike): 2⁶⁰ + 12345 is 2²⁸.
  EXPECT_EQ(cuda::fixed_to_float_bf16((1ll << 60) + 12345), 268435456.0f);
}

// The range: N terms each below fixed_term_limit(N) sum below 2³¹ (2⁶³ in fixed point).
TEST(FixedPoint, TermLimitKeepsTheSumInRange) {
  for (const std::int64_t n : {std::int64_t{1}, std::int64_t{2}, std::int64_t{3}, std::int64_t{1000}, std::int64_t{5632},
                               std::int64_t{1} << 20, (std::int64_t{1} << 31) - 1}) {
    const double limit = cuda::fixed_term_limit(n);
    EXPECT_LE(static_cast<double>(n) * limit, std::ldexp(1.0, 31)) << n;
    EXPECT_GT(2.0 * static_cast<double>(n) * limit, std::ldexp(1.0, 31)) << n << ": not the largest power of two";
  }
  EXPECT_EQ(cuda::fixed_term_limit(5632), 262144.0f);
}

}  // namespace
}  // namespace twell::test
