// top_candidates (model_ops.hpp): top-k sampling's selection on the device, so that a sampled
// decode step copies back k candidates a row instead of V logits. One CTA a row: the history's
// tokens as a bitmap in shared memory (the repetition penalty), then a radix select over 32-bit
// keys ordered as z (four passes of 8 bits: each counts, per digit, the tokens whose higher digits
// equal the threshold's so far) finds T, the k-th largest key, and how many tokens of key T to
// take; a pass writes every token above T (slots by a shared counter: any order) and the lowest
// ids of key T (a block-wide scan in id order, stopping once enough are found). z is recomputed
// from the logits each pass (≈ 200 KB a row at V = 49152, L2-resident), so no row-sized scratch.
#include <climits>
#include <cmath>

#include "cuda/common/check.hpp"
#include "cuda/common/launch.cuh"
#include "cuda/ops/model_ops.hpp"
#include "cuda/ops/sample_row.cuh"

namespace twell::cuda::ops {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;

using detail::key_of;
using detail::z_of;

__global__ void __launch_bounds__(kThreads)
    top_candidates_kernel(const float* logits, std::int64_t v, std::int64_t k, float p, const std::int32_t* hist,
                          const std::int64_t* hist_off, float* z_out, std::int32_t* id_out, std::int32_t* bad) {
  extern __shared__ unsigned seen_bits[];  // [ceil(v / 32)] where there is a history
  __shared__ unsigned bins[256];
  __shared__ unsigned s_digit, s_left, s_above;
  __shared__ int s_bad;
  __shared__ unsigned s_warp[kWarps];
  dev::pdl_begin();
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const std::int64_t r = blockIdx.x;
  const float* row = logits + r * v;
  const unsigned* seen = detail::load_seen<kThreads>(seen_bits, v, hist, hist_off, r);
  if (tid == 0) s_bad = INT_MAX;
  __syncthreads();
  // Radix select: after the pass of `shift`, T's digits above it are known (prefix under mask), and
  // `left` of the tokens sharing them are still to be taken from the top.
  unsigned prefix = 0, mask = 0, left = static_cast<unsigned>(k);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = tid; b < 256; b += kThreads) bins[b] = 0;
    __syncthreads();
    for (std::int64_t i = tid; i < v; i += kThreads) {
      if (shift == 24 && !isfinite(row[i])) atomicMin(&s_bad, static_cast<int>(i));
      const unsigned key = key_of(z_of(row, seen, i, p));
      if ((key & mask) == prefix) atomicAdd(&bins[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (tid == 0) {  // the digit where the count from the top reaches `left`
      unsigned above = 0;
      int d = 255;
      for (; d > 0 && above + bins[d] < left; --d) above += bins[d];
      s_digit = static_cast<unsigned>(d);
      s_left = left - above;
    }
    __syncthreads();
    prefix |= s_digit << shift;
    mask |= 255u << shift;
    left = s_left;
  }
  // T = prefix; `left` ≥ 1 tokens of key T are taken (the lowest ids), k − left above it.
  const unsigned above_t = static_cast<unsigned>(k) - left;
  float* zr = z_out + r * k;
  std::int32_t* ir = id_out + r * k;
  if (tid == 0) s_above = 0;
  __syncthreads();
  for (std::int64_t i = tid; i < v; i += kThreads) {
    const float z = z_of(row, seen, i, p);
    if (key_of(z) > prefix) {
      const unsigned slot = atomicAdd(&s_above, 1u);
      zr[slot] = z;
      ir[slot] = static_cast<std::int32_t>(i);
    }
  }
  unsigned taken = 0;  // tokens of key T written so far (the same in every thread)
  for (std::int64_t base = 0; base < v && taken < left; base += kThreads) {
    const std::int64_t i = base + tid;
    float z = 0.0f;
    bool tie = false;
    if (i < v) {
      z = z_of(row, seen, i, p);
      tie = key_of(z) == prefix;
    }
    const unsigned ballot = __ballot_sync(0xffffffffu, tie);
    if (lane == 0) s_warp[warp] = __popc(ballot);
    __syncthreads();
    unsigned before = 0, total = 0;
    for (int w = 0; w < kWarps; ++w) {
      before += w < warp ? s_warp[w] : 0;
      total += s_warp[w];
    }
    const unsigned rank = taken + before + __popc(ballot & ((1u << lane) - 1u));
    if (tie && rank < left) {
      zr[above_t + rank] = z;
      ir[above_t + rank] = static_cast<std::int32_t>(i);
    }
    taken += total;
    __syncthreads();  // s_warp is rewritten next tile
  }
  if (tid == 0) bad[r] = s_bad == INT_MAX ? -1 : s_bad;
}

}  // namespace

void top_candidates(const float* logits, std::int64_t rows, std::int64_t v, std::int64_t k, float penalty,
                    const std::int32_t* hist, const std::int64_t* hist_off, float* z_out, std::int32_t* id_out,
                    std::int32_t* bad, cudaStream_t stream) {
  TWELL_CU_REQUIRE(logits && z_out && id_out && bad && (!hist || hist_off), ErrorCode::invalid_argument,
                   "top_candidates: null pointer");
  TWELL_CU_REQUIRE(rows > 0 && rows < (1ll << 31) && v > 0 && v <= kTopMaxVocab && k >= 1 && k <= v,
                   ErrorCode::invalid_argument, "top_candidates: needs rows ≥ 1, 1 ≤ k ≤ v ≤ {} (got rows {}, v {}, k {})",
                   kTopMaxVocab, rows, v, k);
  TWELL_CU_REQUIRE(!hist || (std::isfinite(penalty) && penalty > 0), ErrorCode::invalid_argument,
                   "top_candidates: the repetition penalty must be > 0 (got {})", penalty);
  const std::size_t smem = hist ? static_cast<std::size_t>((v + 31) / 32) * sizeof(unsigned) : 0;
  launch_kernel(top_candidates_kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), smem, stream, logits, v, k,
                penalty, hist, hist_off, z_out, id_out, bad);
  TWELL_CUDA_CHECK_LAUNCH("top_candidates_kernel");
}

}  // namespace twell::cuda::ops
