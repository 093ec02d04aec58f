// The public per-layer FFN API (twell/cuda/ffn_layer.hpp) over FfnContext and TrainContext.
#include "twell/cuda/ffn_layer.hpp"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <utility>

#include "cuda/common/check.hpp"
#include "cuda/common/convert.hpp"
#include "cuda/ffn_context.hpp"
#include "cuda/ffn_workspace.hpp"
#include "cuda/ops/gemv.hpp"
#include "cuda/ops/model_ops.hpp"
#include "cuda/sm90/union_ffn.hpp"
#include "cuda/train/train_context.hpp"
#include "twell/error.hpp"

namespace twell::cuda {
namespace {

static_assert(sizeof(bf16) == sizeof(__nv_bfloat16) && alignof(bf16) <= alignof(__nv_bfloat16),
              "twell::bf16 and __nv_bfloat16 must share their layout");

const __nv_bfloat16* nv(const bf16* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }
__nv_bfloat16* nv(bf16* p) { return reinterpret_cast<__nv_bfloat16*>(p); }
cudaStream_t cu(Stream s) { return static_cast<cudaStream_t>(s); }

DeviceFfnWeights internal(const DeviceWeights& w) {
  TWELL_CHECK(w.w_up != nullptr && w.w_down != nullptr && w.n > 0 && w.k > 0, ErrorCode::invalid_argument,
              "DeviceWeights: w_up, w_down and positive n, k are required (n = {}, k = {})", w.n, w.k);
  return {w.w_gate, w.w_up, w.w_down, w.n, w.k, w.type};
}

template <typename Ctx>
Ctx& loaded(const std::unique_ptr<Ctx>& ctx, std::int64_t n, const char* what) {
  TWELL_CHECK(n > 0, ErrorCode::invalid_argument, "{}: load_weights() or upload_weights() first", what);
  return *ctx;
}

}  // namespace

DeviceScope::DeviceScope(int device) {
  TWELL_CUDA_CHECK(cudaGetDevice(&previous_));
  if (device != previous_) TWELL_CUDA_CHECK(cudaSetDevice(device));
}

DeviceScope::~DeviceScope() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
}

InferWorkspace::InferWorkspace(std::shared_ptr<DeviceAllocator> allocator)
    : set_(std::make_shared<FfnWorkspace>(false, std::move(allocator))) {}
std::int64_t InferWorkspace::bytes() const noexcept { return static_cast<std::int64_t>(set_->bytes()); }
LtGemm& InferWorkspace::gemm() const noexcept { return set_->gemm; }
void InferWorkspace::set_gemm_autotune(int candidates, std::int64_t max_rows) {
  const LtGemm::Autotune a{candidates > 1, candidates, max_rows};
  set_->gemm.set_autotune(a);
  if (set_->side_gemm) set_->side_gemm->set_autotune(a);  // else side() takes gemm's when made
}
// run_step's shared buffers: the decode kernel's gate and partials, the union FFN's slots, counts
// and h, the dense FFN's gu and h (the one-token kernels' buffers and the decode tickets are the
// layer's own, sized once; cuBLASLt's workspace never moves).
std::vector<const void*> InferWorkspace::step_addresses() const {
  return {set_->g.get(),          set_->gu.get(),           set_->h.get(),      set_->decode_partials.get(),
          set_->union_list.get(), set_->union_counts.get(), set_->union_h.get()};
}

TrainWorkspace::TrainWorkspace(std::shared_ptr<DeviceAllocator> allocator)
    : set_(std::make_shared<TrainScratch>(std::move(allocator))) {}
std::int64_t TrainWorkspace::bytes() const noexcept { return static_cast<std::int64_t>(set_->bytes()); }

// ---- inference ----

FfnLayer::FfnLayer(const InferWorkspace* workspace)
    : ctx_(std::make_unique<FfnContext>(ContextOptions{}, workspace ? workspace->get() : nullptr)) {}
FfnLayer::~FfnLayer() = default;
FfnLayer::FfnLayer(FfnLayer&&) noexcept = default;
FfnLayer& FfnLayer::operator=(FfnLayer&&) noexcept = default;

void FfnLayer::load_weights(const DeviceWeights& w, Stream stream) { ctx_->load_weights(internal(w), cu(stream)); }
void FfnLayer::upload_weights(const FfnWeights& w, Stream stream) { ctx_->upload_weights(w, cu(stream)); }

void FfnLayer::forward(const bf16* x, std::int64_t m, bf16* y, Path path, Stream stream) {
  const ForwardResult r = loaded(ctx_, n(), "FfnLayer").forward(nv(x), m, nv(y), path, cu(stream));
  ++calls_;
  if (r.sparse) ++sparse_calls_;
}

bool FfnLayer::last_sparse() const noexcept { return calls_ > 0 && ctx_->last_call().sparse; }
std::string FfnLayer::last_path() const { return calls_ == 0 ? std::string() : describe_call(ctx_->last_call()); }

FfnLayer::StepPlan FfnLayer::plan_step(std::int64_t m, Path path) {
  FfnContext& c = loaded(ctx_, n(), "FfnLayer");
  TWELL_CHECK(m >= 1, ErrorCode::invalid_argument, "FfnLayer::plan_step: m = {} (at least 1)", m);
  StepPlan p;
  p.m = m;
  if (path == Path::dense) {
    p.capturable = true;
  } else if (path == Path::automatic && c.is_decode(m)) {
    p.capturable = true;
    p.sparse = c.decode_plan_sparse(m);
  } else if (path == Path::automatic && c.automatic_is_plain_dense(m)) {
    p.capturable = true;
  }
  return p;
}

void FfnLayer::prepare_step(const StepPlan& plan, Stream stream) {
  FfnContext& c = loaded(ctx_, n(), "FfnLayer");
  TWELL_CHECK(plan.capturable && plan.m >= 1, ErrorCode::invalid_argument,
              "FfnLayer::prepare_step: the plan of {} rows is not a capturable one (run forward instead)", plan.m);
  if (c.is_decode(plan.m))
    c.prepare_decode(plan.m, cu(stream));  // the dense FFN's scratch too
  else
    c.prepare_dense(plan.m);
}

void FfnLayer::run_step(const bf16* x, bf16* y, const StepPlan& plan, Stream stream) {
  FfnContext& c = loaded(ctx_, n(), "FfnLayer");
  TWELL_CHECK(plan.capturable, ErrorCode::invalid_argument,
              "FfnLayer::run_step: the plan of {} rows is not a capturable one (run forward instead)", plan.m);
  if (plan.sparse)
    c.decode_step(nv(x), plan.m, nv(y), true, cu(stream));
  else
    c.dense_forward(nv(x), plan.m, nv(y), cu(stream));
}

void FfnLayer::run_step(const ResidualNorm& in, bf16* x, bf16* y, const StepPlan& plan, Stream stream) {
  FfnContext& c = loaded(ctx_, n(), "FfnLayer");
  TWELL_CHECK(plan.capturable && plan.m == 1, ErrorCode::invalid_argument,
              "FfnLayer::run_step: a residual norm needs a capturable plan of 1 row (got {} rows{})", plan.m,
              plan.capturable ? "" : ", not capturable");
  DecodeTokenNorm d;
  d.r = in.r;
  d.first = nv(in.first);
  d.delta = nv(in.delta);
  d.w = in.w;
  d.eps = in.eps;
  if (plan.sparse && c.folds_norm()) {
    c.decode_step_folded(d, nv(y), cu(stream));
    return;
  }
  if (folds_dense_norm(plan)) {
    c.dense_token_folded(d, nv(y), cu(stream));
    return;
  }
  ops::add_rmsnorm(d.r, d.delta, 1, c.k(), d.w, d.eps, nv(x), cu(stream), d.first);
  run_step(x, y, plan, stream);
}

void FfnLayer::reorder_decode_neurons(Stream stream) { loaded(ctx_, n(), "FfnLayer").reorder_decode(cu(stream)); }
void FfnLayer::advance_decode_order(Stream stream) { loaded(ctx_, n(), "FfnLayer").advance_decode_order(cu(stream)); }
void FfnLayer::set_decode_reorder(bool on, Stream stream) { ctx_->set_decode_reorder(on, cu(stream)); }
void FfnLayer::set_dense_fold_norm(bool on) { ctx_->set_dense_fold_norm(on); }
bool FfnLayer::folds_dense_norm(const StepPlan& plan) const {
  return ctx_ && plan.capturable && !plan.sparse && plan.m == 1 && ctx_->folds_dense_norm();
}

bool FfnLayer::folds_fixed_point(const StepPlan& plan) const {
  return ctx_ && plan.capturable && plan.sparse && plan.m == 1 && ctx_->folds_norm();
}

void FfnLayer::run_step(const ResidualNorm& in, const FixedPointOut& out, const StepPlan& plan, Stream stream) {
  FfnContext& c = loaded(ctx_, n(), "FfnLayer");
  TWELL_CHECK(folds_fixed_point(plan), ErrorCode::invalid_argument,
              "FfnLayer::run_step: a fixed-point output needs a capturable sparse plan of 1 row on the one-token kernels");
  TWELL_CHECK(!in.first && !in.delta, ErrorCode::invalid_argument,
              "FfnLayer::run_step: with a fixed-point output the residual r must be current (no first or delta)");
  DecodeTokenNorm d;
  d.r = in.r;
  d.w = in.w;
  d.eps = in.eps;
  c.decode_step_fixed(d, reinterpret_cast<long long*>(out.acc), out.overflow, cu(stream));
}

void FfnLayer::set_decode_max_density(double density) {
  TWELL_CHECK(density >= 0 && density <= 1, ErrorCode::invalid_argument,
              "FfnLayer::set_decode_max_density: {} is not a density in [0, 1]", density);
  ctx_->set_decode_max_density(density);
}
double FfnLayer::decode_max_density() const noexcept { return ctx_->options().decode_max_density; }

void FfnLayer::set_decode_max_rows(std::int64_t rows) {
  const std::int64_t limit = ctx_->options().dispatch_min_rows - 1;
  TWELL_CHECK(rows >= 1 && rows <= limit, ErrorCode::invalid_argument,
              "FfnLayer::set_decode_max_rows: {} rows (1 … {}: decode sizes lie below the dispatch minimum)", rows, limit);
  ctx_->set_decode_max_rows(rows);
}
std::int64_t FfnLayer::decode_max_rows() const noexcept { return ctx_->options().decode_max_rows; }

void FfnLayer::set_decode_gemv_max_rows(std::int64_t rows) {
  TWELL_CHECK(rows >= 1 && rows <= kGemvMaxRows, ErrorCode::invalid_argument,
              "FfnLayer::set_decode_gemv_max_rows: {} rows (1 … {}; one row is the one-token kernels')", rows, kGemvMaxRows);
  ctx_->set_decode_gemv_max_rows(rows);
}
std::int64_t FfnLayer::decode_gemv_max_rows() const noexcept { return ctx_->options().decode_gemv_max_rows; }

void FfnLayer::set_union_max_rows(std::int64_t rows) {
  TWELL_CHECK(rows >= 0 && rows <= kUnionMaxRows, ErrorCode::invalid_argument,
              "FfnLayer::set_union_max_rows: {} rows (0: never, up to {})", rows, kUnionMaxRows);
  ctx_->set_union_max_rows(rows);
}
std::int64_t FfnLayer::union_max_rows() const noexcept { return ctx_->options().union_max_rows; }

void FfnLayer::set_union_min_rows(std::int64_t rows) {
  TWELL_CHECK(rows == 0 || (rows >= 2 && rows <= kUnionMaxRows), ErrorCode::invalid_argument,
              "FfnLayer::set_union_min_rows: {} rows (0: never, else 2 … {}; one row is the one-token kernels')", rows,
              kUnionMaxRows);
  ctx_->set_union_min_rows(rows);
}
std::int64_t FfnLayer::union_min_rows() const noexcept { return ctx_->options().union_min_rows; }

void FfnLayer::set_union_kernels(const UnionKernels& k) {
  TWELL_CHECK(union_shape_ok(k.up_split, k.down_split, k.up_clusters), ErrorCode::invalid_argument,
              "FfnLayer::set_union_kernels: splits {} / {} (1, 2, 4 or 8), up clusters {} (≥ 0; 0: one a 64-slot block)",
              k.up_split, k.down_split, k.up_clusters);
  ctx_->set_union_kernels(k.up_split, k.down_split, k.up_clusters);
}
static_assert(ContextOptions{}.union_up_split == FfnLayer::UnionKernels{}.up_split &&
                  ContextOptions{}.union_down_split == FfnLayer::UnionKernels{}.down_split &&
                  ContextOptions{}.union_up_clusters == FfnLayer::UnionKernels{}.up_clusters,
              "FfnLayer::UnionKernels states the engine's defaults");
FfnLayer::UnionKernels FfnLayer::union_kernels() const noexcept {
  const ContextOptions& o = ctx_->options();
  return {o.union_up_split, o.union_down_split, o.union_up_clusters};
}

std::uint64_t FfnLayer::weights_epoch() const noexcept { return ctx_->weights_epoch(); }

LayerStats FfnLayer::stats() {
  LayerStats s;
  s.calls = calls_;
  s.sparse_calls = sparse_calls_;
  s.path = last_path();
  if (n() == 0) return s;  // no weights yet: nothing measured
  s.hot_neurons = ctx_->hot_count();
  const FfnContext::Measured c = ctx_->measured();
  s.density = c.density;
  s.active = c.active;
  s.counted_rows = c.m;
  s.nnz = c.nnz;
  s.overflow_tiles = c.overflow_tiles;
  s.overflow_rows = c.overflow_rows;
  return s;
}

std::int64_t FfnLayer::n() const noexcept { return ctx_->n(); }
std::int64_t FfnLayer::k() const noexcept { return ctx_->k(); }
bool FfnLayer::gated() const noexcept { return ctx_->gated(); }

// ---- training ----

FfnTrainLayer::FfnTrainLayer(const TrainWorkspace* workspace)
    : ctx_(std::make_unique<TrainContext>(TrainContextOptions{}, workspace ? workspace->get() : nullptr)) {}
FfnTrainLayer::~FfnTrainLayer() = default;
FfnTrainLayer::FfnTrainLayer(FfnTrainLayer&&) noexcept = default;
FfnTrainLayer& FfnTrainLayer::operator=(FfnTrainLayer&&) noexcept = default;

void FfnTrainLayer::load_weights(const DeviceWeights& w, Stream stream) { ctx_->load_weights(internal(w), cu(stream)); }
void FfnTrainLayer::upload_weights(const FfnWeights& w, Stream stream) { ctx_->upload_weights(w, cu(stream)); }

TrainForwardInfo FfnTrainLayer::forward(const bf16* x, std::int64_t m, bf16* y, Path path, Stream stream) {
  const TrainForwardResult r = loaded(ctx_, n(), "FfnTrainLayer").forward(nv(x), m, nv(y), path, cu(stream));
  TrainForwardInfo info;
  info.sparse = r.sparse;
  info.nnz = r.nnz;
  info.hot_neurons = r.hot_neurons;
  info.dense_rows = r.dense_rows;
  info.overflow_tiles = r.overflow_tiles;
  info.overflow_rows = r.overflow_rows;
  info.path = r.path;
  return info;
}

void FfnTrainLayer::write_scalars(float* l1, float* l0, Stream stream) const { ctx_->write_scalars(l1, l0, cu(stream)); }

void FfnTrainLayer::backward(const bf16* x, const bf16* dy, std::int64_t m, const float* l1_coeff_device, bf16* dx,
                             Stream stream) {
  TWELL_CHECK(l1_coeff_device != nullptr, ErrorCode::invalid_argument, "FfnTrainLayer::backward: null l1_coeff_device");
  ctx_->backward(nv(x), nv(dy), m, l1_coeff_device, nv(dx), cu(stream));
}

void FfnTrainLayer::backward(const bf16* x, const bf16* dy, std::int64_t m, double l1_coeff, bf16* dx, Stream stream) {
  ctx_->backward(nv(x), nv(dy), m, l1_coeff, nv(dx), cu(stream));
}

void FfnTrainLayer::gradients_to(GradOut dw_gate, GradOut dw_up, GradOut dw_down, Stream stream) const {
  TWELL_CHECK(n() > 0 && ctx_->dw_down() != nullptr, ErrorCode::invalid_argument,
              "FfnTrainLayer::gradients_to: no backward has run");
  TWELL_CHECK(dw_up.data != nullptr && dw_down.data != nullptr && (dw_gate.data != nullptr || !gated()),
              ErrorCode::invalid_argument, "FfnTrainLayer::gradients_to: null output (dw_gate is needed for a gated layer)");
  // out [rows, cols] (contiguous) from twell's fp32 gradient `in` (row stride ld_in).
  const auto store = [&](GradOut out, const float* in, std::int64_t ld_in, std::int64_t rows, std::int64_t cols) {
    if (out.type == GradOut::Type::bf16) {
      launch_convert_f32_to_bf16(in, ld_in, rows, cols, static_cast<__nv_bfloat16*>(out.data), cols, cu(stream));
    } else {
      const std::size_t row = static_cast<std::size_t>(cols) * sizeof(float);
      TWELL_CUDA_CHECK(cudaMemcpy2DAsync(out.data, row, in, static_cast<std::size_t>(ld_in) * sizeof(float), row,
                                         static_cast<std::size_t>(rows), cudaMemcpyDeviceToDevice, cu(stream)));
    }
  };
  if (gated()) store(dw_gate, ctx_->dw_gate(), k(), n(), k());
  store(dw_up, ctx_->dw_up(), k(), n(), k());
  store(dw_down, ctx_->dw_down(), ctx_->ldn(), k(), n());
}

std::int64_t FfnTrainLayer::n() const noexcept { return ctx_->n(); }
std::int64_t FfnTrainLayer::k() const noexcept { return ctx_->k(); }
bool FfnTrainLayer::gated() const noexcept { return ctx_->gated(); }
std::int64_t FfnTrainLayer::own_bytes() const noexcept { return static_cast<std::int64_t>(ctx_->own_bytes()); }
std::int64_t FfnTrainLayer::device_bytes() const noexcept { return static_cast<std::int64_t>(ctx_->device_bytes()); }

}  // namespace twell::cuda
