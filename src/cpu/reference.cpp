// The float64 oracle. Straight loops over the definitions in DESIGN §1/§3; nothing clever, so that
// it is easy to trust.
#include "twell/cpu/reference.hpp"

#include <cmath>

#include "twell/bf16.hpp"

namespace twell::ref {
namespace {

double dotd(const float* a, const float* b, std::int64_t n) {
  double acc = 0;
  for (std::int64_t i = 0; i < n; ++i) acc += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return acc;
}

}  // namespace

std::vector<double> ffn_forward(CMatrixF x, const FfnWeights& w, const std::vector<std::int64_t>& rows, Options opt,
                                std::vector<double>* bf16_bound) {
  ffn_check_shapes(x, w);
  const std::int64_t K = w.hidden(), N = w.intermediate();
  std::vector<std::int64_t> rr = rows;
  if (rr.empty())
    for (std::int64_t m = 0; m < x.rows; ++m) rr.push_back(m);
  const auto R = static_cast<std::int64_t>(rr.size());
  for (auto m : rr) TWELL_CHECK(m >= 0 && m < x.rows, ErrorCode::invalid_argument, "reference: row {} out of range [0, {})", m, x.rows);
  std::vector<double> y(static_cast<std::size_t>(R * K), 0.0);
  std::vector<double> wd_norm;
  if (bf16_bound) {
    bf16_bound->assign(static_cast<std::size_t>(R), 0.0);
    wd_norm.assign(static_cast<std::size_t>(N), 0.0);
    for (std::int64_t k = 0; k < K; ++k)
      for (std::int64_t n = 0; n < N; ++n) wd_norm[static_cast<std::size_t>(n)] += static_cast<double>(w.w_down(k, n)) * w.w_down(k, n);
    for (auto& v : wd_norm) v = std::sqrt(v);
  }
#pragma omp parallel for schedule(dynamic)
  for (std::int64_t i = 0; i < R; ++i) {
    const std::int64_t m = rr[static_cast<std::size_t>(i)];
    const float* xr = x.row(m);
    double* yr = y.data() + i * K;
    for (std::int64_t n = 0; n < N; ++n) {
      double a = dotd(xr, w.gated() ? w.w_gate.row(n) : w.w_up.row(n), K);
      if (!(a > 0)) continue;
      if (opt.round_activation_bf16) a = static_cast<double>(round_bf16(static_cast<float>(a)));
      const double h = w.gated() ? a * dotd(xr, w.w_up.row(n), K) : a;
      if (bf16_bound) (*bf16_bound)[static_cast<std::size_t>(i)] += std::ldexp(std::fabs(h), -7) * wd_norm[static_cast<std::size_t>(n)];
      for (std::int64_t k = 0; k < K; ++k) yr[k] += h * static_cast<double>(w.w_down(k, n));
    }
  }
  return y;
}

TrainResult ffn_train(CMatrixF x, CMatrixF dy, const FfnWeights& w, double l1_coeff) {
  ffn_check_shapes(x, w);
  const std::int64_t M = x.rows, K = w.hidden(), N = w.intermediate();
  TWELL_CHECK(dy.rows == M && dy.cols == K, ErrorCode::shape_mismatch, "reference: dy shape");
  const bool gated = w.gated();
  TrainResult r;
  r.y.assign(static_cast<std::size_t>(M * K), 0.0);
  r.dx.assign(static_cast<std::size_t>(M * K), 0.0);
  r.dw_gate.assign(gated ? static_cast<std::size_t>(N * K) : 0, 0.0);
  r.dw_up.assign(static_cast<std::size_t>(N * K), 0.0);
  r.dw_down.assign(static_cast<std::size_t>(K * N), 0.0);
  const double c = l1_coeff / static_cast<double>(M);
  double l1 = 0, active = 0;
  for (std::int64_t m = 0; m < M; ++m) {
    const float* xr = x.row(m);
    const float* dyr = dy.row(m);
    for (std::int64_t n = 0; n < N; ++n) {
      const double a = dotd(xr, gated ? w.w_gate.row(n) : w.w_up.row(n), K);
      if (!(a > 0)) continue;  // inactive: h = 0 and every gradient path through it is 0
      active += 1;
      const double u = gated ? dotd(xr, w.w_up.row(n), K) : 1.0;
      const double h = gated ? a * u : a;
      l1 += std::fabs(h);
      double dh = c * (h > 0 ? 1.0 : (h < 0 ? -1.0 : 0.0));
      for (std::int64_t k = 0; k < K; ++k) {
        const double wd = static_cast<double>(w.w_down(k, n));
        r.y[static_cast<std::size_t>(m * K + k)] += h * wd;
        dh += static_cast<double>(dyr[k]) * wd;
        r.dw_down[static_cast<std::size_t>(k * N + n)] += static_cast<double>(dyr[k]) * h;
      }
      const double da = gated ? dh * u : dh;  // through the ReLU (active) into the gate pre-activation
      const double du = gated ? dh * a : 0.0;
      for (std::int64_t k = 0; k < K; ++k) {
        const double xk = static_cast<double>(xr[k]);
        if (gated) {
          r.dx[static_cast<std::size_t>(m * K + k)] += da * w.w_gate(n, k) + du * w.w_up(n, k);
          r.dw_gate[static_cast<std::size_t>(n * K + k)] += da * xk;
          r.dw_up[static_cast<std::size_t>(n * K + k)] += du * xk;
        } else {
          r.dx[static_cast<std::size_t>(m * K + k)] += da * w.w_up(n, k);
          r.dw_up[static_cast<std::size_t>(n * K + k)] += da * xk;
        }
      }
    }
  }
  r.l1 = l1 / static_cast<double>(M);
  r.l0 = active / static_cast<double>(M);
  double loss = 0;
  for (std::int64_t i = 0; i < M * K; ++i) loss += r.y[static_cast<std::size_t>(i)] * static_cast<double>(dy.data[(i / K) * dy.ld + i % K]);
  r.loss = loss + l1_coeff * r.l1;
  return r;
}

double rel_error(const float* a, const double* b, std::int64_t n) {
  double num = 0, den = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    if (std::isnan(a[i])) return INFINITY;  // NaN never passes
    num += d * d;
    den += b[i] * b[i];
  }
  if (den == 0) return std::sqrt(num) == 0 ? 0.0 : INFINITY;
  return std::sqrt(num / den);
}

double max_row_rel_error(const float* a, const double* b, std::int64_t rows, std::int64_t cols) {
  double worst = 0;
  for (std::int64_t r = 0; r < rows; ++r) worst = std::max(worst, rel_error(a + r * cols, b + r * cols, cols));
  return worst;
}

}  // namespace twell::ref
