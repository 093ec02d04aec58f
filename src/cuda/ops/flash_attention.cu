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

// Rows are padded (+16 bytes) so that the 16 rows a WMMA fragment reads start in different banks.
template <int D>
struct FlashSmem {
  static_assert(D % 16 == 0 && D <= 128, "head_dim must be a multiple of 16, at most 128");
  static constexpr int kLdH = D + 8;     // bf16 rows of D
  static constexpr int kLdP = kBN + 8;   // bf16 rows of kBN
  static constexpr int kLdS = kBN + 4;   // fp32 rows of kBN
  static constexpr int kLdO = D + 4;     // fp32 rows of D
  __nv_bfloat16 q[kBM][kLdH];           // [64, D] the block's queries
  __nv_bfloat16 k[kBN][kLdH];           // [64, D] one key tile (zero past the last key)
  __nv_bfloat16 v[kBN][kLdH];           // [64, D] its values
  float s[kWarps][16][kLdS];            // per warp [16, 64]: scores of its rows
  __nv_bfloat16 p[kWarps][16][kLdP];    // per warp [16, 64]: probabilities (unnormalised), bf16
  float o[kWarps][16][kLdO];            // per warp [16, D]: output accumulators
  float m[kBM], l[kBM];                 // running max and sum per row
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
  const __nv_bfloat16* kc = info.head_k(layer, kvh * D);
  const __nv_bfloat16* vc = info.head_v(layer, kvh * D);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tid = threadIdx.x;

  // 16-byte loads: 8 bf16 per load (row strides and head offsets are multiples of 8 elements).
  constexpr int kVec = 8, kChunks = D / kVec;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int i = tid; i < kBM * kChunks; i += blockDim.x) {
    const int r = i / kChunks, c = (i % kChunks) * kVec;
    *reinterpret_cast<uint4*>(&sm.q[r][c]) =
        r < rows ? *reinterpret_cast<const uint4*>(qkv + (blk.row0 + r) * ld + h * D + c) : zero;
  }
  for (int i = tid; i < kWarps * 16 * D; i += blockDim.x) sm.o[i / (16 * D)][(i / D) % 16][i % D] = 0.0f;
  for (int i = tid; i < kBM; i += blockDim.x) {
    sm.m[i] = -INFINITY;
    sm.l[i] = 0.0f;
  }
  for (int k0 = 0; k0 < keys; k0 += kBN) {
    __syncthreads();  // the previous tile's K/V are no longer read
    for (int i = tid; i < kBN * kChunks; i += blockDim.x) {
      const int r = i / kChunks, c = (i % kChunks) * kVec;
      const bool in = k0 + r < keys;
      const std::int64_t off = (in ? info.slot(k0 + r) : 0) * kv_dim + c;  // key k0 + r's cache row
      *reinterpret_cast<uint4*>(&sm.k[r][c]) = in ? *reinterpret_cast<const uint4*>(kc + off) : zero;
      *reinterpret_cast<uint4*>(&sm.v[r][c]) = in ? *reinterpret_cast<const uint4*>(vc + off) : zero;
    }
    __syncthreads();
    // S_w [16, 64] = Q_w [16, D] · K_tileᵀ
    for (int j = 0; j < kBN / 16; ++j) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int kk = 0; kk < D / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
        wmma::load_matrix_sync(a, &sm.q[warp * 16][kk * 16], FlashSmem<D>::kLdH);
        wmma::load_matrix_sync(b, &sm.k[j * 16][kk * 16], FlashSmem<D>::kLdH);  // b[k][n] = K[n][k]
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(&sm.s[warp][0][j * 16], acc, FlashSmem<D>::kLdS, wmma::mem_row_major);
    }
    __syncwarp();
    // Online softmax, one row at a time, the warp's lanes across the row (columns lane and
    // lane + 32: conflict-free shared-memory accesses). Row r is query position p0 + 16·warp + r
    // and sees keys ≤ its position.
    for (int r = 0; r < 16; ++r) {
      const int row = warp * 16 + r, limit = p0 + row;
      float s0 = k0 + lane <= limit ? sm.s[warp][r][lane] * scale : -INFINITY;
      float s1 = k0 + lane + 32 <= limit ? sm.s[warp][r][lane + 32] * scale : -INFINITY;
      float mx = fmaxf(s0, s1);
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_old = sm.m[row], m_new = fmaxf(m_old, mx);
      // A row whose keys are all masked so far keeps m = −∞ and gains nothing.
      const bool none = m_new == -INFINITY;
      const float corr = none ? 1.0f : __expf(m_old - m_new);
      const __nv_bfloat16 e0 = __float2bfloat16(none ? 0.0f : __expf(s0 - m_new));
      const __nv_bfloat16 e1 = __float2bfloat16(none ? 0.0f : __expf(s1 - m_new));
      sm.p[warp][r][lane] = e0;
      sm.p[warp][r][lane + 32] = e1;
      float sum = __bfloat162float(e0) + __bfloat162float(e1);
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      for (int c = lane; c < D; c += 32) sm.o[warp][r][c] *= corr;
      __syncwarp();
      if (lane == 0) {
        sm.m[row] = m_new;
        sm.l[row] = sm.l[row] * corr + sum;
      }
    }
    __syncwarp();
    // O_w [16, D] += P_w [16, 64] · V_tile [64, D]
    for (int dt = 0; dt < D / 16; ++dt) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, &sm.o[warp][0][dt * 16], FlashSmem<D>::kLdO, wmma::mem_row_major);
      for (int kk = 0; kk < kBN / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
        wmma::load_matrix_sync(a, &sm.p[warp][0][kk * 16], FlashSmem<D>::kLdP);
        wmma::load_matrix_sync(b, &sm.v[kk * 16][dt * 16], FlashSmem<D>::kLdH);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(&sm.o[warp][0][dt * 16], acc, FlashSmem<D>::kLdO, wmma::mem_row_major);
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
  // Per device and cheap: set on every launch (a process may run on several GPUs, from several threads).
  TWELL_CUDA_CHECK(cudaFuncSetAttribute(flash_attention_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  flash_attention_kernel<D><<<dim3(static_cast<unsigned>(nblocks), static_cast<unsigned>(heads)), kWarps * 32, smem,
                              stream>>>(qkv, heads, kv_heads, blocks, rows_kv, layer, scale, out);
  TWELL_CUDA_CHECK_LAUNCH("flash_attention_kernel");
}

}  // namespace

bool flash_attention_supported(std::int64_t d) noexcept {
  if (d != 64 && d != 128) return false;
  int dev = 0, optin = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
    return false;
  const std::size_t need = d == 64 ? sizeof(FlashSmem<64>) : sizeof(FlashSmem<128>);
  return need <= static_cast<std::size_t>(optin);  // e.g. not d = 128 on a 99 KB sm_86 / sm_89
}

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
