// CUDA training step (forward + backward) vs the CPU oracle, for the sparse path (CSR) and the
// dense cuBLASLt path, over shapes that hit the edges: one row, N not a multiple of 8 or of the
// tile, K = 520, N = 70000, M above 65536, empty rows, all-active rows, all-active and hot neurons,
// hot rows, density 0 and 20 %, gated and non-gated.
//
// Oracles: twell::ref::ffn_train (float64) where M·N·K is small; elsewhere the CPU sparse training
// path (fp32 accumulation, itself checked against float64 to 1e-4 by test_cpu_train).
//
// Tolerance: relative Frobenius error ≤ 1e-2 for y, dx and every weight gradient. Inputs are
// bf16-exact, so the GPU differs from the oracle by fp32 accumulation (~1e-6) and by bf16 storage:
// sparse path: g and y/dx rounded once (≤ 2⁻⁹ each); dense path: g, u, h, dh, dg, du rounded
// (≤ 2⁻⁹ each, independent signs) — a few 1e-3 over a matrix.
// The ReLU pattern itself must agree exactly: a gate value within the fp32 rounding noise of 0 that
// lands on different sides of the ReLU changes dx and dWg by a whole term, 1/√nnz of their norm
// (5e-3 at nnz = 30k — the size of the tolerance). The cases therefore use exact_preactivation
// inputs (cuda_test_util.hpp), on which every backend computes the ReLU inputs exactly, so the
// pattern, the nnz count and l0 must match the oracle exactly. A missing or wrong entry, a NaN, an
// unwritten row or a dropped token changes a norm by orders of magnitude more. Rows forced
// inactive must come back exactly zero.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <ostream>
#include <random>
#include <vector>

#include "cuda/ffn_context.hpp"
#include "cuda/sm90/gate_pack.hpp"
#include "cuda/train/train_context.hpp"
#include "cuda_test_util.hpp"
#include "twell/cpu/ffn_ops.hpp"
#include "twell/cpu/reference.hpp"

namespace twell::cuda::test {
namespace {

constexpr double kTol = 1e-2;

// The training cases of the shared table (bench/ffn/ffn_cases.hpp).
using TrainCase = ::twell::test::FfnTrainCase;

struct Out {
  std::vector<float> y, dx, dwg, dwu, dwd;
  FfnTrainScalars s;
};

double frob_err(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += b[i] * b[i];
  }
  if (den == 0) return num == 0 ? 0.0 : INFINITY;
  return std::sqrt(num / den);
}

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

Out alloc(std::int64_t m, std::int64_t k, std::int64_t n) {
  Out o;
  o.y.assign(static_cast<std::size_t>(m * k), NAN);
  o.dx.assign(static_cast<std::size_t>(m * k), NAN);
  o.dwg.assign(static_cast<std::size_t>(n * k), NAN);
  o.dwu.assign(static_cast<std::size_t>(n * k), NAN);
  o.dwd.assign(static_cast<std::size_t>(k * n), NAN);
  return o;
}

FfnGrads grads_of(Out& o, std::int64_t m, std::int64_t k, std::int64_t n) {
  return FfnGrads{MatrixF(o.dx.data(), m, k), MatrixF(o.dwg.data(), n, k), MatrixF(o.dwu.data(), n, k),
                  MatrixF(o.dwd.data(), k, n)};
}

class CudaTrain : public ::testing::TestWithParam<TrainCase> {};

// Two steps' outputs are the same bits: y, dx and every weight gradient.
void expect_same_bits(const Out& a, const Out& b, bool gated, const char* what) {
  const auto same = [](const std::vector<float>& u, const std::vector<float>& v) {
    return u.size() == v.size() && std::memcmp(u.data(), v.data(), u.size() * sizeof(float)) == 0;
  };
  EXPECT_TRUE(same(a.y, b.y)) << "y: " << what;
  EXPECT_TRUE(same(a.dx, b.dx)) << "dx: " << what;
  EXPECT_TRUE(same(a.dwu, b.dwu)) << "dw_up: " << what;
  EXPECT_TRUE(same(a.dwd, b.dwd)) << "dw_down: " << what;
  if (gated) {
    EXPECT_TRUE(same(a.dwg, b.dwg)) << "dw_gate: " << what;
  }
}

TEST_P(CudaTrain, MatchesOracle) {
  TWELL_REQUIRE_GPU();
  const TrainCase& c = GetParam();
  const FfnData d = make_ffn(c.f);
  const std::int64_t M = d.m, K = d.k, N = d.n;
  const std::vector<float> dy = ::twell::test::make_dy(c.f);
  const CMatrixF xv = d.xv(), dyv(dy.data(), M, K);
  const FfnWeights w = d.weights();

  // The oracle.
  ref::TrainResult r;
  if (c.fp64_oracle) {
    r = ref::ffn_train(xv, dyv, w, c.l1_coeff);
  } else {
    Out o = alloc(M, K, N);
    const cpu::PreparedFfn prep = cpu::prepare_ffn(w);
    const cpu::TrainState st = cpu::ffn_train_forward(xv, prep, MatrixF(o.y.data(), M, K));
    cpu::ffn_train_backward(xv, dyv, prep, st, c.l1_coeff, grads_of(o, M, K, N));
    r.y = widen(o.y);
    r.dx = widen(o.dx);
    if (d.gated) r.dw_gate = widen(o.dwg);
    r.dw_up = widen(o.dwu);
    r.dw_down = widen(o.dwd);
    r.l1 = st.scalars.l1;
    r.l0 = st.scalars.l0;
  }

  // Every path, then the sparse step with the weight-gradient knobs at their edges: many token
  // blocks (a tiny L2 budget) and one entry per work item (the nnz / 8192 floor still applies).
  // Hot neurons: calibrated by the step itself (from M = 4096), none, every third neuron, or all
  // of them (the CSR then holds nothing).
  enum class Hot { automatic, none, third, all };
  struct Run {
    const char* name;
    Path path;
    double l2_fraction;
    std::int64_t run;
    Hot hot = Hot::automatic;
    int token_min_blocks = 6;  // the default build
    bool gate_sm90 = true;     // the sm90 TwELL gate where it can serve (TrainContextOptions::gate_sm90)
  };
  const Run runs[] = {{"sparse", Path::sparse, 0.6, 0},
                      {"dense", Path::dense, 0.6, 0},
                      {"automatic", Path::automatic, 0.6, 0},
                      {"sparse, weight-gradient knobs at their edges, token kernels without a register bound, cuBLASLt gate",
                       Path::sparse, 0.001, 1, Hot::automatic, 0, false},
                      // No calibration: the TwELL gate serves the first step; above the dispatch
                      // threshold the step then computes the dense gate once more.
                      {"automatic, no hot neurons", Path::automatic, 0.6, 0, Hot::none},
                      {"sparse, no hot neurons, no dense rows", Path::sparse, 0.6, 0, Hot::none},
                      {"sparse, every third neuron dense, knobs at their edges, token kernels for 8 blocks/SM", Path::sparse,
                       0.001, 1, Hot::third, 8},
                      {"sparse, every neuron dense", Path::sparse, 0.6, 0, Hot::all}};
  const bool hopper = gate_pack_sm90_available(0);
  for (const Run& run : runs) {
    const Path path = run.path;
    SCOPED_TRACE(run.name);
    Out o = alloc(M, K, N);
    TrainOptions opt;
    opt.path = path;
    opt.weight_grad_l2_fraction = run.l2_fraction;
    opt.weight_grad_run = run.run;
    opt.token_min_blocks = run.token_min_blocks;
    opt.gate_sm90 = run.gate_sm90;
    // Dense rows from one row on, except in the first run (the default minimum: small batches keep
    // their heavy rows in the CSR) and the run without them.
    opt.dense_rows = run.hot != Hot::none;
    opt.dense_rows_min = &run == &runs[0] ? 256 : 1;
    if (run.hot != Hot::automatic) {
      opt.hot_neurons.emplace();
      for (std::int64_t i = 0; i < N && run.hot != Hot::none; i += run.hot == Hot::third ? 3 : 1) opt.hot_neurons->push_back(i);
    }
    const TrainReport rep = ffn_train_host(xv, dyv, w, c.l1_coeff, MatrixF(o.y.data(), M, K), grads_of(o, M, K, N), opt);
    EXPECT_LE(frob_err(o.y, r.y), kTol) << "y";
    EXPECT_LE(frob_err(o.dx, r.dx), kTol) << "dx";
    if (d.gated) {
      EXPECT_LE(frob_err(o.dwg, r.dw_gate), kTol) << "dw_gate";
    }
    EXPECT_LE(frob_err(o.dwu, r.dw_up), kTol) << "dw_up";
    EXPECT_LE(frob_err(o.dwd, r.dw_down), kTol) << "dw_down";
    EXPECT_NEAR(rep.scalars.l1, r.l1, kTol * std::max(r.l1, 1e-30)) << "l1";
    const double nnz_ref = std::round(r.l0 * static_cast<double>(M));
    EXPECT_EQ(std::round(rep.scalars.l0 * static_cast<double>(M)), nnz_ref) << "l0";
    const bool ran_sparse = rep.path.rfind("twell sparse", 0) == 0;
    if (path != Path::automatic) {
      EXPECT_EQ(ran_sparse, path == Path::sparse) << rep.path;
    }
    // On Hopper the TwELL gate serves every sparse step it can: no calibration due (an explicit
    // hot set, or M below its minimum) and the hot columns gathered by the count (≤ 2048 of them).
    if (ran_sparse && hopper && run.gate_sm90 && (opt.hot_neurons || M < 4096) &&
        (!opt.hot_neurons || opt.hot_neurons->size() <= 2048)) {
      EXPECT_NE(rep.path.find("TwELL"), std::string::npos) << rep.path;
    }
    if (ran_sparse && !run.gate_sm90) {
      EXPECT_EQ(rep.path.find("TwELL"), std::string::npos) << rep.path;
    }
    if (opt.hot_neurons && ran_sparse) {
      EXPECT_EQ(rep.hot_neurons, static_cast<std::int64_t>(opt.hot_neurons->size())) << "hot neurons used";
    }
    if (!ran_sparse || (M < 4096 && !opt.hot_neurons)) {
      EXPECT_EQ(rep.hot_neurons, 0) << "hot neurons calibrated below their minimum M or used by the dense path";
    }
    if (path == Path::sparse) {
      EXPECT_EQ(static_cast<double>(rep.nnz), nnz_ref) << "nnz";
      // Deterministic: a second step gives the same bits (split neurons add partials in order).
      if (M <= 16384) {
        Out o2 = alloc(M, K, N);
        ffn_train_host(xv, dyv, w, c.l1_coeff, MatrixF(o2.y.data(), M, K), grads_of(o2, M, K, N), opt);
        expect_same_bits(o2, o, d.gated, "a second step (determinism)");
      }
      // Saved state: offsets + per non-zero col, p (and u), plus [g | u] (or h) of the hot
      // columns: never a dense [M, N] tensor unless every neuron is hot.
      const double per_nnz = d.gated ? 10.0 : 6.0;
      // Dense rows: flags, their list and [g | u] (or h) over every neuron.
      const double hot_cols = static_cast<double>((rep.hot_neurons + 7) / 8 * 8) * (d.gated ? 2.0 : 1.0);
      const double row_bytes = 4.0 + 2.0 * static_cast<double>((N + 7) / 8 * 8) * (d.gated ? 2.0 : 1.0);
      EXPECT_LE(static_cast<double>(rep.saved_bytes),
                8.0 * static_cast<double>(M + 1) + per_nnz * static_cast<double>(rep.nnz) + 2.0 * static_cast<double>(M) * hot_cols +
                    static_cast<double>(M) + row_bytes * static_cast<double>(rep.dense_rows));
      if (!opt.dense_rows) {
        EXPECT_EQ(rep.dense_rows, 0);
      }
      if (opt.dense_rows && opt.dense_rows_min <= c.f.full_rows && run.hot != Hot::all) {  // all hot: no cold non-zeros
        EXPECT_GE(rep.dense_rows, c.f.full_rows) << "all-active rows run dense";
      }
    }
    // Rows forced inactive (zero_rows, right after row 0) are exactly zero in y and dx.
    for (int i = 1; i <= c.f.zero_rows && i < M; ++i)
      for (std::int64_t kk = 0; kk < K; ++kk) {
        ASSERT_EQ(o.y[static_cast<std::size_t>(i * K + kk)], 0.0f) << "y row " << i;
        ASSERT_EQ(o.dx[static_cast<std::size_t>(i * K + kk)], 0.0f) << "dx row " << i;
      }
    if (c.f.density == 0 && c.f.full_rows == 0 && c.f.full_cols == 0 && c.f.hot_rows == 0 && c.f.hot_neurons == 0) {
      for (float v : o.y) ASSERT_EQ(v, 0.0f);
      for (float v : o.dwu) ASSERT_EQ(v, 0.0f);
      for (float v : o.dwd) ASSERT_EQ(v, 0.0f);
    }
  }
}

// Tuning knobs out of their range are refused when the context is made, not run as something else.
TEST(CudaTrainOptions, RejectsUnbuiltKernelVariants) {
  TWELL_REQUIRE_GPU();
  for (int mb : {-1, 1, 5, 7, 16}) {
    TrainContextOptions o;
    o.token_min_blocks = mb;
    EXPECT_THROW(TrainContext ctx(o), Error) << "token_min_blocks " << mb;
  }
  for (int v : {-1, 5}) {
    ContextOptions o;
    o.updown_variant = v;
    EXPECT_THROW(FfnContext ctx(o), Error) << "updown_variant " << v;
    ContextOptions n;
    n.updown_variant_nongated = v;
    EXPECT_THROW(FfnContext ctx(n), Error) << "updown_variant_nongated " << v;
  }
}

// The hot-neuron choice rule and explicit sets (the outputs with hot neurons are checked in every
// CudaTrain case).
TEST(CudaTrainHotNeurons, ChoiceRuleAndExplicitSets) {
  TWELL_REQUIRE_GPU();
  FfnCase f;
  f.name = "hot_rule";
  f.m = 8;
  f.n = 100;
  f.k = 64;
  const FfnData d = make_ffn(f);
  TrainContextOptions o;
  o.hot_neurons_density = 0.1;
  o.hot_neurons_max_share = 0.25;
  TrainContext ctx(o);
  ctx.upload_weights(d.weights(), nullptr);
  EXPECT_FALSE(ctx.hot_calibrated());
  std::vector<std::uint32_t> counts(100);
  for (std::size_t i = 0; i < counts.size(); ++i) counts[i] = i % 10 == 0 ? 50 : 10;  // limit 0.1 · 100 = 10
  std::vector<std::int64_t> want;
  for (std::int64_t i = 0; i < 100; i += 10) want.push_back(i);
  EXPECT_EQ(ctx.choose_hot_neurons(counts, 100), want);
  for (std::size_t i = 0; i < counts.size(); ++i) counts[i] = static_cast<std::uint32_t>(i);  // 89 > 25 % of N
  EXPECT_TRUE(ctx.choose_hot_neurons(counts, 100).empty());
  EXPECT_THROW(ctx.choose_hot_neurons(std::vector<std::uint32_t>(99), 100), Error);
  o.hot_neurons_density = 0;  // off
  TrainContext off(o);
  off.upload_weights(d.weights(), nullptr);
  EXPECT_TRUE(off.choose_hot_neurons(std::vector<std::uint32_t>(100, 100), 100).empty());

  ctx.set_hot_neurons({99, 5, 3, 5}, nullptr);  // any order, duplicates ignored
  EXPECT_EQ(ctx.hot_neurons(), (std::vector<std::int64_t>{3, 5, 99}));
  EXPECT_EQ(ctx.hot_count(), 3);
  EXPECT_TRUE(ctx.hot_calibrated());
  EXPECT_THROW(ctx.set_hot_neurons({100}, nullptr), Error);
  EXPECT_THROW(ctx.set_hot_neurons({-1}, nullptr), Error);
  ctx.upload_weights(d.weights(), nullptr);  // same shape: the set stays
  EXPECT_EQ(ctx.hot_count(), 3);
  f.n = 101;
  ctx.upload_weights(make_ffn(f).weights(), nullptr);  // another shape: cleared
  EXPECT_EQ(ctx.hot_count(), 0);
  EXPECT_FALSE(ctx.hot_calibrated());
}

// Calibration counts neurons over the rows that stay sparse: a token that runs as a dense row
// makes every neuron it fires look popular, and a neuron popular only there belongs in the CSR.
// On make_calibration_gate() (g exact in bf16 and fp32), threshold 3 % (count > 15.36): over every
// row, neurons 0..90 qualify (more than half of N: alone, the max-share rule would choose none);
// the cold neurons 91..99 then make rows 0..9 dense rows (cold count 9 > the cap ⌊0.02 · 9⌋ = 0),
// and counted without them only 60..90 stay hot. In the step itself rows 0..19 run dense (60 +
// their cold neurons > ⌊0.02 · 69⌋ = 1).
TEST(CudaTrainHotNeurons, CalibrationLeavesOutDenseRows) {
  TWELL_REQUIRE_GPU();
  const CalibrationGate gate = make_calibration_gate();
  constexpr std::int64_t M = CalibrationGate::M, K = CalibrationGate::K;
  const std::vector<float>& x = gate.x;
  const std::vector<float> dy(M * K, 0.0f);
  const FfnWeights w = gate.weights();
  const ref::TrainResult r = ref::ffn_train({x.data(), M, K}, {dy.data(), M, K}, w, 0.0);

  std::vector<std::uint16_t> xb(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) xb[i] = to_bf16(x[i]).bits;
  DeviceBuffer<__nv_bfloat16> xd(xb.size()), yd(xb.size());
  ASSERT_EQ(cudaMemcpy(xd.get(), xb.data(), xb.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  auto calibrate = [&](double dense_rows_density, double max_share, std::int64_t* rows_dense, std::vector<float>* y) {
    TrainContextOptions o;
    o.hot_neurons_min_rows = 1;
    o.hot_neurons_density = 0.03;
    o.hot_neurons_max_share = max_share;
    o.dense_rows_density = dense_rows_density;
    o.dense_rows_min = 1;
    TrainContext ctx(o);
    ctx.upload_weights(w, nullptr);
    const TrainForwardResult fr = ctx.forward(xd.get(), M, yd.get(), Path::sparse, nullptr);
    EXPECT_TRUE(fr.sparse);
    *rows_dense = fr.dense_rows;
    std::vector<std::uint16_t> yb(xb.size());
    EXPECT_EQ(cudaMemcpy(yb.data(), yd.get(), yb.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    y->resize(yb.size());
    for (std::size_t i = 0; i < yb.size(); ++i) (*y)[i] = to_float(bf16{yb[i]});
    return ctx.hot_neurons();
  };
  std::vector<std::int64_t> want;
  for (std::int64_t i = 60; i <= 90; ++i) want.push_back(i);
  std::int64_t rows = -1;
  std::vector<float> y;
  EXPECT_EQ(calibrate(0.02, 0.5, &rows, &y), want);
  EXPECT_EQ(rows, 20);
  EXPECT_LE(frob_err(y, r.y), kTol) << "y";
  for (std::int64_t i = 0; i < 60; ++i) want.insert(want.begin() + i, i);  // without dense rows: 0..90
  EXPECT_EQ(calibrate(0.0, 1.0, &rows, &y), want);
  EXPECT_EQ(rows, 0);
  EXPECT_LE(frob_err(y, r.y), kTol) << "y";
  EXPECT_TRUE(calibrate(0.0, 0.5, &rows, &y).empty());  // 91 of 100 > half
  EXPECT_LE(frob_err(y, r.y), kTol) << "y";
}

// The weight-gradient pass plan (host arithmetic; runs without a GPU): 512-column slices while
// x and dy of all rows fit the L2 budget, then 256-column slices and token blocks of whole
// 256-row multiples (at least 1024 rows), never wider than K.
TEST(WeightGradPasses, SlicesThenBlocksWithinTheBudget) {
  const std::int64_t l2 = 50 << 20;
  WeightGradPasses p = weight_grad_passes(4096, 2048, l2, 0.6);  // 4·4096·512 = 8 MB ≤ 30 MB
  EXPECT_EQ(p.slice_cols, 512);
  EXPECT_EQ(p.block_rows, 4096);
  p = weight_grad_passes(16384, 2048, l2, 0.6);  // 32 MB > 30 MB: 256 columns, all rows fit
  EXPECT_EQ(p.slice_cols, 256);
  EXPECT_EQ(p.block_rows, 16384);
  p = weight_grad_passes(131072, 2048, l2, 0.6);  // blocks of 30 MB / 1 KB per row
  EXPECT_EQ(p.slice_cols, 256);
  EXPECT_EQ(p.block_rows, static_cast<std::int64_t>(0.6 * static_cast<double>(l2)) / (4 * 256) / 256 * 256);
  EXPECT_LT(p.block_rows, 131072);
  p = weight_grad_passes(7, 520, l2, 0.6);  // narrow K: one slice of K... capped at 512
  EXPECT_EQ(p.slice_cols, 512);
  EXPECT_EQ(p.block_rows, 7);
  p = weight_grad_passes(7, 136, l2, 0.6);
  EXPECT_EQ(p.slice_cols, 136);
  p = weight_grad_passes(1 << 20, 2048, l2, 0.001);  // tiny budget: blocks never below 1024 rows
  EXPECT_EQ(p.block_rows, 1024);
  p = weight_grad_passes(1 << 20, 2048, l2, 0.0);  // 0: widest slices, one block
  EXPECT_EQ(p.slice_cols, 512);
  EXPECT_EQ(p.block_rows, 1 << 20);
  // The default budget (0.7 since the thirteenth session): the H100's 50 MB L2 takes the
  // 512-column slices at M = 16384 (32 MB ≤ 35 MB), as 0.6 of the H200's 60 MB did.
  const double def = TrainContextOptions{}.weight_grad_l2_fraction;
  p = weight_grad_passes(16384, 2048, l2, def);
  EXPECT_EQ(p.slice_cols, 512);
  EXPECT_EQ(p.block_rows, 16384);
  p = weight_grad_passes(16384, 2048, std::int64_t{60} << 20, def);
  EXPECT_EQ(p.slice_cols, 512);
  EXPECT_EQ(p.block_rows, 16384);
}

std::vector<TrainCase> cuda_train_cases() {
  std::vector<TrainCase> v;
  for (TrainCase& c : ::twell::test::ffn_train_cases())
    if (c.f.cuda) v.push_back(std::move(c));
  return v;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaTrain, ::testing::ValuesIn(cuda_train_cases()),
    [](const ::testing::TestParamInfo<TrainCase>& i) { return i.param.f.name; });

}  // namespace
}  // namespace twell::cuda::test
