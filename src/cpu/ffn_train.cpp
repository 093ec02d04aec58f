// Sparse FFN training on the CPU (DESIGN §3, training). The forward keeps only the pattern and
// its values (hybrid form); every backward product runs over the non-zeros.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/blas.hpp"
#include "cpu/kernels.hpp"
#include "twell/cpu/ffn_ops.hpp"

namespace twell::cpu {
namespace {

// Row-major list of the active (token, neuron) pairs: entries offsets[m] .. offsets[m+1] of row m,
// neurons ascending. p = ReLU input value (> 0), r = up value (gated only).
struct Csr {
  std::vector<std::int64_t> offsets;
  std::vector<std::int32_t> cols;
  std::vector<float> p, r;
};

// Gate GEMM in row blocks; each block's active entries are appended (ReLU as the packing criterion).
Csr gate_pattern(CMatrixF x, CMatrixF w) {
  const std::int64_t M = x.rows, N = w.rows;
  Csr s;
  s.offsets.assign(static_cast<std::size_t>(M + 1), 0);
  const std::int64_t B = std::min<std::int64_t>(kGateBlockRows, M);
  std::vector<float> scratch(static_cast<std::size_t>(B * N));
  for (std::int64_t r0 = 0; r0 < M; r0 += B) {
    const std::int64_t n = std::min(B, M - r0);
    MatrixF blk(scratch.data(), n, N);
    gemm(false, true, 1.0f, CMatrixF(x.row(r0), n, x.cols, x.ld), w, 0.0f, blk);
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < n; ++i) {
      std::int64_t cnt = 0;
      const float* row = blk.row(i);
      for (std::int64_t c = 0; c < N; ++c) cnt += row[c] > 0.0f;
      s.offsets[static_cast<std::size_t>(r0 + i + 1)] = cnt;
    }
    for (std::int64_t i = 0; i < n; ++i) s.offsets[static_cast<std::size_t>(r0 + i + 1)] += s.offsets[static_cast<std::size_t>(r0 + i)];
    const auto total = static_cast<std::size_t>(s.offsets[static_cast<std::size_t>(r0 + n)]);
    s.cols.resize(total);
    s.p.resize(total);
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < n; ++i) {
      auto at = static_cast<std::size_t>(s.offsets[static_cast<std::size_t>(r0 + i)]);
      const float* row = blk.row(i);
      for (std::int64_t c = 0; c < N; ++c)
        if (row[c] > 0.0f) {
          s.cols[at] = static_cast<std::int32_t>(c);
          s.p[at++] = row[c];
        }
    }
  }
  return s;
}

// Rebuilds the CSR lists from the saved hybrids (tail rows: the pattern is where p > 0).
Csr csr_from_state(const TrainState& st, bool gated) {
  const HybridMatrix& P = st.p;
  Csr s;
  s.offsets.assign(static_cast<std::size_t>(P.rows + 1), 0);
  for (std::int64_t m = 0; m < P.rows; ++m)
    s.offsets[static_cast<std::size_t>(m + 1)] = s.offsets[static_cast<std::size_t>(m)] + P.counts[static_cast<std::size_t>(m)];
  const auto nnz = static_cast<std::size_t>(s.offsets.back());
  s.cols.resize(nnz);
  s.p.resize(nnz);
  if (gated) s.r.resize(nnz);
  const int E = P.ell_width;
#pragma omp parallel for schedule(static)
  for (std::int64_t m = 0; m < P.rows; ++m) {
    auto at = static_cast<std::size_t>(s.offsets[static_cast<std::size_t>(m)]);
    const std::int64_t slot = P.tail_slot[static_cast<std::size_t>(m)];
    if (slot >= 0) {
      const float* prow = P.tail.data() + slot * P.cols;
      const float* rrow = gated ? st.r.tail.data() + slot * P.cols : nullptr;
      for (std::int64_t c = 0; c < P.cols; ++c)
        if (prow[c] > 0.0f) {
          s.cols[at] = static_cast<std::int32_t>(c);
          s.p[at] = prow[c];
          if (gated) s.r[at] = rrow[c];
          ++at;
        }
    } else {
      const auto base = static_cast<std::size_t>(m * E);
      const auto n = static_cast<std::size_t>(P.counts[static_cast<std::size_t>(m)]);
      std::memcpy(s.cols.data() + at, P.ell_cols.data() + base, n * sizeof(std::int32_t));
      std::memcpy(s.p.data() + at, P.ell_vals.data() + base, n * sizeof(float));
      if (gated) std::memcpy(s.r.data() + at, st.r.ell_vals.data() + base, n * sizeof(float));
    }
  }
  return s;
}

// Transposed order: for neuron n, entries toffsets[n] .. toffsets[n+1] of `order` index the
// row-major entries of that neuron, tokens ascending.
struct Transposed {
  std::vector<std::int64_t> offsets;
  std::vector<std::int64_t> order;
  std::vector<std::int32_t> rows;
};

Transposed transpose(const Csr& s, std::int64_t M, std::int64_t N) {
  Transposed t;
  t.offsets.assign(static_cast<std::size_t>(N + 1), 0);
  for (auto c : s.cols) ++t.offsets[static_cast<std::size_t>(c) + 1];
  for (std::int64_t n = 0; n < N; ++n) t.offsets[static_cast<std::size_t>(n + 1)] += t.offsets[static_cast<std::size_t>(n)];
  t.order.resize(s.cols.size());
  t.rows.resize(s.cols.size());
  std::vector<std::int64_t> fill(t.offsets.begin(), t.offsets.end() - 1);
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t e = s.offsets[static_cast<std::size_t>(m)]; e < s.offsets[static_cast<std::size_t>(m + 1)]; ++e) {
      const auto at = static_cast<std::size_t>(fill[static_cast<std::size_t>(s.cols[static_cast<std::size_t>(e)])]++);
      t.order[at] = e;
      t.rows[at] = static_cast<std::int32_t>(m);
    }
  return t;
}

void check_prepared(const PreparedFfn& p) {
  TWELL_CHECK(static_cast<std::int64_t>(p.down_t.size()) == p.w.intermediate() * p.w.hidden(), ErrorCode::invalid_argument,
              "PreparedFfn was not built by prepare_ffn for these weights");
}

}  // namespace

TrainState ffn_train_forward(CMatrixF x, const PreparedFfn& pw, MatrixF y, HybridConfig config) {
  const FfnWeights& w = pw.w;
  ffn_check_shapes(x, w);
  check_prepared(pw);
  config.validate();
  const std::int64_t M = x.rows, K = w.hidden(), N = w.intermediate();
  TWELL_CHECK(y.rows == M && y.cols == K, ErrorCode::shape_mismatch, "y is [{}, {}], expected [{}, {}]", y.rows, y.cols, M, K);
  const bool gated = w.gated();
  Csr s = gate_pattern(x, gated ? w.w_gate : w.w_up);
  if (gated) s.r.resize(s.cols.size());
  const CMatrixF down_t = pw.down_t_view();
  double l1 = 0;
#pragma omp parallel for schedule(dynamic, 4) reduction(+ : l1)
  for (std::int64_t m = 0; m < M; ++m) {
    const float* xr = x.row(m);
    float* yr = y.row(m);
    std::fill(yr, yr + K, 0.0f);
    for (std::int64_t e = s.offsets[static_cast<std::size_t>(m)]; e < s.offsets[static_cast<std::size_t>(m + 1)]; ++e) {
      const auto ue = static_cast<std::size_t>(e);
      const std::int32_t n = s.cols[ue];
      float t = s.p[ue];
      if (gated) {
        s.r[ue] = dot(xr, w.w_up.row(n), K);  // R = x·Wuᵀ sampled at the pattern
        t *= s.r[ue];                          // T = P ⊙ R
      }
      l1 += std::fabs(static_cast<double>(t));
      axpy(t, down_t.row(n), yr, K);  // y = T·Wdᵀ
    }
  }
  TrainState st;
  st.scalars.l1 = l1 / static_cast<double>(M);
  st.scalars.l0 = static_cast<double>(s.cols.size()) / static_cast<double>(M);
  st.p = hybrid_from_csr(M, N, s.offsets, s.cols, s.p, config);
  if (gated) st.r = hybrid_from_csr(M, N, s.offsets, s.cols, s.r, config);
  return st;
}

void ffn_train_backward(CMatrixF x, CMatrixF dy, const PreparedFfn& pw, const TrainState& st, double l1_coeff,
                        const FfnGrads& g) {
  const FfnWeights& w = pw.w;
  ffn_check_shapes(x, w);
  check_prepared(pw);
  const std::int64_t M = x.rows, K = w.hidden(), N = w.intermediate();
  const bool gated = w.gated();
  TWELL_CHECK(dy.rows == M && dy.cols == K, ErrorCode::shape_mismatch, "dy is [{}, {}], expected [{}, {}]", dy.rows, dy.cols, M, K);
  TWELL_CHECK(st.p.rows == M && st.p.cols == N && (!gated || (st.r.rows == M && st.r.cols == N)), ErrorCode::shape_mismatch,
              "saved training state is [{}, {}] but the inputs need [{}, {}]", st.p.rows, st.p.cols, M, N);
  TWELL_CHECK(g.dx.rows == M && g.dx.cols == K && g.dw_up.rows == N && g.dw_up.cols == K && g.dw_down.rows == K &&
                  g.dw_down.cols == N && (!gated || (g.dw_gate.rows == N && g.dw_gate.cols == K)),
              ErrorCode::shape_mismatch, "gradient buffers do not match x [{}, {}] and N = {}", M, K, N);
  // The transposed pattern (per neuron: its tokens) is built here as an index over the entries;
  // it lives only for this call.
  const Csr s = csr_from_state(st, gated);
  const auto nnz = s.cols.size();
  const CMatrixF down_t = pw.down_t_view();
  const float c1 = static_cast<float>(l1_coeff / static_cast<double>(M));

  // dT = (dy·Wd) sampled at the pattern + (c/M)·sign(T); then dR = dT ⊙ P (→ Wu), dA = dT ⊙ R (→ Wg).
  std::vector<float> t(nnz), d_up(nnz), d_gate(gated ? nnz : 0);
#pragma omp parallel for schedule(dynamic, 4)
  for (std::int64_t m = 0; m < M; ++m) {
    const float* dyr = dy.row(m);
    float* dxr = g.dx.row(m);
    std::fill(dxr, dxr + K, 0.0f);
    for (std::int64_t e = s.offsets[static_cast<std::size_t>(m)]; e < s.offsets[static_cast<std::size_t>(m + 1)]; ++e) {
      const auto ue = static_cast<std::size_t>(e);
      const std::int32_t n = s.cols[ue];
      const float tv = gated ? s.p[ue] * s.r[ue] : s.p[ue];
      t[ue] = tv;
      const float sign = tv > 0.0f ? 1.0f : (tv < 0.0f ? -1.0f : 0.0f);
      const float dt = dot(dyr, down_t.row(n), K) + c1 * sign;
      if (gated) {
        d_up[ue] = dt * s.p[ue];
        d_gate[ue] = dt * s.r[ue];
        axpy(d_up[ue], w.w_up.row(n), dxr, K);      // dx = dR·Wu
        axpy(d_gate[ue], w.w_gate.row(n), dxr, K);  //    + dA·Wg
      } else {
        d_up[ue] = dt;
        axpy(dt, w.w_up.row(n), dxr, K);
      }
    }
  }

  // Weight gradients per neuron over the tokens where it fired (the transposed pattern).
  const Transposed tr = transpose(s, M, N);
  std::vector<float> dwd_t(static_cast<std::size_t>(N * K));  // [N, K] = dWdᵀ
#pragma omp parallel for schedule(dynamic, 8)
  for (std::int64_t n = 0; n < N; ++n) {
    float* du = g.dw_up.row(n);
    float* dd = dwd_t.data() + n * K;
    float* dg = gated ? g.dw_gate.row(n) : nullptr;
    std::fill(du, du + K, 0.0f);
    std::fill(dd, dd + K, 0.0f);
    if (gated) std::fill(dg, dg + K, 0.0f);
    for (std::int64_t i = tr.offsets[static_cast<std::size_t>(n)]; i < tr.offsets[static_cast<std::size_t>(n + 1)]; ++i) {
      const auto e = static_cast<std::size_t>(tr.order[static_cast<std::size_t>(i)]);
      const std::int32_t m = tr.rows[static_cast<std::size_t>(i)];
      axpy(d_up[e], x.row(m), du, K);   // dWu = dRᵀ·x
      axpy(t[e], dy.row(m), dd, K);     // dWdᵀ = Tᵀ·dy
      if (gated) axpy(d_gate[e], x.row(m), dg, K);  // dWg = dAᵀ·x
    }
  }
  constexpr std::int64_t B = 64;
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t k0 = 0; k0 < K; k0 += B)
    for (std::int64_t n0 = 0; n0 < N; n0 += B)
      for (std::int64_t k = k0; k < std::min(k0 + B, K); ++k)
        for (std::int64_t n = n0; n < std::min(n0 + B, N); ++n) g.dw_down(k, n) = dwd_t[static_cast<std::size_t>(n * K + k)];
}

}  // namespace twell::cpu
