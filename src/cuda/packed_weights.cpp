#include "cuda/packed_weights.hpp"

#include <vector>

#include "cuda/common/check.hpp"
#include "cuda/common/weight_load.hpp"
#include "cuda/sm80/twell_hot_neurons.hpp"
#include "twell/bf16.hpp"

namespace twell::cuda {
namespace {

std::int64_t round_up(std::int64_t v, std::int64_t m) { return (v + m - 1) / m * m; }
std::size_t sz(std::int64_t v) { return static_cast<std::size_t>(v); }

// Copies rows of an fp32 host matrix into a bf16 host staging buffer with row stride `ld`.
void to_bf16_rows(CMatrixF src, std::vector<std::uint16_t>& dst, std::int64_t row0, std::int64_t ld) {
  for (std::int64_t r = 0; r < src.rows; ++r)
    for (std::int64_t c = 0; c < src.cols; ++c) dst[sz((row0 + r) * ld + c)] = to_bf16(src(r, c)).bits;
}

}  // namespace

bool PackedWeights::set_shape(bool gated, std::int64_t n, std::int64_t k) {
  TWELL_CHECK(k >= 8 && k % 8 == 0, ErrorCode::unsupported,
              "the CUDA path needs the hidden size K to be a multiple of 8 (got K = {})", k);
  TWELL_CHECK(k <= 16384, ErrorCode::unsupported, "the CUDA path supports K ≤ 16384 (got K = {})", k);
  TWELL_CHECK(n >= 1 && n < (std::int64_t{1} << 31), ErrorCode::unsupported, "N = {} out of range", n);
  const bool same = !empty() && gated == gated_ && n == n_ && k == k_;
  if (same) return true;
  // Empty until all three are allocated: a failed allocation leaves no half-shaped object.
  n_ = k_ = ldn_ = 0;
  gate_up_.release();
  down_.release();
  down_t_.release();
  const std::int64_t ldn = round_up(n, 8);
  gate_up_.resize(sz((gated ? 2 : 1) * ldn * k));
  down_.resize(sz(k * ldn));
  down_t_.resize(sz(n * k));
  gated_ = gated;
  n_ = n;
  k_ = k;
  ldn_ = ldn;
  return false;
}

bool PackedWeights::upload(const FfnWeights& w, cudaStream_t stream) {
  TWELL_CHECK(w.w_up.data && w.w_down.data, ErrorCode::invalid_argument, "FFN weights: w_up and w_down are required");
  const std::int64_t n = w.intermediate(), k = w.hidden();
  TWELL_CHECK(w.w_up.rows == n && w.w_up.cols == k, ErrorCode::shape_mismatch, "w_up is [{}, {}]", w.w_up.rows,
              w.w_up.cols);
  TWELL_CHECK(w.w_down.rows == k && w.w_down.cols == n, ErrorCode::shape_mismatch,
              "w_down must be [K, N] = [{}, {}] (HF down_proj layout); got [{}, {}]", k, n, w.w_down.rows,
              w.w_down.cols);
  TWELL_CHECK(!w.gated() || (w.w_gate.rows == n && w.w_gate.cols == k), ErrorCode::shape_mismatch,
              "w_gate must be [N, K] = [{}, {}]; got [{}, {}]", n, k, w.w_gate.rows, w.w_gate.cols);
  const bool same = set_shape(w.gated(), n, k);

  // Staged whole, padding included, so every byte of the three buffers is written.
  std::vector<std::uint16_t> gu(gate_up_.size(), 0);
  if (gated_) {
    to_bf16_rows(w.w_gate, gu, 0, k_);
    to_bf16_rows(w.w_up, gu, ldn_, k_);
  } else {
    to_bf16_rows(w.w_up, gu, 0, k_);
  }
  std::vector<std::uint16_t> down(down_.size(), 0);
  to_bf16_rows(w.w_down, down, 0, ldn_);
  std::vector<std::uint16_t> down_t(down_t_.size());
  for (std::int64_t kk = 0; kk < k_; ++kk)
    for (std::int64_t nn = 0; nn < n_; ++nn) down_t[sz(nn * k_ + kk)] = to_bf16(w.w_down(kk, nn)).bits;

  TWELL_CUDA_CHECK(cudaMemcpyAsync(gate_up_.get(), gu.data(), gu.size() * 2, cudaMemcpyHostToDevice, stream));
  TWELL_CUDA_CHECK(cudaMemcpyAsync(down_.get(), down.data(), down.size() * 2, cudaMemcpyHostToDevice, stream));
  TWELL_CUDA_CHECK(cudaMemcpyAsync(down_t_.get(), down_t.data(), down_t.size() * 2, cudaMemcpyHostToDevice, stream));
  TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));  // the staging vectors die here
  return same;
}

bool PackedWeights::load(const DeviceFfnWeights& w, cudaStream_t stream) {
  TWELL_CHECK(w.w_up && w.w_down, ErrorCode::invalid_argument, "FFN weights: w_up and w_down are required");
  TWELL_CHECK(w.type == WeightType::bf16 || w.type == WeightType::f32, ErrorCode::dtype_mismatch,
              "FFN weights: bf16 or fp32 only");
  const bool same = set_shape(w.w_gate != nullptr, w.n, w.k);
  if (!same) {
    // Padding rows of [Wg; Wu] and columns of Wd stay zero: the copy below never writes them.
    TWELL_CUDA_CHECK(cudaMemsetAsync(gate_up_.get(), 0, gate_up_.bytes(), stream));
    TWELL_CUDA_CHECK(cudaMemsetAsync(down_.get(), 0, down_.bytes(), stream));
  }
  WeightLoadParams p;
  p.w_gate = w.w_gate;
  p.w_up = w.w_up;
  p.w_down = w.w_down;
  p.fp32 = w.type == WeightType::f32;
  p.n = n_;
  p.k = k_;
  p.ldn = ldn_;
  p.gu = gate_up_.get();
  p.down = down_.get();
  p.down_t = down_t_.get();
  launch_load_ffn_weights(p, stream);  // one pass: [Wg; Wu], Wd padded, Wdᵀ (fp32 rounded to bf16)
  return same;
}

PackedWeights PackedWeights::gathered(const int* idx, cudaStream_t stream) const {
  TWELL_CHECK(!empty(), ErrorCode::invalid_argument, "PackedWeights::gathered: no weights yet");
  PackedWeights r;
  r.set_shape(gated_, n_, k_);
  TWELL_CUDA_CHECK(cudaMemsetAsync(r.gate_up_.get(), 0, r.gate_up_.bytes(), stream));  // padding stays zero
  TWELL_CUDA_CHECK(cudaMemsetAsync(r.down_.get(), 0, r.down_.bytes(), stream));
  launch_gather_rows(gate_up_.get(), k_, idx, n_, k_, r.gate_up_.get(), k_, stream);
  if (gated_) launch_gather_rows(gate_up_.get() + ldn_ * k_, k_, idx, n_, k_, r.gate_up_.get() + ldn_ * k_, k_, stream);
  launch_gather_rows(down_t_.get(), k_, idx, n_, k_, r.down_t_.get(), k_, stream);
  launch_gather_cols(down_.get(), ldn_, idx, k_, n_, r.down_.get(), ldn_, stream);
  return r;
}

}  // namespace twell::cuda
