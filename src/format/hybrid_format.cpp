#include "twell/hybrid_format.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

namespace twell {

void HybridConfig::validate() const {
  TWELL_CHECK(ell_width >= 1 && ell_width <= (1 << 20), ErrorCode::invalid_argument,
              "hybrid ELL width {} is out of range [1, 1048576]", ell_width);
}

std::int64_t HybridMatrix::nnz() const noexcept {
  std::int64_t n = 0;
  for (auto c : counts) n += c;
  return n;
}

std::size_t HybridMatrix::bytes() const noexcept {
  return counts.size() * sizeof(std::int32_t) + ell_cols.size() * sizeof(std::int32_t) +
         ell_vals.size() * sizeof(float) + tail_slot.size() * sizeof(std::int64_t) +
         tail_rows.size() * sizeof(std::int64_t) + tail.size() * sizeof(float);
}

namespace {

void check_dims(std::int64_t rows, std::int64_t cols) {
  TWELL_CHECK(rows >= 0 && cols >= 1, ErrorCode::invalid_argument, "hybrid matrix needs rows ≥ 0, cols ≥ 1 (got [{}, {}])",
              rows, cols);
  TWELL_CHECK(cols <= std::numeric_limits<std::int32_t>::max() && rows <= std::numeric_limits<std::int32_t>::max(),
              ErrorCode::overflow, "hybrid matrix [{}, {}] exceeds the int32 index range", rows, cols);
}

// Allocates the ELL store and assigns tail slots to rows whose count exceeds E.
HybridMatrix allocate(std::int64_t rows, std::int64_t cols, int E, std::vector<std::int32_t> counts) {
  HybridMatrix h;
  h.rows = rows;
  h.cols = cols;
  h.ell_width = E;
  h.counts = std::move(counts);
  h.ell_cols.assign(static_cast<std::size_t>(rows * E), 0);
  h.ell_vals.assign(static_cast<std::size_t>(rows * E), 0.0f);
  h.tail_slot.assign(static_cast<std::size_t>(rows), -1);
  for (std::int64_t r = 0; r < rows; ++r) {
    if (h.counts[static_cast<std::size_t>(r)] > E) {
      h.tail_slot[static_cast<std::size_t>(r)] = static_cast<std::int64_t>(h.tail_rows.size());
      h.tail_rows.push_back(r);
    }
  }
  h.tail.assign(h.tail_rows.size() * static_cast<std::size_t>(cols), 0.0f);
  return h;
}

}  // namespace

HybridMatrix hybrid_from_dense(CMatrixF dense, HybridConfig config, bool relu) {
  config.validate();
  check_dims(dense.rows, dense.cols);
  const auto keep = [relu](float v) { return relu ? v > 0.0f : v != 0.0f; };
  std::vector<std::int32_t> counts(static_cast<std::size_t>(dense.rows));
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < dense.rows; ++r) {
    std::int32_t n = 0;
    for (std::int64_t c = 0; c < dense.cols; ++c) n += keep(dense(r, c));
    counts[static_cast<std::size_t>(r)] = n;
  }
  HybridMatrix h = allocate(dense.rows, dense.cols, config.ell_width, std::move(counts));
  const int E = h.ell_width;
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < dense.rows; ++r) {
    const float* src = dense.row(r);
    const std::int64_t slot = h.tail_slot[static_cast<std::size_t>(r)];
    if (slot >= 0) {
      float* dst = h.tail.data() + slot * h.cols;
      for (std::int64_t c = 0; c < h.cols; ++c) dst[c] = keep(src[c]) ? src[c] : 0.0f;
    } else {
      std::int32_t j = 0;
      for (std::int64_t c = 0; c < h.cols; ++c) {
        if (keep(src[c])) {
          h.ell_cols[static_cast<std::size_t>(r * E + j)] = static_cast<std::int32_t>(c);
          h.ell_vals[static_cast<std::size_t>(r * E + j)] = src[c];
          ++j;
        }
      }
    }
  }
  return h;
}

HybridMatrix hybrid_from_csr(std::int64_t rows, std::int64_t cols, const std::vector<std::int64_t>& offsets,
                             const std::vector<std::int32_t>& col_idx, const std::vector<float>& values,
                             HybridConfig config) {
  config.validate();
  check_dims(rows, cols);
  TWELL_CHECK(offsets.size() == static_cast<std::size_t>(rows + 1) && offsets.front() == 0 &&
                  static_cast<std::size_t>(offsets.back()) == col_idx.size() && col_idx.size() == values.size(),
              ErrorCode::shape_mismatch, "hybrid_from_csr: offsets/indices/values do not describe {} rows", rows);
  std::vector<std::int32_t> counts(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t n = offsets[static_cast<std::size_t>(r + 1)] - offsets[static_cast<std::size_t>(r)];
    TWELL_CHECK(n >= 0 && n <= cols, ErrorCode::corrupt, "hybrid_from_csr: row {} has {} entries", r, n);
    counts[static_cast<std::size_t>(r)] = static_cast<std::int32_t>(n);
  }
  for (std::int64_t r = 0; r < rows; ++r)  // serial check: nothing may throw inside the parallel fill
    for (std::int64_t i = offsets[static_cast<std::size_t>(r)]; i < offsets[static_cast<std::size_t>(r + 1)]; ++i) {
      const std::int32_t c = col_idx[static_cast<std::size_t>(i)];
      TWELL_CHECK(c >= 0 && c < cols && (i == offsets[static_cast<std::size_t>(r)] || col_idx[static_cast<std::size_t>(i - 1)] < c),
                  ErrorCode::corrupt, "hybrid_from_csr: row {} column {} out of range or not ascending", r, c);
    }
  HybridMatrix h = allocate(rows, cols, config.ell_width, std::move(counts));
  const int E = h.ell_width;
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t b = offsets[static_cast<std::size_t>(r)], e = offsets[static_cast<std::size_t>(r + 1)];
    const std::int64_t slot = h.tail_slot[static_cast<std::size_t>(r)];
    for (std::int64_t i = b; i < e; ++i) {
      const std::int32_t c = col_idx[static_cast<std::size_t>(i)];
      if (slot >= 0) {
        h.tail[static_cast<std::size_t>(slot * cols + c)] = values[static_cast<std::size_t>(i)];
      } else {
        h.ell_cols[static_cast<std::size_t>(r * E + (i - b))] = c;
        h.ell_vals[static_cast<std::size_t>(r * E + (i - b))] = values[static_cast<std::size_t>(i)];
      }
    }
  }
  return h;
}

void hybrid_to_dense(const HybridMatrix& h, MatrixF out) {
  TWELL_CHECK(out.rows == h.rows && out.cols == h.cols, ErrorCode::shape_mismatch,
              "hybrid to dense: output [{}, {}] does not match the matrix [{}, {}]", out.rows, out.cols, h.rows, h.cols);
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < h.rows; ++r) {
    float* dst = out.row(r);
    const std::int64_t slot = h.tail_slot[static_cast<std::size_t>(r)];
    if (slot >= 0) {
      std::memcpy(dst, h.tail.data() + slot * h.cols, static_cast<std::size_t>(h.cols) * sizeof(float));
      continue;
    }
    std::fill(dst, dst + h.cols, 0.0f);
    const std::int32_t* c = h.ell_cols.data() + r * h.ell_width;
    const float* v = h.ell_vals.data() + r * h.ell_width;
    for (std::int32_t j = 0; j < h.counts[static_cast<std::size_t>(r)]; ++j) dst[c[j]] = v[j];
  }
}

HybridMatrix hybrid_transpose(const HybridMatrix& h, HybridConfig config) {
  config.validate();
  // Counting sort by column: rows visited in ascending order give ascending row lists per column.
  std::vector<std::int64_t> offsets(static_cast<std::size_t>(h.cols + 1), 0);
  for (std::int64_t r = 0; r < h.rows; ++r)
    hybrid_for_each(h, r, [&](std::int32_t c, float) { ++offsets[static_cast<std::size_t>(c) + 1]; });
  for (std::int64_t c = 0; c < h.cols; ++c) offsets[static_cast<std::size_t>(c + 1)] += offsets[static_cast<std::size_t>(c)];
  const std::int64_t nnz = offsets.back();
  std::vector<std::int32_t> rows_of(static_cast<std::size_t>(nnz));
  std::vector<float> vals(static_cast<std::size_t>(nnz));
  std::vector<std::int64_t> fill(offsets.begin(), offsets.end() - 1);
  for (std::int64_t r = 0; r < h.rows; ++r)
    hybrid_for_each(h, r, [&](std::int32_t c, float v) {
      const auto at = static_cast<std::size_t>(fill[static_cast<std::size_t>(c)]++);
      rows_of[at] = static_cast<std::int32_t>(r);
      vals[at] = v;
    });
  return hybrid_from_csr(h.cols, h.rows, offsets, rows_of, vals, config);
}

void hybrid_validate(const HybridMatrix& h) {
  const auto R = static_cast<std::size_t>(h.rows);
  const std::int64_t E = h.ell_width;
  TWELL_CHECK(h.rows >= 0 && h.cols >= 1 && E >= 1, ErrorCode::corrupt, "hybrid: bad dimensions [{}, {}] E={}", h.rows,
              h.cols, E);
  TWELL_CHECK(h.counts.size() == R && h.tail_slot.size() == R && h.ell_cols.size() == R * static_cast<std::size_t>(E) &&
                  h.ell_vals.size() == h.ell_cols.size(),
              ErrorCode::corrupt, "hybrid: array sizes do not match {} rows of ELL width {}", h.rows, E);
  TWELL_CHECK(h.tail.size() == h.tail_rows.size() * static_cast<std::size_t>(h.cols), ErrorCode::corrupt,
              "hybrid: tail holds {} values for {} rows of {} columns", h.tail.size(), h.tail_rows.size(), h.cols);
  for (std::size_t s = 0; s < h.tail_rows.size(); ++s) {
    const std::int64_t r = h.tail_rows[s];
    TWELL_CHECK(r >= 0 && r < h.rows && h.tail_slot[static_cast<std::size_t>(r)] == static_cast<std::int64_t>(s),
                ErrorCode::corrupt, "hybrid: tail slot {} maps to row {} which does not map back", s, r);
    TWELL_CHECK(s == 0 || h.tail_rows[s - 1] < r, ErrorCode::corrupt, "hybrid: tail rows not ascending at slot {}", s);
  }
  for (std::int64_t r = 0; r < h.rows; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    const std::int32_t n = h.counts[ur];
    TWELL_CHECK(n >= 0 && n <= h.cols, ErrorCode::corrupt, "hybrid: row {} count {} out of range", r, n);
    const std::int64_t slot = h.tail_slot[ur];
    TWELL_CHECK(slot >= -1 && slot < h.tail_count(), ErrorCode::corrupt, "hybrid: row {} has bad tail slot {}", r, slot);
    TWELL_CHECK((n > E) == (slot >= 0), ErrorCode::corrupt,
                "hybrid: row {} with {} non-zeros (ELL width {}) is {}in the tail", r, n, E, slot >= 0 ? "" : "not ");
    if (slot >= 0) {
      const float* row = h.tail.data() + slot * h.cols;
      std::int64_t stored = 0;
      for (std::int64_t c = 0; c < h.cols; ++c) stored += row[c] != 0.0f;
      TWELL_CHECK(stored <= n, ErrorCode::corrupt, "hybrid: tail row {} holds {} non-zeros but counts {}", r, stored, n);
      continue;
    }
    const std::int32_t* c = h.ell_cols.data() + r * E;
    const float* v = h.ell_vals.data() + r * E;
    for (std::int64_t j = 0; j < E; ++j) {
      if (j < n) {
        TWELL_CHECK(c[j] >= 0 && c[j] < h.cols && (j == 0 || c[j - 1] < c[j]), ErrorCode::corrupt,
                    "hybrid: row {} slot {} column {} out of range or not ascending", r, j, c[j]);
      } else {
        TWELL_CHECK(c[j] == 0 && v[j] == 0.0f, ErrorCode::corrupt, "hybrid: row {} padding slot {} is not zero", r, j);
      }
    }
  }
}

}  // namespace twell
