// flash_attention: causal prefill attention on tensor cores (WMMA bf16 → fp32), online softmax,
// reading each block's keys and values from its sequence's KV cache once per 64 query rows.
//
// A block owns up to 64 consecutive query rows of one sequence (positions p0 … p0 + rows − 1) and
// one query head; 4 warps hold 16 rows each. Per 64-key tile: S = Q·Kᵀ (WMMA), masked scaled
// softmax update of the running max m and sum l per row, O ← O·exp(m_old − m_new) + P·V (WMMA, P
// rounded to bf16). Exact up to those roundings: the plain kernel (attention.cu) is its reference in
// tests/cuda/test_model_ops.cpp.
#include <mma.h>

#include "cuda/common/check.hpp"
#include "cuda/ops/model_ops.hpp"

namespace twell::cuda::ops {
namespace {

namespace wmma = nvcuda::wmma;
constexpr int kBM = 64, kBN = 64, kWarps = 4;

template <int D>
struct FlashSmem {
  static_assert(D % 16 == 0 && D <= 128, "head_dim must be a multiple of 16, at most 128");
  __nv_bfloat16 q[kBM][D];           // the block's queries
  __nv_bfloat16 k[kBN][D];           // one key tile (zero past the last key)
  __nv_bfloat16 v[kBN][D];           // its values
  float s[kWarps][16][kBN];          // per warp: scores of its 16 rows
  __nv_bfloat16 p[kWarps][16][kBN];  // per warp: probabilities (unnormalised), bf16
  float o[kWarps][16][D];            // per warp: output accumulators
  float m[kBM], l[kBM];              // running max and sum per row
};

template <int D>
__global__ void __launch_bounds__(kWarps * 32) flash_attention_kernel(const __nv_bfloat16* qkv, std::int64_t heads,
                                                                      std::int64_t kv_heads, const FlashBlock* blocks,
                                                                      const RowKv* rows_kv, std::int64_t layer,
                                                                      float scale, __nv_bfloat16* out) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  auto& sm = *reinterpret_cast<FlashSmem<D>*>(smem_raw);
  const FlashBlock blk = blocks[blockIdx.x];
  const std::int64_t h = blockIdx.y, kvh = h / (heads / kv_heads);
  const std::int64_t ld = (heads + 2 * kv_heads) * D, q_dim = heads * D, kv_dim = kv_heads * D;
  const RowKv info = rows_kv[blk.row0];
  const int p0 = info.pos, rows = blk.rows, keys = p0 + rows;
  const __nv_bfloat16* kc = info.k + layer * info.layer_stride + kvh * D;
  const __nv_bfloat16* vc = info.v + layer * info.layer_stride + kvh * D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tid = threadIdx.x;

  for (int i = tid; i < kBM * D; i += blockDim.x) {
    const int r = i / D, c = i % D;
    sm.q[r][c] = r < rows ? qkv[(blk.row0 + r) * ld + h * D + c] : __float2bfloat16(0.0f);
  }
  for (int i = tid; i < kWarps * 16 * D; i += blockDim.x) (&sm.o[0][0][0])[i] = 0.0f;
  for (int i = tid; i < kBM; i += blockDim.x) {
    sm.m[i] = -INFINITY;
    sm.l[i] = 0.0f;
  }
  for (int k0 = 0; k0 < keys; k0 += kBN) {
    __syncthreads();  // the previous tile's K/V are no longer read
    for (int i = tid; i < kBN * D; i += blockDim.x) {
      const int r = i / D, c = i % D;
      const bool in = k0 + r < keys;
      sm.k[r][c] = in ? kc[static_cast<std::int64_t>(k0 + r) * kv_dim + c] : __float2bfloat16(0.0f);
      sm.v[r][c] = in ? vc[static_cast<std::int64_t>(k0 + r) * kv_dim + c] : __float2bfloat16(0.0f);
    }
    __syncthreads();
    // S_w [16, 64] = Q_w [16, D] · K_tileᵀ
    for (int j = 0; j < kBN / 16; ++j) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int kk = 0; kk < D / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
        wmma::load_matrix_sync(a, &sm.q[warp * 16][kk * 16], D);
        wmma::load_matrix_sync(b, &sm.k[j * 16][kk * 16], D);  // b[k][n] = K[n][k]
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(&sm.s[warp][0][j * 16], acc, kBN, wmma::mem_row_major);
    }
    __syncwarp();
    // Online softmax: two lanes per row, 32 keys each. Row r (query position p0 + 16·warp + r)
    // sees keys ≤ its position.
    {
      const int r = lane / 2, half = lane % 2, row = warp * 16 + r;
      const int limit = p0 + row;  // last key this row may see
      float mx = -INFINITY;
      for (int c = half * 32; c < half * 32 + 32; ++c) {
        const float s = (k0 + c <= limit) ? sm.s[warp][r][c] * scale : -INFINITY;
        sm.s[warp][r][c] = s;
        mx = fmaxf(mx, s);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      const float m_old = sm.m[row], m_new = fmaxf(m_old, mx);
      // A row whose keys are all masked so far keeps m = −∞ and contributes nothing.
      const float corr = m_new == -INFINITY ? 1.0f : __expf(m_old - m_new);
      float sum = 0.0f;
      for (int c = half * 32; c < half * 32 + 32; ++c) {
        const float e = m_new == -INFINITY ? 0.0f : __expf(sm.s[warp][r][c] - m_new);
        const __nv_bfloat16 eb = __float2bfloat16(e);
        sm.p[warp][r][c] = eb;
        sum += __bfloat162float(eb);
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      for (int c = half * (D / 2); c < (half + 1) * (D / 2); ++c) sm.o[warp][r][c] *= corr;
      __syncwarp();
      if (half == 0) {
        sm.m[row] = m_new;
        sm.l[row] = sm.l[row] * corr + sum;
      }
    }
    __syncwarp();
    // O_w [16, D] += P_w [16, 64] · V_tile [64, D]
    for (int dt = 0; dt < D / 16; ++dt) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, &sm.o[warp][0][dt * 16], D, wmma::mem_row_major);
      for (int kk = 0; kk < kBN / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
        wmma::load_matrix_sync(a, &sm.p[warp][0][kk * 16], kBN);
        wmma::load_matrix_sync(b, &sm.v[kk * 16][dt * 16], D);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(&sm.o[warp][0][dt * 16], acc, D, wmma::mem_row_major);
    }
  }
  __syncthreads();
  for (int i = tid; i < rows * D; i += blockDim.x) {
    const int r = i / D, c = i % D;
    const float l = sm.l[r];
    out[(blk.row0 + r) * q_dim + h * D + c] = __float2bfloat16(sm.o[r / 16][r % 16][c] / l);
  }
}

template <int D>
void launch(const __nv_bfloat16* qkv, std::int64_t nblocks, std::int64_t heads, std::int64_t kv_heads,
            const FlashBlock* blocks, const RowKv* rows_kv, std::int64_t layer, __nv_bfloat16* out, cudaStream_t stream) {
  const std::size_t smem = sizeof(FlashSmem<D>);
  static bool configured = false;  // per device in practice: every GPU we run takes the same setting
  if (!configured) {
    TWELL_CUDA_CHECK(cudaFuncSetAttribute(flash_attention_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
    configured = true;
  }
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  flash_attention_kernel<D><<<dim3(static_cast<unsigned>(nblocks), static_cast<unsigned>(heads)), kWarps * 32, smem,
                              stream>>>(qkv, heads, kv_heads, blocks, rows_kv, layer, scale, out);
  TWELL_CUDA_CHECK_LAUNCH("flash_attention_kernel");
}

}  // namespace

bool flash_attention_supported(std::int64_t d) noexcept { return d == 64 || d == 128; }

void flash_attention(const __nv_bfloat16* qkv, std::int64_t nblocks, std::int64_t heads, std::int64_t kv_heads,
                     std::int64_t d, const FlashBlock* blocks, const RowKv* rows_kv, std::int64_t layer,
                     __nv_bfloat16* out, cudaStream_t stream) {
  TWELL_CU_REQUIRE(nblocks > 0 && nblocks < (1ll << 31) && heads > 0 && heads < 65536 && kv_heads > 0 &&
                       heads % kv_heads == 0,
                   ErrorCode::invalid_argument, "flash_attention: bad shape (blocks {}, heads {}/{})", nblocks, heads,
                   kv_heads);
  if (d == 64) return launch<64>(qkv, nblocks, heads, kv_heads, blocks, rows_kv, layer, out, stream);
  if (d == 128) return launch<128>(qkv, nblocks, heads, kv_heads, blocks, rows_kv, layer, out, stream);
  ::twell::cuda::detail::raise(ErrorCode::unsupported, "flash_attention: head_dim {} (64 or 128)", d);
}

}  // namespace twell::cuda::ops
