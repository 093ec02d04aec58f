// Decode FFN kernel (see twell_decode.hpp).
#include "cuda/sm80/twell_decode.hpp"

#include "cuda/common/check.hpp"
#include "cuda/common/device_math.cuh"
#include "cuda/common/launch.cuh"

namespace twell::cuda {
namespace {

constexpr int kThreads = 256;  // = one TwELL tile of neurons, one thread each when gathering
constexpr int kWarps = kThreads / 32;
constexpr int kMaxCh = static_cast<int>(kDecodeMaxK / 8 / kThreads);  // 16-byte K-chunks per thread

__global__ void __launch_bounds__(kThreads) twell_decode_kernel(TwellDecodeParams p) {
  __shared__ int s_col[kThreads];
  __shared__ float s_h[kThreads];
  __shared__ int s_warp[kWarps];
  __shared__ bool s_last;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const std::int64_t tile = blockIdx.x, m = blockIdx.y, tiles = gridDim.x;
  const int kchunks = static_cast<int>(p.k / 8);
  // Under a programmatic launch: wait for the gate before reading g, and let the kernel after this
  // one (the runtime's add + norm) be scheduled now; it waits for this grid's end in turn.
  dev::pdl_begin();

  // 1. The tile's active neurons, ascending: s_col[0, cnt), their values in s_h.
  const std::int64_t n = tile * kThreads + tid;
  const float gv = n < p.n ? __bfloat162float(p.g[m * p.ld_g + n]) : 0.0f;
  const bool act = gv > 0.0f;
  const unsigned ballot = __ballot_sync(0xffffffffu, act);
  if (lane == 0) s_warp[warp] = __popc(ballot);
  __syncthreads();
  int base = 0, cnt = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    base += w < warp ? s_warp[w] : 0;
    cnt += s_warp[w];
  }
  if (act) {
    const int at = base + __popc(ballot & ((1u << lane) - 1u));
    s_col[at] = static_cast<int>(n - tile * kThreads);
    s_h[at] = gv;
  }
  __syncthreads();

  // 2. Gated: h = g · ⟨x[m], Wu[n]⟩, one warp per active neuron.
  if (p.gated) {
    const uint4* xr = reinterpret_cast<const uint4*>(p.x + m * p.ld_x);
    for (int j = warp; j < cnt; j += kWarps) {
      const uint4* wr = reinterpret_cast<const uint4*>(p.w_up + (tile * kThreads + s_col[j]) * p.k);
      float s = 0.0f;
#pragma unroll 8  // the row's loads in flight together (the sum's order is unchanged)
      for (int c = lane; c < kchunks; c += 32) s += dev::dot8(__ldg(xr + c), __ldg(wr + c));
      s = dev::warp_sum(s);
      if (lane == 0) s_h[j] *= s;
    }
    __syncthreads();
  }

  // 3. The tile's partial y[m]: thread tid owns the K-chunks {tid + 256·i}.
  float acc[kMaxCh][8];
#pragma unroll
  for (int i = 0; i < kMaxCh; ++i)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[i][e] = 0.0f;
#pragma unroll 4
  for (int j = 0; j < cnt; ++j) {
    const float h = s_h[j];
    const uint4* row = reinterpret_cast<const uint4*>(p.w_down_t + (tile * kThreads + s_col[j]) * p.k);
#pragma unroll
    for (int i = 0; i < kMaxCh; ++i) {
      const int c = i * kThreads + tid;
      if (c < kchunks) dev::axpy8(h, __ldg(row + c), acc[i]);
    }
  }
  float* part = p.partials + (m * tiles + tile) * p.k;
#pragma unroll
  for (int i = 0; i < kMaxCh; ++i) {
    const int c = i * kThreads + tid;
    if (c < kchunks) {
      float4* o = reinterpret_cast<float4*>(part + static_cast<std::int64_t>(c) * 8);
      o[0] = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
      o[1] = make_float4(acc[i][4], acc[i][5], acc[i][6], acc[i][7]);
    }
  }

  // 4. Tickets: the last CTA of token m adds the partials in tile order and writes y[m].
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    if (cnt) atomicAdd(p.nnz, static_cast<unsigned long long>(cnt));
    __threadfence();
    s_last = atomicAdd(&p.row_tickets[m], 1u) == static_cast<unsigned>(tiles - 1);
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  // kBatch tiles' partials in flight at once (a loop of one load pair per tile put the tiles'
  // L2 round trips one after another: ≈ 22 of them at N = 5632), added in tile order as before.
  constexpr int kBatch = 8;
  for (int c = tid; c < kchunks; c += kThreads) {
    float4 lo = make_float4(0.0f, 0.0f, 0.0f, 0.0f), hi = lo;
    const float* col = p.partials + m * tiles * p.k + static_cast<std::int64_t>(c) * 8;
    for (std::int64_t t0 = 0; t0 < tiles; t0 += kBatch) {
      float4 q[kBatch][2];
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        if (t0 + b < tiles) {
          const float4* src = reinterpret_cast<const float4*>(col + (t0 + b) * p.k);
          q[b][0] = __ldcg(src);
          q[b][1] = __ldcg(src + 1);
        }
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        if (t0 + b < tiles) {
          lo = make_float4(lo.x + q[b][0].x, lo.y + q[b][0].y, lo.z + q[b][0].z, lo.w + q[b][0].w);
          hi = make_float4(hi.x + q[b][1].x, hi.y + q[b][1].y, hi.z + q[b][1].z, hi.w + q[b][1].w);
        }
    }
    const float sum[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    *reinterpret_cast<uint4*>(p.y + m * p.ld_y + static_cast<std::int64_t>(c) * 8) = dev::pack8_bf16(sum);
  }
  if (tid == 0) {
    p.row_tickets[m] = 0;
    // Each token's CTAs added their pairs before the token's ticket; the last token publishes.
    dev::grid_count_publish(p.nnz, p.cta_ticket, gridDim.y, 0, p.nnz_out);
  }
}

}  // namespace

void launch_twell_decode(const TwellDecodeParams& p, cudaStream_t stream) {
  TWELL_CU_REQUIRE(p.g && p.w_down_t && p.y && p.partials && p.row_tickets && p.cta_ticket && p.nnz &&
                       (!p.gated || (p.x && p.w_up)),
                   ErrorCode::invalid_argument, "twell decode: null pointer");
  TWELL_CU_REQUIRE(p.m >= 1 && p.m <= 65535 && p.n >= 1 && p.k >= 8 && p.k % 8 == 0 && p.k <= kDecodeMaxK &&
                       p.ld_y % 8 == 0 && (!p.gated || p.ld_x % 8 == 0),
                   ErrorCode::unsupported, "twell decode: M = {} (≤ 65535), K = {} (multiple of 8, ≤ {}) not supported",
                   p.m, p.k, kDecodeMaxK);
  const std::int64_t tiles = (p.n + kThreads - 1) / kThreads;
  TWELL_CU_REQUIRE(tiles <= 0x7fffffff, ErrorCode::unsupported, "twell decode: N = {} too large", p.n);
  launch_kernel(twell_decode_kernel, dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(p.m)), dim3(kThreads), 0,
                stream, p);
  TWELL_CUDA_CHECK_LAUNCH("twell_decode_kernel");
}

}  // namespace twell::cuda
