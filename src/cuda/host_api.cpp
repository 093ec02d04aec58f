// Host-facing entry points (include/twell/cuda/ffn_cuda.hpp): fp32 host tensors in and out, the
// CUDA work on a private stream of a private FfnContext.
#include <algorithm>
#include <cstring>
#include <tuple>
#include <vector>

#include "cuda/common/check.hpp"
#include "cuda/common/stream.hpp"
#include "cuda/common/transfer.hpp"
#include "cuda/ffn_context.hpp"
#include "cuda/host_util.hpp"
#include "twell/cuda/ffn_cuda.hpp"

namespace twell::cuda {

using host::median_ms;
using host::poison;
using host::require_device;

DeviceInfo query_device() noexcept {
  DeviceInfo d;
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    d.reason = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
    cudaGetLastError();  // clear the sticky-free error state
    return d;
  }
  if (count == 0) {
    d.reason = "no CUDA device";
    return d;
  }
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    d.reason = "cudaGetDeviceProperties failed";
    cudaGetLastError();
    return d;
  }
  d.available = true;
  d.name = prop.name;
  d.sm_count = prop.multiProcessorCount;
  d.cc_major = prop.major;
  d.cc_minor = prop.minor;
  d.l2_bytes = prop.l2CacheSize;
  d.smem_per_block_optin = static_cast<std::int64_t>(prop.sharedMemPerBlockOptin);
  return d;
}

InferenceReport ffn_infer_host(CMatrixF x, const FfnWeights& w, MatrixF y, const InferenceOptions& opt) {
  require_device();
  ffn_check_shapes(x, w);
  TWELL_CHECK(y.rows == x.rows && y.cols == w.hidden(), ErrorCode::shape_mismatch,
              "y must be [M, K] = [{}, {}]; got [{}, {}]", x.rows, w.hidden(), y.rows, y.cols);
  OwnedStream stream;
  ContextOptions copt;
  copt.twell = opt.twell;
  FfnContext ctx(copt);
  ctx.upload_weights(w, stream.get());
  auto dx = upload_bf16(x, stream.get());
  DeviceBuffer<__nv_bfloat16> dy(static_cast<std::size_t>(x.rows * w.hidden()));
  poison(dy.get(), dy.size(), stream.get());
  const ForwardResult r = ctx.forward(dx.get(), x.rows, dy.get(), opt.path, stream.get());
  const auto out = download_bf16(dy.get(), x.rows, w.hidden(), stream.get());
  for (std::int64_t i = 0; i < y.rows; ++i)
    std::memcpy(y.row(i), out.data() + i * w.hidden(), static_cast<std::size_t>(w.hidden()) * sizeof(float));
  InferenceReport rep;
  rep.path = r.path();
  if (r.sparse) {
    const TwellCounters c = ctx.read_counters(stream.get());
    rep.nnz = static_cast<std::int64_t>(c.nnz);
    rep.overflow_tiles = static_cast<std::int64_t>(c.overflow_tiles);
    rep.overflow_rows = static_cast<std::int64_t>(c.overflow_rows);
  } else if (r.counted) {  // dense remainder: no packing ran; the count is the sampled estimate
    rep.nnz = static_cast<std::int64_t>(r.sampled_density * static_cast<double>(x.rows) * static_cast<double>(w.intermediate()));
    rep.path += " [nnz estimated from sampled rows]";
  }
  return rep;
}

BenchTimes bench_ffn_host(CMatrixF x, const FfnWeights& w, const BenchOptions& opt) {
  require_device();
  ffn_check_shapes(x, w);
  OwnedStream stream;
  cudaStream_t s = stream.get();
  ContextOptions copt;
  copt.twell = opt.twell;
  copt.autotune_gemm = true;  // the dense yardstick gets cuBLASLt's best algorithm, as does our gate
  FfnContext ctx(copt);
  ctx.upload_weights(w, s);
  const std::int64_t m = x.rows, k = w.hidden();
  auto dx = upload_bf16(x, s);
  DeviceBuffer<__nv_bfloat16> y_sparse(static_cast<std::size_t>(m * k)), y_dense(static_cast<std::size_t>(m * k));

  BenchTimes t;
  poison(y_dense.get(), y_dense.size(), s);
  // Each comparison timed alternately, rep by rep (host::alternating_medians_ms), so that clock and
  // power drift over the run weigh on both sides alike: the gate GEMM alone against the gate with
  // its TwELL epilogue, the dense FFN against the dispatched one.
  std::tie(t.dense_gate_ms, t.gate_ms) = host::alternating_medians_ms(
      opt.warmup, opt.reps, s, [&] { ctx.dense_gate_gemm(dx.get(), m, s); }, [&] { ctx.gate_twell(dx.get(), m, s); });
  t.sparse_ms = median_ms(opt.warmup, opt.reps, s, [&] { ctx.sparse_rest(dx.get(), m, y_sparse.get(), s); });
  poison(y_sparse.get(), y_sparse.size(), s);
  ForwardResult r;
  std::tie(t.dense_ms, t.total_ms) = host::alternating_medians_ms(
      opt.warmup, opt.reps, s, [&] { ctx.dense_forward(dx.get(), m, y_dense.get(), s); },
      [&] { r = ctx.forward(dx.get(), m, y_sparse.get(), opt.path, s); });
  t.path = r.path();
  ctx.gate_twell(dx.get(), m, s);  // exact counts for the report, whichever remainder dispatch chose
  const TwellCounters c = ctx.read_counters(s);
  t.nnz = static_cast<std::int64_t>(c.nnz);
  t.overflow_tiles = static_cast<std::int64_t>(c.overflow_tiles);
  t.overflow_rows = static_cast<std::int64_t>(c.overflow_rows);
  t.y_sparse = download_bf16(y_sparse.get(), m, k, s);
  t.y_dense = download_bf16(y_dense.get(), m, k, s);
  return t;
}

}  // namespace twell::cuda
