#pragma once
// Device helpers of the sampling kernels (top_candidates.cu, sample_rows.cu): a token's z (its
// logit after the repetition penalty, twell::model::Candidate's rule), a key ordered as z, and the
// history's bitmap in shared memory.
#include <cstdint>

namespace twell::cuda::ops::detail {

// Larger z → larger key (−0 was made 0 before: ties of zeros are ties of keys).
__device__ __forceinline__ unsigned key_of(float z) {
  const unsigned u = __float_as_uint(z);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Token i's z: its logit, penalised (fp32, correctly rounded: the host's rule) when it is in the history.
__device__ __forceinline__ float z_of(const float* row, const unsigned* seen, std::int64_t i, float p) {
  float l = row[i];
  if (seen && ((seen[i >> 5] >> (i & 31)) & 1u)) l = l > 0.0f ? __fdiv_rn(l, p) : __fmul_rn(l, p);
  return l == 0.0f ? 0.0f : l;
}

// The tokens of row r's history (hist[hist_off[r], hist_off[r + 1]), ids outside [0, v) ignored) as
// bits of bits[ceil(v / 32)] in shared memory; null without a history. Ends with a barrier.
template <int kThreads>
__device__ const unsigned* load_seen(unsigned* bits, std::int64_t v, const std::int32_t* hist,
                                     const std::int64_t* hist_off, std::int64_t r) {
  if (!hist) {
    __syncthreads();
    return nullptr;
  }
  for (std::int64_t w = threadIdx.x; w < (v + 31) / 32; w += kThreads) bits[w] = 0;
  __syncthreads();
  for (std::int64_t j = hist_off[r] + threadIdx.x; j < hist_off[r + 1]; j += kThreads) {
    const std::int32_t id = hist[j];
    if (id >= 0 && id < v) atomicOr(&bits[id >> 5], 1u << (id & 31));
  }
  __syncthreads();
  return bits;
}

}  // namespace twell::cuda::ops::detail
