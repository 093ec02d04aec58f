// sample_rows (model_ops.hpp): a sampled decode step's draw on the device, one id a row back:
// twell::model::sample_fixed_point's rule. One CTA a row. Every step is a selection in the order
// (z descending, the lower id first) without sorting: a radix select over 32-bit keys ordered as z
// (four passes of 8 bits, each summing a value per digit over the tokens whose higher digits equal
// the threshold's so far) finds the key where a running sum in that order reaches a target, then a
// block scan over that key's tokens in id order finds the token. Values are counts for the top-k
// cut and the integer weights W = ⌊exp((z − z_max)/T) · 2⁴⁰⌋ for the top-p cut and the draw: integer
// sums (shared-memory 64-bit atomics) are exact in any order, so the pick does not depend on the
// scheduling. z and W are recomputed from the logits each pass (≈ 200 KB a row at V = 49152,
// L2-resident): no row-sized scratch. Passes a row: 1 (max) + 5 (top-k, where cut) + 1 (the sum)
// + 5 (top-p, where cut) + 5 (the draw).
#include <climits>
#include <cmath>

#include "cuda/common/check.hpp"
#include "cuda/common/device_math.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/ops/model_ops.hpp"
#include "cuda/ops/sample_row.cuh"

namespace twell::cuda::ops {
namespace {

using detail::key_of;
using detail::z_of;
using u64 = unsigned long long;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr double kScale = 1099511627776.0;  // 2⁴⁰: twell::model::kFixedPointWeight

struct Scratch {
  u64 bins[256];
  u64 warp[kWarps];
  u64 left, incl;
  unsigned digit;
  int id, bad;
  float max[kWarps];
};

// The key K and the token of key K (lowest ids first) at which the running sum of value(i) over the
// tokens in order first reaches target (1 ≤ target ≤ the row's total): key_z(i) → the token's key
// and z, value(i, key, z) → its value, asked only of the tokens a pass counts. Returns the token
// (−1 if none: not reached while every pass sees the same values; the caller reports it);
// *key_out = K, *through = the running sum through the token.
template <class KeyZ, class Value>
__device__ int select_in_order(Scratch& s, std::int64_t v, u64 target, KeyZ key_z, Value value, unsigned* key_out,
                               u64* through) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  unsigned prefix = 0, mask = 0;
  u64 left = target;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = tid; b < 256; b += kThreads) s.bins[b] = 0;
    __syncthreads();
    for (std::int64_t i = tid; i < v; i += kThreads) {
      float z;
      const unsigned key = key_z(i, z);
      if ((key & mask) != prefix) continue;
      const u64 x = value(i, key, z);
      if (x) atomicAdd(&s.bins[(key >> shift) & 255u], x);
    }
    __syncthreads();
    if (tid == 0) {  // the digit where the sum from the top reaches `left`
      u64 above = 0;
      int d = 255;
      for (; d > 0 && above + s.bins[d] < left; --d) above += s.bins[d];
      s.digit = static_cast<unsigned>(d);
      s.left = left - above;
    }
    __syncthreads();
    prefix |= s.digit << shift;
    mask |= 255u << shift;
    left = s.left;
  }
  const u64 above_key = target - left;  // the sum over keys above K
  // K's tokens in id order: the first whose running sum reaches `left`.
  u64 running = 0;  // the same in every thread
  if (tid == 0) {
    s.id = -1;
    s.incl = 0;
  }
  for (std::int64_t base = 0; base < v && running < left; base += kThreads) {
    const std::int64_t i = base + tid;
    u64 x = 0;
    if (i < v) {
      float z;
      const unsigned key = key_z(i, z);
      if (key == prefix) x = value(i, key, z);
    }
    const u64 incl_warp = dev::warp_inclusive_scan(x, lane);
    if (lane == 31) s.warp[warp] = incl_warp;
    __syncthreads();
    u64 before = 0, total = 0;
    for (int w = 0; w < kWarps; ++w) {
      before += w < warp ? s.warp[w] : 0;
      total += s.warp[w];
    }
    const u64 incl = running + before + incl_warp;
    if (x > 0 && incl - x < left && incl >= left) {  // exactly one token
      s.id = static_cast<int>(i);
      s.incl = incl;
    }
    running += total;
    __syncthreads();  // s.warp is rewritten next tile; s.id is read after the loop
  }
  *through = above_key + s.incl;
  *key_out = prefix;
  const int id = s.id;
  __syncthreads();  // s is reused by the next selection
  return id;
}

__global__ void __launch_bounds__(kThreads)
    sample_rows_kernel(const float* logits, std::int64_t v, float p, const std::int32_t* hist,
                       const std::int64_t* hist_off, double t, std::int64_t top_k, double top_p, const double* r_in,
                       std::int32_t* out, std::int32_t* bad) {
  extern __shared__ unsigned seen_bits[];  // [ceil(v / 32)] where there is a history
  __shared__ Scratch s;
  dev::pdl_begin();
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const std::int64_t r = blockIdx.x;
  const float* row = logits + r * v;
  const unsigned* seen = detail::load_seen<kThreads>(seen_bits, v, hist, hist_off, r);
  // The largest z, and the first non-finite logit.
  if (tid == 0) s.bad = INT_MAX;
  __syncthreads();
  float mz = -INFINITY;
  for (std::int64_t i = tid; i < v; i += kThreads) {
    const float z = z_of(row, seen, i, p);  // a finite logit penalised past the float range counts too
    if (!isfinite(row[i]) || !isfinite(z)) atomicMin(&s.bad, static_cast<int>(i));
    mz = fmaxf(mz, z);
  }
  for (int o = 16; o > 0; o >>= 1) mz = fmaxf(mz, __shfl_xor_sync(0xffffffffu, mz, o));
  if (lane == 0) s.max[warp] = mz;
  __syncthreads();
  if (s.bad != INT_MAX) {  // the caller reports it
    if (tid == 0) {
      bad[r] = s.bad;
      out[r] = -1;
    }
    return;
  }
  float zmax = s.max[0];
  for (int w = 1; w < kWarps; ++w) zmax = fmaxf(zmax, s.max[w]);
  const double mx = zmax;
  // The top-k cut: tokens of key > k_key, and of key k_key up to id k_id.
  const auto key_z = [&](std::int64_t i, float& z) {
    z = z_of(row, seen, i, p);
    return key_of(z);
  };
  unsigned k_key = 0;
  std::int64_t k_id = v;
  u64 through = 0;
  bool lost = false;  // a selection found no token (see select_in_order)
  if (top_k > 0 && top_k < v) {
    const auto one = [](std::int64_t, unsigned, float) -> u64 { return 1; };
    k_id = select_in_order(s, v, static_cast<u64>(top_k), key_z, one, &k_key, &through);
    lost = k_id < 0;
  }
  const auto weight = [&](std::int64_t i, unsigned key, float z) -> u64 {
    if (key < k_key || (key == k_key && i > k_id)) return 0;
    return static_cast<u64>(floor(exp((static_cast<double>(z) - mx) / t) * kScale));
  };
  // S: the cut's total weight.
  u64 mine = 0;
  for (std::int64_t i = tid; i < v && !lost; i += kThreads) {
    float z;
    const unsigned key = key_z(i, z);
    mine += weight(i, key, z);
  }
  for (int o = 16; o > 0; o >>= 1) mine += __shfl_xor_sync(0xffffffffu, mine, o);
  if (lane == 0) s.warp[warp] = mine;
  __syncthreads();
  u64 S = 0;
  for (int w = 0; w < kWarps; ++w) S += s.warp[w];
  __syncthreads();  // s.warp is reused below
  // The top-p cut, then the draw.
  u64 kept = S;
  unsigned key = 0;
  if (top_p < 1.0 && !lost) {
    u64 need = static_cast<u64>(ceil(top_p * static_cast<double>(S)));
    if (need > S) need = S;  // (double)S may round above S past 2⁵³
    lost = select_in_order(s, v, need, key_z, weight, &key, &kept) < 0;
  }
  int id = -1;
  if (!lost && S > 0) {
    const double rr = r_in[r] >= 0 ? fmin(r_in[r], 0x1.fffffffffffffp-1) : 0.0;  // the caller checks [0, 1)
    u64 u = static_cast<u64>(floor(rr * static_cast<double>(kept)));
    if (u >= kept) u = kept - 1;
    id = select_in_order(s, v, u + 1, key_z, weight, &key, &through);
  }
  if (tid == 0) {
    out[r] = id;
    bad[r] = id < 0 ? static_cast<int>(v) : -1;  // v: no token found (a fault, not an input's)
  }
}

}  // namespace

void sample_rows(const float* logits, std::int64_t rows, std::int64_t v, const SampleRowsOptions& o,
                 const std::int32_t* hist, const std::int64_t* hist_off, const double* r, std::int32_t* out,
                 std::int32_t* bad, cudaStream_t stream) {
  TWELL_CU_REQUIRE(logits && r && out && bad && (!hist || hist_off), ErrorCode::invalid_argument,
                   "sample_rows: null pointer");
  TWELL_CU_REQUIRE(rows > 0 && rows < (1ll << 31) && v > 0 && v <= kTopMaxVocab, ErrorCode::invalid_argument,
                   "sample_rows: needs rows ≥ 1 and 1 ≤ v ≤ {} (got rows {}, v {})", kTopMaxVocab, rows, v);
  TWELL_CU_REQUIRE(std::isfinite(o.temperature) && o.temperature > 0 && o.top_k >= 0 && o.top_p > 0 && o.top_p <= 1 &&
                       std::isfinite(o.repetition_penalty) && o.repetition_penalty > 0,
                   ErrorCode::invalid_argument,
                   "sample_rows: needs temperature > 0, top-k ≥ 0, top-p in (0, 1], penalty > 0 (got {}, {}, {}, {})",
                   o.temperature, o.top_k, o.top_p, o.repetition_penalty);
  const std::size_t smem = hist ? static_cast<std::size_t>((v + 31) / 32) * sizeof(unsigned) : 0;
  launch_kernel(sample_rows_kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), smem, stream, logits, v,
                static_cast<float>(o.repetition_penalty), hist, hist_off, o.temperature, o.top_k, o.top_p, r, out,
                bad);
  TWELL_CUDA_CHECK_LAUNCH("sample_rows_kernel");
}

}  // namespace twell::cuda::ops
