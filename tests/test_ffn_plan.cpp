// The CUDA FFN's dispatch plan (src/cuda/ffn_plan.hpp): pure host rules, checked on every machine.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/ffn_plan.hpp"

namespace twell::cuda {
namespace {

DispatchState call(std::int64_t m, Path path, double last = -1, bool decode = false, bool gated = true,
                   std::int64_t dense_calls = 0) {
  return {.m = m, .path = path, .decode = decode, .gated = gated, .last_density = last, .dense_calls = dense_calls};
}

TEST(FfnPlan, AskedPathsRunAsAskedAndCountNothing) {
  const DispatchPolicy p;
  for (const std::int64_t m : {1, 64, 2048, 16384}) {
    const ForwardPlan d = plan_forward(p, call(m, Path::dense, 0.001));
    EXPECT_EQ(d.step, ForwardStep::dense);
    EXPECT_FALSE(d.counts);
    const ForwardPlan s = plan_forward(p, call(m, Path::sparse, 0.5));
    EXPECT_EQ(s.step, ForwardStep::sparse);
    EXPECT_FALSE(s.counts);
    EXPECT_FALSE(s.sticky);
  }
}

TEST(FfnPlan, SmallCallsRunDenseWithoutCountingExceptDecode) {
  const DispatchPolicy p;
  const ForwardPlan small = plan_forward(p, call(p.dispatch_min_rows - 1, Path::automatic, 0.001));
  EXPECT_EQ(small.step, ForwardStep::dense);
  EXPECT_TRUE(small.below_min_rows);
  EXPECT_FALSE(small.counts);
  // Decode sizes are below the minimum too, but run the decode kernel from the first call.
  const ForwardPlan first = plan_forward(p, call(1, Path::automatic, -1, true));
  EXPECT_EQ(first.step, ForwardStep::decode);
  EXPECT_TRUE(first.counts);
  EXPECT_TRUE(first.sticky);
  EXPECT_EQ(plan_forward(p, call(1, Path::automatic, p.decode_max_density, true)).step, ForwardStep::decode);
  const ForwardPlan dense = plan_forward(p, call(1, Path::automatic, p.decode_max_density * 1.01, true));
  EXPECT_EQ(dense.step, ForwardStep::dense_counted);  // the first dense call counts
}

// One token on the fused one-token kernel keeps the decode path up to its own, higher threshold
// (measured at model level: docs/engine.md); other decode sizes switch at decode_max_density.
TEST(FfnPlan, OneTokenDecodeHasItsOwnThreshold) {
  const DispatchPolicy p;
  ASSERT_GT(p.decode_token_max_density, p.decode_max_density);
  const double between = 0.5 * (p.decode_max_density + p.decode_token_max_density);
  DispatchState one = call(1, Path::automatic, between, true);
  one.one_token = true;
  EXPECT_EQ(plan_forward(p, one).step, ForwardStep::decode);
  EXPECT_DOUBLE_EQ(plan_forward(p, one).max_density, p.decode_token_max_density);
  EXPECT_EQ(plan_forward(p, call(4, Path::automatic, between, true)).step, ForwardStep::dense_counted);
  EXPECT_EQ(plan_forward(p, call(1, Path::automatic, between, true)).step, ForwardStep::dense_counted);  // not fused
  one.last_density = p.decode_token_max_density * 1.01;
  EXPECT_EQ(plan_forward(p, one).step, ForwardStep::dense_counted);
}

TEST(FfnPlan, FirstCallCountsThenTheNewestCountDecides) {
  const DispatchPolicy p;
  const ForwardPlan first = plan_forward(p, call(16384, Path::automatic));
  EXPECT_EQ(first.step, ForwardStep::first_call);
  EXPECT_TRUE(first.counts);
  EXPECT_DOUBLE_EQ(first.max_density, p.max_sparse_density_gated);
  const ForwardPlan sparse = plan_forward(p, call(16384, Path::automatic, p.max_sparse_density_gated));
  EXPECT_EQ(sparse.step, ForwardStep::sparse);
  EXPECT_TRUE(sparse.counts && sparse.sticky);
  EXPECT_EQ(plan_forward(p, call(16384, Path::automatic, p.max_sparse_density_gated * 1.001)).step,
            ForwardStep::dense_counted);
  // Without sticky dispatch every call counts on the device and waits.
  DispatchPolicy off = p;
  off.sticky_dispatch = false;
  EXPECT_EQ(plan_forward(off, call(16384, Path::automatic, 0.001)).step, ForwardStep::first_call);
}

TEST(FfnPlan, DenseCallsCountEveryPeriod) {
  const DispatchPolicy p;
  for (std::int64_t i = 0; i < 3 * p.dense_count_period; ++i) {
    const ForwardPlan d = plan_forward(p, call(16384, Path::automatic, 0.05, false, true, i));
    EXPECT_EQ(d.counts, i % p.dense_count_period == 0) << i;
    EXPECT_EQ(d.step, d.counts ? ForwardStep::dense_counted : ForwardStep::dense);
  }
  for (std::int64_t i = 0; i < 2 * p.decode_dense_count_period; ++i)
    EXPECT_EQ(plan_forward(p, call(4, Path::automatic, 0.05, true, true, i)).counts, i % p.decode_dense_count_period == 0);
  DispatchPolicy every = p;
  every.dense_count_period = 0;  // ≤ 1: every call counts
  EXPECT_TRUE(plan_forward(every, call(16384, Path::automatic, 0.05, false, true, 5)).counts);
}

TEST(FfnPlan, ThresholdsByShape) {
  const DispatchPolicy p;
  EXPECT_DOUBLE_EQ(max_sparse_density(p, 16384, false, true), p.max_sparse_density_gated);
  EXPECT_DOUBLE_EQ(max_sparse_density(p, p.dispatch_large_rows, false, true), p.max_sparse_density_gated_large);
  EXPECT_DOUBLE_EQ(max_sparse_density(p, p.dispatch_large_rows, false, false), p.max_sparse_density_nongated);
  EXPECT_DOUBLE_EQ(max_sparse_density(p, 1, true, false), p.decode_max_density);
  EXPECT_DOUBLE_EQ(max_sparse_density(p, 1, true, true, true), p.decode_token_max_density);
  // Non-gated at a density between its threshold and the gated one: dense there, sparse gated.
  const double d = 0.5 * (p.max_sparse_density_nongated + p.max_sparse_density_gated);
  EXPECT_EQ(plan_forward(p, call(16384, Path::automatic, d, false, false)).step, ForwardStep::dense_counted);
  EXPECT_EQ(plan_forward(p, call(16384, Path::automatic, d, false, true)).step, ForwardStep::sparse);
}

// A 2B-like gated layer (N 5632, K 2048) on an sm90 GPU, 512 hot neurons split off.
LayerFacts layer(std::int64_t hot_n = 512, bool gated = true) {
  return {.n = 5632, .hot_n = hot_n, .gated = gated, .decode_k = true, .token_k = true, .gate_sm90 = true,
          .gemv_max_rows = 16, .down_gemv_max_rows = 16};
}

// The shape of a call is every decision of its size and the layer, written out case by case from
// the policy's comments: decode sizes never split and never run dense rows; the hot split from
// hot_neurons_min_rows on; the gate kernel; the up+down variant by occupancy.
TEST(FfnPlan, ShapeOfACallFollowsItsSize) {
  const DispatchPolicy p;
  const CallShape one = shape_call(p, layer(), 1);
  EXPECT_TRUE(one.decode && one.one_token);
  EXPECT_EQ(one.sparse_n, 5632);
  EXPECT_FALSE(one.hot() || one.dense_rows || one.hot_overlap);
  const CallShape eight = shape_call(p, layer(), 8);
  EXPECT_TRUE(eight.decode);
  EXPECT_FALSE(eight.one_token);
  EXPECT_FALSE(eight.gate_gemv) << "decode_gemv_max_rows is 3: the cuBLASLt gate from 4 rows";
  EXPECT_TRUE(shape_call(p, layer(), 2).gate_gemv) << "2–3 rows: the gate on the GEMV";
  EXPECT_TRUE(shape_call(p, layer(), 3).gate_gemv);
  EXPECT_FALSE(shape_call(p, layer(), 4).gate_gemv);
  EXPECT_TRUE(eight.down_gemv) << "the dense down projection on the GEMV at 2–8 rows";
  EXPECT_FALSE(one.down_gemv) << "one row: not the tensor-core GEMV";
  EXPECT_TRUE(one.token_gemv) << "one row: the dense FFN on the one-token GEMV";
  EXPECT_FALSE(eight.token_gemv);
  EXPECT_TRUE(shape_call(p, layer(), 2).down_gemv);
  EXPECT_FALSE(shape_call(p, layer(), 9).down_gemv) << "9–16 rows: cuBLASLt (the GEMV's second token tile loses)";
  EXPECT_EQ(shape_call(p, layer(), p.decode_max_rows + 1).decode, false);
  // The union FFN where the layer allows it (LayerFacts::union_ffn): decode-sized from
  // union_min_rows (4) to union_max_rows (32), past decode_max_rows; below, the decode kernel.
  LayerFacts uni = layer();
  uni.union_max_rows = 64;
  EXPECT_FALSE(shape_call(p, uni, 3).union_ffn);
  EXPECT_TRUE(shape_call(p, uni, 3).decode);
  EXPECT_TRUE(shape_call(p, uni, 4).union_ffn);
  EXPECT_TRUE(shape_call(p, uni, 16).union_ffn);
  for (std::int64_t m = 2; m <= p.union_max_rows; ++m) {  // by default the union's gate is cuBLASLt's (the GEMV's loses there)
    const CallShape u = shape_call(p, uni, m);
    EXPECT_FALSE(u.union_ffn && u.gate_gemv) << m << " rows";
  }
  for (const std::int64_t m : {p.union_min_rows, p.union_max_rows}) {
    const CallShape u = shape_call(p, uni, m);
    EXPECT_TRUE(u.decode && u.union_ffn) << m << " rows";
    EXPECT_EQ(u.sparse_n, 5632) << "decode sizes never split";
    EXPECT_FALSE(u.dense_rows);
  }
  EXPECT_FALSE(shape_call(p, uni, p.union_max_rows + 1).decode);
  EXPECT_FALSE(shape_call(p, layer(), 17).decode) << "no union on the layer: 17 rows are not decode-sized";
  DispatchPolicy no_union = p;
  no_union.union_max_rows = 0;
  EXPECT_FALSE(shape_call(no_union, uni, 17).decode);
  no_union = p;
  no_union.union_min_rows = 0;  // 0: never
  EXPECT_FALSE(shape_call(no_union, uni, 17).union_ffn);
  DispatchPolicy from2 = p;
  from2.union_min_rows = 2;  // in place of the decode kernel from 2 rows; one row stays the one-token kernels'
  EXPECT_TRUE(shape_call(from2, uni, 2).decode && shape_call(from2, uni, 2).union_ffn);
  EXPECT_FALSE(shape_call(p, uni, 2).union_ffn);
  EXPECT_TRUE(shape_call(from2, uni, 1).one_token && !shape_call(from2, uni, 1).union_ffn);
  DispatchPolicy to64 = p;
  to64.union_max_rows = 64;
  EXPECT_TRUE(shape_call(to64, uni, 64).union_ffn);
  to64.union_max_rows = 65;
  EXPECT_FALSE(shape_call(to64, uni, 65).union_ffn) << "past what the layer's facts allow";
  EXPECT_TRUE(plan_call(p, uni, 24, Path::automatic, -1, 0).step == ForwardStep::decode) << "sparse from the first call";
  const CallShape mid = shape_call(p, layer(), 1024);  // above decode, below the split's minimum
  EXPECT_FALSE(mid.decode);
  EXPECT_EQ(mid.sparse_n, 5632);
  EXPECT_TRUE(mid.dense_rows);
  EXPECT_EQ(mid.gate, GateKernel::sm90);
  EXPECT_EQ(mid.updown_variant, 1) << "below updown_occupancy_min_rows: more rows in flight per warp";
  const CallShape big = shape_call(p, layer(), 16384);
  EXPECT_EQ(big.sparse_n, 5632 - 512);
  EXPECT_TRUE(big.hot() && big.hot_overlap && big.dense_rows);
  EXPECT_EQ(big.updown_variant, p.updown_variant);
  EXPECT_EQ(shape_call(p, layer(512, false), 16384).updown_variant, p.updown_variant_nongated);
  EXPECT_EQ(shape_call(p, layer(512, false), 1024).updown_variant, 0);
  // Off sm90: the cuBLASLt gate, in row chunks (one per 2048 rows, at most gate_chunks).
  LayerFacts lt = layer();
  lt.gate_sm90 = false;
  EXPECT_EQ(shape_call(p, lt, 2048).gate, GateKernel::lt);
  const CallShape chunked = shape_call(p, lt, 16384);
  EXPECT_EQ(chunked.gate, GateKernel::lt_chunked);
  EXPECT_EQ(chunked.gate_chunks, p.gate_chunks);
  DispatchPolicy no_sm90 = p;
  no_sm90.gate_sm90 = false;
  EXPECT_EQ(shape_call(no_sm90, layer(), 16384).gate, GateKernel::lt_chunked);
  // Each switch of the policy shows in the shape.
  DispatchPolicy q = p;
  q.dense_rows_density = 0;
  q.hot_overlap = false;
  q.decode_gemv_max_rows = 4;
  EXPECT_FALSE(shape_call(q, layer(), 16384).dense_rows);
  EXPECT_FALSE(shape_call(q, layer(), 16384).hot_overlap);
  EXPECT_TRUE(shape_call(q, layer(), 4).gate_gemv);
  EXPECT_FALSE(shape_call(q, layer(), 5).gate_gemv);
  q.down_gemv_max_rows = 0;
  EXPECT_FALSE(shape_call(q, layer(), 8).down_gemv);
  LayerFacts padded = layer();
  padded.down_gemv_max_rows = 0;  // N past the GEMV's reduction, or padded rows
  EXPECT_FALSE(shape_call(p, padded, 8).down_gemv);
  EXPECT_FALSE(shape_call(p, padded, 1).token_gemv) << "one row, padded: cuBLASLt";
  EXPECT_TRUE(shape_call(q, layer(), 1).token_gemv) << "down_gemv_max_rows (2–8 rows' tensor-core kernel) leaves one row alone";
  q.dense_token_gemv = false;
  EXPECT_FALSE(shape_call(q, layer(), 1).token_gemv);
  // The layer's K decides too: too wide for the decode kernels (or the GEMV), no decode shape.
  LayerFacts wide = layer();
  wide.decode_k = wide.token_k = false;
  wide.gemv_max_rows = 0;
  EXPECT_FALSE(shape_call(p, wide, 1).decode);
  EXPECT_FALSE(shape_call(p, wide, 1).one_token);
  EXPECT_FALSE(shape_call(q, wide, 1).gate_gemv);
  // No split chosen, or a "split" of every neuron: all neurons sparse.
  EXPECT_FALSE(shape_call(p, layer(0), 16384).hot());
  EXPECT_FALSE(shape_call(p, layer(5632), 16384).hot());
}

// plan_call is shape_call then plan_forward on the shape's decode facts.
TEST(FfnPlan, PlanCallCarriesTheShape) {
  const DispatchPolicy p;
  const ForwardPlan one = plan_call(p, layer(), 1, Path::automatic, -1, 0);
  EXPECT_EQ(one.step, ForwardStep::decode);
  EXPECT_TRUE(one.shape.one_token);
  const double between = 0.5 * (p.decode_max_density + p.decode_token_max_density);
  EXPECT_EQ(plan_call(p, layer(), 1, Path::automatic, between, 0).step, ForwardStep::decode);
  EXPECT_EQ(plan_call(p, layer(), 2, Path::automatic, between, 0).step, ForwardStep::dense_counted);
  const ForwardPlan big = plan_call(p, layer(), 16384, Path::automatic, 0.001, 0);
  EXPECT_EQ(big.step, ForwardStep::sparse);
  EXPECT_EQ(big.shape.sparse_n, 5632 - 512);
  EXPECT_TRUE(plan_call(p, layer(), 1024, Path::automatic, -1, 0).below_min_rows);
}

TrainDispatchState step(std::int64_t m, Path path, double last = -1, bool gated = true, bool hot_split = false) {
  return {.m = m, .path = path, .gated = gated, .last_density = last, .hot_split = hot_split};
}

TEST(TrainPlan, AskedPathsRunAsAsked) {
  const TrainDispatchPolicy p;
  for (const std::int64_t m : {1, 300, 4096, 16384}) {
    const TrainPlan d = plan_train_forward(p, step(m, Path::dense, 0.001));
    EXPECT_EQ(d.step, TrainStep::dense);
    EXPECT_FALSE(d.runs_sparse(0.0, 0)) << "dense asked: never the sparse step";
    EXPECT_FALSE(d.below_min_rows);
    // Sparse asked: counted (the CSR is sized by the count), and sparse whatever the density.
    const TrainPlan s = plan_train_forward(p, step(m, Path::sparse, 0.5));
    EXPECT_EQ(s.step, TrainStep::count);
    EXPECT_TRUE(s.runs_sparse(0.9, 1000));
  }
}

TEST(TrainPlan, AutomaticFollowsTheNewestCount) {
  const TrainDispatchPolicy p;
  const TrainPlan small = plan_train_forward(p, step(p.dispatch_min_rows - 1, Path::automatic, 0.001));
  EXPECT_EQ(small.step, TrainStep::dense);
  EXPECT_TRUE(small.below_min_rows);
  // No count yet, or one within the limit: count, then the count decides.
  for (const double last : {-1.0, 0.001, p.max_sparse_density_gated}) {
    const TrainPlan c = plan_train_forward(p, step(16384, Path::automatic, last));
    EXPECT_EQ(c.step, TrainStep::count) << last;
    EXPECT_DOUBLE_EQ(c.limit, p.max_sparse_density_gated);
    EXPECT_TRUE(c.runs_sparse(p.max_sparse_density_gated, 1000));
    EXPECT_FALSE(c.runs_sparse(p.max_sparse_density_gated * 1.001, 1000));
  }
  // Over the limit: dense, counting for the next step; with hot neurons split off the cold
  // neurons' measure needs the count, so the step counts instead.
  EXPECT_EQ(plan_train_forward(p, step(16384, Path::automatic, 0.02)).step, TrainStep::dense_counted);
  EXPECT_EQ(plan_train_forward(p, step(16384, Path::automatic, 0.02, true, true)).step, TrainStep::count);
  // The non-gated threshold.
  const TrainPlan ng = plan_train_forward(p, step(16384, Path::automatic, -1, false));
  EXPECT_DOUBLE_EQ(ng.limit, p.max_sparse_density_nongated);
  EXPECT_EQ(plan_train_forward(p, step(16384, Path::automatic, p.max_sparse_density_nongated * 1.01, false)).step,
            TrainStep::dense_counted);
}

TEST(TrainPlan, EntriesBeyondTheBackwardsIndicesRunDense) {
  const TrainPlan c = plan_train_forward(TrainDispatchPolicy{}, step(1 << 20, Path::automatic));
  EXPECT_TRUE(c.runs_sparse(0.001, kMaxSparseTrainNnz));
  EXPECT_FALSE(c.runs_sparse(0.001, kMaxSparseTrainNnz + 1));
  // A forced sparse step beyond them is refused by the context before anything is written.
  EXPECT_TRUE(plan_train_forward(TrainDispatchPolicy{}, step(1 << 20, Path::sparse)).runs_sparse(0.001, kMaxSparseTrainNnz + 1));
}

// The one-token kernel's neurons are reordered at steps 8, 16, …, 256, then every 256th step.
TEST(FfnPlan, DecodeReorderSchedule) {
  std::vector<std::int64_t> due;
  for (std::int64_t s = 0; s <= 1024; ++s)
    if (decode_reorder_due(s)) due.push_back(s);
  EXPECT_EQ(due, (std::vector<std::int64_t>{8, 16, 32, 64, 128, 256, 512, 768, 1024}));
  EXPECT_FALSE(decode_reorder_due(-256));
  EXPECT_TRUE(decode_reorder_due(std::int64_t{1} << 40));
  EXPECT_FALSE(decode_reorder_due((std::int64_t{1} << 40) + 1));
}

// describe_call: the text of each kind of call, from its record alone.
TEST(FfnPlan, DescribeCallNamesWhatRan) {
  CallRecord dense;
  dense.asked = Path::dense;
  dense.n = dense.sparse_n = 5632;
  EXPECT_EQ(describe_call(dense), "dense cublasLt");
  CallRecord small = dense;
  small.asked = Path::automatic;
  small.below_min_rows = true;
  EXPECT_EQ(describe_call(small), "dense cublasLt (M below the dispatch minimum)");
  CallRecord sticky = small;
  sticky.below_min_rows = false;
  sticky.sticky = true;
  sticky.step = ForwardStep::dense_counted;
  sticky.followed_density = 0.0123;
  EXPECT_EQ(describe_call(sticky), "dense cublasLt (the previous call measured 1.23% density)");
  sticky.followed_row_costs = true;
  sticky.row_cap = 112;
  sticky.row_cost = 84;
  EXPECT_EQ(describe_call(sticky),
            "dense cublasLt (the previous call measured a cost of 1.23% density, rows over 112 non-zeros at 84 each)");
  CallRecord one_row = dense;
  one_row.token_gemv = true;
  EXPECT_EQ(describe_call(one_row), "dense one-token GEMV");
  CallRecord few_rows = small;
  few_rows.down_gemv = true;
  EXPECT_EQ(describe_call(few_rows), "dense cublasLt + GEMV down (M below the dispatch minimum)");

  CallRecord decode = small;
  decode.below_min_rows = false;
  decode.step = ForwardStep::decode;
  decode.sticky = true;
  decode.one_token = true;
  EXPECT_EQ(describe_call(decode), "twell decode kernel, one token, gate fused in (no density measured yet)");
  decode.one_token = false;
  decode.followed_density = 0.005;
  EXPECT_EQ(describe_call(decode), "twell decode kernel (the previous call measured 0.50% density)");
  decode.gate_gemv = true;
  EXPECT_EQ(describe_call(decode), "twell decode kernel, GEMV gate (the previous call measured 0.50% density)");
  decode.union_ffn = true;
  EXPECT_EQ(describe_call(decode),
            "twell union FFN (GEMV gate; list, up, down on tensor cores) (the previous call measured 0.50% density)");
  decode.gate_gemv = false;
  EXPECT_EQ(describe_call(decode),
            "twell union FFN (cublasLt gate; list, up, down on tensor cores) (the previous call measured 0.50% density)");

  CallRecord sparse = small;
  sparse.below_min_rows = false;
  sparse.step = ForwardStep::sparse;
  sparse.asked = Path::sparse;
  sparse.gate_sm90 = true;
  EXPECT_EQ(describe_call(sparse), "twell: sm90 gate GEMM with TwELL epilogue, fused up+down");
  sparse.gated = false;
  sparse.gate_sm90 = false;
  sparse.sparse_n = 5600;
  EXPECT_EQ(describe_call(sparse), "twell: cublasLt up + pack, sparse down; 32 of 5632 neurons (the hot ones) dense");
  sparse.gated = true;
  sparse.row_cap = 112;
  sparse.dense_rows_capacity = 640;
  sparse.sticky = true;
  sparse.followed_density = 0.004;
  EXPECT_EQ(describe_call(sparse),
            "twell: cublasLt gate + pack, fused up+down; rows over 112 non-zeros dense (up to 640); 32 of 5632 "
            "neurons (the hot ones) dense (the previous call measured 0.40% density)");

  CallRecord first = small;
  first.below_min_rows = false;
  first.step = ForwardStep::first_call;
  EXPECT_EQ(describe_call(first), "twell gate + dense cublasLt up/down (density above threshold)");
  first.gated = false;
  EXPECT_EQ(describe_call(first), "twell up + dense cublasLt down (density above threshold)");
  first.sparse = true;
  first.gate_sm90 = true;
  EXPECT_EQ(describe_call(first), "twell: sm90 up GEMM with TwELL epilogue, sparse down");
}

}  // namespace
}  // namespace twell::cuda
