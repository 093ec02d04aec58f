#pragma once
// Hybrid ELL + dense tail (DESIGN §2), the training-time sparse format.
//
// A row with nnz ≤ E lives in the ELL store: ell_cols/ell_vals[r·E + j], j < counts[r], columns
// strictly ascending; slots j ≥ counts[r] hold column 0 and value 0 (padding never needs a predicate).
// A row with nnz > E lives whole in the dense tail: tail[tail_slot[r]·cols + c]; its ELL slots are
// padding. The tail grows to fit every heavy row: no row is ever dropped. Indices are int32, enough
// for any cols < 2^31 (checked).
//
// The pattern of a tail row is its set of non-zero entries unless `pattern_from` says otherwise: ops
// that need an explicit pattern (training) keep it in a companion matrix (see ffn_train.hpp).
//
// Transposed form: the same struct with rows = the original columns (neurons) and cols = the
// original rows (tokens): per neuron, the tokens where it fired.
#include <cstdint>
#include <vector>

#include "twell/tensor.hpp"

namespace twell {

struct HybridConfig {
  int ell_width = 128;  // E ≥ 1
  void validate() const;
};

struct HybridMatrix {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  int ell_width = 0;
  std::vector<std::int32_t> counts;     // [rows] true nnz of each row
  std::vector<std::int32_t> ell_cols;   // [rows, E]
  std::vector<float> ell_vals;          // [rows, E]
  std::vector<std::int64_t> tail_slot;  // [rows] −1 for ELL rows, else the row's tail index
  std::vector<std::int64_t> tail_rows;  // [tail rows] row of each tail index, ascending
  std::vector<float> tail;              // [tail rows, cols]

  std::int64_t nnz() const noexcept;
  std::int64_t tail_count() const noexcept { return static_cast<std::int64_t>(tail_rows.size()); }
  bool in_tail(std::int64_t r) const noexcept { return tail_slot[static_cast<std::size_t>(r)] >= 0; }
  std::size_t bytes() const noexcept;
};

// Dense → hybrid. relu: keep v > 0 (the rest become 0); else keep v != 0.
HybridMatrix hybrid_from_dense(CMatrixF dense, HybridConfig config = {}, bool relu = false);
// From a per-row sorted list of (col, value): row r's entries are cols[offsets[r] .. offsets[r+1]).
HybridMatrix hybrid_from_csr(std::int64_t rows, std::int64_t cols, const std::vector<std::int64_t>& offsets,
                             const std::vector<std::int32_t>& col_idx, const std::vector<float>& values,
                             HybridConfig config = {});
void hybrid_to_dense(const HybridMatrix& h, MatrixF out);
// The transposed hybrid (per column: the rows where it is non-zero), with its own ELL width.
HybridMatrix hybrid_transpose(const HybridMatrix& h, HybridConfig config = {});
void hybrid_validate(const HybridMatrix& h);  // throws ErrorCode::corrupt

// Visits the non-zeros of row r in ascending column order: f(col, value).
template <typename F>
void hybrid_for_each(const HybridMatrix& h, std::int64_t r, F&& f) {
  const std::size_t ur = static_cast<std::size_t>(r);
  if (h.tail_slot[ur] < 0) {
    const std::int32_t* c = h.ell_cols.data() + r * h.ell_width;
    const float* v = h.ell_vals.data() + r * h.ell_width;
    for (std::int32_t j = 0; j < h.counts[ur]; ++j) f(c[j], v[j]);
  } else {
    const float* row = h.tail.data() + h.tail_slot[ur] * h.cols;
    for (std::int64_t c = 0; c < h.cols; ++c)
      if (row[c] != 0.0f) f(static_cast<std::int32_t>(c), row[c]);
  }
}

}  // namespace twell
