// TwELL round trips, overflow accounting and validation at shapes that hit the edges.
#include <gtest/gtest.h>

#include "test_util.hpp"
#include "twell/twell_format.hpp"

using namespace twell;

namespace {

struct FormatCase {
  std::int64_t rows, cols;
  TwellConfig config;
  std::vector<double> densities;  // per-row densities, cycled (0 = empty row, 1 = all active)
};

std::string case_name(const FormatCase& c) {
  return "M" + std::to_string(c.rows) + "_N" + std::to_string(c.cols) + "_T" + std::to_string(c.config.tile) + "_C" +
         std::to_string(c.config.compression);
}

// Reference for decode: the dense input with kept entries rounded to bf16.
std::vector<float> expected_decode(const std::vector<float>& dense, bool relu) {
  std::vector<float> out(dense.size());
  for (std::size_t i = 0; i < dense.size(); ++i) {
    const bool keep = relu ? dense[i] > 0.0f : dense[i] != 0.0f;
    out[i] = keep ? round_bf16(dense[i]) : 0.0f;
  }
  return out;
}

class TwellRoundTrip : public ::testing::TestWithParam<FormatCase> {};

TEST_P(TwellRoundTrip, EncodeDecodeIsExactAndOverflowIsAccounted) {
  const FormatCase& c = GetParam();
  test::Rng rng(test::fresh_seed());
  for (bool relu : {false, true}) {
    const auto dense = test::random_sparse(rng, c.rows, c.cols, c.densities);
    const TwellMatrix m = twell_encode(CMatrixF(dense.data(), c.rows, c.cols), c.config, relu);
    ASSERT_NO_THROW(twell_validate(m));
    std::vector<float> out = test::poisoned(dense.size());
    twell_decode(m, MatrixF(out.data(), c.rows, c.cols));
    const auto want = expected_decode(dense, relu);
    for (std::size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], want[i]) << "element " << i << " relu=" << relu;
    // Counts are the true counts; overflow accounting matches a direct count.
    const int T = c.config.tile, cap = c.config.capacity();
    std::int64_t nnz = 0, overflow_tiles = 0;
    std::vector<std::int64_t> overflow_rows;
    for (std::int64_t r = 0; r < c.rows; ++r) {
      bool row_over = false;
      for (std::int64_t t = 0; t < m.tiles; ++t) {
        std::int64_t cnt = 0;
        for (std::int64_t col = t * T; col < std::min<std::int64_t>((t + 1) * T, c.cols); ++col) {
          const float v = dense[static_cast<std::size_t>(r * c.cols + col)];
          cnt += relu ? v > 0.0f : v != 0.0f;
        }
        ASSERT_EQ(m.block(r, t)[0], static_cast<std::uint32_t>(cnt));
        nnz += cnt;
        if (cnt > cap) {
          ++overflow_tiles;
          row_over = true;
        }
      }
      if (row_over) overflow_rows.push_back(r);
    }
    EXPECT_EQ(m.nnz(), nnz);
    EXPECT_EQ(m.overflow_tiles, overflow_tiles);
    EXPECT_EQ(m.overflow_rows, overflow_rows);
    const TwellStats s = twell_stats(m);
    EXPECT_EQ(s.nnz, nnz);
    EXPECT_EQ(s.overflow_tiles, overflow_tiles);
    EXPECT_EQ(s.overflow_rows, static_cast<std::int64_t>(overflow_rows.size()));
  }
}

const TwellConfig kDefault{};
INSTANTIATE_TEST_SUITE_P(
    Shapes, TwellRoundTrip,
    ::testing::Values(FormatCase{1, 5632, kDefault, {0.005}}, FormatCase{1, 1, kDefault, {1.0}},
                      FormatCase{7, 1000, kDefault, {0.0, 1.0, 0.01, 0.2}},          // N not a multiple of T
                      FormatCase{3, 70000, kDefault, {0.002, 0.0, 0.05}},           // N > 65536
                      FormatCase{64, 5632, kDefault, {0.005, 0.005, 0.3, 0.0}},     // hot rows overflow
                      FormatCase{33, 257, kDefault, {1.0, 0.0}},                    // all-active rows overflow
                      FormatCase{16, 300, TwellConfig{64, 4}, {0.1, 0.5}},          // other T and C
                      FormatCase{9, 130, TwellConfig{2, 1}, {0.3, 1.0}},            // smallest tile
                      FormatCase{5, 70000, TwellConfig{65536, 2}, {0.01, 0.6}},    // widest tile
                      FormatCase{257, 512, TwellConfig{256, 2}, {0.02, 0.6}}),
    [](const auto& info) { return case_name(info.param); });

TEST(TwellConfig, RejectsBadParameters) {
  EXPECT_THROW((TwellConfig{1, 1}.validate()), Error);        // T < 2
  EXPECT_THROW((TwellConfig{65537, 1}.validate()), Error);    // T > 65536
  EXPECT_THROW((TwellConfig{256, 3}.validate()), Error);      // C does not divide T
  EXPECT_THROW((TwellConfig{256, 256}.validate()), Error);    // S = 1: no room for values
  EXPECT_THROW((TwellConfig{256, 0}.validate()), Error);
  EXPECT_NO_THROW((TwellConfig{256, 128}.validate()));
}

TEST(TwellValidate, DetectsCorruption) {
  test::Rng rng(test::fresh_seed());
  const auto dense = test::random_sparse(rng, 8, 600, {0.02, 0.5});
  const TwellMatrix good = twell_encode(CMatrixF(dense.data(), 8, 600));
  ASSERT_NO_THROW(twell_validate(good));
  ASSERT_FALSE(good.overflow_rows.empty());
  {
    TwellMatrix m = good;  // count larger than the tile's width
    m.words[0] = 1000;
    EXPECT_THROW(twell_validate(m), Error);
  }
  {
    TwellMatrix m = good;  // a column outside the last (partial, 88-column) tile
    const std::int64_t t = m.tiles - 1;
    std::uint32_t* blk = m.words.data() + 0 * m.row_words() + t * m.config.words_per_tile();
    blk[0] = 1;
    blk[1] = twell_pack(to_bf16(1.0f), 100);
    EXPECT_THROW(twell_validate(m), Error);
  }
  {
    TwellMatrix m = good;  // an overflowed row missing from the list
    m.overflow_rows.pop_back();
    m.backup.resize(m.backup.size() - static_cast<std::size_t>(m.cols));
    EXPECT_THROW(twell_validate(m), Error);
  }
  {
    TwellMatrix m = good;  // wrong overflow tile total
    m.overflow_tiles += 1;
    EXPECT_THROW(twell_validate(m), Error);
  }
  {
    TwellMatrix m = good;  // unsorted entries
    for (std::int64_t r = 0; r < m.rows; ++r) {
      std::uint32_t* blk = m.words.data() + r * m.row_words();
      if (blk[0] >= 2 && blk[0] <= static_cast<std::uint32_t>(m.config.capacity())) {
        std::swap(blk[1], blk[2]);
        break;
      }
    }
    EXPECT_THROW(twell_validate(m), Error);
  }
  {
    TwellMatrix m = good;  // truncated storage
    m.words.pop_back();
    EXPECT_THROW(twell_validate(m), Error);
  }
}

TEST(TwellBuilder, RejectsBlocksThatDoNotFit) {
  TwellBuilder b(4, 10, TwellConfig{});
  std::vector<float> block(30, 1.0f);
  EXPECT_THROW(b.pack_rows(2, CMatrixF(block.data(), 3, 10), false), Error);
  EXPECT_THROW(b.pack_rows(0, CMatrixF(block.data(), 3, 9), false), Error);
}

}  // namespace
