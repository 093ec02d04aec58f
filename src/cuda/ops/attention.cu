// attention: causal, GQA, each row's query heads over its sequence's KV cache.
// One block of 4 warps per (row, head): scores a thread per key, then the weighted sum of V with
// keys split over the warps and a key's d elements over a warp's lanes (coalesced 2·d-byte reads). Plain and exact (fp32 scores and sums); a fused flash kernel
// (cuDNN SDPA) is the fast path to come for long prefills.
#include <cstdint>

#include "cuda/common/check.hpp"
#include "cuda/ops/model_ops.hpp"

namespace twell::cuda::ops {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxD = 256;  // ≤ 8 dims per lane in the output accumulators

__global__ void __launch_bounds__(kWarps * 32) attention_kernel(const __nv_bfloat16* qkv, std::int64_t heads,
                                                                std::int64_t kv_heads, std::int64_t d,
                                                                const RowKv* rows_kv, std::int64_t layer, float scale,
                                                                __nv_bfloat16* out) {
  extern __shared__ float smem[];
  const std::int64_t r = blockIdx.x, h = blockIdx.y;
  const std::int64_t q_dim = heads * d, kv_dim = kv_heads * d, kvh = h / (heads / kv_heads);
  const RowKv info = rows_kv[r];
  const int n = info.pos + 1;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  float* q = smem;                 // [d] the query, pre-scaled
  float* part = q + d;             // [kWarps, d] per-warp output sums
  float* red = part + kWarps * d;  // [kWarps] reductions
  float* score = red + kWarps;     // [n] scores, then probabilities (unnormalised)
  const __nv_bfloat16* qrow = qkv + r * (q_dim + 2 * kv_dim) + h * d;
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) q[i] = __bfloat162float(qrow[i]) * scale;
  __syncthreads();
  const __nv_bfloat16* kc = info.k + layer * info.layer_stride + kvh * d;
  const __nv_bfloat16* vc = info.v + layer * info.layer_stride + kvh * d;

  // Scores: a thread per key (a decode row's keys are all in flight at once; a warp per key with
  // shuffle sums left the loads one latency apart). 16-byte loads where the rows allow them.
  float mx = -INFINITY;
  const bool vec = d % 8 == 0 && reinterpret_cast<std::uintptr_t>(kc) % 16 == 0;
  for (int t = static_cast<int>(threadIdx.x); t < n; t += kWarps * 32) {
    const __nv_bfloat16* kr = kc + static_cast<std::int64_t>(t) * kv_dim;
    float s = 0.0f;
    if (vec) {
      for (std::int64_t i = 0; i < d; i += 8) {
        const uint4 raw = *reinterpret_cast<const uint4*>(kr + i);
        const auto* p2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 f = __bfloat1622float2(p2[e]);
          s += q[i + 2 * e] * f.x;
          s += q[i + 2 * e + 1] * f.y;
        }
      }
    } else {
      for (std::int64_t i = 0; i < d; ++i) s += q[i] * __bfloat162float(kr[i]);
    }
    score[t] = s;
    mx = fmaxf(mx, s);
  }
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  mx = red[0];
  for (int w = 1; w < kWarps; ++w) mx = fmaxf(mx, red[w]);
  __syncthreads();  // red is reused below
  float sum = 0.0f;
  for (int t = threadIdx.x; t < n; t += blockDim.x) {
    const float e = __expf(score[t] - mx);
    score[t] = e;
    sum += e;
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) red[warp] = sum;
  __syncthreads();
  sum = 0.0f;
  for (int w = 0; w < kWarps; ++w) sum += red[w];

  float acc[kMaxD / 32];
#pragma unroll
  for (int j = 0; j < kMaxD / 32; ++j) acc[j] = 0.0f;
#pragma unroll 4
  for (int t = warp; t < n; t += kWarps) {
    const float p = score[t];
    const __nv_bfloat16* vr = vc + static_cast<std::int64_t>(t) * kv_dim;
#pragma unroll
    for (int j = 0; j < kMaxD / 32; ++j)
      if (lane + 32 * j < d) acc[j] += p * __bfloat162float(vr[lane + 32 * j]);
  }
#pragma unroll
  for (int j = 0; j < kMaxD / 32; ++j)
    if (lane + 32 * j < d) part[warp * d + lane + 32 * j] = acc[j];
  __syncthreads();
  const float inv = 1.0f / sum;
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w) o += part[w * d + i];
    out[r * q_dim + h * d + i] = __float2bfloat16(o * inv);
  }
}

}  // namespace

std::int64_t attention_max_keys(std::int64_t d) {
  int dev = 0, optin = 0;
  TWELL_CUDA_CHECK(cudaGetDevice(&dev));
  TWELL_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return static_cast<std::int64_t>(optin) / static_cast<std::int64_t>(sizeof(float)) - (1 + kWarps) * d - kWarps;
}

void attention(const __nv_bfloat16* qkv, std::int64_t rows, std::int64_t heads, std::int64_t kv_heads, std::int64_t d,
               const RowKv* rows_kv, std::int64_t layer, std::int64_t max_keys, __nv_bfloat16* out,
               cudaStream_t stream) {
  TWELL_CU_REQUIRE(rows > 0 && rows < (1ll << 31) && heads > 0 && heads < 65536 && kv_heads > 0 &&
                       heads % kv_heads == 0 && d > 0 && d <= kMaxD && max_keys > 0,
                   ErrorCode::invalid_argument, "attention: bad shape (rows {}, heads {}/{}, d {}, keys {})", rows,
                   heads, kv_heads, d, max_keys);
  const std::size_t smem = static_cast<std::size_t>((1 + kWarps) * d + kWarps + max_keys) * sizeof(float);
  if (smem > 48 * 1024) {
    int dev = 0, optin = 0;
    TWELL_CUDA_CHECK(cudaGetDevice(&dev));
    TWELL_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    TWELL_CU_REQUIRE(smem <= static_cast<std::size_t>(optin), ErrorCode::unsupported,
                     "attention: {} keys need {} bytes of shared memory for the scores; this GPU allows {}", max_keys,
                     smem, optin);
    TWELL_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
  }
  const float scale = 1.0f / sqrtf(static_cast<float>(d));
  attention_kernel<<<dim3(static_cast<unsigned>(rows), static_cast<unsigned>(heads)), kWarps * 32, smem, stream>>>(
      qkv, heads, kv_heads, d, rows_kv, layer, scale, out);
  TWELL_CUDA_CHECK_LAUNCH("attention_kernel");
}

}  // namespace twell::cuda::ops
