#pragma once
// The decode GEMVs' weight stream (ops/gemv_kernel.cuh, ops/rmsnorm_project.cu): a warp holds
// kRows weight rows; lane l owns their 16-byte chunks l, l + 32, …; a window is kWin consecutive
// chunk steps of every row, whose kRows · kWin loads are issued together (streaming, __ldcs: read
// once per step), so that the next window's loads overlap this one's math when the caller's loop is
// unrolled. Chunks at or past kchunks, and every chunk of an inactive warp, load as zeros.
#include <cuda_bf16.h>

#include <cstdint>

namespace twell::cuda::detail {

template <int kRows, int kWin>
struct WeightWindow {
  const uint4* row[kRows];  // each row's first chunk
  int kchunks = 0;          // 16-byte chunks per row (K / 8)
  bool active = true;       // false: every load is zero (the warp has no row)
  uint4 v[kRows][kWin];     // the window in flight: row r's chunk of step s

  // rows[r]: row r's first element (a row the caller drops may repeat a valid one).
  __device__ WeightWindow(const __nv_bfloat16* const (&rows)[kRows], std::int64_t k, bool is_active)
      : kchunks(static_cast<int>(k / 8)), active(is_active) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) row[r] = reinterpret_cast<const uint4*>(rows[r]);
  }

  // Issues window s0's loads (chunk steps s0 … s0 + kWin − 1) for this lane.
  __device__ __forceinline__ void load(int s0, int lane) {
#pragma unroll
    for (int s = 0; s < kWin; ++s)
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int c = (s0 + s) * 32 + lane;
        v[r][s] = active && c < kchunks ? __ldcs(row[r] + c) : make_uint4(0, 0, 0, 0);
      }
  }
};

}  // namespace twell::cuda::detail
