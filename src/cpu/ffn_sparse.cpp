// Sparse FFN inference through TwELL (DESIGN §3, inference).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "cpu/blas.hpp"
#include "cpu/kernels.hpp"
#include "cpu/parallel.hpp"
#include "twell/cpu/ffn_ops.hpp"

namespace twell::cpu {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Applies f(col, value) to every non-zero of row r: from the TwELL blocks, or from the dense backup
// when the row overflowed a tile (the backup holds the same bf16-rounded values, all of them).
template <typename F>
void for_each_active(const TwellMatrix& m, std::int64_t r, F&& f) {
  const std::int64_t b = m.backup_index(r);
  if (b >= 0) {
    const float* row = m.backup.data() + b * m.cols;
    for (std::int64_t c = 0; c < m.cols; ++c)
      if (row[c] != 0.0f) f(c, row[c]);
    return;
  }
  const int T = m.config.tile;
  const auto cap = static_cast<std::uint32_t>(m.config.capacity());
  for (std::int64_t t = 0; t < m.tiles; ++t) {
    const std::uint32_t* blk = m.block(r, t);
    const std::uint32_t n = std::min(blk[0], cap);  // n == blk[0]: overflowed rows took the branch above
    for (std::uint32_t j = 0; j < n; ++j) f(t * T + twell_col(blk[1 + j]), to_float(twell_value(blk[1 + j])));
  }
}

// ReLU of rows [r0, r0 + blk.rows) of the first GEMM's output packed by builder, 16 rows a task.
void pack_relu_rows(TwellBuilder& builder, std::int64_t r0, CMatrixF blk) {
#pragma omp parallel for schedule(dynamic) if (blk.rows * blk.cols >= kParallelMinWork)
  for (std::int64_t i = 0; i < blk.rows; i += 16)
    builder.pack_rows(r0 + i, CMatrixF(blk.row(i), std::min<std::int64_t>(16, blk.rows - i), blk.cols, blk.ld), /*relu=*/true);
}

}  // namespace

TwellMatrix ffn_gate_twell(CMatrixF x, CMatrixF w, TwellConfig config) {
  TWELL_CHECK(x.cols == w.cols, ErrorCode::shape_mismatch, "gate: x is [{}, {}] but the weight is [{}, {}]", x.rows, x.cols,
              w.rows, w.cols);
  const std::int64_t M = x.rows, N = w.rows;
  TwellBuilder builder(M, N, config);
  const std::int64_t B = std::min<std::int64_t>(kGateBlockRows, M);
  std::vector<float> scratch(static_cast<std::size_t>(B * N));  // [B, N]: one block of the gate output
  for (std::int64_t r0 = 0; r0 < M; r0 += B) {
    const std::int64_t n = std::min(B, M - r0);
    MatrixF blk(scratch.data(), n, N);
    gemm(false, true, 1.0f, CMatrixF(x.row(r0), n, x.cols, x.ld), w, 0.0f, blk);
    pack_relu_rows(builder, r0, blk);
  }
  return builder.finish();
}

TwellMatrix ffn_pack_gate(CMatrixF pre, TwellConfig config) {
  TwellBuilder builder(pre.rows, pre.cols, config);
  pack_relu_rows(builder, 0, pre);
  return builder.finish();
}

namespace {

// The active entries of a TwELL matrix, neuron-major: neuron n's entries are [offsets[n], offsets[n+1]),
// tokens ascending, with the stored activation value.
struct NeuronMajor {
  std::vector<std::int64_t> offsets;
  std::vector<std::int32_t> token;
  std::vector<float> value;
};

NeuronMajor neuron_major(const TwellMatrix& m) {
  NeuronMajor nm;
  nm.offsets.assign(static_cast<std::size_t>(m.cols + 1), 0);
  for (std::int64_t r = 0; r < m.rows; ++r) for_each_active(m, r, [&](std::int64_t n, float) { ++nm.offsets[static_cast<std::size_t>(n + 1)]; });
  for (std::int64_t n = 0; n < m.cols; ++n) nm.offsets[static_cast<std::size_t>(n + 1)] += nm.offsets[static_cast<std::size_t>(n)];
  nm.token.resize(static_cast<std::size_t>(nm.offsets.back()));
  nm.value.resize(nm.token.size());
  std::vector<std::int64_t> fill(nm.offsets.begin(), nm.offsets.end() - 1);
  for (std::int64_t r = 0; r < m.rows; ++r)
    for_each_active(m, r, [&](std::int64_t n, float v) {
      const auto at = static_cast<std::size_t>(fill[static_cast<std::size_t>(n)]++);
      nm.token[at] = static_cast<std::int32_t>(r);
      nm.value[at] = v;
    });
  return nm;
}

// y = Σ_entries value·Wdᵀ[n] with each Wdᵀ row read once: K is cut into column slices and each
// slice of y (M × 256 floats) stays in cache while every neuron streams past it.
void down_neuron_major(const NeuronMajor& nm, CMatrixF down_t, MatrixF y) {
  const std::int64_t K = down_t.cols, N = down_t.rows;
  constexpr std::int64_t kSlice = 256;
#pragma omp parallel for schedule(dynamic) if (static_cast<std::int64_t>(nm.token.size()) * K >= kParallelMinWork)
  for (std::int64_t k0 = 0; k0 < K; k0 += kSlice) {
    const std::int64_t len = std::min(kSlice, K - k0);
    for (std::int64_t m = 0; m < y.rows; ++m) std::fill(y.row(m) + k0, y.row(m) + k0 + len, 0.0f);
    for (std::int64_t n = 0; n < N; ++n) {
      const float* w = down_t.row(n) + k0;
      for (std::int64_t e = nm.offsets[static_cast<std::size_t>(n)]; e < nm.offsets[static_cast<std::size_t>(n + 1)]; ++e)
        axpy(nm.value[static_cast<std::size_t>(e)], w, y.row(nm.token[static_cast<std::size_t>(e)]) + k0, len);
    }
  }
}

}  // namespace

void ffn_up_down_twell(CMatrixF x, const TwellMatrix& gate, CMatrixF w_up, CMatrixF down_t, MatrixF y) {
  const std::int64_t M = x.rows, K = x.cols;
  TWELL_CHECK(gate.rows == M && gate.cols == w_up.rows && w_up.cols == K && down_t.rows == gate.cols &&
                  down_t.cols == K && y.rows == M && y.cols == K,
              ErrorCode::shape_mismatch, "fused up+down: inconsistent shapes (x [{}, {}], gate [{}, {}], w_up [{}, {}])", M, K,
              gate.rows, gate.cols, w_up.rows, w_up.cols);
  // Neuron-major: each Wu row is read once for all the tokens where its neuron fired (h = g·⟨x, Wu[n]⟩
  // replaces g in place; h lives only in this scratch list, never as a dense [M, N]).
  NeuronMajor nm = neuron_major(gate);
  const auto N = static_cast<std::int64_t>(nm.offsets.size()) - 1;
#pragma omp parallel for schedule(dynamic, 16) if (static_cast<std::int64_t>(nm.token.size()) * K >= kParallelMinWork)
  for (std::int64_t n = 0; n < N; ++n) {
    const float* wu = w_up.row(n);
    for (std::int64_t e = nm.offsets[static_cast<std::size_t>(n)]; e < nm.offsets[static_cast<std::size_t>(n + 1)]; ++e)
      nm.value[static_cast<std::size_t>(e)] *= dot(x.row(nm.token[static_cast<std::size_t>(e)]), wu, K);
  }
  down_neuron_major(nm, down_t, y);
}

void ffn_down_twell(const TwellMatrix& h, CMatrixF down_t, MatrixF y) {
  const std::int64_t K = down_t.cols;
  TWELL_CHECK(down_t.rows == h.cols && y.rows == h.rows && y.cols == K, ErrorCode::shape_mismatch,
              "sparse down: h [{}, {}], Wdᵀ [{}, {}], y [{}, {}] do not fit", h.rows, h.cols, down_t.rows, K, y.rows, y.cols);
  down_neuron_major(neuron_major(h), down_t, y);
}

namespace {

void check_sparse_call(CMatrixF x, const PreparedFfn& p, MatrixF y) {
  ffn_check_shapes(x, p.w);
  TWELL_CHECK(y.rows == x.rows && y.cols == x.cols, ErrorCode::shape_mismatch, "y is [{}, {}], expected [{}, {}]", y.rows,
              y.cols, x.rows, x.cols);
  TWELL_CHECK(static_cast<std::int64_t>(p.down_t.size()) == p.w.intermediate() * p.w.hidden(), ErrorCode::invalid_argument,
              "PreparedFfn was not built by prepare_ffn for these weights");
}

// The products after the gate (up + down gated, down alone non-gated), timed into info.
void sparse_rest(CMatrixF x, const TwellMatrix& g, const PreparedFfn& p, MatrixF y, SparseInferenceInfo& info) {
  const double t0 = now_seconds();
  if (p.w.gated())
    ffn_up_down_twell(x, g, p.w.w_up, p.down_t_view(), y);
  else
    ffn_down_twell(g, p.down_t_view(), y);
  info.sparse_seconds = now_seconds() - t0;
  info.stats = twell_stats(g);
}

}  // namespace

SparseInferenceInfo ffn_sparse(CMatrixF x, const PreparedFfn& p, MatrixF y, TwellConfig config) {
  check_sparse_call(x, p, y);
  SparseInferenceInfo info;
  const double t0 = now_seconds();
  const TwellMatrix g = ffn_gate_twell(x, p.w.gated() ? p.w.w_gate : p.w.w_up, config);
  info.gate_seconds = now_seconds() - t0;
  sparse_rest(x, g, p, y, info);
  return info;
}

SparseInferenceInfo ffn_sparse_from_gate(CMatrixF x, CMatrixF pre, const PreparedFfn& p, MatrixF y, TwellConfig config) {
  check_sparse_call(x, p, y);
  TWELL_CHECK(pre.rows == x.rows && pre.cols == p.w.intermediate(), ErrorCode::shape_mismatch,
              "sparse FFN: the first GEMM's output is [{}, {}], expected [{}, {}]", pre.rows, pre.cols, x.rows,
              p.w.intermediate());
  SparseInferenceInfo info;
  const double t0 = now_seconds();
  const TwellMatrix g = ffn_pack_gate(pre, config);
  info.gate_seconds = now_seconds() - t0;
  sparse_rest(x, g, p, y, info);
  return info;
}

}  // namespace twell::cpu
