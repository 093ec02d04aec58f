#pragma once
// TwELL: tile-wise ELLPACK (DESIGN §2).
//
// The columns of an [M, N] matrix are cut into tiles of T columns (the last tile may be partial).
// Each (row, tile) owns a block of S = T / C 32-bit words, C = compression factor:
//   word 0            : the TRUE number of non-zeros in that (row, tile); may exceed capacity = S − 1
//   words 1..min(count, S−1) : (bf16 value bits << 16) | tile-local column, columns strictly ascending
//   words past that   : zero in host-built matrices; consumers must never read them
// The whole matrix is one row-major [M, tiles · S] array of words, so a row's tiles are contiguous.
//
// Overflow: a (row, tile) with count > S − 1 keeps only the first S − 1 entries in its block and is
// counted; its row is listed in `overflow_rows` and the row's full values are kept, bf16-rounded,
// in `backup`. decode() and every consumer use the backup for those rows, so nothing is ever lost.
#include <cstdint>
#include <mutex>
#include <vector>

#include "twell/bf16.hpp"
#include "twell/tensor.hpp"

namespace twell {

struct TwellConfig {
  int tile = 256;        // T: columns per tile; 2 ≤ T ≤ 65536 (indices are 16-bit, tile-local)
  int compression = 8;   // C: T must be a multiple of C and T / C ≥ 2

  int words_per_tile() const noexcept { return tile / compression; }  // S
  int capacity() const noexcept { return tile / compression - 1; }    // S − 1 values per (row, tile)
  void validate() const;  // throws ErrorCode::invalid_argument
};

constexpr std::uint32_t twell_pack(bf16 value, std::uint32_t local_col) noexcept {
  return (static_cast<std::uint32_t>(value.bits) << 16) | (local_col & 0xffffu);
}
constexpr bf16 twell_value(std::uint32_t word) noexcept { return bf16{static_cast<std::uint16_t>(word >> 16)}; }
constexpr std::uint32_t twell_col(std::uint32_t word) noexcept { return word & 0xffffu; }

struct TwellMatrix {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  TwellConfig config;
  std::int64_t tiles = 0;                  // ceil(cols / T)
  std::vector<std::uint32_t> words;        // [rows, tiles · S]
  std::vector<std::int64_t> overflow_rows; // ascending; rows with ≥ 1 overflowed tile
  std::vector<float> backup;               // [overflow_rows.size(), cols], bf16-rounded values
  std::int64_t overflow_tiles = 0;         // (row, tile) blocks with count > capacity

  std::int64_t row_words() const noexcept { return tiles * config.words_per_tile(); }
  const std::uint32_t* block(std::int64_t r, std::int64_t t) const noexcept {
    return words.data() + r * row_words() + t * config.words_per_tile();
  }
  std::int64_t nnz() const noexcept;  // sum of the true counts
  // Index of row r in overflow_rows (and backup), or −1.
  std::int64_t backup_index(std::int64_t r) const noexcept;
  std::size_t bytes() const noexcept;  // words + backup + overflow list
};

// Builds a TwELL matrix a block of rows at a time (the CPU analogue of the GEMM epilogue).
// pack_rows may be called concurrently for disjoint row ranges.
class TwellBuilder {
 public:
  TwellBuilder(std::int64_t rows, std::int64_t cols, TwellConfig config);
  // Packs rows [row0, row0 + block.rows) from `block` ([n, cols]). relu: keep v > 0 (ReLU fused);
  // else keep v != 0. Values are rounded to bf16.
  void pack_rows(std::int64_t row0, CMatrixF block, bool relu);
  TwellMatrix finish();

 private:
  TwellMatrix m_;
  std::mutex overflow_mutex_;
  std::vector<std::pair<std::int64_t, std::vector<float>>> overflow_;
};

TwellMatrix twell_encode(CMatrixF dense, TwellConfig config = {}, bool relu = false);
// Writes the matrix's (bf16-rounded) values into out ([rows, cols]); zeros elsewhere.
void twell_decode(const TwellMatrix& m, MatrixF out);
// Checks every invariant above; throws ErrorCode::corrupt naming the first broken one.
void twell_validate(const TwellMatrix& m);

struct TwellStats {
  std::int64_t rows = 0, cols = 0, nnz = 0;
  double mean_row_nnz = 0;
  std::int64_t max_row_nnz = 0;
  std::int64_t empty_rows = 0;
  double mean_tile_nnz = 0;
  std::int64_t max_tile_nnz = 0;
  std::int64_t overflow_tiles = 0;
  std::int64_t overflow_rows = 0;
};
TwellStats twell_stats(const TwellMatrix& m);

}  // namespace twell
