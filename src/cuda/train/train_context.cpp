#include "cuda/train/train_context.hpp"

#include <nvtx3/nvToolsExt.h>

#include <algorithm>

#include "cuda/common/check.hpp"
#include "cuda/common/transpose.hpp"
#include "cuda/sm80/twell_dense_rows.hpp"
#include "cuda/sm80/twell_hot_neurons.hpp"
#include "cuda/sm90/gate_pack.hpp"
#include "cuda/train/csr_kernels.hpp"

namespace twell::cuda {
namespace {

std::size_t sz(std::int64_t v) { return static_cast<std::size_t>(v); }

// Entry buffers grow with 25 % headroom so that a step whose count moves a little does not reallocate.
// Never left unallocated (an empty pattern still passes valid pointers to the kernels).
template <typename T>
void reserve_entries(DeviceBuffer<T>& b, std::int64_t nnz) {
  if (sz(nnz) > b.size() || b.get() == nullptr) b.resize(sz(nnz + nnz / 4 + 1024));
}

// Elementwise parameters of a dense block of `rows` rows over n neurons (row stride ldc): gated,
// g and u are the halves of gu [rows, 2·ldc] and h [rows, ldc] is written; non-gated, h = gu
// [rows, ldc] itself. Rows flagged in row_skip are treated as inactive.
DenseTrainElementwiseParams block_params(bool gated, std::int64_t rows, std::int64_t n, std::int64_t ldc, __nv_bfloat16* gu,
                                         __nv_bfloat16* h, const unsigned char* row_skip) {
  DenseTrainElementwiseParams e;
  e.m = rows;
  e.n = n;
  e.ldn = ldc;
  e.gated = gated;
  e.row_skip = row_skip;
  e.h = gated ? h : gu;
  e.ld_h = ldc;
  if (gated) {
    e.g = gu;
    e.u = gu + ldc;
    e.ld_g = e.ld_u = 2 * ldc;
  }
  return e;
}

}  // namespace

WeightGradPasses weight_grad_passes(std::int64_t m, std::int64_t k, std::int64_t l2_bytes, double l2_fraction) {
  WeightGradPasses w;
  if (l2_fraction <= 0) {
    w.slice_cols = std::min(k, kWeightGradMaxSlice);
    w.block_rows = m;
    return w;
  }
  const auto budget = static_cast<std::int64_t>(static_cast<double>(l2_bytes) * l2_fraction);
  // x and dy columns of every row: 4 bytes per row and column.
  w.slice_cols = std::min(k, 4 * m * kWeightGradMaxSlice <= budget ? kWeightGradMaxSlice : kWeightGradMaxSlice / 2);
  const std::int64_t rows = std::max<std::int64_t>(1024, budget / (4 * w.slice_cols) / 256 * 256);
  w.block_rows = std::min(m, rows);
  return w;
}

TrainScratch::TrainScratch(std::shared_ptr<DeviceAllocator> mem_) : mem(std::move(mem_)) {
  DeviceAllocator* a = mem.get();
  for (auto* b : {&g, &h, &dh, &dgu}) b->use(a);
  for (auto* b : {&row_counts, &wg_item_counts, &wg_item_offsets}) b->use(a);
  for (auto* b : {&entry_rows, &order, &tmp_keys, &tmp_vals, &wg_item_neuron}) b->use(a);
  for (auto* b : {&d_up_e, &d_gate_e, &dwd_t, &dw_gu, &dw_down}) b->use(a);
  wg_entries.use(a);
  for (auto* b : {&wg_work, &cub_ws}) b->use(a);
  for (auto* b : {&twell_words, &twell_row_ovf}) b->use(a);
  twell_counters.use(a);
}

std::size_t TrainScratch::bytes() const noexcept {
  return g.bytes() + h.bytes() + dh.bytes() + dgu.bytes() + row_counts.bytes() + wg_item_counts.bytes() +
         wg_item_offsets.bytes() + entry_rows.bytes() + order.bytes() + tmp_keys.bytes() + tmp_vals.bytes() +
         wg_item_neuron.bytes() + d_up_e.bytes() + d_gate_e.bytes() + dwd_t.bytes() + dw_gu.bytes() + dw_down.bytes() +
         wg_entries.bytes() + wg_work.bytes() + cub_ws.bytes() + twell_words.bytes() + twell_row_ovf.bytes() +
         twell_counters.bytes() + (gemm ? gemm->workspace_bytes() : 0);
}

TrainContext::TrainContext(const TrainContextOptions& opt) : TrainContext(opt, nullptr) {}

TrainContext::TrainContext(const TrainContextOptions& opt, std::shared_ptr<TrainScratch> scratch)
    : opt_(opt), gemm_([&] {  // a shared set: one GEMM workspace for all its contexts
        if (!scratch) return std::make_shared<LtGemm>(opt.autotune_gemm, 8, 64u << 20, nullptr);
        if (!scratch->gemm) {
          // The GEMM's workspace comes from the set's allocator, which the GEMM keeps alive: a
          // context may outlive its set (and the allocator's last other owner).
          std::shared_ptr<DeviceAllocator> mem = scratch->mem;
          scratch->gemm = std::shared_ptr<LtGemm>(new LtGemm(opt.autotune_gemm, 8, 64u << 20, mem.get()),
                                                  [mem](LtGemm* g) { delete g; });
        }
        return scratch->gemm;
      }()),
      scratch_(scratch ? std::move(scratch) : std::make_shared<TrainScratch>()),
      g_(scratch_->g), dh_(scratch_->dh), dgu_(scratch_->dgu), row_counts_(scratch_->row_counts),
      entry_rows_(scratch_->entry_rows), order_(scratch_->order), tmp_keys_(scratch_->tmp_keys),
      tmp_vals_(scratch_->tmp_vals), d_up_e_(scratch_->d_up_e), d_gate_e_(scratch_->d_gate_e), dwd_t_(scratch_->dwd_t),
      wg_entries_(scratch_->wg_entries), wg_work_(scratch_->wg_work), wg_item_counts_(scratch_->wg_item_counts),
      wg_item_offsets_(scratch_->wg_item_offsets), wg_item_neuron_(scratch_->wg_item_neuron), cub_ws_(scratch_->cub_ws),
      dw_gu_(scratch_->dw_gu), dw_down_(scratch_->dw_down), scalars_(1),
      twell_words_(scratch_->twell_words), twell_row_ovf_(scratch_->twell_row_ovf),
      twell_counters_(scratch_->twell_counters), n_dense_(1), scalars_host_(1), totals_host_(4) {
  TWELL_CHECK(opt_.token_min_blocks == 0 || opt_.token_min_blocks == 6 || opt_.token_min_blocks == 8,
              ErrorCode::invalid_argument, "TrainContextOptions::token_min_blocks must be 0, 6 or 8 (got {})",
              opt_.token_min_blocks);
  TWELL_CUDA_CHECK(cudaEventCreateWithFlags(&counted_, cudaEventDisableTiming));
  int dev = 0, l2 = 0;
  TWELL_CUDA_CHECK(cudaGetDevice(&dev));
  TWELL_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  TWELL_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, dev));
  l2_bytes_ = l2;
  gate_sm90_ok_ = gate_pack_sm90_available(dev);
  TWELL_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&totals_dev_), totals_host_.get(), 0));
}

TrainContext::~TrainContext() {
  if (counted_) cudaEventDestroy(counted_);
}

void TrainContext::mark(const char* phase, cudaStream_t stream) {
  nvtxMarkA(phase);  // a few ns when no profiler is attached
  if (observer_ != nullptr) observer_->phase_done(phase, stream);
}

void TrainContext::load_weights(const DeviceFfnWeights& w, cudaStream_t stream) {
  saved_ = Saved::none;  // a forward over the old weights has no backward over the new ones
  const bool same_shape = w_.load(w, stream);
  if (same_shape) {
    // The dispatch's density and the hot set carry over: one optimizer step barely moves them.
    gather_hot_weights(stream);
    return;
  }
  hot_.clear();
  hot_calibrated_ = false;
  forget_measurements();
}

void TrainContext::upload_weights(const FfnWeights& w, cudaStream_t stream) {
  saved_ = Saved::none;
  forget_measurements();
  const bool same_shape = w_.upload(w, stream);
  if (same_shape) {
    gather_hot_weights(stream);  // the same hot set, the new weights
  } else {
    hot_.clear();
    hot_calibrated_ = false;
  }
}

void TrainContext::forget_measurements() {
  last_density_ = -1;
  last_dense_rows_ = 0;
  count_pending_ = false;
  if (scratch_.use_count() == 1) {  // a set of its own: fresh gradient buffers (NaN-filled) for a new shape
    dw_gu_.release();
    dw_down_.release();
    dwd_t_.release();
  }
  col_offsets_.release();
}

std::size_t TrainContext::device_bytes() const noexcept { return own_bytes() + scratch_->bytes(); }

std::size_t TrainContext::own_bytes() const noexcept {
  // The GEMM workspaces belong to the scratch set when it holds them (shared), else to this context.
  const std::size_t gemm = scratch_->gemm ? 0 : gemm_->workspace_bytes();
  return gemm + w_.bytes() + gu_.bytes() + u_.bytes() + own_h_.bytes() +
         g_saved_.bytes() + offsets_.bytes() + col_offsets_.bytes() + cols_.bytes() + p_.bytes() + u_e_.bytes() +
         row_l1_.bytes() + scalars_.bytes() + hot_idx_.bytes() + hot_base8_.bytes() +
         skip8_.bytes() + w_hot_.bytes() + dw_hot_.bytes() + row_flags_.bytes() + dense_rows_.bytes() + n_dense_.bytes() + rows_gu_.bytes() + rows_x_.bytes() +
         rows_dy_.bytes() + rows_out_.bytes() + rows_h_.bytes() + rows_dh_.bytes() + rows_dgu_.bytes();
}

void TrainContext::reserve_grads() {
  // Fresh gradient buffers are filled with NaN (0xffffffff) once, so a row no kernel writes shows.
  const std::size_t gu = sz((gated() ? 2 : 1) * ldn() * k()), dd = sz(k() * ldn());
  if (dw_gu_.size() < gu) {
    dw_gu_.resize(gu);
    TWELL_CUDA_CHECK(cudaMemset(dw_gu_.get(), 0xff, dw_gu_.bytes()));
  }
  if (dw_down_.size() < dd) {
    dw_down_.resize(dd);
    TWELL_CUDA_CHECK(cudaMemset(dw_down_.get(), 0xff, dw_down_.bytes()));
  }
}

TrainForwardResult TrainContext::forward(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, Path path,
                                         cudaStream_t stream) {
  TWELL_CHECK(!w_.empty(), ErrorCode::invalid_argument, "TrainContext: upload_weights() first");
  TWELL_CHECK(m >= 1 && m <= 0x7fffffff, ErrorCode::invalid_argument, "TrainContext: M = {} out of range", m);
  TWELL_CHECK(x != nullptr && y != nullptr, ErrorCode::invalid_argument, "TrainContext: null x or y");
  mark("start", stream);
  TWELL_CUDA_CHECK(cudaMemsetAsync(scalars_.get(), 0, sizeof(DenseTrainScalars), stream));
  saved_m_ = m;
  TrainForwardResult r;
  if (path == Path::automatic && count_pending_) {  // the previous dense step's count (long done)
    TWELL_CUDA_CHECK(cudaEventSynchronize(counted_));
    last_density_ = static_cast<double>(scalars_host_[0].active) / (static_cast<double>(pending_m_) * static_cast<double>(n()));
    count_pending_ = false;
  }
  // Plan (ffn_plan.hpp: pure host, unit-tested), then execute.
  const TrainPlan plan = plan_train_forward(
      opt_, {.m = m, .path = path, .gated = gated(), .last_density = last_density_, .hot_split = !hot_.empty()});
  const double limit = plan.limit;
  if (plan.step != TrainStep::count) {
    dense_forward_stacked(x, m, y, stream);
    mark("fwd: dense", stream);
    if (path == Path::dense) {
      r.path = "dense cublasLt (stacked gate|up GEMM)";
    } else if (plan.below_min_rows) {
      r.path = "dense cublasLt (M below the training dispatch minimum)";
    } else {
      TWELL_CUDA_CHECK(cudaMemcpyAsync(scalars_host_.get(), scalars_.get(), sizeof(DenseTrainScalars),
                                       cudaMemcpyDeviceToHost, stream));
      TWELL_CUDA_CHECK(cudaEventRecord(counted_, stream));
      count_pending_ = true;
      pending_m_ = m;
      r.path = fmt::format("dense cublasLt (the previous step measured {:.2f}% density)", 100 * last_density_);
    }
    return r;
  }
  // Gate GEMM with ReLU: TwELL words (+ the overflowed blocks' values in g_) from the sm90 kernel
  // where it can serve (TrainContextOptions::gate_sm90), else every value into g_ [m, ldn]
  // (columns ≥ N unwritten: nothing reads them); then the exact per-row counts and their prefix sum.
  const bool calibrating = opt_.hot_neurons_auto && !hot_calibrated_ && m >= opt_.hot_neurons_min_rows;
  row_counts_.reserve(sz(m));
  offsets_.reserve(sz(m + 1));
  CsrBuildParams cp;
  cp.ld_src = ldn();
  cp.m = m;
  cp.n = n();
  cp.row_counts = row_counts_.get();
  cp.offsets = offsets_.get();
  // The column mask of the hot set, and the hot part's gate columns gathered by the count where it
  // can (hot_forward_up's input); again after a calibration, which may change the set.
  const auto hot_columns = [&] {
    cp.skip8 = hot_.empty() ? nullptr : skip8_.get();
    cp.hot_base8 = nullptr;
    cp.hot_out = nullptr;
    cp.ld_hot = cp.hot_count = 0;
    hot_gathered_ = false;
    if (hot_.empty()) return;
    const std::int64_t ld_hot = (gated() ? 2 : 1) * ldh();
    DeviceBuffer<__nv_bfloat16>& dst = gated() ? gu_ : hbuf();
    dst.reserve(sz(m * ld_hot));
    if (csr_count_can_gather(hot_count(), ld_hot, dst.get())) {
      cp.hot_base8 = hot_base8_.get();
      cp.hot_out = dst.get();
      cp.ld_hot = ld_hot;
      cp.hot_count = hot_count();
      hot_gathered_ = true;
    }
  };
  hot_columns();
  const bool twell_gate = opt_.gate_sm90 && gate_sm90_ok_ && k() % 8 == 0 &&
                          (reinterpret_cast<std::uintptr_t>(x) & 15) == 0 && !calibrating &&
                          (hot_.empty() || hot_gathered_) && (last_dense_rows_ == 0 || opt_.gate_sm90_dense_rows) &&
                          !(path == Path::automatic && last_density_ > limit);
  g_.reserve(sz(m * ldn()));
  cp.src = g_.get();
  // Every ReLU gate value into g_ by cuBLASLt: the gate here, or after a TwELL gate on a density jump.
  const auto dense_gate = [&] {
    gemm_->run({m, n(), k(), k(), k(), ldn(), GemmEpilogue::relu}, w_.gate_up(), x, g_.get(), stream);
  };
  if (twell_gate) {
    const std::int64_t tiles = (n() + kTwellTile - 1) / kTwellTile;
    twell_words_.reserve(sz(m * tiles * kTrainTwellWords));
    twell_row_ovf_.reserve(sz(m));
    twell_counters_.reserve(1);
    GatePackParams gp;
    gp.x = x;
    gp.w = w_.gate_up();  // rows [0, N): Wg (gated) or Wu (non-gated)
    gp.m = m;
    gp.n = n();
    gp.k = k();
    gp.words_per_tile = kTrainTwellWords;
    gp.words = twell_words_.get();
    gp.row_overflow = twell_row_ovf_.get();
    gp.counters = twell_counters_.get();
    gp.gate = g_.get();
    gp.ld_gate = ldn();
    gp.sm_count = sm_count_;
    gp.heavy_rows = opt_.gate_sm90_heavy_rows;
    launch_twell_gate_pack_sm90(gp, stream);
    cp.words = twell_words_.get();
    cp.words_per_tile = kTrainTwellWords;
    mark("fwd: gate GEMM + TwELL epilogue", stream);
  } else {
    dense_gate();
    mark("fwd: gate GEMM", stream);
  }
  if (calibrating) {
    calibrate_hot_neurons(m, stream);
    mark("fwd: hot-neuron calibration", stream);
    hot_columns();
  }
  const std::int64_t n_cold = n() - hot_count();
  if (opt_.dense_rows_density > 0) {
    cp.dense_row_cap = static_cast<std::int64_t>(opt_.dense_rows_density * static_cast<double>(n_cold));
    cp.dense_rows_min = std::max<std::int64_t>(opt_.dense_rows_min, 1);
    row_flags_.reserve(sz(m));
    dense_rows_.reserve(sz(m));
    cp.row_flags = row_flags_.get();
    cp.dense_rows = dense_rows_.get();
    cp.n_dense = n_dense_.get();
  }
  csr_count_and_scan(cp, cub_ws_, stream);
  mark("fwd: CSR count + scan", stream);
  // The TwELL gate's overflow counts travel with the totals (the same wait, no other).
  launch_csr_publish_totals(offsets_.get() + m, cp.n_dense, twell_gate ? &twell_counters_.get()->overflow_tiles : nullptr,
                            totals_dev_, stream);
  TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
  r.nnz = totals_host_[0];
  r.overflow_tiles = totals_host_[2];
  r.overflow_rows = totals_host_[3];
  const std::int64_t n_dense = totals_host_[1];
  const std::int64_t hot_n = hot_count();
  const std::int64_t rows_n = n_dense >= cp.dense_rows_min ? n_dense : 0;  // fewer: the CSR holds them
  last_dense_rows_ = rows_n;
  // The dispatch's measure, comparable with the limit set for plain CSR steps: the CSR's non-zeros
  // plus each dense row at the row cap and each hot neuron at the hot threshold's count (their
  // break-even counts), over M·N.
  const double hot_density = std::max(0.0, hot_threshold());
  const double eff_nnz = static_cast<double>(r.nnz) +
                         static_cast<double>(std::max<std::int64_t>(cp.dense_row_cap, 0)) * static_cast<double>(rows_n) +
                         hot_density * static_cast<double>(m) * static_cast<double>(hot_n);
  r.density = eff_nnz / (static_cast<double>(m) * static_cast<double>(n()));
  // The backward's transposed index addresses entries with 32 bits: refuse a forced sparse step
  // beyond that before anything is written; automatic dispatch runs dense there (runs_sparse).
  TWELL_CHECK(!plan.forced_sparse || r.nnz <= kMaxSparseTrainNnz, ErrorCode::unsupported,
              "sparse training step: {} non-zeros exceed the 2^31 − 1 its 32-bit entry indices address; split the "
              "batch (M = {}) or use the dense or automatic path",
              r.nnz, m);
  r.sparse = plan.runs_sparse(r.density, r.nnz);
  last_density_ = r.density;
  nnz_ = r.nnz;
  if (r.sparse) {
    r.hot_neurons = saved_hot_ = hot_n;
    r.dense_rows = saved_rows_ = rows_n;
    reserve_entries(cols_, nnz_);
    reserve_entries(p_, nnz_);
    cp.cols = cols_.get();
    cp.vals = p_.get();
    if (nnz_ > 0) launch_csr_fill(cp, stream);
    mark("fwd: count read-back + CSR fill", stream);
    sparse_forward(x, m, y, stream);
    mark("fwd: sparse up+down", stream);
    r.path = twell_gate ? "twell sparse training (CSR of the sm90 gate's TwELL, exact)"
                        : "twell sparse training (CSR of the gate, exact)";
    if (saved_hot_ > 0) {
      hot_forward_up(x, m, scalars_.get(), stream);
      hot_forward_down(m, y, stream);
      mark("fwd: hot neurons: down GEMM", stream);
      r.path += fmt::format("; {} of {} neurons (the hot ones) dense", saved_hot_, n());
    }
    if (saved_rows_ > 0) {
      dense_rows_forward(x, y, stream);
      mark("fwd: dense rows", stream);
      r.path += fmt::format("; {} of {} rows (over {} non-zeros) dense", saved_rows_, m, cp.dense_row_cap);
    }
  } else {
    if (twell_gate) {  // the TwELL gate left no dense gate: one GEMM more, on a density jump only
      dense_gate();
      mark("fwd: gate GEMM (dense, after the TwELL gate)", stream);
    }
    dense_forward_after_gate(x, m, y, stream);
    mark("fwd: dense rest", stream);
    r.path = "dense cublasLt after the gate GEMM (density above threshold)";
  }
  return r;
}

void TrainContext::sparse_forward(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, cudaStream_t stream) {
  reserve_entries(u_e_, gated() ? nnz_ : 0);
  row_l1_.reserve(sz(m));
  SparseTrainForwardParams p;
  p.x = x;
  p.offsets = offsets_.get();
  p.cols = cols_.get();
  p.p = p_.get();
  p.u = u_e_.get();
  p.w_up = gated() ? w_.up() : nullptr;
  p.w_down_t = w_.down_t();
  p.y = y;
  p.row_l1 = row_l1_.get();
  p.ld = k();
  p.m = m;
  p.k = k();
  p.gated = gated();
  p.min_blocks = opt_.token_min_blocks;
  launch_sparse_train_forward(p, stream);
  launch_sum_rows(row_l1_.get(), m, &scalars_.get()->l1_sum, stream);
  // active count = nnz = offsets[m] (int64 and unsigned long long have the same size)
  static_assert(sizeof(std::int64_t) == sizeof(unsigned long long));
  TWELL_CUDA_CHECK(cudaMemcpyAsync(&scalars_.get()->active, offsets_.get() + m, sizeof(std::int64_t),
                                   cudaMemcpyDeviceToDevice, stream));
  saved_ = Saved::sparse;
  saved_bytes_ = sz(m + 1) * sizeof(std::int64_t) +
                 sz(nnz_) * (sizeof(std::int32_t) + sizeof(__nv_bfloat16) + (gated() ? sizeof(float) : 0)) +
                 sz(m * (gated() ? 2 : 1) * ldh()) * sizeof(__nv_bfloat16) +  // [g | u]_hot or h_hot
                 (saved_rows_ > 0 ? sz(m) + sz(saved_rows_) * (sizeof(std::int32_t) +  // row flags, list, [g | u]_R
                                                                sz((gated() ? 2 : 1) * ldn()) * sizeof(__nv_bfloat16))
                                  : 0);
}

DenseTrainElementwiseParams TrainContext::elementwise_params(std::int64_t m) {
  hbuf().reserve(sz(m * ldn()));
  DenseTrainElementwiseParams e;
  e.m = m;
  e.n = n();
  e.ldn = ldn();
  e.gated = gated();
  e.h = hbuf().get();
  e.ld_h = ldn();
  e.scalars = scalars_.get();
  return e;
}

void TrainContext::dense_forward_stacked(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y, cudaStream_t stream) {
  DenseTrainElementwiseParams e = elementwise_params(m);
  if (gated()) {
    gu_.reserve(sz(m * 2 * ldn()));
    gemm_->run({m, 2 * ldn(), k(), k(), k(), 2 * ldn(), GemmEpilogue::none}, w_.gate_up(), x, gu_.get(), stream);
    e.g = gu_.get();
    e.u = gu_.get() + ldn();
    e.ld_g = e.ld_u = 2 * ldn();
    saved_bytes_ = sz(m * 3 * ldn()) * sizeof(__nv_bfloat16);  // g, u and h
  } else {
    gemm_->run({m, ldn(), k(), k(), k(), ldn(), GemmEpilogue::relu}, w_.gate_up(), x, hbuf().get(), stream);
    saved_bytes_ = sz(m * ldn()) * sizeof(__nv_bfloat16);  // h (its sign is the ReLU mask)
  }
  launch_dense_train_forward(e, stream);
  gemm_->run({m, k(), ldn(), ldn(), ldn(), k(), GemmEpilogue::none}, w_.down(), hbuf().get(), y, stream);
  saved_ = Saved::dense_stacked;
  saved_hot_ = saved_rows_ = 0;
}

void TrainContext::dense_forward_after_gate(const __nv_bfloat16* x, std::int64_t m, __nv_bfloat16* y,
                                            cudaStream_t stream) {
  DenseTrainElementwiseParams e = elementwise_params(m);
  if (gated()) {
    u_.reserve(sz(m * ldn()));
    gemm_->run({m, ldn(), k(), k(), k(), ldn(), GemmEpilogue::none}, w_.up(), x, u_.get(),
                    stream);
    // The backward reads g: a copy of its own when g_ is shared (the next layer's gate overwrites it).
    const __nv_bfloat16* g = g_.get();
    if (scratch_.use_count() > 1) {
      g_saved_.reserve(sz(m * ldn()));
      TWELL_CUDA_CHECK(cudaMemcpyAsync(g_saved_.get(), g_.get(), sz(m * ldn()) * sizeof(__nv_bfloat16),
                                       cudaMemcpyDeviceToDevice, stream));
      g = g_saved_.get();
    }
    saved_g_ = g;
    e.g = g;
    e.u = u_.get();
    e.ld_g = e.ld_u = ldn();
    saved_bytes_ = sz(m * 3 * ldn()) * sizeof(__nv_bfloat16);
  } else {
    // g_ already is h = ReLU(x·Wuᵀ); the kernel zeroes its padding columns and counts.
    TWELL_CUDA_CHECK(cudaMemcpy2DAsync(hbuf().get(), sz(ldn()) * 2, g_.get(), sz(ldn()) * 2, sz(n()) * 2, sz(m),
                                       cudaMemcpyDeviceToDevice, stream));
    saved_bytes_ = sz(m * ldn()) * sizeof(__nv_bfloat16);
  }
  launch_dense_train_forward(e, stream);
  gemm_->run({m, k(), ldn(), ldn(), ldn(), k(), GemmEpilogue::none}, w_.down(), hbuf().get(), y, stream);
  saved_ = Saved::dense_split;
  saved_hot_ = saved_rows_ = 0;
}

void TrainContext::backward(const __nv_bfloat16* x, const __nv_bfloat16* dy, std::int64_t m, double l1_coeff,
                            __nv_bfloat16* dx, cudaStream_t stream) {
  TWELL_CHECK(saved_ != Saved::none, ErrorCode::invalid_argument, "TrainContext: backward() needs a forward() first");
  TWELL_CHECK(m == saved_m_, ErrorCode::shape_mismatch, "TrainContext: backward for M = {} after a forward for M = {}", m,
              saved_m_);
  TWELL_CHECK(x && dy && dx, ErrorCode::invalid_argument, "TrainContext: null x, dy or dx");
  reserve_grads();
  const float c1 = static_cast<float>(l1_coeff / static_cast<double>(m));
  if (saved_ == Saved::sparse) {
    sparse_backward(x, dy, m, c1, dx, stream);
  } else {
    dense_backward(x, dy, m, c1, dx, stream);
    mark("bwd: dense", stream);
  }
}

void TrainContext::backward(const __nv_bfloat16* x, const __nv_bfloat16* dy, std::int64_t m,
                            const float* l1_coeff_device, __nv_bfloat16* dx, cudaStream_t stream) {
  TWELL_CHECK(l1_coeff_device != nullptr, ErrorCode::invalid_argument, "TrainContext: null l1_coeff_device");
  // The kernels read the coefficient when they run: c1 = (1 / m) · *l1_coeff_device.
  c1_scale_ = l1_coeff_device;
  try {
    backward(x, dy, m, 1.0, dx, stream);
  } catch (...) {
    c1_scale_ = nullptr;
    throw;
  }
  c1_scale_ = nullptr;
}

void TrainContext::dense_backward(const __nv_bfloat16* x, const __nv_bfloat16* dy, std::int64_t m, float c1,
                                  __nv_bfloat16* dx, cudaStream_t stream) {
  const std::int64_t kin = gated() ? 2 * ldn() : ldn();  // columns of [dg | du]
  dh_.reserve(sz(m * ldn()));
  dgu_.reserve(sz(m * kin));
  LtGemm& gemm = *gemm_;
  // dh = dy · Wd: [m, K] · [K, ldn]
  gemm.matmul({false, false, m, ldn(), k(), k(), ldn(), ldn(), false, GemmEpilogue::none}, dy, w_.down(), dh_.get(),
              stream);
  DenseTrainElementwiseParams e = elementwise_params(m);
  e.scalars = nullptr;
  e.dh = dh_.get();
  e.ld_dh = ldn();
  e.c1 = c1;
  e.c1_scale = c1_scale_;
  e.ld_d = kin;
  if (gated()) {
    // h again from the saved [g | u] (the same bits as the forward's), for the dWd GEMM below: h
    // is scratch for a gated layer, overwritten by the layers whose forwards ran since.
    e.recompute_h = true;
    const bool stacked = saved_ == Saved::dense_stacked;
    e.g = stacked ? gu_.get() : saved_g_;
    e.u = stacked ? gu_.get() + ldn() : u_.get();
    e.ld_g = e.ld_u = stacked ? 2 * ldn() : ldn();
    e.d_gate = dgu_.get();
    e.d_up = dgu_.get() + ldn();
  } else {
    e.d_up = dgu_.get();
  }
  launch_dense_train_backward(e, stream);
  // dx = [dg | du] · [Wg; Wu]: [m, kin] · [kin, K]
  gemm.matmul({false, false, m, k(), kin, kin, k(), k(), false, GemmEpilogue::none}, dgu_.get(), w_.gate_up(), dx,
              stream);
  // [dWg; dWu] = [dg | du]ᵀ · x: [kin, m] · [m, K], fp32
  gemm.matmul({true, false, kin, k(), m, kin, k(), k(), true, GemmEpilogue::none}, dgu_.get(), x, dw_gu_.get(), stream);
  // dWd = dyᵀ · h: [K, m] · [m, ldn], fp32
  gemm.matmul({true, false, k(), ldn(), m, k(), ldn(), ldn(), true, GemmEpilogue::none}, dy, hbuf().get(), dw_down_.get(),
              stream);
}

void TrainContext::sparse_backward(const __nv_bfloat16* x, const __nv_bfloat16* dy, std::int64_t m, float c1,
                                   __nv_bfloat16* dx, cudaStream_t stream) {
  reserve_entries(d_up_e_, nnz_);
  reserve_entries(d_gate_e_, gated() ? nnz_ : 0);
  SparseTrainBackwardParams b;
  b.dy = dy;
  b.offsets = offsets_.get();
  b.cols = cols_.get();
  b.p = p_.get();
  b.u = gated() ? u_e_.get() : nullptr;
  b.w_gate = gated() ? w_.gate_up() : nullptr;
  b.w_up = w_.up();
  b.w_down_t = w_.down_t();
  b.c1 = c1;
  b.c1_scale = c1_scale_;
  b.d_up = d_up_e_.get();
  b.d_gate = gated() ? d_gate_e_.get() : nullptr;
  b.dx = dx;
  b.ld = k();
  b.m = m;
  b.k = k();
  b.gated = gated();
  b.min_blocks = opt_.token_min_blocks;
  launch_sparse_train_backward(b, stream);
  mark("bwd: token-major dt, dx", stream);

  // Per neuron: its entries (tokens ascending), then the three weight-gradient rows.
  reserve_entries(entry_rows_, nnz_);
  reserve_entries(order_, nnz_);
  reserve_entries(tmp_keys_, nnz_);
  reserve_entries(tmp_vals_, nnz_);
  col_offsets_.reserve(sz(n() + 1));
  CscParams c;
  c.offsets = offsets_.get();
  c.cols = cols_.get();
  c.m = m;
  c.n = n();
  c.nnz = nnz_;
  c.entry_rows = entry_rows_.get();
  c.order = order_.get();
  c.col_offsets = col_offsets_.get();
  c.tmp_keys = tmp_keys_.get();
  c.tmp_vals = tmp_vals_.get();
  build_csc(c, cub_ws_, stream);
  mark("bwd: transposed index", stream);

  // The entries in neuron order, gathered once for all the weight-gradient passes.
  reserve_entries(wg_entries_, nnz_);
  WeightGradEntriesParams ge;
  ge.entry_rows = entry_rows_.get();
  ge.order = order_.get();
  ge.p = p_.get();
  ge.u = gated() ? u_e_.get() : nullptr;
  ge.d_up = d_up_e_.get();
  ge.d_gate = gated() ? d_gate_e_.get() : nullptr;
  ge.out = wg_entries_.get();
  ge.nnz = nnz_;
  ge.gated = gated();
  launch_weight_grad_entries(ge, stream);

  // Work items: runs of at most `run` entries of one neuron, so that hot neurons are shared
  // among warps; at most 8192 items beyond one per neuron (their partial sums take 6 KB each).
  // The nnz / 8192 floor holds for a user-set run too: it bounds the partials at 8192 · 6 KB.
  const std::int64_t run = std::max<std::int64_t>(opt_.weight_grad_run > 0 ? opt_.weight_grad_run : 128, (nnz_ + 8191) / 8192);
  const std::int64_t extras = nnz_ / run;
  wg_item_counts_.reserve(sz(n()));
  wg_item_offsets_.reserve(sz(n() + 1));
  wg_item_neuron_.reserve(sz(n() + extras));
  WeightGradItemsParams ip;
  ip.col_offsets = col_offsets_.get();
  ip.n = n();
  ip.run = run;
  ip.item_counts = wg_item_counts_.get();
  ip.item_offsets = wg_item_offsets_.get();
  ip.item_neuron = wg_item_neuron_.get();
  build_weight_grad_items(ip, cub_ws_, stream);

  // Workspace for the partials: the gate workspace when it is large enough (it is free until the
  // next forward), else a buffer of its own.
  const WeightGradPasses passes = weight_grad_passes(m, k(), l2_bytes_, opt_.weight_grad_l2_fraction);
  const std::int64_t w = passes.slice_cols;
  const std::size_t need = sz(extras * 3 * kWeightGradMaxSlice) * sizeof(float);
  unsigned char* work = nullptr;
  if (g_.bytes() >= need) {
    work = reinterpret_cast<unsigned char*>(g_.get());
  } else {
    wg_work_.reserve(need);
    work = wg_work_.get();
  }
  mark("bwd: weight-gradient items", stream);

  dwd_t_.reserve(sz(n() * k()));
  SparseWeightGradParams g;
  g.entries = wg_entries_.get();
  g.col_offsets = col_offsets_.get();
  g.item_offsets = wg_item_offsets_.get();
  g.item_neuron = wg_item_neuron_.get();
  g.run = run;
  g.items_bound = n() + extras;
  g.partials = extras > 0 ? reinterpret_cast<float*>(work) : nullptr;
  g.dw_gate = gated() ? dw_gu_.get() : nullptr;
  g.dw_up = gated() ? dw_gu_.get() + ldn() * k() : dw_gu_.get();
  g.dw_down_t = dwd_t_.get();
  g.n = n();
  g.k = k();
  g.gated = gated();
  // Passes over column slices (and token blocks) whose x and dy columns (2 · rows · slice bf16)
  // fit the L2 budget: each pass's x, dy reads then hit L2 whichever item asks. A slice costs
  // nothing extra beyond re-reading the entries (16 B each); an extra token block costs one
  // read-modify-write of the fp32 gradient slice, so slices shrink to 256 columns before blocks
  // appear (lab/notes/2026-11-cuda-perf-log.md).
  for (std::int64_t c0 = 0; c0 < k(); c0 += w) {
    g.col_begin = c0;
    g.col_end = std::min(k(), c0 + w);
    g.ld = k();
    g.x = x + c0;
    g.dy = dy + c0;
    for (std::int64_t r0 = 0; r0 < m; r0 += passes.block_rows) {
      g.row_begin = r0;
      g.row_end = std::min(m, r0 + passes.block_rows);
      g.accumulate = r0 > 0;
      launch_sparse_weight_grads(g, stream);
      launch_weight_grad_fixup(g, stream);
    }
  }
  mark("bwd: weight gradients", stream);
  if (saved_hot_ > 0) {
    hot_backward_reserve(m);
    hot_backward_grads(x, dy, m, c1, stream);
    hot_backward_dx(m, dx, stream);
    mark("bwd: hot neurons: dx GEMM", stream);
    hot_backward_scatter(stream);
    mark("bwd: hot neurons: scatter", stream);
  }
  launch_transpose_f32(dwd_t_.get(), k(), n(), k(), dw_down_.get(), ldn(), stream);
  mark("bwd: dWd transpose", stream);
  if (saved_rows_ > 0) {
    dense_rows_backward(x, dy, c1, dx, stream);
    mark("bwd: dense rows", stream);
  }
}

std::vector<std::int64_t> TrainContext::choose_hot_neurons(const std::vector<std::uint32_t>& counts, std::int64_t m) const {
  TWELL_CHECK(static_cast<std::int64_t>(counts.size()) == n(), ErrorCode::shape_mismatch,
              "choose_hot_neurons: {} counts for N = {} neurons", counts.size(), n());
  TWELL_CHECK(m >= 1, ErrorCode::invalid_argument, "choose_hot_neurons: M must be ≥ 1 (got {})", m);
  return neurons_over(counts, hot_threshold(), m, max_hot_neurons(), over_share());
}

void TrainContext::set_hot_neurons(const std::vector<std::int64_t>& hot, cudaStream_t stream) {
  TWELL_CHECK(!w_.empty(), ErrorCode::invalid_argument, "TrainContext: upload_weights() first");
  std::vector<char> is_hot(sz(n()), 0);
  for (const std::int64_t i : hot) {
    TWELL_CHECK(i >= 0 && i < n(), ErrorCode::invalid_argument, "set_hot_neurons: neuron {} out of [0, {})", i, n());
    is_hot[sz(i)] = 1;
  }
  // A backward after this call would pair the last forward's saved hot columns with the new set.
  if (saved_ == Saved::sparse && saved_hot_ > 0) saved_ = Saved::none;
  hot_.clear();
  for (std::int64_t i = 0; i < n(); ++i)
    if (is_hot[sz(i)]) hot_.push_back(i);
  hot_calibrated_ = true;  // an explicit set counts as a calibration
  if (hot_.empty()) return;
  std::vector<std::int32_t> idx(hot_.begin(), hot_.end()), base8(sz((n() + 7) / 8), 0);
  std::vector<unsigned char> skip(sz((n() + 7) / 8), 0);
  for (const std::int64_t i : hot_) skip[sz(i / 8)] |= static_cast<unsigned char>(1u << (i % 8));
  for (std::size_t b = 1; b < base8.size(); ++b) base8[b] = base8[b - 1] + __builtin_popcount(skip[b - 1]);
  hot_idx_.reserve(idx.size());
  hot_base8_.reserve(base8.size());
  skip8_.reserve(skip.size());
  TWELL_CUDA_CHECK(cudaMemcpyAsync(hot_idx_.get(), idx.data(), idx.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice, stream));
  TWELL_CUDA_CHECK(cudaMemcpyAsync(hot_base8_.get(), base8.data(), base8.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice,
                                   stream));
  TWELL_CUDA_CHECK(cudaMemcpyAsync(skip8_.get(), skip.data(), skip.size(), cudaMemcpyHostToDevice, stream));
  gather_hot_weights(stream);
  TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));  // idx, base8 and skip die here
}

void TrainContext::gather_hot_weights(cudaStream_t stream) {
  if (hot_.empty()) return;
  const std::int64_t h = hot_count(), lh = ldh(), parts = gated() ? 3 : 2;
  w_hot_.reserve(sz(parts * lh * k()));
  TWELL_CUDA_CHECK(cudaMemsetAsync(w_hot_.get(), 0, sz(parts * lh * k()) * sizeof(__nv_bfloat16), stream));
  const int* idx = hot_idx_.get();
  __nv_bfloat16* dst = w_hot_.get();
  if (gated()) {
    launch_gather_rows(w_.gate_up(), k(), idx, h, k(), dst, k(), stream);  // Wg rows
    dst += lh * k();
  }
  launch_gather_rows(w_.up(), k(), idx, h, k(), dst, k(), stream);  // Wu rows
  launch_gather_rows(w_.down_t(), k(), idx, h, k(), dst + lh * k(), k(), stream);                      // Wdᵀ rows
}

void TrainContext::calibrate_hot_neurons(std::int64_t m, cudaStream_t stream) {
  // Rows the step will run dense (more than the dense-row cap of non-zeros in the cold neurons,
  // when at least dense_rows_min of them) cost nothing per neuron: a hot token would otherwise make
  // every neuron it fires look popular. The inference context calibrates by the same rule.
  SparseRowsRecount recount;
  DeviceBuffer<std::uint32_t> row_nnz;
  if (opt_.dense_rows_density > 0) {
    row_nnz.resize(sz(m));
    recount = [&](const std::vector<unsigned char>& cold, std::int64_t* left_out) {
      const auto n_cold = static_cast<std::int64_t>(std::count(cold.begin(), cold.end(), 1));
      const auto cap = static_cast<std::uint32_t>(opt_.dense_rows_density * static_cast<double>(n_cold));
      return read_neuron_counts_sparse_rows(g_.get(), ldn(), m, n(), cold, cap, row_nnz.get(), left_out, stream);
    };
  }
  const HotNeuronChoice c = choose_hot_neurons_calibrated(read_neuron_counts(g_.get(), ldn(), m, n(), nullptr, 0, stream),
                                                          hot_threshold(), m, max_hot_neurons(), opt_.dense_rows_min,
                                                          recount, over_share());
  set_hot_neurons(c.hot, stream);
}

void TrainContext::hot_forward_up(const __nv_bfloat16* x, std::int64_t m, DenseTrainScalars* scalars, cudaStream_t stream) {
  LtGemm& gemm = *gemm_;
  const std::int64_t lh = ldh();
  hbuf().reserve(sz(m * lh));
  if (gated()) gu_.reserve(sz(m * 2 * lh));
  // Dense rows take every neuron themselves: the hot part treats them as inactive.
  DenseTrainElementwiseParams e = block_params(gated(), m, hot_count(), lh, gated() ? gu_.get() : hbuf().get(), hbuf().get(),
                                               saved_rows_ > 0 ? row_flags_.get() : nullptr);
  e.scalars = scalars;  // adds (scalars_ after the cold part set it)
  // The hot gate columns come from the gate GEMM over every neuron (g_, ReLU applied: the same
  // ReLU(g) and g > 0 the elementwise kernels need), gathered into the first lh columns of gu_
  // (non-gated: h_, where h_hot = ReLU(x·Wu_hotᵀ) is the gate output itself), by the CSR count in
  // forward() where it could, else here; only u needs a GEMM. The elementwise kernels read
  // columns < H only.
  if (!hot_gathered_)
    launch_gather_cols(g_.get(), ldn(), hot_idx_.get(), m, hot_count(), gated() ? gu_.get() : hbuf().get(),
                       (gated() ? 2 : 1) * lh, stream);
  if (gated())
    gemm.run({m, lh, k(), k(), k(), 2 * lh, GemmEpilogue::none}, w_hot_.get() + lh * k(), x, gu_.get() + lh, stream);
  mark("fwd: hot neurons: (gather), u GEMM", stream);
  launch_dense_train_forward(e, stream);
  mark("fwd: hot neurons: elementwise", stream);
}

void TrainContext::hot_forward_down(std::int64_t m, __nv_bfloat16* y, cudaStream_t stream) {
  const std::int64_t lh = ldh();
  // y += h_hot · Wd_hotᵀ = h_hot · (Wdᵀ_hot rows)
  const __nv_bfloat16* wdt = w_hot_.get() + (gated() ? 2 : 1) * lh * k();
  gemm_->matmul({false, false, m, k(), lh, lh, k(), k(), false, GemmEpilogue::none, true}, hbuf().get(), wdt, y, stream);
}

void TrainContext::hot_backward_reserve(std::int64_t m) {
  const std::int64_t lh = ldh(), kin = gated() ? 2 * lh : lh;
  dh_.reserve(sz(m * lh));
  dgu_.reserve(sz(m * kin));
  dw_hot_.reserve(sz((kin + lh) * k()));
}

void TrainContext::hot_backward_grads(const __nv_bfloat16* x, const __nv_bfloat16* dy, std::int64_t m, float c1,
                                      cudaStream_t stream) {
  LtGemm& gemm = *gemm_;
  const std::int64_t h = saved_hot_, lh = ldh(), kin = gated() ? 2 * lh : lh;
  const __nv_bfloat16* wdt = w_hot_.get() + kin * k();
  // dh = dy · Wd_hot = dy · (Wdᵀ_hot)ᵀ
  gemm.run({m, lh, k(), k(), k(), lh, GemmEpilogue::none}, wdt, dy, dh_.get(), stream);
  mark("bwd: hot neurons: dh GEMM", stream);
  const DenseTrainElementwiseParams e = block_params(gated(), m, h, lh, gated() ? gu_.get() : hbuf().get(), hbuf().get(),
                                                     saved_rows_ > 0 ? row_flags_.get() : nullptr);
  block_backward(e, dh_.get(), c1, dgu_.get(), stream);
  mark("bwd: hot neurons: elementwise", stream);
  // [dWg; dWu]_hot = [dg | du]_hotᵀ · x and dWdᵀ_hot = h_hotᵀ · dy, fp32, scattered into their rows later.
  gemm.matmul({true, false, kin, k(), m, kin, k(), k(), true, GemmEpilogue::none}, dgu_.get(), x, dw_hot_.get(), stream);
  mark("bwd: hot neurons: d[Wg; Wu] GEMM", stream);
  gemm.matmul({true, false, lh, k(), m, lh, k(), k(), true, GemmEpilogue::none}, e.h, dy, dw_hot_.get() + kin * k(),
              stream);
  mark("bwd: hot neurons: dWd GEMM", stream);
}

void TrainContext::hot_backward_dx(std::int64_t m, __nv_bfloat16* dx, cudaStream_t stream) {
  LtGemm& gemm = *gemm_;
  const std::int64_t kin = (gated() ? 2 : 1) * ldh();
  // dx += [dg | du]_hot · [Wg_hot; Wu_hot]
  gemm.matmul({false, false, m, k(), kin, kin, k(), k(), false, GemmEpilogue::none, true}, dgu_.get(), w_hot_.get(), dx,
              stream);
}

void TrainContext::hot_backward_scatter(cudaStream_t stream) {
  const std::int64_t h = saved_hot_, lh = ldh(), kin = gated() ? 2 * lh : lh;
  const std::int32_t* idx = hot_idx_.get();
  for (std::int64_t part = 0; part < kin / lh; ++part)  // gated: the gate rows, then the up rows
    launch_scatter_rows_f32(dw_hot_.get() + part * lh * k(), k(), idx, h, k(), dw_gu_.get() + part * ldn() * k(), k(), stream);
  launch_scatter_rows_f32(dw_hot_.get() + kin * k(), k(), idx, h, k(), dwd_t_.get(), k(), stream);
}

void TrainContext::dense_rows_forward(const __nv_bfloat16* x, __nv_bfloat16* y, cudaStream_t stream) {
  const std::int64_t r = saved_rows_, kin = gated() ? 2 * ldn() : ldn();
  LtGemm& gemm = *gemm_;
  rows_x_.reserve(sz(r * k()));
  rows_out_.reserve(sz(r * k()));
  rows_gu_.reserve(sz(r * kin));
  rows_h_.reserve(sz(r * ldn()));
  launch_gather_rows(x, k(), dense_rows_.get(), r, k(), rows_x_.get(), k(), stream);
  DenseTrainElementwiseParams e = block_params(gated(), r, n(), ldn(), rows_gu_.get(), rows_h_.get(), nullptr);
  e.scalars = scalars_.get();  // adds the rows' sums (the CSR and the hot part skip them)
  // [g | u]_R (non-gated: h_R, what its backward keeps) over every neuron
  gemm.run({r, kin, k(), k(), k(), kin, gated() ? GemmEpilogue::none : GemmEpilogue::relu}, w_.gate_up(),
           rows_x_.get(), rows_gu_.get(), stream);
  launch_dense_train_forward(e, stream);
  gemm.run({r, k(), ldn(), ldn(), ldn(), k(), GemmEpilogue::none}, w_.down(), e.h, rows_out_.get(), stream);
  scatter_dense_rows(y, stream);
}

void TrainContext::dense_rows_backward(const __nv_bfloat16* x, const __nv_bfloat16* dy, float c1, __nv_bfloat16* dx,
                                       cudaStream_t stream) {
  const std::int64_t r = saved_rows_, kin = gated() ? 2 * ldn() : ldn();
  LtGemm& gemm = *gemm_;
  rows_x_.reserve(sz(r * k()));
  rows_dy_.reserve(sz(r * k()));
  rows_out_.reserve(sz(r * k()));
  rows_h_.reserve(sz(r * ldn()));
  rows_dh_.reserve(sz(r * ldn()));
  rows_dgu_.reserve(sz(r * kin));
  // x_R is gathered again rather than kept from the forward: keeping it would add R·K·2 saved
  // bytes to spare a gather of the same size.
  launch_gather_rows(x, k(), dense_rows_.get(), r, k(), rows_x_.get(), k(), stream);
  launch_gather_rows(dy, k(), dense_rows_.get(), r, k(), rows_dy_.get(), k(), stream);
  // dh_R = dy_R · Wd
  gemm.matmul({false, false, r, ldn(), k(), k(), ldn(), ldn(), false, GemmEpilogue::none}, rows_dy_.get(), w_.down(),
              rows_dh_.get(), stream);
  const DenseTrainElementwiseParams e = block_params(gated(), r, n(), ldn(), rows_gu_.get(), rows_h_.get(), nullptr);
  block_backward(e, rows_dh_.get(), c1, rows_dgu_.get(), stream);
  // dx_R = [dg | du]_R · [Wg; Wu], into dx's rows (the CSR and hot parts left them 0)
  gemm.matmul({false, false, r, k(), kin, kin, k(), k(), false, GemmEpilogue::none}, rows_dgu_.get(), w_.gate_up(),
              rows_out_.get(), stream);
  scatter_dense_rows(dx, stream);
  // [dWg; dWu] += [dg | du]_Rᵀ · x_R; dWd += dy_Rᵀ · h_R (fp32, β = 1)
  gemm.matmul({true, false, kin, k(), r, kin, k(), k(), true, GemmEpilogue::none, true}, rows_dgu_.get(), rows_x_.get(),
              dw_gu_.get(), stream);
  gemm.matmul({true, false, k(), ldn(), r, k(), ldn(), ldn(), true, GemmEpilogue::none, true}, rows_dy_.get(), e.h,
              dw_down_.get(), stream);
}

void TrainContext::scatter_dense_rows(__nv_bfloat16* out, cudaStream_t stream) {
  DenseRowsScatterParams sp;  // the inference path's scatter: list and count as the CSR build left them
  sp.list = dense_rows_.get();
  sp.selected = n_dense_.get();
  sp.capacity = saved_rows_;
  sp.y_h = rows_out_.get();
  sp.y = out;
  sp.ld_y = k();
  sp.k = k();
  launch_dense_rows_scatter(sp, stream);
}

void TrainContext::block_backward(const DenseTrainElementwiseParams& block, const __nv_bfloat16* dh, float c1,
                                  __nv_bfloat16* d, cudaStream_t stream) {
  DenseTrainElementwiseParams e = block;
  if (e.gated) {  // h again from the saved [g | u] (the forward's arithmetic, so the same bits), in the same pass
    e.recompute_h = true;
    e.d_gate = d;
    e.d_up = d + e.ldn;
  } else {
    e.d_up = d;
  }
  e.scalars = nullptr;
  e.dh = dh;
  e.ld_dh = e.ldn;
  e.c1 = c1;
  e.c1_scale = c1_scale_;
  e.ld_d = (e.gated ? 2 : 1) * e.ldn;
  launch_dense_train_backward(e, stream);
}

void TrainContext::write_scalars(float* l1, float* l0, cudaStream_t stream) const {
  TWELL_CHECK(saved_ != Saved::none, ErrorCode::invalid_argument, "TrainContext: write_scalars() needs a forward() first");
  launch_train_scalars_f32(scalars_.get(), saved_m_, l1, l0, stream);
}

FfnTrainScalars TrainContext::read_scalars(cudaStream_t stream) {
  TWELL_CUDA_CHECK(cudaMemcpyAsync(scalars_host_.get(), scalars_.get(), sizeof(DenseTrainScalars), cudaMemcpyDeviceToHost,
                                   stream));
  TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
  FfnTrainScalars s;
  s.l1 = scalars_host_[0].l1_sum / static_cast<double>(saved_m_);
  s.l0 = static_cast<double>(scalars_host_[0].active) / static_cast<double>(saved_m_);
  return s;
}

}  // namespace twell::cuda
