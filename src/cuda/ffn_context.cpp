#include "cuda/ffn_context.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <vector>

#include "cuda/common/check.hpp"
#include "cuda/common/weight_load.hpp"
#include "cuda/ops/gemv.hpp"
#include "cuda/ops/model_ops.hpp"
#include "cuda/sm80/twell_hot_neurons.hpp"
#include "cuda/sm90/gate_pack.hpp"
#include "cuda/sm90/union_ffn.hpp"
#include "twell/bf16.hpp"

namespace twell::cuda {

// measured(): a counted TwELL call's nnz, overflow tiles and overflow rows travel as the count
// ring's extra words, read from TwellCounters as three consecutive words.
static_assert(offsetof(TwellCounters, overflow_tiles) == offsetof(TwellCounters, nnz) + sizeof(unsigned long long) &&
                  offsetof(TwellCounters, overflow_rows) == offsetof(TwellCounters, nnz) + 2 * sizeof(unsigned long long) &&
                  CountRing::kExtraWords == 3,
              "TwellCounters' nnz, overflow_tiles, overflow_rows must be the count ring's three extra words");
namespace {

std::int64_t round_up(std::int64_t v, std::int64_t m) { return (v + m - 1) / m * m; }

}  // namespace

FfnContext::FfnContext(const ContextOptions& opt, std::shared_ptr<FfnWorkspace> ws)
    : opt_(opt), ws_(ws ? std::move(ws) : std::make_shared<FfnWorkspace>(opt.autotune_gemm)), gemm_(ws_->gemm), dispatch_(1), dispatch_host_(1), counters_(1), counters_host_(1),
      decode_nnz_(1), dense_stats_(1) {
  TWELL_CUDA_CHECK(cudaEventCreateWithFlags(&decided_, cudaEventDisableTiming));
  int dev = 0, sms = 0, optin = 0;
  TWELL_CUDA_CHECK(cudaGetDevice(&dev));
  TWELL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  TWELL_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  sm_count_ = sms;
  smem_optin_ = static_cast<std::size_t>(optin);
  gate_sm90_ok_ = gate_pack_sm90_available(dev);
  union_ok_ = union_ffn_available(dev);
  opt_.twell.validate();
  TWELL_CHECK(opt_.updown_variant >= 0 && opt_.updown_variant <= 4 && opt_.updown_variant_nongated >= 0 &&
                  opt_.updown_variant_nongated <= 4,
              ErrorCode::invalid_argument, "ContextOptions: up/down variants are 0..4 (got {} and {})", opt_.updown_variant,
              opt_.updown_variant_nongated);
  TWELL_CHECK(union_shape_ok(opt_.union_up_split, opt_.union_down_split, opt_.union_up_clusters), ErrorCode::invalid_argument,
              "ContextOptions: the union FFN's splits are 1, 2, 4 or 8 and its up clusters ≥ 0 (got {}, {} and {})",
              opt_.union_up_split, opt_.union_down_split, opt_.union_up_clusters);
  TWELL_CHECK(opt_.twell.tile == kTwellTile, ErrorCode::unsupported,
              "the CUDA TwELL path uses T = {} columns per tile (got T = {}); use the CPU path for other tiles",
              kTwellTile, opt_.twell.tile);
  TWELL_CHECK(opt_.twell.words_per_tile() <= 128, ErrorCode::unsupported,
              "the CUDA TwELL path needs C ≥ 2 (S ≤ 128); got C = {}", opt_.twell.compression);
}

FfnContext::~FfnContext() {
  if (decided_) cudaEventDestroy(decided_);
}

void FfnContext::reset_dispatch_state() {
  last_density_ = -1;
  last_active_ = -1;
  last_counted_ = {};
  dense_calls_ = 0;
  counts_.reset();
  hot_share_.reset();
  last_hot_share_ = -1;
  dense_cap_ = 0;
}

// The bookkeeping runs before the weights change, so that a load that fails halfway leaves no graph
// or workspace size believing the old weights are still there.
void FfnContext::upload_weights(const FfnWeights& w, cudaStream_t stream) {
  weights_changing(/*keep_measurements=*/false);  // a new layer: no density measured yet
  w_.upload(w, stream);
}

void FfnContext::load_weights(const DeviceFfnWeights& w, cudaStream_t stream) {
  // The same shape in the same neuron order (no hot split, whose densities were measured over
  // permuted neurons) keeps the dispatch's measurements: one optimizer step barely moves them.
  const bool same = !w_.empty() && (w.w_gate != nullptr) == w_.gated() && w.n == w_.n() && w.k == w_.k();
  weights_changing(same && order_.empty());
  w_.load(w, stream);
}

void FfnContext::weights_changing(bool keep_measurements) {
  ++weights_epoch_;  // buffers or their order change: graphs that captured this layer are stale
  if (!keep_measurements) reset_dispatch_state();
  hot_n_ = 0;  // the new weights in their own order; hot neurons are calibrated again when due
  order_.clear();
  w_hot_gu_.release();
  hot_calibrated_ = false;
  cap_m_ = 0;  // workspaces are sized again on next use (they only grow: nothing is reallocated for the same shape)
}

void FfnContext::check_m(std::int64_t m) const {
  TWELL_CHECK(!w_.empty(), ErrorCode::invalid_argument, "FfnContext: upload_weights() first");
  TWELL_CHECK(m >= 1, ErrorCode::invalid_argument, "FfnContext: M must be ≥ 1 (got {})", m);
  TWELL_CHECK(m <= 0x7fffffff, ErrorCode::unsupported, "FfnContext: M = {} too large", m);
}

bool FfnContext::needs_row_nnz() const noexcept {
  return opt_.dense_rows_density > 0;
}

void FfnContext::reserve(std::int64_t m) {
  check_m(m);
  // Every buffer below holds m rows' worth already (buffers only grow; a new shape resets cap_m_).
  // The early return also skips CUB's scratch-size query, ≈ 10 µs of host time, on every call.
  if (m <= cap_m_) return;
  // Grow-only: the workspace may be shared with layers of other shapes or larger calls.
  const auto um = static_cast<std::size_t>(m);
  ws_->g.reserve(um * static_cast<std::size_t>(ldn()));
  ws_->gu.reserve(um * static_cast<std::size_t>(2 * ldn()));
  ws_->h.reserve(um * static_cast<std::size_t>(ldn()));
  ws_->words.reserve(um * static_cast<std::size_t>(tiles() * words_per_tile()));
  ws_->row_ovf.reserve(um);
  if (needs_row_nnz()) ws_->row_nnz.reserve(um);
  if (opt_.dense_rows_density > 0) {
    ws_->dense_list.reserve(um + 1);
    ws_->row_dense.reserve(um);
    ws_->dense_temp.reserve(dense_rows_plan_temp_bytes(m));
  }
  cap_m_ = std::max(cap_m_, m);
}

void FfnContext::dense_forward(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, const CallShape& s,
                               cudaStream_t stream) {
  reserve(m);
  // h = ReLU(x · Wuᵀ), or [g | u] = x · [Wg; Wu]ᵀ (2·ldn outputs) then h = ReLU(g) ⊙ u.
  if (s.token_gemv) {
    // One row, on the one-token GEMV: its first weight window is read before a programmatic
    // launch's wait, the same ground as the decode gate's GEMV (decode_forward). Gated, its
    // epilogue also forms h from the [g | u] it stores (TwellGemvParams::h; the gated product's
    // bits, without its kernel); [g | u] stays for dense_forward_counted's sample.
    // act 0: ReLU, the engine's.
    TwellGemvParams gp = gated() ? gemv_gated_row(x, w_.gate_up(), ldn(), n(), k(), ws_->gu.get(), ws_->h.get(), 0)
                                 : gemv_rows(x, 1, w_.gate_up(), n(), k());
    if (!gated()) {
      gp.relu = true;
      gp.g = ws_->h.get();
    }
    gp.w_before_wait = true;
    launch_twell_gemv(gp, stream);
  } else if (!gated()) {
    gemm_.run({m, n(), k(), k(), k(), ldn(), GemmEpilogue::relu}, w_.gate_up(), x, ws_->h.get(), stream);
  } else {
    gemm_.run({m, 2 * ldn(), k(), k(), k(), 2 * ldn(), GemmEpilogue::none}, w_.gate_up(), x, ws_->gu.get(), stream);
    ops::gated_product(ws_->gu.get(), ws_->gu.get() + ldn(), 2 * ldn(), ws_->h.get(), ldn(), m, n(), 0, stream);
  }
  down_product(ws_->h.get(), m, y, s, stream);  // y = h · Wdᵀ
  dense_gate_rows_ = m;
}

void FfnContext::down_product(const __nv_bfloat16* h, std::int64_t m, __nv_bfloat16* y, const CallShape& s,
                              cudaStream_t stream, const DecodeTokenNorm* store) {
  TWELL_CHECK(!store || (m == 1 && s.token_gemv), ErrorCode::invalid_argument,
              "down_product: the residual store needs one row on the one-token GEMV");
  if (s.down_gemv || s.token_gemv) {  // Wd [K, N] unpadded (facts()): the GEMV's W with N as its reduction
    TwellGemvParams p = gemv_rows(h, m, w_.down(), k(), n());
    p.ld_x = ldn();
    p.g = y;
    p.w_before_wait = true;  // the model's weights (decode_forward's GEMV gate): h after the wait
    if (store) {  // each output column's lane stores r there before it writes y (y may be `first`)
      p.store_r = store->r;
      p.store_first = store->first;
      p.store_delta = store->delta;
    }
    launch_twell_gemv(p, stream);
    return;
  }
  gemm_.run({m, k(), n(), ldn(), ldn(), k(), GemmEpilogue::none}, w_.down(), h, y, stream);
}

void FfnContext::dense_gate_gemm(const __nv_bfloat16* x, std::int64_t m, cudaStream_t stream) {
  reserve(m);
  gemm_.run({m, n(), k(), k(), k(), ldn(), GemmEpilogue::none}, w_.gate_up(), x, ws_->g.get(), stream);
}

void FfnContext::gate_twell(const __nv_bfloat16* x, std::int64_t m, const CallShape& s, cudaStream_t stream) {
  const std::int64_t n = s.sparse_n;  // the hot neurons' gate is part of their dense GEMM
  if (s.gate == GateKernel::sm90) {
    gate_pack_sm90(x, m, n, stream);
    return;
  }
  if (s.gate == GateKernel::lt) {
    gate_gemm_cols(x, m, n, stream);
    pack_rows(0, m, n, nullptr, /*reset_counters=*/true, stream);
    return;
  }
  reserve(m);
  TWELL_CUDA_CHECK(cudaMemsetAsync(counters_.get(), 0, sizeof(TwellCounters), stream));
  const std::int64_t chunks = s.gate_chunks;
  const std::int64_t per = round_up((m + chunks - 1) / chunks, 128);  // whole 128-row GEMM tiles
  for (std::int64_t r0 = 0; r0 < m; r0 += per) {
    const std::int64_t rows = std::min(per, m - r0);
    gemm_.run({rows, n, k(), k(), k(), ldn(), GemmEpilogue::relu}, w_.gate_up(), x + r0 * k(), ws_->g.get() + r0 * ldn(), stream);
    // After this chunk's GEMM (and the counters' reset), beside the next chunk's GEMM.
    pack_rows(r0, rows, n, nullptr, /*reset_counters=*/false, pack_side_.fork(stream));
  }
  pack_side_.join(stream);
}

void FfnContext::gate_pack_sm90(const __nv_bfloat16* x, std::int64_t m, std::int64_t n, cudaStream_t stream) {
  reserve(m);
  GatePackParams p;
  p.x = x;
  p.w = w_.gate_up();  // rows [0, N): Wg (gated) or Wu (non-gated)
  p.m = m;
  p.n = n;
  p.k = k();
  p.words_per_tile = words_per_tile();
  p.words = ws_->words.get();
  p.row_overflow = ws_->row_ovf.get();
  p.row_nnz = needs_row_nnz() ? ws_->row_nnz.get() : nullptr;  // the split plan's and dense rows' input
  p.counters = counters_.get();
  p.gate = ws_->g.get();
  p.ld_gate = ldn();
  p.store_gate = opt_.gate_store_values;
  p.sm_count = sm_count_;
  p.cluster = opt_.gate_sm90_cluster;
  p.stage_stmatrix = opt_.gate_sm90_stmatrix;
  p.heavy_rows = opt_.gate_sm90_heavy_rows;
  p.word_masks = opt_.gate_sm90_word_masks;
  launch_twell_gate_pack_sm90(p, stream);
}

void FfnContext::gate_gemm(const __nv_bfloat16* x, std::int64_t m, cudaStream_t stream) { gate_gemm_cols(x, m, n(), stream); }

void FfnContext::gate_gemm_cols(const __nv_bfloat16* x, std::int64_t m, std::int64_t n, cudaStream_t stream) {
  reserve(m);
  // ReLU in the GEMM epilogue: g ≥ 0 in the buffer, so the overflow backup and dense_rest read it as is.
  gemm_.run({m, n, k(), k(), k(), ldn(), GemmEpilogue::relu}, w_.gate_up(), x, ws_->g.get(), stream);
}

void FfnContext::pack(std::int64_t m, const std::uint32_t* enable, cudaStream_t stream) {
  pack_rows(0, m, shape(m).sparse_n, enable, /*reset_counters=*/true, stream);
}

void FfnContext::pack_rows(std::int64_t r0, std::int64_t rows, std::int64_t n, const std::uint32_t* enable,
                           bool reset_counters, cudaStream_t stream) {
  TWELL_CHECK(r0 >= 0 && rows >= 1 && r0 + rows <= cap_m_, ErrorCode::invalid_argument,
              "pack: rows [{}, {}) not produced by gate_gemm for this context", r0, r0 + rows);
  TwellPackParams p;
  p.enable = enable;
  p.src = ws_->g.get() + r0 * ldn();
  p.ld_src = ldn();
  p.m = rows;
  p.n = n;
  p.words_per_tile = words_per_tile();
  p.relu = true;
  p.words = ws_->words.get() + r0 * ((n + kTwellTile - 1) / kTwellTile) * words_per_tile();
  p.row_overflow = ws_->row_ovf.get() + r0;
  p.row_nnz = needs_row_nnz() ? ws_->row_nnz.get() + r0 : nullptr;  // the split plan's and dense rows' input
  p.counters = counters_.get();
  p.reset_counters = reset_counters;
  launch_twell_pack(p, stream);
}

void FfnContext::sparse_rest(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, const CallShape& s,
                             cudaStream_t stream) {
  TWELL_CHECK(m <= cap_m_, ErrorCode::invalid_argument, "sparse_rest: run gate_twell for these {} rows first", m);
  if (!s.hot()) {
    cold_rest(x, m, y, s, stream);
    return;
  }
  if (s.hot_overlap) {
    LtGemm& gemm = side_gemm();
    hot_up(x, m, gemm, hot_side_.fork(stream));
    cold_rest(x, m, y, s, stream);
    hot_side_.join(stream);
  } else {
    cold_rest(x, m, y, s, stream);
    hot_up(x, m, gemm_, stream);
  }
  hot_down(m, y, stream);  // adds into the y the cold part wrote
}

LtGemm& FfnContext::side_gemm() {
  return ws_->side();
}

void FfnContext::cold_rest(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, const CallShape& s,
                           cudaStream_t stream) {
  last_dense_planned_ = false;  // set below where this call plans dense rows (read_dense_rows)
  last_dense_cap_ = 0;
  const std::int64_t n = s.sparse_n;
  TwellUpDownParams p;
  static_cast<FfnOperands&>(p) = operands(x, m, y, n);
  p.words = ws_->words.get();
  p.backup = ws_->g.get();
  p.ld_backup = ldn();
  p.words_per_tile = words_per_tile();
  p.relu = true;
  p.variant = s.updown_variant;
  last_dense_planned_ = s.dense_rows;
  if (!last_dense_planned_) {
    launch_twell_up_down(p, stream);
    return;
  }
  const std::int64_t cap = dense_rows_capacity(m);
  last_dense_cap_ = cap;
  p.row_filter = dense_rows_begin(x, m, n, cap, stream);
  p.filter_keep_flagged = false;
  launch_twell_up_down(p, stream);
  dense_rows_finish(m, n, cap, y, stream);
}

LayerFacts FfnContext::facts() const noexcept {
  return {.n = n(), .hot_n = hot_n_, .gated = gated(), .decode_k = k() <= kDecodeMaxK, .token_k = k() <= kDecodeTokenMaxK,
          .gate_sm90 = gate_sm90_ok_, .gemv_max_rows = gemv_takes_k(k()) ? kGemvMaxRows : 0,
          // The GEMV reads W's rows at stride N and h's at ldn: unpadded rows only.
          .down_gemv_max_rows = ldn() == n() && gemv_takes_k(n()) ? kGemvMaxRows : 0,
          .union_max_rows = union_ok_ && union_ffn_fits(1, n(), k(), gated()) && ldn() % 4 == 0 ? kUnionMaxRows : 0};
}

bool FfnContext::automatic_is_plain_dense(std::int64_t m) const noexcept {
  // ... and no hot-neuron calibration is due at m (forward's calibrate_if_due would run one).
  const bool calibration_due =
      opt_.hot_neurons_auto && !hot_calibrated_ && m >= std::max<std::int64_t>(1, opt_.hot_neurons_min_rows);
  return !calibration_due && plan_call(opt_, facts(), m, Path::automatic, -1, 0).below_min_rows;
}

std::uint32_t FfnContext::dense_row_cap(std::int64_t n) const noexcept {
  return static_cast<std::uint32_t>(std::min<double>(opt_.dense_rows_density * static_cast<double>(n), 4.0e9));
}

std::uint32_t FfnContext::dense_row_cost(std::int64_t n) const noexcept {
  return static_cast<std::uint32_t>(std::min<double>(opt_.dense_rows_cost_density * static_cast<double>(n), 4.0e9));
}

std::int64_t FfnContext::dense_rows_capacity(std::int64_t m) {
  if (opt_.dense_rows_capacity >= 0) return std::min(opt_.dense_rows_capacity, m);
  double share = 0;
  if (hot_share_.poll(&share)) last_hot_share_ = share;
  const double hot = last_hot_share_ * static_cast<double>(m);
  if (last_hot_share_ < 0 || hot < static_cast<double>(std::max<std::int64_t>(1, opt_.dense_rows_min))) return 0;
  // Room for 10 % more rows than last counted plus 64 (every capacity row costs GEMM time, used or
  // not); kept while the need stays within [3/4 cap, cap] (a new GEMM shape costs a cuBLASLt plan).
  const auto want = static_cast<std::int64_t>(hot * 1.1) + 64;
  if (want > dense_cap_ || want < dense_cap_ * 3 / 4) dense_cap_ = round_up(want, 64);
  return std::min(dense_cap_, m);
}

const std::uint32_t* FfnContext::dense_rows_begin(const __nv_bfloat16* x, std::int64_t m, std::int64_t n,
                                                  std::int64_t cap, cudaStream_t stream) {
  DenseRowsPlanParams pp;
  pp.row_nnz = ws_->row_nnz.get();
  pp.m = m;
  pp.row_cap = dense_row_cap(n);
  pp.row_cost = dense_row_cost(n);
  pp.stats = dense_stats_.get();
  if (cap > 0) {
    pp.list = ws_->dense_list.get();
    pp.selected = ws_->dense_list.get() + m;
    pp.temp = ws_->dense_temp.get();
    pp.temp_bytes = ws_->dense_temp.size();
  }
  launch_dense_rows_plan(pp, stream);
  // The share of rows over the threshold sizes later calls' capacity (never waited for).
  if (opt_.dense_rows_capacity < 0) hot_share_.push(&dense_stats_.get()->hot, static_cast<double>(m), stream);
  if (cap == 0) return nullptr;
  DenseRowsGatherParams gp;
  gp.list = pp.list;
  gp.selected = pp.selected;
  gp.capacity = cap;
  gp.m = m;
  gp.row_dense = ws_->row_dense.get();
  gp.stats = dense_stats_.get();
  if (gated()) {
    ws_->x_h.reserve(static_cast<std::size_t>(cap * k()));
    gp.x = x;
    gp.ld_x = k();
    gp.k = k();
    gp.x_h = ws_->x_h.get();
  }
  launch_dense_rows_gather(gp, stream);
  return ws_->row_dense.get();
}

void FfnContext::dense_rows_finish(std::int64_t m, std::int64_t n, std::int64_t cap, __nv_bfloat16* y,
                                   cudaStream_t stream) {
  if (cap == 0) return;
  const int* list = ws_->dense_list.get();
  const int* selected = ws_->dense_list.get() + m;
  DenseRowsHParams hp;
  hp.list = list;
  hp.selected = selected;
  hp.capacity = cap;
  hp.words = ws_->words.get();
  hp.words_per_tile = words_per_tile();
  hp.backup = ws_->g.get();
  hp.ld_backup = ldn();
  hp.relu = true;
  hp.n = n;
  hp.h = ws_->h.get();  // [m, ldn] workspace, its first cap rows
  hp.ld_h = ldn();
  if (gated()) {  // u of the gathered rows into the stacked buffer's first cap·ldn elements
    gemm_.run({cap, n, k(), k(), k(), ldn(), GemmEpilogue::none}, w_.up(), ws_->x_h.get(), ws_->gu.get(), stream);
    hp.u = ws_->gu.get();
    hp.ld_u = ldn();
  }
  launch_dense_rows_h(hp, stream);
  ws_->y_h.reserve(static_cast<std::size_t>(cap * k()));
  gemm_.run({cap, k(), n, ldn(), ldn(), k(), GemmEpilogue::none}, w_.down(), ws_->h.get(), ws_->y_h.get(), stream);
  DenseRowsScatterParams sp;
  sp.list = list;
  sp.selected = selected;
  sp.capacity = cap;
  sp.y_h = ws_->y_h.get();
  sp.y = y;
  sp.ld_y = k();
  sp.k = k();
  launch_dense_rows_scatter(sp, stream);
}

FfnContext::DenseRowsInfo FfnContext::read_dense_rows(cudaStream_t stream) {
  DenseRowsInfo r;
  r.counted = last_dense_planned_;
  r.capacity = last_dense_cap_;
  if (!r.counted) return r;
  DenseRowsStats st{};
  TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
  TWELL_CUDA_CHECK(cudaMemcpy(&st, dense_stats_.get(), sizeof st, cudaMemcpyDeviceToHost));
  r.hot = st.hot;
  r.dense = st.dense;
  r.cost = st.cost;
  r.nnz = st.nnz;
  return r;
}

FfnOperands FfnContext::operands(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y,
                                 std::int64_t n) const noexcept {
  FfnOperands o;
  o.x = x;
  o.ld_x = k();
  o.w_up = gated() ? w_.up() : nullptr;
  o.w_down_t = w_.down_t();
  o.y = y;
  o.ld_y = k();
  o.m = m;
  o.n = n;
  o.k = k();
  o.gated = gated();
  return o;
}

void FfnContext::dense_rest(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, const CallShape& s,
                            cudaStream_t stream) {
  TWELL_CHECK(m <= cap_m_, ErrorCode::invalid_argument, "dense_rest: run gate_twell for these {} rows first", m);
  const __nv_bfloat16* h = ws_->g.get();
  if (gated()) {
    __nv_bfloat16* u = ws_->gu.get();  // [m, ldn] view of the stacked buffer
    gemm_.run({m, n(), k(), k(), k(), ldn(), GemmEpilogue::none}, w_.up(), x, u, stream);
    ops::gated_product(ws_->g.get(), u, ldn(), ws_->h.get(), ldn(), m, n(), 0, stream);
    h = ws_->h.get();
  }
  down_product(h, m, y, s, stream);
}

void FfnContext::dense_forward_counted(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, const CallShape& s,
                                       cudaStream_t stream) {
  dense_forward(x, m, y, s, stream);
  // The gate's sign pattern is in the stacked output (gated) or in h = ReLU(up) (non-gated); with
  // row chunks only the last chunk's rows are still there, and those are counted.
  const std::int64_t rows = dense_gate_rows_;
  // Only the cold neurons (the first s.sparse_n columns) count: their density decides.
  const std::int64_t n = s.sparse_n;
  const TwellSampleParams sp =
      sample_params(gated() ? ws_->gu.get() : ws_->h.get(), gated() ? 2 * ldn() : ldn(), rows, n, 0.0, s.dense_rows);
  launch_twell_sample_decide(sp, stream);
  const double sampled = static_cast<double>((rows + sp.stride - 1) / sp.stride);
  // Tag 0: the extra words are the sampled rows' true count (then two unused words, defined here so
  // that nothing uninitialised travels), not a TwELL call's counters.
  TWELL_CUDA_CHECK(cudaMemsetAsync(dispatch_.get()->unused, 0, sizeof(Dispatch::unused), stream));
  counts_.push(&dispatch_.get()->count, sampled * static_cast<double>(n), stream, &dispatch_.get()->nnz, 0,
               sampled * static_cast<double>(n));
  if (s.dense_rows && opt_.dense_rows_capacity < 0) hot_share_.push(&dispatch_.get()->hot, sampled, stream);
}

void FfnContext::decode_forward(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, const CallShape& s,
                                cudaStream_t stream) {
  if (s.one_token)
    advance_decode_order(stream);  // prepares the step (and restarts the order on new weights)
  else
    prepare_decode(m, stream);
  counts_.push_by(static_cast<double>(m) * static_cast<double>(n()), stream,
                  [&](unsigned long long* dst) { enqueue_decode(x, m, y, s, dst, stream); });
}

bool FfnContext::decode_plan_sparse(std::int64_t m) {
  resolve_pending();
  // As forward(automatic) would plan it (−1, nothing measured yet: sparse).
  return plan_call(opt_, facts(), m, Path::automatic, last_density_, dense_calls_).step == ForwardStep::decode;
}

void FfnContext::prepare_decode(std::int64_t m, cudaStream_t stream) {
  const CallShape s = shape(m);
  TWELL_CHECK(s.decode, ErrorCode::invalid_argument,
              "prepare_decode: {} rows are not decode rows (at most {} with K ≤ {}, or the union FFN's {} … {})", m,
              opt_.decode_max_rows, kDecodeMaxK, opt_.union_min_rows, union_rows_cap());
  reserve(m);
  if (s.one_token) {
    if (decode_token_n_ != n()) {  // for this N (a reload may change it); zero once, every launch leaves it so
      decode_token_n_ = n();
      decode_h_.resize(static_cast<std::size_t>(n()));
      decode_flags_.resize(static_cast<std::size_t>(decode_token_flag_bytes(n())));
      TWELL_CUDA_CHECK(cudaMemsetAsync(decode_flags_.get(), 0, decode_flags_.bytes(), stream));
    }
    if (!decode_order_current()) {
      // New weights (or a new layout of them, as a hot split makes): the counts start again from
      // the identity order. The buffers keep their addresses once sized (a captured step reads them).
      decode_order_epoch_ = weights_epoch_;
      decode_order_steps_ = 0;
      if (decode_order_.size() != static_cast<std::size_t>(n())) {
        decode_order_.resize(static_cast<std::size_t>(n()));
        decode_hits_.resize(static_cast<std::size_t>(n()));
      }
      std::vector<std::int32_t> identity(static_cast<std::size_t>(n()));
      std::iota(identity.begin(), identity.end(), 0);
      // (from pageable memory: the call returns once `identity` is staged, so it may go)
      TWELL_CUDA_CHECK(cudaMemcpyAsync(decode_order_.get(), identity.data(), decode_order_.bytes(), cudaMemcpyHostToDevice, stream));
      TWELL_CUDA_CHECK(cudaMemsetAsync(decode_hits_.get(), 0, decode_hits_.bytes(), stream));
    }
    return;
  }
  if (s.union_ffn) {  // the union's slots, counts and h for its largest step (its count is decode_nnz_ below)
    ws_->union_list.reserve(static_cast<std::size_t>(union_list_size(n())));
    ws_->union_counts.reserve(static_cast<std::size_t>(union_tiles(n())));
    ws_->union_h.reserve(static_cast<std::size_t>(std::max(m, union_rows_cap()) * union_list_size(n())));
  } else {
    ws_->decode_partials.reserve(static_cast<std::size_t>(m * tiles() * k()));
  }
  if (decode_tickets_.size() < static_cast<std::size_t>(m + 2)) {
    // [0, m): the decode kernel's row tickets, [size − 2]: the decode kernel's CTA ticket,
    // [size − 1]: unused; the count (the decode kernel's and the union's) is separate (64-bit).
    // Zeroed once; every launch leaves them zero again. Sized once for any decode size the
    // settings may ever allow (below the dispatch minimum; the union's 64), so that no later step,
    // whatever set_decode_max_rows or set_union_*_rows say by then, moves what a captured one reads.
    decode_tickets_.resize(static_cast<std::size_t>(std::max({m, opt_.dispatch_min_rows - 1, kUnionMaxRows}) + 2));
    TWELL_CUDA_CHECK(cudaMemsetAsync(decode_tickets_.get(), 0, decode_tickets_.bytes(), stream));
    TWELL_CUDA_CHECK(cudaMemsetAsync(decode_nnz_.get(), 0, decode_nnz_.bytes(), stream));
  }
}

std::int64_t FfnContext::union_rows_cap() const noexcept {
  const std::int64_t top = std::min(opt_.union_max_rows, facts().union_max_rows);
  return opt_.union_min_rows >= 1 && opt_.union_min_rows <= top ? top : 0;
}

bool FfnContext::decode_prepared(std::int64_t m) const noexcept {
  const CallShape s = shape(m);
  if (!s.decode || m > cap_m_) return false;
  if (s.one_token) return decode_token_n_ == n();  // (prepare_decode sizes the order with it)
  if (decode_tickets_.size() < static_cast<std::size_t>(m + 2)) return false;
  if (s.union_ffn)
    return ws_->union_list.size() >= static_cast<std::size_t>(union_list_size(n())) &&
           ws_->union_counts.size() >= static_cast<std::size_t>(union_tiles(n())) &&
           ws_->union_h.size() >= static_cast<std::size_t>(m * union_list_size(n()));
  return ws_->decode_partials.size() >= static_cast<std::size_t>(m * tiles() * k());
}

void FfnContext::decode_step(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, bool sparse,
                             cudaStream_t stream) {
  TWELL_CHECK(decode_prepared(m), ErrorCode::invalid_argument, "decode_step: {} rows without prepare_decode({})", m, m);
  if (sparse)
    enqueue_decode(x, m, y, shape(m), decode_step_nnz_.get(), stream);
  else
    dense_forward(x, m, y, shape(m), stream);
}

void FfnContext::decode_step_folded(const DecodeTokenNorm& in, __nv_bfloat16* y, cudaStream_t stream) {
  TWELL_CHECK(in.r && in.delta && in.w, ErrorCode::invalid_argument, "decode_step: the residual norm needs r, delta and w");
  TWELL_CHECK(folds_norm() && decode_prepared(1), ErrorCode::invalid_argument,
              "decode_step: a folded norm needs the one-token kernels, prepared (prepare_decode(1))");
  enqueue_decode(nullptr, 1, y, shape(1), decode_step_nnz_.get(), stream, &in);
}

void FfnContext::dense_token_folded(const DecodeTokenNorm& in, __nv_bfloat16* y, cudaStream_t stream) {
  TWELL_CHECK(in.r && in.delta && in.w && y, ErrorCode::invalid_argument,
              "dense_token_folded: the residual norm needs r, delta, w and y");
  TWELL_CHECK(folds_dense_norm(), ErrorCode::invalid_argument,
              "dense_token_folded: needs a gated layer on the one-token GEMV, with dense_fold_norm on");
  reserve(1);
  // [g | u] and h as dense_forward's token_gemv path writes them, its norm inside (act 0: ReLU).
  ops::GatedUp gated;
  gated.h = ws_->h.get();
  gated.up_row = ldn();
  gated.h_n = n();
  ops::rmsnorm_gated_up(in.r, in.first, in.delta, k(), in.w, in.eps, w_.gate_up(), gated, ws_->gu.get(), stream);
  down_product(ws_->h.get(), 1, y, shape(1), stream, &in);  // y = h · Wdᵀ, r stored
  dense_gate_rows_ = 1;
}

void FfnContext::decode_step_fixed(const DecodeTokenNorm& in, long long* y_fixed, unsigned* overflow,
                                   cudaStream_t stream) {
  TWELL_CHECK(in.r && in.w && !in.first && !in.delta && y_fixed && overflow, ErrorCode::invalid_argument,
              "decode_step: the fixed-point output needs r, w, the accumulator and the flag, and no first or delta");
  TWELL_CHECK(folds_norm() && decode_prepared(1), ErrorCode::invalid_argument,
              "decode_step: the fixed-point output needs the one-token kernels, prepared (prepare_decode(1))");
  TwellDecodeTokenParams tp;
  static_cast<FfnOperands&>(tp) = operands(nullptr, 1, nullptr, n());
  tp.w_first = w_.gate_up();
  tp.norm = in;
  tp.y_fixed = y_fixed;
  tp.overflow = overflow;
  tp.order = decode_order_.get();
  tp.hits = decode_hits_.get();
  launch_twell_decode_token(tp, stream);
}

void FfnContext::set_decode_reorder(bool on, cudaStream_t stream) {
  opt_.decode_reorder = on;
  if (!on) decode_order_epoch_ = ~std::uint64_t{0};  // the next prepare_decode restores the identity
  if (!on && n() > 0 && decode_token_n_ == n()) prepare_decode(1, stream);
}

bool FfnContext::decode_order_current() const noexcept {
  return decode_order_epoch_ == weights_epoch_ && decode_order_.size() == static_cast<std::size_t>(n());
}

void FfnContext::reorder_decode(cudaStream_t stream) {
  if (!opt_.decode_reorder || !decode_order_current()) return;  // not prepared for these weights: the identity stands
  launch_decode_token_reorder(decode_hits_.get(), decode_order_.get(), n(), stream);
}

void FfnContext::advance_decode_order(cudaStream_t stream) {
  if (!shape(1).one_token) return;
  prepare_decode(1, stream);  // new weights: the identity order, and the count from zero
  if (decode_reorder_due(++decode_order_steps_)) reorder_decode(stream);
}

void FfnContext::enqueue_decode(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, const CallShape& s,
                                unsigned long long* nnz_out, cudaStream_t stream, const DecodeTokenNorm* norm) {
  if (s.one_token) {  // (prepared: decode_forward prepares, decode_step checks)
    TwellDecodeTokenParams tp;
    static_cast<FfnOperands&>(tp) = operands(x, m, y, n());
    tp.w_first = w_.gate_up();
    tp.h = decode_h_.get();
    tp.flags = decode_flags_.get();
    tp.nnz_out = nnz_out;
    tp.order = decode_order_.get();
    tp.hits = decode_hits_.get();
    if (norm) tp.norm = *norm;
    launch_twell_decode_token(tp, stream);
    return;
  }
  if (s.gate_gemv) {
    // The gate (the up GEMM non-gated) as a GEMV: same values as gate_gemm's.
    TwellGemvParams gp = gemv_rows(x, m, w_.gate_up(), n(), k());
    gp.relu = true;
    gp.g = ws_->g.get();
    gp.ld_g = ldn();
    // Its first weight window before a programmatic launch's wait: programmatic launches happen
    // only in the model runtime's forward (launch.hpp), whose weights no kernel of the step writes
    // (the union's down stages its Wdᵀ rows early on the same ground). Outside one, no effect.
    gp.w_before_wait = true;
    launch_twell_gemv(gp, stream);
  } else {
    gate_gemm(x, m, stream);
  }
  if (s.union_ffn) {
    UnionFfnParams u;
    static_cast<FfnOperands&>(u) = operands(x, m, y, n());
    u.g = ws_->g.get();
    u.ld_g = ldn();
    u.list = ws_->union_list.get();
    u.counts = ws_->union_counts.get();
    u.h = ws_->union_h.get();
    u.nnz = decode_nnz_.get();
    u.nnz_out = nnz_out;
    u.up_split = opt_.union_up_split;
    u.down_split = opt_.union_down_split;
    u.up_clusters = opt_.union_up_clusters;
    launch_union_ffn(u, stream);
    return;
  }
  TwellDecodeParams p;
  static_cast<FfnOperands&>(p) = operands(x, m, y, n());  // decode runs every neuron
  p.g = ws_->g.get();
  p.ld_g = ldn();
  p.partials = ws_->decode_partials.get();
  p.row_tickets = decode_tickets_.get();
  p.cta_ticket = decode_tickets_.get() + decode_tickets_.size() - 2;  // the pairs' ticket: the decode kernel leaves it zero
  p.nnz = decode_nnz_.get();
  p.nnz_out = nnz_out;
  launch_twell_decode(p, stream);
}

void FfnContext::resolve_pending() {
  double d = 0;
  CountRing::Extra e;
  if (!counts_.poll(&d, &e)) return;
  last_density_ = d;
  // No extra words: the decode kernel's count, a true one. Else words[0] is the true count over
  // e.scale cells: a TwELL call's counters (tag: its M) or a dense call's sampled count (tag 0).
  last_active_ = !e.present ? d : e.scale > 0 ? static_cast<double>(e.words[0]) / e.scale : -1;
  if (e.present && e.tag > 0)
    last_counted_ = {d, last_active_, e.tag, static_cast<std::int64_t>(e.words[0]),
                     static_cast<std::int64_t>(e.words[1]), static_cast<std::int64_t>(e.words[2])};
}

FfnContext::Measured FfnContext::measured() {
  resolve_pending();
  Measured r = last_counted_;
  r.density = last_density_;
  r.active = last_active_;
  return r;
}

TwellSampleParams FfnContext::sample_params(const __nv_bfloat16* src, std::int64_t ld, std::int64_t m, std::int64_t n,
                                            double max_density, bool rows_at_cost) {
  TwellSampleParams sp;
  sp.src = src;
  sp.ld_src = ld;
  sp.m = m;
  sp.n = n;
  sp.stride = std::max<std::int64_t>(1, m / std::max<std::int64_t>(1, opt_.dispatch_sample_rows));
  sp.max_density = max_density;
  sp.count = &dispatch_.get()->count;
  sp.hot = &dispatch_.get()->hot;
  sp.nnz = &dispatch_.get()->nnz;
  sp.decision = &dispatch_.get()->decision;
  if (rows_at_cost) {  // the sparse path would run heavy rows dense: count them at that cost
    sp.row_cap = dense_row_cap(n);
    sp.row_cost = dense_row_cost(n);
  }
  return sp;
}

TwellCounters FfnContext::read_counters(cudaStream_t stream) {
  TWELL_CUDA_CHECK(
      cudaMemcpyAsync(counters_host_.get(), counters_.get(), sizeof(TwellCounters), cudaMemcpyDeviceToHost, stream));
  TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
  return counters_host_[0];
}

std::vector<std::uint32_t> FfnContext::count_neurons(const __nv_bfloat16* x, std::int64_t m, cudaStream_t stream) {
  gate_gemm(x, m, stream);  // every neuron, in the current order
  return neuron_counts_of_gate(m, nullptr, nullptr, stream);
}

std::vector<std::uint32_t> FfnContext::neuron_counts_of_gate(std::int64_t m, const std::vector<unsigned char>* cold,
                                                             std::int64_t* rows_left_out, cudaStream_t stream) {
  std::vector<std::uint32_t> pos;  // by position
  if (cold) {  // rows with more than dense_row_cap(cold count) non-zeros in the cold neurons are skipped
    std::vector<unsigned char> mask(static_cast<std::size_t>(n()));
    std::int64_t nc = 0;
    for (std::int64_t j = 0; j < n(); ++j) {  // by position
      mask[static_cast<std::size_t>(j)] = (*cold)[static_cast<std::size_t>(order_.empty() ? j : order_[static_cast<std::size_t>(j)])];
      nc += mask[static_cast<std::size_t>(j)];
    }
    pos = read_neuron_counts_sparse_rows(ws_->g.get(), ldn(), m, n(), mask, dense_row_cap(nc), ws_->row_nnz.get(), rows_left_out,
                                         stream);
  } else {
    pos = read_neuron_counts(ws_->g.get(), ldn(), m, n(), nullptr, 0, stream);
  }
  if (order_.empty()) return pos;
  std::vector<std::uint32_t> orig(static_cast<std::size_t>(n()));
  for (std::int64_t j = 0; j < n(); ++j) orig[static_cast<std::size_t>(order_[static_cast<std::size_t>(j)])] = pos[static_cast<std::size_t>(j)];
  return orig;
}

std::vector<std::int64_t> FfnContext::choose_hot_neurons(const std::vector<std::uint32_t>& counts, std::int64_t m) const {
  TWELL_CHECK(static_cast<std::int64_t>(counts.size()) == n(), ErrorCode::shape_mismatch,
              "choose_hot_neurons: {} counts for N = {} neurons", counts.size(), n());
  TWELL_CHECK(m >= 1, ErrorCode::invalid_argument, "choose_hot_neurons: M must be ≥ 1 (got {})", m);
  return neurons_over(counts, hot_threshold(), m, max_hot_neurons(), over_share());
}

double FfnContext::max_hot_neurons() const noexcept {
  // At most half of the neurons (less the up to 7 that set_hot_neurons may add, and rounding): the
  // hot part's workspace is half of the stacked buffer.
  return std::min(opt_.hot_neurons_max_share * static_cast<double>(n()), static_cast<double>(ldn() / 2 - 16));
}

std::vector<std::int64_t> FfnContext::hot_neurons() const {
  std::vector<std::int64_t> hot;
  for (std::int64_t j = n() - hot_n_; j < n(); ++j) hot.push_back(order_.empty() ? j : order_[static_cast<std::size_t>(j)]);
  std::sort(hot.begin(), hot.end());
  return hot;
}

void FfnContext::set_hot_neurons(const std::vector<std::int64_t>& hot, cudaStream_t stream,
                                 const std::vector<std::uint32_t>* counts) {
  TWELL_CHECK(!w_.empty(), ErrorCode::invalid_argument, "FfnContext: upload_weights() first");
  TWELL_CHECK(!counts || static_cast<std::int64_t>(counts->size()) == n(), ErrorCode::shape_mismatch,
              "set_hot_neurons: {} counts for N = {} neurons", counts ? counts->size() : 0, n());
  ++weights_epoch_;  // the weights move to new buffers in a new order
  std::vector<char> is_hot(static_cast<std::size_t>(n()), 0);
  for (const std::int64_t i : hot) {
    TWELL_CHECK(i >= 0 && i < n(), ErrorCode::invalid_argument, "set_hot_neurons: neuron {} out of [0, {})", i, n());
    is_hot[static_cast<std::size_t>(i)] = 1;
  }
  std::vector<std::int64_t> cold;
  for (std::int64_t i = 0; i < n(); ++i)
    if (!is_hot[static_cast<std::size_t>(i)]) cold.push_back(i);
  // Whole groups of 8 cold neurons: the hot part of Wd then starts 16-byte aligned. The extra hot
  // ones are the hottest cold neurons by `counts` (else the last ones); exact either way.
  if (cold.size() != static_cast<std::size_t>(n()) && counts) {
    std::stable_sort(cold.begin(), cold.end(), [&](std::int64_t a, std::int64_t b) {
      return (*counts)[static_cast<std::size_t>(a)] < (*counts)[static_cast<std::size_t>(b)];
    });
  }
  if (cold.size() != static_cast<std::size_t>(n())) cold.resize(cold.size() / 8 * 8);
  if (cold.empty() || cold.size() == static_cast<std::size_t>(n())) {  // nothing to split: every neuron sparse
    cold.clear();
    for (std::int64_t i = 0; i < n(); ++i) cold.push_back(i);
  }
  std::sort(cold.begin(), cold.end());
  std::vector<char> in_cold(static_cast<std::size_t>(n()), 0);
  for (const std::int64_t i : cold) in_cold[static_cast<std::size_t>(i)] = 1;
  std::vector<std::int64_t> order = cold;  // position → original neuron
  for (std::int64_t i = 0; i < n(); ++i)
    if (!in_cold[static_cast<std::size_t>(i)]) order.push_back(i);
  // Gather index: new position j takes the row / column now at the current position of order[j].
  std::vector<std::int64_t> cur_pos(static_cast<std::size_t>(n()));
  for (std::int64_t j = 0; j < n(); ++j) cur_pos[static_cast<std::size_t>(order_.empty() ? j : order_[static_cast<std::size_t>(j)])] = j;
  std::vector<int> idx(static_cast<std::size_t>(n()));
  for (std::int64_t j = 0; j < n(); ++j) idx[static_cast<std::size_t>(j)] = static_cast<int>(cur_pos[static_cast<std::size_t>(order[static_cast<std::size_t>(j)])]);

  DeviceBuffer<int> d_idx(idx.size());
  TWELL_CUDA_CHECK(cudaMemcpyAsync(d_idx.get(), idx.data(), idx.size() * sizeof(int), cudaMemcpyHostToDevice, stream));
  const std::int64_t nc = static_cast<std::int64_t>(cold.size());
  // The hot part's workspace is the second half of ws_->gu ([m, ldn] ⊇ [m, 2·ldh]); checked before
  // anything is enqueued.
  TWELL_CHECK(2 * round_up(n() - nc, 8) <= ldn(), ErrorCode::unsupported,
              "set_hot_neurons: {} of {} neurons hot; at most half of them can be split off", n() - nc, n());
  PackedWeights permuted = w_.gathered(d_idx.get(), stream);
  const __nv_bfloat16* gu = permuted.gate_up();
  hot_n_ = n() - nc;
  w_hot_gu_.release();
  if (hot_sm90()) {  // blocks of [Wg rows; Wu rows] of 128 hot neurons each
    w_hot_gu_.resize(static_cast<std::size_t>(gated_product_rows(hot_n_) * k()));
    pack_gated_product_weights(gu + nc * k(), gu + (ldn() + nc) * k(), hot_n_, k(), w_hot_gu_.get(), stream);
  } else if (hot_n_ > 0) {  // [Wg_hot; 0; Wu_hot; 0] (gated) or [Wu_hot; 0]: their stacked GEMM's weight
    const std::int64_t ldh = round_up(hot_n_, 8);
    w_hot_gu_.resize(static_cast<std::size_t>((gated() ? 2 : 1) * ldh * k()));
    TWELL_CUDA_CHECK(cudaMemsetAsync(w_hot_gu_.get(), 0, w_hot_gu_.bytes(), stream));
    const std::size_t bytes = static_cast<std::size_t>(hot_n_ * k()) * sizeof(__nv_bfloat16);  // whole rows
    TWELL_CUDA_CHECK(cudaMemcpyAsync(w_hot_gu_.get(), gu + nc * k(), bytes, cudaMemcpyDeviceToDevice, stream));
    if (gated())
      TWELL_CUDA_CHECK(cudaMemcpyAsync(w_hot_gu_.get() + ldh * k(), gu + (ldn() + nc) * k(), bytes,
                                       cudaMemcpyDeviceToDevice, stream));
  }
  TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));  // the old buffers die below
  w_ = std::move(permuted);
  order_ = std::move(order);
  bool identity = true;
  for (std::int64_t j = 0; j < n() && identity; ++j) identity = order_[static_cast<std::size_t>(j)] == j;
  if (identity) order_.clear();
  reset_dispatch_state();  // densities measured before were over other neurons
  hot_calibrated_ = true;  // an explicit choice: hot_neurons_auto leaves it alone
}

bool FfnContext::calibrate_if_due(const __nv_bfloat16* x, std::int64_t m, cudaStream_t stream) {
  if (!opt_.hot_neurons_auto || hot_calibrated_ || shape(m).decode || m < std::max<std::int64_t>(1, opt_.hot_neurons_min_rows))
    return false;
  hot_calibrated_ = true;  // once per layer, whatever it finds
  calibrate_hot_neurons(x, m, stream);
  return true;
}

std::int64_t FfnContext::calibrate_hot_neurons(const __nv_bfloat16* x, std::int64_t m, cudaStream_t stream) {
  std::vector<std::uint32_t> counts = count_neurons(x, m, stream);
  // Rows that run dense even after the split (more than the dense-row threshold of non-zeros in
  // the cold neurons: hot tokens, when at least dense_rows_min of them) cost nothing per neuron;
  // counted without them, choose again. The training context calibrates by the same rule.
  SparseRowsRecount recount;
  if (shape(m).dense_rows) {
    recount = [&](const std::vector<unsigned char>& cold, std::int64_t* left_out) {
      return neuron_counts_of_gate(m, &cold, left_out, stream);
    };
  }
  const HotNeuronChoice c = choose_hot_neurons_calibrated(std::move(counts), hot_threshold(), m, max_hot_neurons(),
                                                          opt_.dense_rows_min, recount, over_share());
  set_hot_neurons(c.hot, stream, &c.counts);
  return hot_n_;
}

__nv_bfloat16* FfnContext::hot_workspace(std::int64_t m) noexcept {
  // The second half of ws_->gu ([m, 2·ldn]): m·ldn elements ⊇ [m, 2·ldh] since hot_n_ ≤ N/2 (rounded,
  // checked in set_hot_neurons). The cold part's dense rows use only ws_->gu's first cap·ldn ≤ m·ldn.
  return ws_->gu.get() + m * ldn();
}

void FfnContext::hot_up(const __nv_bfloat16* x, std::int64_t m, LtGemm& gemm, cudaStream_t stream) {
  const std::int64_t hn = hot_n_, ldh = round_up(hn, 8);
  __nv_bfloat16* ws = hot_workspace(m);
  if (hot_sm90()) {  // one kernel: the [g | u] GEMM with h = ReLU(g) ⊙ u in its epilogue
    GatedProductParams p;
    p.x = x;
    p.w = w_hot_gu_.get();
    p.m = m;
    p.n = gated_product_rows(hn);
    p.k = k();
    p.h = ws;
    p.ld_h = 2 * ldh;
    p.h_cols = hn;
    p.sm_count = sm_count_;
    p.cluster = opt_.gate_sm90_cluster;
    launch_gated_product_sm90(p, stream);
  } else if (gated()) {  // [g | u] into ws, then h = ReLU(g) ⊙ u in place of g (element by element)
    gemm.run({m, 2 * ldh, k(), k(), k(), 2 * ldh, GemmEpilogue::none}, w_hot_gu_.get(), x, ws, stream);
    ops::gated_product(ws, ws + ldh, 2 * ldh, ws, 2 * ldh, m, hn, 0, stream);
  } else {
    gemm.run({m, hn, k(), k(), k(), 2 * ldh, GemmEpilogue::relu}, w_hot_gu_.get(), x, ws, stream);
  }
}

void FfnContext::hot_down(std::int64_t m, __nv_bfloat16* y, cudaStream_t stream) {
  const std::int64_t hn = hot_n_, ldh = round_up(hn, 8), nc = n() - hn;
  GemmShape down{m, k(), hn, 2 * ldh, ldn(), k(), GemmEpilogue::none};
  down.accumulate = true;  // y += h_hot · Wd[:, hot]ᵀ (Wd's last hn columns, row stride ldn)
  gemm_.run(down, w_.down() + nc, hot_workspace(m), y, stream);
}

ForwardResult FfnContext::forward(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, Path path,
                                  cudaStream_t stream) {
  ForwardResult r;
  if (path != Path::dense) calibrate_if_due(x, m, stream);  // may split hot neurons off: before the plan
  if (path == Path::automatic) resolve_pending();  // the newest count that came back
  // Plan (ffn_plan.hpp: pure host, unit-tested), then execute what it says.
  const ForwardPlan plan = plan_call(opt_, facts(), m, path, last_density_, dense_calls_);
  const CallShape& s = plan.shape;
  if (plan.sticky && (plan.step == ForwardStep::dense || plan.step == ForwardStep::dense_counted)) ++dense_calls_;
  // The call's record (describe_call makes text of it when asked).
  CallRecord& c = r.call;
  c.step = plan.step;
  c.asked = path;
  c.sticky = plan.sticky;
  c.below_min_rows = plan.below_min_rows;
  c.gated = gated();
  c.gate_sm90 = s.gate == GateKernel::sm90;
  c.one_token = s.decode && s.one_token;
  c.union_ffn = s.decode && s.union_ffn;
  c.gate_gemv = s.decode && !s.one_token && s.gate_gemv;
  c.token_gemv = s.token_gemv;
  c.down_gemv = s.down_gemv;
  c.n = n();
  c.sparse_n = s.sparse_n;
  c.row_cap = dense_row_cap(c.sparse_n);
  c.row_cost = dense_row_cost(c.sparse_n);
  c.followed_density = last_density_;
  c.followed_row_costs = s.dense_rows;
  const auto finish = [&](ForwardResult& res) {
    res.call.sparse = res.sparse;
    last_call_ = res.call;
    return res;
  };
  // After a sparse remainder: the dense-row capacity it used (0: none).
  const auto note_dense_rows = [&] { c.dense_rows_capacity = s.dense_rows ? last_dense_cap_ : 0; };
  const double cells = static_cast<double>(m) * static_cast<double>(s.sparse_n);  // a count's denominator
  switch (plan.step) {
    case ForwardStep::dense:
    case ForwardStep::dense_counted:
      if (plan.step == ForwardStep::dense_counted)
        dense_forward_counted(x, m, y, s, stream);
      else
        dense_forward(x, m, y, s, stream);
      return finish(r);
    case ForwardStep::decode:
      decode_forward(x, m, y, s, stream);  // counts through its own last CTA
      r.sparse = true;
      return finish(r);
    case ForwardStep::sparse:
      gate_twell(x, m, s, stream);
      sparse_rest(x, m, y, s, stream);
      // Both paths are exact: a density jump costs one call's speed, never a wrong result. The
      // count goes back in passing, for later calls; with dense rows it is their cost measure
      // (hot rows at their dense cost).
      // The TwELL counters (nnz, overflow tiles, rows: consecutive) travel with it, for measured().
      if (plan.counts)
        counts_.push(s.dense_rows ? &dense_stats_.get()->cost : &counters_.get()->nnz, cells, stream,
                     &counters_.get()->nnz, m, cells);
      r.sparse = true;
      note_dense_rows();
      return finish(r);
    case ForwardStep::first_call:
      break;
  }
  // First call of the layer (or sticky_dispatch off): gate GEMM (cuBLASLt, every neuron: dense_rest
  // reads the whole gate), a sampled count decides on the device while the packing runs or is
  // skipped, the host waits for that one flag.
  gate_gemm(x, m, stream);
  const std::int64_t n = s.sparse_n;
  TwellSampleParams sp = sample_params(ws_->g.get(), ldn(), m, n, plan.max_density, s.dense_rows);
  Dispatch* d = dispatch_.get();
  launch_twell_sample_decide(sp, stream);
  TWELL_CUDA_CHECK(cudaMemcpyAsync(dispatch_host_.get(), d, sizeof(Dispatch), cudaMemcpyDeviceToHost, stream));
  TWELL_CUDA_CHECK(cudaEventRecord(decided_, stream));
  pack_rows(0, m, n, &d->decision, /*reset_counters=*/true, stream);  // runs (or returns at once) while the host reads the flag
  TWELL_CUDA_CHECK(cudaEventSynchronize(decided_));
  r.counted = true;
  r.sparse = dispatch_host_[0].decision != 0;
  const std::int64_t sampled = (m + sp.stride - 1) / sp.stride;
  r.sampled_density = static_cast<double>(dispatch_host_[0].count) / (static_cast<double>(sampled) * static_cast<double>(n));
  last_density_ = r.sampled_density;
  last_active_ = static_cast<double>(dispatch_host_[0].nnz) / (static_cast<double>(sampled) * static_cast<double>(n));
  if (s.dense_rows) {  // sizes this call's dense-row capacity
    hot_share_.reset();
    last_hot_share_ = static_cast<double>(dispatch_host_[0].hot) / static_cast<double>(sampled);
  }
  if (r.sparse) {
    sparse_rest(x, m, y, s, stream);
    note_dense_rows();
  } else {
    dense_rest(x, m, y, s, stream);
  }
  return finish(r);
}

}  // namespace twell::cuda
