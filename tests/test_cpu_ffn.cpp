// CPU FFN inference ops against the float64 oracle, on fresh random inputs at edge shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "cpu/blas.hpp"
#include "ffn_cases.hpp"
#include "test_util.hpp"
#include "twell/cpu/ffn_ops.hpp"
#include "twell/cpu/reference.hpp"
#include "twell/sparsity_gen.hpp"

using namespace twell;

namespace {

using test::FfnCase;

// fp32 accumulation over K terms: relative error ≲ K·2⁻²⁴ in the worst case; 2e-5 is ~30× the
// typical (√K·2⁻²⁴) error at K ≤ 2048 and still 50× below a single bf16 rounding (2⁻⁸).
constexpr double kFp32Tol = 2e-5;

struct Inputs {
  test::FfnData d;
  FfnWeights w;
  CMatrixF x;
};

// The case's generated inputs (bench/ffn/ffn_cases.hpp's generator, as the CUDA suite's) with a fresh seed.
Inputs make(FfnCase c) {
  c.seed = test::fresh_seed();
  Inputs in;
  in.d = test::make_ffn(c);
  in.x = in.d.xv();
  in.w = in.d.weights();
  return in;
}

TwellConfig twell_of(const FfnCase& c) { return TwellConfig{c.tile, c.compression}; }

class CpuFfn : public ::testing::TestWithParam<FfnCase> {};

TEST_P(CpuFfn, DenseMatchesReference) {
  const FfnCase& p = GetParam();
  Inputs in = make(p);
  std::vector<float> y = test::poisoned(static_cast<std::size_t>(p.m * p.k));
  cpu::ffn_dense(in.x, in.w, MatrixF(y.data(), p.m, p.k));
  const auto ref = ref::ffn_forward(in.x, in.w);
  EXPECT_LE(test::rel_err(y, ref), kFp32Tol);
}

TEST_P(CpuFfn, SparseMatchesReferenceOnEveryRow) {
  const FfnCase& p = GetParam();
  Inputs in = make(p);
  const cpu::PreparedFfn prep = cpu::prepare_ffn(in.w);
  std::vector<float> y = test::poisoned(static_cast<std::size_t>(p.m * p.k));
  const auto info = cpu::ffn_sparse(in.x, prep, MatrixF(y.data(), p.m, p.k), twell_of(p));
  std::vector<double> bound;
  const auto ref = ref::ffn_forward(in.x, in.w, {}, {}, &bound);
  // Per row: the error may not exceed what storing the activation in bf16 can cause (a rigorous
  // bound from the reference) plus fp32 accumulation. Empty rows must be exactly zero.
  for (std::int64_t m = 0; m < p.m; ++m) {
    double err = 0, nrm = 0;
    for (std::int64_t k = 0; k < p.k; ++k) {
      const double r = ref[static_cast<std::size_t>(m * p.k + k)];
      const double d = y[static_cast<std::size_t>(m * p.k + k)] - r;
      err += d * d;
      nrm += r * r;
    }
    ASSERT_FALSE(std::isnan(err)) << "row " << m << " has NaN (unwritten?)";
    ASSERT_LE(std::sqrt(err), bound[static_cast<std::size_t>(m)] + kFp32Tol * std::sqrt(nrm)) << "row " << m;
  }
  // And against the reference that rounds the activation like TwELL does: fp32-level agreement
  // everywhere except the rare element whose fp32 and fp64 values round to different bf16.
  ref::Options opt;
  opt.round_activation_bf16 = true;
  const auto ref_rounded = ref::ffn_forward(in.x, in.w, {}, opt);
  EXPECT_LE(test::rel_err(y, ref_rounded), 1e-3);
  EXPECT_EQ(info.stats.rows, p.m);
}

// The sparse FFN from a first GEMM's output computed by the caller (the runtime's decode steps
// compute it from bf16 weight copies): given the gate GEMM's own values, ffn_sparse's bits exactly,
// with the same TwELL statistics; a pre of the wrong shape is refused.
TEST_P(CpuFfn, SparseFromGateIsTheWholeOp) {
  const FfnCase& p = GetParam();
  Inputs in = make(p);
  const cpu::PreparedFfn prep = cpu::prepare_ffn(in.w);
  std::vector<float> pre(static_cast<std::size_t>(p.m * p.n));
  cpu::gemm(false, true, 1.0f, in.x, p.gated ? in.w.w_gate : in.w.w_up, 0.0f, MatrixF(pre.data(), p.m, p.n));
  std::vector<float> want = test::poisoned(static_cast<std::size_t>(p.m * p.k)), got = want;
  const auto a = cpu::ffn_sparse(in.x, prep, MatrixF(want.data(), p.m, p.k), twell_of(p));
  const auto b = cpu::ffn_sparse_from_gate(in.x, CMatrixF(pre.data(), p.m, p.n), prep, MatrixF(got.data(), p.m, p.k),
                                           twell_of(p));
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);
  EXPECT_EQ(a.stats.nnz, b.stats.nnz);
  EXPECT_EQ(a.stats.overflow_rows, b.stats.overflow_rows);
  EXPECT_THROW(cpu::ffn_sparse_from_gate(in.x, CMatrixF(pre.data(), p.m, p.n - 1), prep, MatrixF(got.data(), p.m, p.k)),
               Error);
}

TEST_P(CpuFfn, OverflowRowsAreExact) {
  // Force overflow with a tiny tile capacity and compare overflowed rows alone.
  const FfnCase& p = GetParam();
  Inputs in = make(p);
  const cpu::PreparedFfn prep = cpu::prepare_ffn(in.w);
  const TwellConfig tiny{16, 8};  // capacity 1 per 16 columns
  const TwellMatrix g = cpu::ffn_gate_twell(in.x, p.gated ? in.w.w_gate : in.w.w_up, tiny);
  ASSERT_NO_THROW(twell_validate(g));
  std::vector<float> y_tiny = test::poisoned(static_cast<std::size_t>(p.m * p.k));
  std::vector<float> y_wide = test::poisoned(static_cast<std::size_t>(p.m * p.k));
  cpu::ffn_sparse(in.x, prep, MatrixF(y_tiny.data(), p.m, p.k), tiny);
  cpu::ffn_sparse(in.x, prep, MatrixF(y_wide.data(), p.m, p.k), TwellConfig{256, 1});  // never overflows
  // The two configurations compute the same bf16 activations, so the results agree to fp32 rounding.
  std::vector<double> wide(y_wide.begin(), y_wide.end());
  EXPECT_LE(test::rel_err(y_tiny, wide), kFp32Tol);
  // The overflow list is exactly the rows with a tile of more than S − 1 = 1 active values (read
  // from the decoded activations), and these cases are dense enough that some row overflows
  // unless the drawn rows happen to be sparse (a single row of the log-normal spread may be).
  std::vector<float> dec(static_cast<std::size_t>(p.m * p.n));
  twell_decode(g, MatrixF(dec.data(), p.m, p.n));
  std::vector<std::int64_t> expected;
  for (std::int64_t r = 0; r < p.m; ++r) {
    bool over = false;
    for (std::int64_t t0 = 0; t0 < p.n && !over; t0 += tiny.tile) {
      int cnt = 0;
      for (std::int64_t c = t0; c < std::min(p.n, t0 + tiny.tile); ++c) cnt += dec[static_cast<std::size_t>(r * p.n + c)] != 0.0f;
      over = cnt > tiny.words_per_tile() - 1;
    }
    if (over) expected.push_back(r);
  }
  EXPECT_EQ(g.overflow_rows, expected);
  if (p.density >= 0.05 && p.m >= 7) {
    EXPECT_GT(g.overflow_rows.size(), 0u);
  }
}

// Every case of the shared table (bench/ffn/ffn_cases.hpp) that runs on the CPU.
std::vector<FfnCase> cpu_cases() {
  std::vector<FfnCase> v;
  for (FfnCase& c : test::ffn_cases())
    if (c.cpu) v.push_back(std::move(c));
  return v;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuFfn, ::testing::ValuesIn(cpu_cases()),
                         [](const ::testing::TestParamInfo<FfnCase>& i) { return i.param.name; });

TEST(CpuFfnEdges, AllZeroAndAllActiveRows) {
  // Hand-built inputs: row 0 activates nothing (gate < 0 everywhere), row 1 activates every neuron.
  const std::int64_t M = 3, K = 4, N = 300;
  test::Rng rng(test::fresh_seed());
  std::vector<float> x = {1, 0, 0, 0, /**/ 0, 1, 0, 0, /**/ 0.5f, 0.5f, 0.3f, -0.2f};
  std::vector<float> wg(static_cast<std::size_t>(N * K)), wu = test::random_matrix(rng, N, K), wd = test::random_matrix(rng, K, N);
  for (std::int64_t n = 0; n < N; ++n) {
    wg[static_cast<std::size_t>(n * K + 0)] = -1.0f - static_cast<float>(rng.uniform());  // row 0: all negative
    wg[static_cast<std::size_t>(n * K + 1)] = 0.5f + static_cast<float>(rng.uniform());   // row 1: all positive
    wg[static_cast<std::size_t>(n * K + 2)] = rng.normal();
    wg[static_cast<std::size_t>(n * K + 3)] = rng.normal();
  }
  FfnWeights w{CMatrixF(wg.data(), N, K), CMatrixF(wu.data(), N, K), CMatrixF(wd.data(), K, N)};
  const auto prep = cpu::prepare_ffn(w);
  std::vector<float> y = test::poisoned(static_cast<std::size_t>(M * K));
  const auto info = cpu::ffn_sparse(CMatrixF(x.data(), M, K), prep, MatrixF(y.data(), M, K));
  EXPECT_EQ(info.stats.empty_rows, 1);
  EXPECT_EQ(info.stats.max_row_nnz, N);
  EXPECT_GE(info.stats.overflow_rows, 1);
  for (std::int64_t k = 0; k < K; ++k) EXPECT_EQ(y[static_cast<std::size_t>(k)], 0.0f);  // exactly zero
  ref::Options opt;
  opt.round_activation_bf16 = true;
  const auto ref = ref::ffn_forward(CMatrixF(x.data(), M, K), w, {}, opt);
  EXPECT_LE(test::rel_err(y, ref), 1e-3);
}

TEST(CpuFfnEdges, ShapeErrors) {
  std::vector<float> a(100, 1.0f);
  FfnWeights w{CMatrixF(a.data(), 5, 4), CMatrixF(a.data(), 5, 4), CMatrixF(a.data(), 4, 5)};
  std::vector<float> y(100);
  EXPECT_THROW(cpu::ffn_dense(CMatrixF(a.data(), 2, 3), w, MatrixF(y.data(), 2, 3)), Error);  // K mismatch
  FfnWeights bad_down = w;
  bad_down.w_down = CMatrixF(a.data(), 5, 4);  // [N, K] instead of [K, N]
  EXPECT_THROW(cpu::ffn_dense(CMatrixF(a.data(), 2, 4), bad_down, MatrixF(y.data(), 2, 4)), Error);
  FfnWeights bad_gate = w;
  bad_gate.w_gate = CMatrixF(a.data(), 6, 4);
  EXPECT_THROW(cpu::prepare_ffn(bad_gate), Error);
  EXPECT_THROW(cpu::ffn_dense(CMatrixF(a.data(), 2, 4), w, MatrixF(y.data(), 3, 4)), Error);  // y shape
}

}  // namespace
