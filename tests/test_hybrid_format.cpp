// Hybrid ELL + dense tail: round trips, tail growth, transposes, validation.
#include <gtest/gtest.h>

#include "test_util.hpp"
#include "twell/hybrid_format.hpp"

using namespace twell;

namespace {

struct HybridCase {
  std::int64_t rows, cols;
  int ell_width;
  std::vector<double> densities;
};

class HybridRoundTrip : public ::testing::TestWithParam<HybridCase> {};

TEST_P(HybridRoundTrip, DenseHybridDenseAndTranspose) {
  const HybridCase& c = GetParam();
  test::Rng rng(test::fresh_seed());
  const auto dense = test::random_sparse(rng, c.rows, c.cols, c.densities);
  const HybridMatrix h = hybrid_from_dense(CMatrixF(dense.data(), c.rows, c.cols), HybridConfig{c.ell_width});
  ASSERT_NO_THROW(hybrid_validate(h));
  // Every row with more than E non-zeros is in the tail, every other row in the ELL: none dropped.
  std::int64_t heavy = 0, nnz = 0;
  for (std::int64_t r = 0; r < c.rows; ++r) {
    std::int64_t n = 0;
    for (std::int64_t col = 0; col < c.cols; ++col) n += dense[static_cast<std::size_t>(r * c.cols + col)] != 0.0f;
    EXPECT_EQ(h.counts[static_cast<std::size_t>(r)], n);
    EXPECT_EQ(h.in_tail(r), n > c.ell_width);
    heavy += n > c.ell_width;
    nnz += n;
  }
  EXPECT_EQ(h.tail_count(), heavy);
  EXPECT_EQ(h.nnz(), nnz);
  std::vector<float> back = test::poisoned(dense.size());
  hybrid_to_dense(h, MatrixF(back.data(), c.rows, c.cols));
  EXPECT_EQ(back, dense);

  const HybridMatrix t = hybrid_transpose(h, HybridConfig{c.ell_width});
  ASSERT_NO_THROW(hybrid_validate(t));
  EXPECT_EQ(t.rows, c.cols);
  EXPECT_EQ(t.cols, c.rows);
  std::vector<float> tb = test::poisoned(dense.size());
  hybrid_to_dense(t, MatrixF(tb.data(), c.cols, c.rows));
  for (std::int64_t r = 0; r < c.rows; ++r)
    for (std::int64_t col = 0; col < c.cols; ++col)
      ASSERT_EQ(tb[static_cast<std::size_t>(col * c.rows + r)], dense[static_cast<std::size_t>(r * c.cols + col)]);
}

INSTANTIATE_TEST_SUITE_P(Shapes, HybridRoundTrip,
                         ::testing::Values(HybridCase{1, 5632, 128, {0.005}}, HybridCase{1, 3, 1, {1.0}},
                                           HybridCase{50, 1000, 8, {0.0, 0.005, 0.5, 1.0}},
                                           HybridCase{4, 70000, 128, {0.001, 0.01}},  // N > 65536: wide indices
                                           HybridCase{300, 64, 4, {0.05, 0.05, 0.9}},  // many tail rows
                                           HybridCase{70, 20, 128, {1.0}}),            // ELL wider than a row
                         [](const auto& info) {
                           return "M" + std::to_string(info.param.rows) + "_N" + std::to_string(info.param.cols) + "_E" +
                                  std::to_string(info.param.ell_width);
                         });

TEST(Hybrid, TokensAbove65536InTransposedForm) {
  // A column active in 70000 rows: the transposed row holds token indices above 65535.
  const std::int64_t M = 70000, N = 3;
  std::vector<float> dense(static_cast<std::size_t>(M * N), 0.0f);
  for (std::int64_t r = 0; r < M; ++r) dense[static_cast<std::size_t>(r * N + 1)] = static_cast<float>(r % 7 + 1);
  dense[static_cast<std::size_t>((M - 1) * N + 2)] = 5.0f;
  const HybridMatrix h = hybrid_from_dense(CMatrixF(dense.data(), M, N), HybridConfig{2});
  const HybridMatrix t = hybrid_transpose(h, HybridConfig{4});
  ASSERT_NO_THROW(hybrid_validate(t));
  EXPECT_TRUE(t.in_tail(1));
  EXPECT_FALSE(t.in_tail(2));
  EXPECT_EQ(t.counts[2], 1);
  EXPECT_EQ(t.ell_cols[2 * 4], M - 1);
  EXPECT_EQ(t.tail[static_cast<std::size_t>(t.tail_slot[1] * M + (M - 1))], static_cast<float>((M - 1) % 7 + 1));
}

TEST(Hybrid, ReluKeepsPositivesOnly) {
  const std::vector<float> dense = {1.0f, -2.0f, 0.0f, 3.0f, -0.5f, 0.25f};
  const HybridMatrix h = hybrid_from_dense(CMatrixF(dense.data(), 2, 3), HybridConfig{1}, /*relu=*/true);
  std::vector<float> back(6);
  hybrid_to_dense(h, MatrixF(back.data(), 2, 3));
  EXPECT_EQ(back, (std::vector<float>{1.0f, 0.0f, 0.0f, 3.0f, 0.0f, 0.25f}));
  EXPECT_TRUE(h.in_tail(1));
}

TEST(Hybrid, FromCsrChecksInput) {
  const std::vector<std::int64_t> off = {0, 2, 2};
  EXPECT_THROW(hybrid_from_csr(2, 4, off, {3, 1}, {1.0f, 2.0f}), Error);   // not ascending
  EXPECT_THROW(hybrid_from_csr(2, 4, off, {1, 4}, {1.0f, 2.0f}), Error);   // out of range
  EXPECT_THROW(hybrid_from_csr(2, 4, {0, 2}, {1, 2}, {1.0f, 2.0f}), Error);  // wrong offsets length
  EXPECT_NO_THROW(hybrid_from_csr(2, 4, off, {1, 3}, {1.0f, 2.0f}));
  EXPECT_THROW(HybridConfig{0}.validate(), Error);
}

TEST(Hybrid, ValidateDetectsCorruption) {
  test::Rng rng(test::fresh_seed());
  const auto dense = test::random_sparse(rng, 20, 50, {0.05, 0.6});
  const HybridMatrix good = hybrid_from_dense(CMatrixF(dense.data(), 20, 50), HybridConfig{8});
  ASSERT_NO_THROW(hybrid_validate(good));
  ASSERT_GT(good.tail_count(), 0);
  {
    HybridMatrix h = good;  // a heavy row claimed by the ELL
    h.tail_slot[static_cast<std::size_t>(h.tail_rows[0])] = -1;
    EXPECT_THROW(hybrid_validate(h), Error);
  }
  {
    HybridMatrix h = good;  // dirty padding
    for (std::int64_t r = 0; r < h.rows; ++r)
      if (!h.in_tail(r) && h.counts[static_cast<std::size_t>(r)] < h.ell_width) {
        h.ell_vals[static_cast<std::size_t>(r * h.ell_width + h.ell_width - 1)] = 1.0f;
        break;
      }
    EXPECT_THROW(hybrid_validate(h), Error);
  }
  {
    HybridMatrix h = good;  // a tail row whose count says it belongs in the ELL
    h.counts[static_cast<std::size_t>(h.tail_rows[0])] = 1;
    EXPECT_THROW(hybrid_validate(h), Error);
  }
  {
    HybridMatrix h = good;  // truncated tail
    h.tail.pop_back();
    EXPECT_THROW(hybrid_validate(h), Error);
  }
}

}  // namespace
