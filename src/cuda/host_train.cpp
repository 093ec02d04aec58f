// Host-facing training entry points (include/twell/cuda/ffn_cuda.hpp): fp32 host tensors in and
// out, one TrainContext per call on a private stream.
#include <cmath>
#include <tuple>
#include <cstring>
#include <vector>

#include "cuda/common/stream.hpp"
#include "cuda/common/transfer.hpp"
#include "cuda/host_util.hpp"
#include "cuda/train/train_context.hpp"
#include "twell/cuda/ffn_cuda.hpp"

namespace twell::cuda {
namespace {

void download_f32_rows(const float* src, std::int64_t ld, MatrixF dst, cudaStream_t stream) {
  TWELL_CUDA_CHECK(cudaMemcpy2DAsync(dst.data, static_cast<std::size_t>(dst.ld) * sizeof(float), src,
                                     static_cast<std::size_t>(ld) * sizeof(float),
                                     static_cast<std::size_t>(dst.cols) * sizeof(float), static_cast<std::size_t>(dst.rows),
                                     cudaMemcpyDeviceToHost, stream));
}

void copy_rows(const std::vector<float>& src, MatrixF dst) {
  for (std::int64_t r = 0; r < dst.rows; ++r)
    std::memcpy(dst.row(r), src.data() + r * dst.cols, static_cast<std::size_t>(dst.cols) * sizeof(float));
}

void check_train_args(CMatrixF x, CMatrixF dy, const FfnWeights& w) {
  ffn_check_shapes(x, w);
  TWELL_CHECK(dy.rows == x.rows && dy.cols == w.hidden(), ErrorCode::shape_mismatch, "dy must be [M, K] = [{}, {}]; got [{}, {}]",
              x.rows, w.hidden(), dy.rows, dy.cols);
}

}  // namespace

TrainReport ffn_train_host(CMatrixF x, CMatrixF dy, const FfnWeights& w, double l1_coeff, MatrixF y,
                           const FfnGrads& grads, const TrainOptions& opt) {
  host::require_device();
  check_train_args(x, dy, w);
  const std::int64_t m = x.rows, k = w.hidden(), n = w.intermediate();
  TWELL_CHECK(y.rows == m && y.cols == k && grads.dx.rows == m && grads.dx.cols == k && grads.dw_up.rows == n &&
                  grads.dw_up.cols == k && grads.dw_down.rows == k && grads.dw_down.cols == n &&
                  (!w.gated() || (grads.dw_gate.rows == n && grads.dw_gate.cols == k)),
              ErrorCode::shape_mismatch, "output buffers do not match x [{}, {}] and N = {}", m, k, n);
  OwnedStream stream;
  cudaStream_t s = stream.get();
  TrainContextOptions copt;
  copt.weight_grad_l2_fraction = opt.weight_grad_l2_fraction;
  copt.weight_grad_run = opt.weight_grad_run;
  copt.hot_neurons_auto = opt.hot_neurons_auto;
  copt.gate_sm90 = opt.gate_sm90;
  copt.token_min_blocks = opt.token_min_blocks;
  if (!opt.dense_rows) copt.dense_rows_density = 0;
  copt.dense_rows_min = opt.dense_rows_min;
  TrainContext ctx(copt);
  ctx.upload_weights(w, s);
  if (opt.hot_neurons) ctx.set_hot_neurons(*opt.hot_neurons, s);
  auto dx_in = upload_bf16(x, s);
  auto ddy = upload_bf16(dy, s);
  DeviceBuffer<__nv_bfloat16> dev_y(static_cast<std::size_t>(m * k)), dev_dx(static_cast<std::size_t>(m * k));
  host::poison(dev_y.get(), dev_y.size(), s);
  host::poison(dev_dx.get(), dev_dx.size(), s);
  const TrainForwardResult f = ctx.forward(dx_in.get(), m, dev_y.get(), opt.path, s);
  ctx.backward(dx_in.get(), ddy.get(), m, l1_coeff, dev_dx.get(), s);
  TrainReport rep;
  rep.path = f.path;
  rep.hot_neurons = f.hot_neurons;
  rep.dense_rows = f.dense_rows;
  rep.scalars = ctx.read_scalars(s);
  rep.nnz = static_cast<std::int64_t>(std::llround(rep.scalars.l0 * static_cast<double>(m)));  // every path counts
  rep.saved_bytes = static_cast<std::int64_t>(ctx.saved_bytes());
  rep.device_bytes = static_cast<std::int64_t>(ctx.device_bytes());
  copy_rows(download_bf16(dev_y.get(), m, k, s), y);
  copy_rows(download_bf16(dev_dx.get(), m, k, s), grads.dx);
  if (w.gated()) download_f32_rows(ctx.dw_gate(), k, grads.dw_gate, s);
  download_f32_rows(ctx.dw_up(), k, grads.dw_up, s);
  download_f32_rows(ctx.dw_down(), ctx.ldn(), grads.dw_down, s);
  TWELL_CUDA_CHECK(cudaStreamSynchronize(s));
  return rep;
}

TrainBenchTimes bench_train_host(CMatrixF x, CMatrixF dy, const FfnWeights& w, double l1_coeff, const BenchOptions& opt) {
  host::require_device();
  check_train_args(x, dy, w);
  const std::int64_t m = x.rows, k = w.hidden();
  OwnedStream stream;
  cudaStream_t s = stream.get();
  auto dx_in = upload_bf16(x, s);
  auto ddy = upload_bf16(dy, s);
  DeviceBuffer<__nv_bfloat16> dev_y(static_cast<std::size_t>(m * k)), dev_dx(static_cast<std::size_t>(m * k));
  TrainContextOptions copt;
  copt.autotune_gemm = true;  // the dense yardstick gets cuBLASLt's best algorithm per shape
  TrainBenchTimes t;
  TrainContext dense(copt), sparse(copt);
  dense.upload_weights(w, s);
  sparse.upload_weights(w, s);
  TrainForwardResult f;
  t.dense_fwd_ms = host::median_ms(opt.warmup, opt.reps, s, [&] { dense.forward(dx_in.get(), m, dev_y.get(), Path::dense, s); });
  t.sparse_fwd_ms =
      host::median_ms(opt.warmup, opt.reps, s, [&] { f = sparse.forward(dx_in.get(), m, dev_y.get(), Path::automatic, s); });
  // Whole steps: dense and dispatched alternately (host::alternating_medians_ms).
  const auto dense_step = [&] {
    dense.forward(dx_in.get(), m, dev_y.get(), Path::dense, s);
    dense.backward(dx_in.get(), ddy.get(), m, l1_coeff, dev_dx.get(), s);
  };
  const auto sparse_step = [&] {
    f = sparse.forward(dx_in.get(), m, dev_y.get(), Path::automatic, s);
    sparse.backward(dx_in.get(), ddy.get(), m, l1_coeff, dev_dx.get(), s);
  };
  std::tie(t.dense_step_ms, t.sparse_step_ms) = host::alternating_medians_ms(opt.warmup, opt.reps, s, dense_step, sparse_step);
  t.dense_saved_bytes = static_cast<std::int64_t>(dense.saved_bytes());
  t.dense_device_bytes = static_cast<std::int64_t>(dense.device_bytes());
  // The checked step: the dispatched path once more, on poisoned outputs.
  host::poison(dev_y.get(), dev_y.size(), s);
  host::poison(dev_dx.get(), dev_dx.size(), s);
  sparse_step();
  t.path = f.path;
  // The exact active count of that step, whichever path it took (the dense step counts too).
  t.nnz = static_cast<std::int64_t>(std::llround(sparse.read_scalars(s).l0 * static_cast<double>(m)));
  t.sparse_saved_bytes = static_cast<std::int64_t>(sparse.saved_bytes());
  t.sparse_device_bytes = static_cast<std::int64_t>(sparse.device_bytes());
  t.y_sparse = download_bf16(dev_y.get(), m, k, s);
  t.dx_sparse = download_bf16(dev_dx.get(), m, k, s);
  return t;
}

}  // namespace twell::cuda
