#pragma once
// The up product of one fired neuron for the rows that fired it, as twell_decode_kernel sums it
// (lane l adds chunks l, l + 32, … of ⟨x[row], Wu[n]⟩ in order, then the butterfly): the probes'
// fused m-row FFN forms (probe_decode_rows.cu, probe_decode_fixed_rows.cu) share it, so their h
// has the decode kernel's bits.
#include <cuda_bf16.h>

#include "cuda/common/device_math.cuh"

namespace twell::probe {

// Every lane of the warp calls it with the same mask (bit t: row t fired the neuron). Up to kPass
// fired rows a pass over the Wu row (wu_row: its k / 8 chunks); for each fired row t, every lane
// then calls take(t, sum) with the row's dot product (the caller keeps g · sum where it wants h).
template <class Mask, class Take>
__device__ __forceinline__ void rows_up_dots(const uint4* wu_row, const __nv_bfloat16* x, long long ld_x, Mask mask,
                                             int kchunks, int lane, Take take) {
  constexpr int kPass = 4;
  for (Mask mk = mask; mk;) {
    int t[kPass], cnt = 0;
#pragma unroll
    for (int i = 0; i < kPass; ++i) {
      t[i] = mk ? __ffsll(static_cast<long long>(mk)) - 1 : -1;
      if (mk) {
        mk &= mk - 1;
        ++cnt;
      }
    }
    float sum[kPass] = {};
#pragma unroll 4
    for (int c = lane; c < kchunks; c += 32) {
      const uint4 w = __ldg(wu_row + c);
#pragma unroll
      for (int i = 0; i < kPass; ++i)
        if (i < cnt) sum[i] += twell::cuda::dev::dot8(__ldg(reinterpret_cast<const uint4*>(x + t[i] * ld_x) + c), w);
    }
#pragma unroll
    for (int i = 0; i < kPass; ++i) {
      if (i >= cnt) break;
      take(t[i], twell::cuda::dev::warp_sum(sum[i]));
    }
  }
}

}  // namespace twell::probe
