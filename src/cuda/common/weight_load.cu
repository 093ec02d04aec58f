#include "cuda/common/weight_load.hpp"

#include <algorithm>

#include "cuda/common/check.hpp"

namespace twell::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = 32;                 // down's [kTile, kTile] tiles, by kThreads / kTile rows at a time
constexpr std::int64_t kMaxBlocks = 8192;  // per part; both parts stride over their work

__device__ __forceinline__ __nv_bfloat16 as_bf16(const float* p, std::int64_t i) { return __float2bfloat16_rn(p[i]); }
__device__ __forceinline__ __nv_bfloat16 as_bf16(const __nv_bfloat16* p, std::int64_t i) { return p[i]; }

__device__ __forceinline__ unsigned two_bf16(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);  // .x = lo at the lower address
  return *reinterpret_cast<unsigned*>(&h);
}
// 8 consecutive elements at p[i] (16-byte aligned sources) as 8 bf16 in one uint4.
__device__ __forceinline__ uint4 eight_bf16(const float* p, std::int64_t i) {
  const float4 a = *reinterpret_cast<const float4*>(p + i), b = *reinterpret_cast<const float4*>(p + i + 4);
  return make_uint4(two_bf16(a.x, a.y), two_bf16(a.z, a.w), two_bf16(b.x, b.y), two_bf16(b.z, b.w));
}
__device__ __forceinline__ uint4 eight_bf16(const __nv_bfloat16* p, std::int64_t i) {
  return *reinterpret_cast<const uint4*>(p + i);
}

// Blocks [0, row_blocks): the rows of Wg and Wu into gu, 8 elements a thread (k % 8 == 0), as one
// uint4 store (VEC: every source 16-byte aligned) or 8 scalar ones. Blocks from row_blocks on: Wd's
// [kTile, kTile] tiles, each written to down as read and to down_t through shared memory.
template <typename T, bool VEC>
__global__ void __launch_bounds__(kThreads) load_ffn_weights_kernel(const T* wg, const T* wu, const T* wd, std::int64_t n,
                                                                    std::int64_t k, std::int64_t ldn, __nv_bfloat16* gu,
                                                                    __nv_bfloat16* down, __nv_bfloat16* down_t,
                                                                    std::int64_t row_blocks) {
  if (static_cast<std::int64_t>(blockIdx.x) < row_blocks) {
    const std::int64_t per_row = k / 8, rows = (wg != nullptr ? 2 : 1) * n, chunks = rows * per_row;
    const int thread = threadIdx.y * kTile + threadIdx.x;  // the block is [kThreads / kTile, kTile]
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(kThreads) + thread; i < chunks;
         i += row_blocks * kThreads) {
      const std::int64_t r = i / per_row, c = (i % per_row) * 8;
      const bool up = wg == nullptr || r >= n;
      const T* src = up ? wu : wg;
      const std::int64_t sr = up && wg != nullptr ? r - n : r, dr = up && wg != nullptr ? ldn + sr : sr;
      __nv_bfloat16* dst = gu + dr * k + c;
      if constexpr (VEC) {
        *reinterpret_cast<uint4*>(dst) = eight_bf16(src, sr * k + c);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) dst[j] = as_bf16(src, sr * k + c + j);
      }
    }
    return;
  }
  __shared__ __nv_bfloat16 tile[kTile][kTile + 1];  // [k rows, n columns] of one tile; +1: no bank conflicts
  const std::int64_t tiles_c = (n + kTile - 1) / kTile, tiles = ((k + kTile - 1) / kTile) * tiles_c;
  const std::int64_t tile_blocks = static_cast<std::int64_t>(gridDim.x) - row_blocks;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) - row_blocks; t < tiles; t += tile_blocks) {
    const std::int64_t r0 = (t / tiles_c) * kTile, c0 = (t % tiles_c) * kTile;
    for (int i = threadIdx.y; i < kTile; i += kThreads / kTile) {
      const std::int64_t r = r0 + i, c = c0 + threadIdx.x;
      if (r < k && c < n) {
        const __nv_bfloat16 v = as_bf16(wd, r * n + c);
        down[r * ldn + c] = v;
        tile[i][threadIdx.x] = v;
      }
    }
    __syncthreads();
    for (int i = threadIdx.y; i < kTile; i += kThreads / kTile) {
      const std::int64_t c = c0 + i, r = r0 + threadIdx.x;
      if (r < k && c < n) down_t[c * k + r] = tile[threadIdx.x][i];
    }
    __syncthreads();  // the tile is rewritten by the next iteration
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15) == 0; }

template <typename T>
void launch(const WeightLoadParams& p, cudaStream_t stream) {
  const std::int64_t chunks = (p.w_gate != nullptr ? 2 : 1) * p.n * (p.k / 8);
  const std::int64_t tiles = ((p.k + kTile - 1) / kTile) * ((p.n + kTile - 1) / kTile);
  const std::int64_t row_blocks = std::min(kMaxBlocks, (chunks + kThreads - 1) / kThreads);
  const std::int64_t tile_blocks = std::min(kMaxBlocks, tiles);
  const bool vec = aligned16(p.w_up) && (p.w_gate == nullptr || aligned16(p.w_gate)) && aligned16(p.gu);
  const auto* wg = static_cast<const T*>(p.w_gate);
  const auto* wu = static_cast<const T*>(p.w_up);
  const auto* wd = static_cast<const T*>(p.w_down);
  const dim3 grid(static_cast<unsigned>(row_blocks + tile_blocks)), block(kTile, kThreads / kTile);
  if (vec)
    load_ffn_weights_kernel<T, true>
        <<<grid, block, 0, stream>>>(wg, wu, wd, p.n, p.k, p.ldn, p.gu, p.down, p.down_t, row_blocks);
  else
    load_ffn_weights_kernel<T, false>
        <<<grid, block, 0, stream>>>(wg, wu, wd, p.n, p.k, p.ldn, p.gu, p.down, p.down_t, row_blocks);
  TWELL_CUDA_CHECK_LAUNCH("load_ffn_weights_kernel");
}

}  // namespace

void launch_load_ffn_weights(const WeightLoadParams& p, cudaStream_t stream) {
  TWELL_CU_REQUIRE(p.w_up != nullptr && p.w_down != nullptr && p.gu != nullptr && p.down != nullptr &&
                       p.down_t != nullptr,
                   ErrorCode::invalid_argument, "load_ffn_weights: null source or destination");
  TWELL_CU_REQUIRE(p.n >= 1 && p.k >= 8 && p.k % 8 == 0 && p.ldn >= p.n, ErrorCode::invalid_argument,
                   "load_ffn_weights: n = {}, k = {} (a multiple of 8), ldn = {} out of range", p.n, p.k, p.ldn);
  if (p.fp32)
    launch<float>(p, stream);
  else
    launch<__nv_bfloat16>(p, stream);
}

}  // namespace twell::cuda
