#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "test_util.hpp"
#include "twell/bf16.hpp"
#include "twell/tensor.hpp"

using namespace twell;

namespace {
float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }
}  // namespace

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(to_bf16(1.0f).bits, 0x3f80);
  // Exactly halfway between 0x3f80 and 0x3f81: ties to the even one (0x3f80).
  EXPECT_EQ(to_bf16(from_bits(0x3f808000u)).bits, 0x3f80);
  // Halfway between 0x3f81 and 0x3f82: ties to even (0x3f82).
  EXPECT_EQ(to_bf16(from_bits(0x3f818000u)).bits, 0x3f82);
  // Just above halfway rounds up; just below rounds down.
  EXPECT_EQ(to_bf16(from_bits(0x3f808001u)).bits, 0x3f81);
  EXPECT_EQ(to_bf16(from_bits(0x3f807fffu)).bits, 0x3f80);
  EXPECT_EQ(to_bf16(-2.5f).bits, 0xc020);
}

TEST(Bf16, SpecialValues) {
  EXPECT_TRUE(std::isnan(to_float(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A signalling-style NaN whose payload lives only in the low bits must stay NaN, not become Inf.
  EXPECT_TRUE(std::isnan(to_float(to_bf16(from_bits(0x7f800001u)))));
  EXPECT_EQ(to_float(to_bf16(std::numeric_limits<float>::infinity())), std::numeric_limits<float>::infinity());
  EXPECT_EQ(to_float(to_bf16(-std::numeric_limits<float>::infinity())), -std::numeric_limits<float>::infinity());
  // The largest float rounds up to Inf (beyond the largest bf16).
  EXPECT_EQ(to_float(to_bf16(std::numeric_limits<float>::max())), std::numeric_limits<float>::infinity());
  EXPECT_EQ(to_bf16(0.0f).bits, 0x0000);
  EXPECT_EQ(to_bf16(-0.0f).bits, 0x8000);
}

TEST(Bf16, RandomValuesWithinHalfUlp) {
  test::Rng rng(test::fresh_seed());
  for (int i = 0; i < 100000; ++i) {
    const float f = rng.normal(100.0f);
    const float r = round_bf16(f);
    // bf16 keeps 8 significant bits: round-to-nearest moves a normal number by ≤ 2⁻⁸·|f| (half an ulp).
    EXPECT_LE(std::fabs(r - f), std::ldexp(std::fabs(f), -8)) << f;
  }
}

TEST(Tensor, ViewShapesAndContiguity) {
  std::vector<float> buf(24);
  const std::int64_t shape[] = {2, 3, 4};
  TensorView v = make_view(buf.data(), DType::f32, shape);
  EXPECT_EQ(v.numel(), 24);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.strides[0], 12);
  EXPECT_EQ(v.shape_string(), "[2, 3, 4]");
  v.strides[2] = 2;
  EXPECT_FALSE(v.is_contiguous());
  const std::int64_t bad[] = {1, 2, 3, 4, 5};
  EXPECT_THROW(make_view(buf.data(), DType::f32, bad), Error);
  const std::int64_t neg[] = {2, -1};
  EXPECT_THROW(make_view(buf.data(), DType::f32, neg), Error);
}

TEST(Tensor, HostTensorConversions) {
  HostTensor t(DType::bf16, {2, 2});
  t.data<bf16>()[0] = to_bf16(1.5f);
  t.data<bf16>()[1] = to_bf16(-3.0f);
  t.data<bf16>()[2] = to_bf16(0.0f);
  t.data<bf16>()[3] = to_bf16(1e30f);
  HostTensor f = t.to_f32();
  EXPECT_EQ(f.dtype(), DType::f32);
  EXPECT_EQ(f.data<float>()[0], 1.5f);
  EXPECT_EQ(f.data<float>()[1], -3.0f);
  EXPECT_EQ(f.data<float>()[3], round_bf16(1e30f));
  HostTensor i(DType::i32, {3});
  EXPECT_THROW(i.to_f32(), Error);
  const float vals[] = {1, 2, 3};
  EXPECT_THROW(HostTensor::from_f32({2, 2}, vals), Error);
  EXPECT_EQ(HostTensor::from_f32({3}, vals).data<float>()[2], 3.0f);
}
