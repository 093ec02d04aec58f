#include "twell/twell_format.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

namespace twell {

void TwellConfig::validate() const {
  TWELL_CHECK(tile >= 2 && tile <= 65536, ErrorCode::invalid_argument,
              "TwELL tile width {} is out of range: it must be in [2, 65536] (indices are 16-bit, tile-local)", tile);
  TWELL_CHECK(compression >= 1 && tile % compression == 0, ErrorCode::invalid_argument,
              "TwELL compression factor {} must be ≥ 1 and divide the tile width {}", compression, tile);
  TWELL_CHECK(tile / compression >= 2, ErrorCode::invalid_argument,
              "TwELL tile width {} / compression {} leaves no room for values (need T / C ≥ 2)", tile, compression);
}

std::int64_t TwellMatrix::nnz() const noexcept {
  std::int64_t total = 0;
  const std::int64_t s = config.words_per_tile();
  for (std::int64_t i = 0; i < rows * tiles; ++i) total += words[static_cast<std::size_t>(i * s)];
  return total;
}

std::int64_t TwellMatrix::backup_index(std::int64_t r) const noexcept {
  auto it = std::lower_bound(overflow_rows.begin(), overflow_rows.end(), r);
  if (it == overflow_rows.end() || *it != r) return -1;
  return it - overflow_rows.begin();
}

std::size_t TwellMatrix::bytes() const noexcept {
  return words.size() * sizeof(std::uint32_t) + backup.size() * sizeof(float) +
         overflow_rows.size() * sizeof(std::int64_t);
}

TwellBuilder::TwellBuilder(std::int64_t rows, std::int64_t cols, TwellConfig config) {
  config.validate();
  TWELL_CHECK(rows >= 0 && cols >= 1, ErrorCode::invalid_argument,
              "TwELL matrix needs rows ≥ 0 and cols ≥ 1 (got [{}, {}])", rows, cols);
  m_.rows = rows;
  m_.cols = cols;
  m_.config = config;
  m_.tiles = (cols + config.tile - 1) / config.tile;
  m_.words.assign(static_cast<std::size_t>(rows * m_.row_words()), 0u);
}

void TwellBuilder::pack_rows(std::int64_t row0, CMatrixF block, bool relu) {
  TWELL_CHECK(block.cols == m_.cols && row0 >= 0 && row0 + block.rows <= m_.rows, ErrorCode::shape_mismatch,
              "TwELL pack: block [{}, {}] at row {} does not fit a [{}, {}] matrix", block.rows, block.cols, row0,
              m_.rows, m_.cols);
  const int T = m_.config.tile;
  const int S = m_.config.words_per_tile();
  const int cap = S - 1;
  for (std::int64_t i = 0; i < block.rows; ++i) {
    const float* src = block.row(i);
    std::uint32_t* dst_row = m_.words.data() + (row0 + i) * m_.row_words();
    bool row_overflow = false;
    std::int64_t row_overflow_tiles = 0;
    for (std::int64_t t = 0; t < m_.tiles; ++t) {
      std::uint32_t* blk = dst_row + t * S;
      const std::int64_t c0 = t * T;
      const std::int64_t c1 = std::min<std::int64_t>(c0 + T, m_.cols);
      std::uint32_t count = 0;
      for (std::int64_t c = c0; c < c1; ++c) {
        const float v = src[c];
        if (relu ? v > 0.0f : v != 0.0f) {
          if (count < static_cast<std::uint32_t>(cap))
            blk[1 + count] = twell_pack(to_bf16(v), static_cast<std::uint32_t>(c - c0));
          ++count;
        }
      }
      // Slots past the stored entries are zero (the block may be reused).
      for (std::uint32_t j = std::min<std::uint32_t>(count, static_cast<std::uint32_t>(cap)); j < static_cast<std::uint32_t>(cap); ++j)
        blk[1 + j] = 0u;
      blk[0] = count;
      if (count > static_cast<std::uint32_t>(cap)) {
        row_overflow = true;
        ++row_overflow_tiles;
      }
    }
    if (row_overflow) {
      std::vector<float> backup(static_cast<std::size_t>(m_.cols));
      for (std::int64_t c = 0; c < m_.cols; ++c) {
        const float v = src[c];
        backup[static_cast<std::size_t>(c)] = (relu ? v > 0.0f : v != 0.0f) ? round_bf16(v) : 0.0f;
      }
      std::lock_guard<std::mutex> lock(overflow_mutex_);
      overflow_.emplace_back(row0 + i, std::move(backup));
      m_.overflow_tiles += row_overflow_tiles;
    }
  }
}

TwellMatrix TwellBuilder::finish() {
  std::sort(overflow_.begin(), overflow_.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  m_.overflow_rows.clear();
  m_.backup.assign(overflow_.size() * static_cast<std::size_t>(m_.cols), 0.0f);
  for (std::size_t i = 0; i < overflow_.size(); ++i) {
    m_.overflow_rows.push_back(overflow_[i].first);
    std::memcpy(m_.backup.data() + i * static_cast<std::size_t>(m_.cols), overflow_[i].second.data(),
                static_cast<std::size_t>(m_.cols) * sizeof(float));
  }
  overflow_.clear();
  return std::move(m_);
}

TwellMatrix twell_encode(CMatrixF dense, TwellConfig config, bool relu) {
  TwellBuilder builder(dense.rows, dense.cols, config);
  constexpr std::int64_t kBlock = 64;
#pragma omp parallel for schedule(dynamic)
  for (std::int64_t r0 = 0; r0 < dense.rows; r0 += kBlock) {
    const std::int64_t n = std::min(kBlock, dense.rows - r0);
    builder.pack_rows(r0, CMatrixF(dense.row(r0), n, dense.cols, dense.ld), relu);
  }
  return builder.finish();
}

void twell_decode(const TwellMatrix& m, MatrixF out) {
  TWELL_CHECK(out.rows == m.rows && out.cols == m.cols, ErrorCode::shape_mismatch,
              "TwELL decode: output [{}, {}] does not match the matrix [{}, {}]", out.rows, out.cols, m.rows, m.cols);
  const int T = m.config.tile;
  const int cap = m.config.capacity();
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < m.rows; ++r) {
    float* dst = out.row(r);
    const std::int64_t b = m.backup_index(r);
    if (b >= 0) {
      std::memcpy(dst, m.backup.data() + b * m.cols, static_cast<std::size_t>(m.cols) * sizeof(float));
      continue;
    }
    std::fill(dst, dst + m.cols, 0.0f);
    for (std::int64_t t = 0; t < m.tiles; ++t) {
      const std::uint32_t* blk = m.block(r, t);
      const std::uint32_t n = std::min<std::uint32_t>(blk[0], static_cast<std::uint32_t>(cap));
      for (std::uint32_t j = 0; j < n; ++j) dst[t * T + twell_col(blk[1 + j])] = to_float(twell_value(blk[1 + j]));
    }
  }
}

void twell_validate(const TwellMatrix& m) {
  m.config.validate();
  const int T = m.config.tile;
  const int S = m.config.words_per_tile();
  const int cap = S - 1;
  TWELL_CHECK(m.rows >= 0 && m.cols >= 1 && m.tiles == (m.cols + T - 1) / T, ErrorCode::corrupt,
              "TwELL: {} tiles do not match {} columns at tile width {}", m.tiles, m.cols, T);
  TWELL_CHECK(m.words.size() == static_cast<std::size_t>(m.rows * m.row_words()), ErrorCode::corrupt,
              "TwELL: {} words stored, expected rows {} × {} words", m.words.size(), m.rows, m.row_words());
  TWELL_CHECK(m.backup.size() == m.overflow_rows.size() * static_cast<std::size_t>(m.cols), ErrorCode::corrupt,
              "TwELL: backup holds {} values for {} overflow rows of {} columns", m.backup.size(),
              m.overflow_rows.size(), m.cols);
  for (std::size_t i = 1; i < m.overflow_rows.size(); ++i)
    TWELL_CHECK(m.overflow_rows[i - 1] < m.overflow_rows[i], ErrorCode::corrupt,
                "TwELL: overflow rows are not strictly ascending at index {}", i);
  std::int64_t overflow_tiles = 0;
  for (std::int64_t r = 0; r < m.rows; ++r) {
    bool row_overflow = false;
    for (std::int64_t t = 0; t < m.tiles; ++t) {
      const std::uint32_t* blk = m.block(r, t);
      const std::int64_t width = std::min<std::int64_t>(T, m.cols - t * T);
      TWELL_CHECK(blk[0] <= static_cast<std::uint64_t>(width), ErrorCode::corrupt,
                  "TwELL: row {} tile {} claims {} non-zeros in {} columns", r, t, blk[0], width);
      if (blk[0] > static_cast<std::uint32_t>(cap)) {
        row_overflow = true;
        ++overflow_tiles;
      }
      const std::uint32_t n = std::min<std::uint32_t>(blk[0], static_cast<std::uint32_t>(cap));
      for (std::uint32_t j = 0; j < n; ++j) {
        const std::uint32_t c = twell_col(blk[1 + j]);
        TWELL_CHECK(c < static_cast<std::uint64_t>(width), ErrorCode::corrupt,
                    "TwELL: row {} tile {} slot {} has column {} outside the tile's {} columns", r, t, j + 1, c, width);
        TWELL_CHECK(j == 0 || twell_col(blk[j]) < c, ErrorCode::corrupt,
                    "TwELL: row {} tile {} columns are not strictly ascending at slot {}", r, t, j + 1);
      }
    }
    const bool listed = m.backup_index(r) >= 0;
    TWELL_CHECK(row_overflow == listed, ErrorCode::corrupt, "TwELL: row {} {} but is {}in the overflow list", r,
                row_overflow ? "overflows a tile" : "overflows no tile", listed ? "" : "not ");
  }
  TWELL_CHECK(overflow_tiles == m.overflow_tiles, ErrorCode::corrupt,
              "TwELL: {} tiles overflow but {} are recorded", overflow_tiles, m.overflow_tiles);
}

TwellStats twell_stats(const TwellMatrix& m) {
  TwellStats s;
  s.rows = m.rows;
  s.cols = m.cols;
  const int cap = m.config.capacity();
  for (std::int64_t r = 0; r < m.rows; ++r) {
    std::int64_t row_nnz = 0;
    for (std::int64_t t = 0; t < m.tiles; ++t) {
      const std::int64_t c = m.block(r, t)[0];
      row_nnz += c;
      s.max_tile_nnz = std::max(s.max_tile_nnz, c);
      if (c > cap) ++s.overflow_tiles;
    }
    s.nnz += row_nnz;
    s.max_row_nnz = std::max(s.max_row_nnz, row_nnz);
    if (row_nnz == 0) ++s.empty_rows;
  }
  s.overflow_rows = static_cast<std::int64_t>(m.overflow_rows.size());
  s.mean_row_nnz = m.rows ? static_cast<double>(s.nnz) / static_cast<double>(m.rows) : 0.0;
  s.mean_tile_nnz = (m.rows * m.tiles) != 0 ? static_cast<double>(s.nnz) / static_cast<double>(m.rows * m.tiles) : 0.0;
  return s;
}

}  // namespace twell
