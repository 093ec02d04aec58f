// rmsnorm_project (model_ops.hpp): one row's RMSNorm, then its projection, in one kernel — a decode
// step's attention input without the norm's own launch. Each CTA normalises the row into shared
// memory (norm_row_reread: the bits add_rmsnorm writes, without holding the row in registers beside
// the weight window — 80 registers a thread with RoPE, so 3 CTAs an SM and the 2B's 384 CTAs one
// wave on 132 SMs; norm_row's held row took 127: 2 an SM, 1.45 waves, the second wave's window not
// loaded before the wait), then its warps stream their W rows as the decode
// GEMV does (16-byte loads, a lane's chunks l, l + 32, … in order, fp32 sums, a butterfly over the
// lanes): the bits launch_twell_gemv writes. Every CTA reads the row (≈ 20 KB from L2 at K = 2048)
// and sums it again: cheaper than a kernel boundary at one token. The first window of W rows is
// loaded before the wait for the previous kernel (programmatic launches): weights, which no kernel
// writes, so their latency overlaps the previous kernel's tail and the norm.
// With a RopeStore the projection is the attention's QKV and its epilogue is rope_store_kv's: each
// warp's two rows are a RoPE pair (i, i + d/2) of one q or k head, or two consecutive v columns, so
// lane 0 rotates q in place and writes k and v into the row's cache (rope_pair: the bits
// rope_store_kv writes).
// With a GatedUp the projection is a gated FFN's [Wg; Wu] (rmsnorm_gated_up): each warp holds two
// neurons' gate rows i and up rows up_row + i, and lane j stores its neuron's g and u and forms
// h[i] = bf16(act(g) · u) from them, as launch_twell_gemv's gated epilogue does; the norm then adds
// two deltas, (x + first) + delta, in add_rmsnorm's order.
#include "cuda/common/check.hpp"
#include "cuda/common/device_math.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/ops/gemv.hpp"
#include "cuda/ops/model_ops.hpp"
#include "cuda/ops/norm_row.cuh"
#include "cuda/ops/rope_pair.cuh"
#include "cuda/ops/weight_window.cuh"

namespace twell::cuda::ops {
namespace {

using detail::kNormThreads;
using detail::norm_row_reread;
using detail::stage_norm_weights;

constexpr int kWarps = kNormThreads / 32;

// What the projection's epilogue does with a warp's rows: store them, rotate a RoPE pair and store
// the cache (RopeStore), or form a gated FFN's h (GatedUp).
enum class Epilogue { plain, rope, gated };

// W rows a warp: 2 (16 a CTA: the synthetic 2B's 6144-row QKV in 384 CTAs), or for the gated form
// two neurons' gate and up rows (8 neurons a CTA: the 2B's 5632 in 704 CTAs at one neuron a warp
// were 1.33 waves at 4 CTAs an SM, 352 are one). Chunk steps a load window: rows · window = 8
// 16-byte loads in flight a lane either way.
template <Epilogue kEp>
inline constexpr int kWarpRows = kEp == Epilogue::gated ? 4 : 2;
template <Epilogue kEp>
inline constexpr int kWin = 8 / kWarpRows<kEp>;

// Warp p's output rows: rows 2p, 2p + 1 (the second may be past n), or with RoPE the pair
// (i, i + d/2) of head h for p < (heads + kv_heads)·d/2 (q heads first, then k heads), then two v
// columns at a time, or gated neurons 2p and 2p + 1: their gate rows, then their up rows
// (up_row + 2p, up_row + 2p + 1); a neuron past up_row has neither.
template <Epilogue kEp>
struct WarpRows {
  std::int64_t row[kWarpRows<kEp>];
  bool valid[kWarpRows<kEp>];
  int head = -1, i = 0;  // RoPE: the pair's head and index; head −1: v columns (or no RoPE)
};

template <Epilogue kEp>
__device__ WarpRows<kEp> warp_rows(std::int64_t p, std::int64_t n, const RopeStore& rope, const GatedUp& gated) {
  WarpRows<kEp> w;
  if constexpr (kEp == Epilogue::gated) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {  // past up_row: both rows invalid (a warp with none takes part in the norm only)
      const std::int64_t i = 2 * p + j;
      const bool in = i < gated.up_row;
      w.row[j] = in ? i : n;
      w.row[2 + j] = in ? gated.up_row + i : n;
    }
  } else if constexpr (kEp == Epilogue::rope) {
    const int half = rope.d / 2;
    const std::int64_t pairs = static_cast<std::int64_t>(rope.heads + rope.kv_heads) * half;
    const std::int64_t q_dim = static_cast<std::int64_t>(rope.heads) * rope.d;
    const std::int64_t kv_dim = static_cast<std::int64_t>(rope.kv_heads) * rope.d;
    if (p < pairs) {
      w.head = static_cast<int>(p / half);
      w.i = static_cast<int>(p % half);
      const std::int64_t base = w.head < rope.heads ? static_cast<std::int64_t>(w.head) * rope.d
                                                    : q_dim + static_cast<std::int64_t>(w.head - rope.heads) * rope.d;
      w.row[0] = base + w.i;
      w.row[1] = base + w.i + half;
    } else {
      w.row[0] = q_dim + kv_dim + 2 * (p - pairs);
      w.row[1] = w.row[0] + 1;
    }
  } else {
    w.row[0] = 2 * p;
    w.row[1] = 2 * p + 1;
  }
#pragma unroll
  for (int r = 0; r < kWarpRows<kEp>; ++r) w.valid[r] = w.row[r] < n;
  return w;
}

template <Epilogue kEp, typename D0>
__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_project_kernel(const float* x, const D0* delta, const __nv_bfloat16* delta2, std::int64_t k, const float* wn,
                           float eps, const __nv_bfloat16* w, std::int64_t n, __nv_bfloat16* y, RopeStore rope,
                           GatedUp gated) {
  constexpr int kRows = kWarpRows<kEp>, kW = kWin<kEp>;
  static_assert(kEp != Epilogue::rope || kRows == 2, "a warp's two rows are one RoPE pair");
  constexpr bool kRope = kEp == Epilogue::rope;
  extern __shared__ uint4 xs_raw[];  // the normalised row, bf16 [k] (16-byte aligned); then the norm's staged weights
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(xs_raw);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const WarpRows<kEp> rows = warp_rows<kEp>(static_cast<std::int64_t>(blockIdx.x) * kWarps + warp, n, rope, gated);
  const bool active = rows.valid[0];  // warps past n take part in the norm only
  const int kchunks = static_cast<int>(k / 8);
  const __nv_bfloat16* wrows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r)  // a row past n reads row 0 (its sum is dropped)
    wrows[r] = w + (rows.valid[r] ? rows.row[r] : 0) * k;
  cuda::detail::WeightWindow<kRows, kW> wv(wrows, k, active);  // windows of kW chunk steps (weight_window.cuh)
  wv.load(0, lane);  // before the wait: weights only
  float4* norm_stage = reinterpret_cast<float4*>(xs_raw + kchunks);
  stage_norm_weights(wn, k, norm_stage);  // weights too
  // RoPE: lane 0's row, cache slot and angle, before the wait too: the row's RowKv and block table
  // are copied in before the step's first kernel and the tables are constants (RopeStore), so no
  // kernel of the chain writes them. After the wait, the slot's dependent loads (the RowKv, then
  // its table entry) held every warp's norm behind one or two round trips: +3.1 % sparse, +1.2 %
  // dense at batch 1 on the H200's 2B (lab/patches/2026-12-02-h200-rope-after-wait.patch).
  RowKv info{};
  std::int64_t slot = 0;  // the row's cache row (through a paged sequence's block table)
  float cos_a = 0.0f, sin_a = 0.0f;
  if constexpr (kRope) {
    if (lane == 0 && active) {
      info = rope.rows_kv[0];
      slot = info.slot(info.pos);
      if (rows.head >= 0) {
        const std::int64_t t = static_cast<std::int64_t>(info.pos) * (rope.d / 2) + rows.i;
        cos_a = rope.cos[t];
        sin_a = rope.sin[t];
      }
    }
  }
  dev::pdl_begin();
  // The bits norm_row writes (add_rmsnorm's normalised row), few registers beside the window.
  norm_row_reread(x, delta, delta2, k, wn, eps, xs, norm_stage);
  __syncthreads();
  if (!active) return;
  float acc[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
  for (int s0 = 0; s0 * 32 < kchunks; s0 += kW) {
    if (s0 > 0) wv.load(s0, lane);
#pragma unroll
    for (int s = 0; s < kW; ++s) {
      const int c = (s0 + s) * 32 + lane;
      if (c < kchunks) {
        float xf[8];
        dev::unpack8_bf16(xs_raw[c], xf);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          float wf[8];
          dev::unpack8_bf16(wv.v[r][s], wf);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[r] = fmaf(xf[e], wf[e], acc[r]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = dev::warp_sum(acc[r]);  // every lane holds every sum
  if constexpr (kEp == Epilogue::gated) {
    // Lane j < 2 stores neuron 2p + j's g and u (rows j and 2 + j), then h from those stored values.
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      if (lane != j || !rows.valid[j]) continue;  // valid: its up row is rows.row[2 + j] = up_row + i
      dev::store_gated_neuron(acc[j], acc[2 + j], rows.row[j], gated.up_row, y, gated.h, gated.h_n, gated.act);
    }
    return;
  }
  if (lane != 0) return;
  const __nv_bfloat16 y0 = __float2bfloat16_rn(acc[0]), y1 = __float2bfloat16_rn(acc[1]);
  if constexpr (!kRope) {
    y[rows.row[0]] = y0;
    if (rows.valid[1]) y[rows.row[1]] = y1;
  } else {
    const int half = rope.d / 2;
    const std::int64_t q_dim = static_cast<std::int64_t>(rope.heads) * rope.d;
    const std::int64_t kv_dim = static_cast<std::int64_t>(rope.kv_heads) * rope.d;
    const std::int64_t cache = rope.layer * info.layer_stride + slot * kv_dim;
    if (rows.head < 0) {  // two v columns: into qkv (as the GEMV writes them) and the cache
      const std::int64_t col = rows.row[0] - (q_dim + kv_dim);
      y[rows.row[0]] = y0;
      y[rows.row[1]] = y1;
      info.v[cache + col] = y0;
      info.v[cache + col + 1] = y1;
      return;
    }
    __nv_bfloat16 o1, o2;
    detail::rope_pair(__bfloat162float(y0), __bfloat162float(y1), cos_a, sin_a, o1, o2);
    const bool is_q = rows.head < rope.heads;
    if (is_q || rope.k_in_place) {
      y[rows.row[0]] = o1;
      y[rows.row[1]] = o2;
    } else {  // k as projected, as rope_store_kv leaves it without k_in_place
      y[rows.row[0]] = y0;
      y[rows.row[1]] = y1;
    }
    if (!is_q) {
      __nv_bfloat16* dst = info.k + cache + static_cast<std::int64_t>(rows.head - rope.heads) * rope.d;
      dst[rows.i] = o1;
      dst[rows.i + half] = o2;
    }
  }
}

}  // namespace

namespace {

// Every public form: delta bf16, or the fixed-point FFN output (D0 = long long); with a GatedUp a
// second bf16 delta (delta2, may be null) and the gated epilogue.
template <typename D0>
void launch_rmsnorm_project(const float* x, const D0* delta, const __nv_bfloat16* delta2, std::int64_t k, const float* w,
                            float eps, const __nv_bfloat16* wproj, std::int64_t n, __nv_bfloat16* y, cudaStream_t stream,
                            const RopeStore* rope, const GatedUp* gated) {
  TWELL_CU_REQUIRE(x && w && wproj && y, ErrorCode::invalid_argument, "rmsnorm_project: null pointer");
  TWELL_CU_REQUIRE(n >= 1 && gemv_takes_k(k) && (reinterpret_cast<std::uintptr_t>(wproj) & 15) == 0,
                   ErrorCode::unsupported,
                   "rmsnorm_project: needs K a multiple of 8 ≤ {} (got {}), n ≥ 1 (got {}), 16-byte aligned W", kGemvMaxK,
                   k, n);
  // A fixed-point delta: 16-byte aligned where norm_row's 4-wide branch reads it (add_delta4), else its own size.
  const bool delta_ok = sizeof(D0) == 2 ? detail::norm_row_aligned(k, x, w, delta, nullptr, nullptr)
                                        : (reinterpret_cast<std::uintptr_t>(delta) & (detail::norm_row_wide(k) ? 15 : 7)) == 0;
  TWELL_CU_REQUIRE(detail::norm_row_aligned(k, x, w, nullptr, delta2, nullptr) && delta_ok, ErrorCode::invalid_argument,
                   "rmsnorm_project: x and w must be 16-byte aligned, a bf16 delta 8-byte aligned and a fixed-point one "
                   "16-byte aligned");
  if (rope)
    TWELL_CU_REQUIRE(rope->rows_kv && rope->cos && rope->sin && rope->heads > 0 && rope->kv_heads > 0 && rope->d > 0 &&
                         rope->d % 2 == 0 && n == static_cast<std::int64_t>(rope->heads + 2 * rope->kv_heads) * rope->d,
                     ErrorCode::invalid_argument,
                     "rmsnorm_project: RoPE needs the QKV width n = (heads + 2·kv_heads)·d with d even (got n = {})", n);
  if (gated)
    TWELL_CU_REQUIRE(gated->h && gated->up_row >= 1 && n == 2 * gated->up_row && gated->h_n >= 1 &&
                         gated->h_n <= gated->up_row && gated->act >= 0 && gated->act <= 3,
                     ErrorCode::invalid_argument,
                     "rmsnorm_gated_up: needs h, N = 2 · up_row (got N {}, up_row {}), 1 ≤ h_n ≤ up_row (got {}) and "
                     "an activation 0–3 (got {})",
                     n, gated->up_row, gated->h_n, gated->act);
  // Warps: two rows a warp, or two neurons (four rows) a warp in the gated form.
  const std::int64_t warps = gated ? (gated->up_row + 1) / 2 : (n + 1) / 2;
  const std::int64_t ctas = (warps + kWarps - 1) / kWarps;
  TWELL_CU_REQUIRE(ctas <= 0x7fffffff, ErrorCode::unsupported, "rmsnorm_project: n = {} too large", n);
  const std::size_t smem = static_cast<std::size_t>(detail::norm_row_smem_bytes(k));
  const dim3 grid(static_cast<unsigned>(ctas)), block(kNormThreads);
  if (gated)
    launch_kernel(rmsnorm_project_kernel<Epilogue::gated, D0>, grid, block, smem, stream, x, delta, delta2, k, w, eps, wproj,
                  n, y, RopeStore{}, *gated);
  else if (rope)
    launch_kernel(rmsnorm_project_kernel<Epilogue::rope, D0>, grid, block, smem, stream, x, delta, delta2, k, w, eps, wproj,
                  n, y, *rope, GatedUp{});
  else
    launch_kernel(rmsnorm_project_kernel<Epilogue::plain, D0>, grid, block, smem, stream, x, delta, delta2, k, w, eps,
                  wproj, n, y, RopeStore{}, GatedUp{});
  TWELL_CUDA_CHECK_LAUNCH("rmsnorm_project_kernel");
}

}  // namespace

void rmsnorm_project(const float* x, const __nv_bfloat16* delta, std::int64_t k, const float* w, float eps,
                     const __nv_bfloat16* wproj, std::int64_t n, __nv_bfloat16* y, cudaStream_t stream,
                     const RopeStore* rope) {
  launch_rmsnorm_project(x, delta, nullptr, k, w, eps, wproj, n, y, stream, rope, nullptr);
}

void rmsnorm_project(const float* x, const std::int64_t* delta_fixed, std::int64_t k, const float* w, float eps,
                     const __nv_bfloat16* wproj, std::int64_t n, __nv_bfloat16* y, cudaStream_t stream,
                     const RopeStore* rope) {
  TWELL_CU_REQUIRE(delta_fixed, ErrorCode::invalid_argument, "rmsnorm_project: null fixed-point delta");
  launch_rmsnorm_project(x, reinterpret_cast<const long long*>(delta_fixed), nullptr, k, w, eps, wproj, n, y, stream, rope,
                         nullptr);
}

void rmsnorm_gated_up(const float* x, const __nv_bfloat16* first, const __nv_bfloat16* delta, std::int64_t k,
                      const float* w, float eps, const __nv_bfloat16* w_gu, const GatedUp& gated, __nv_bfloat16* gu,
                      cudaStream_t stream) {
  TWELL_CU_REQUIRE(delta, ErrorCode::invalid_argument, "rmsnorm_gated_up: null delta");
  launch_rmsnorm_project(x, first, delta, k, w, eps, w_gu, 2 * gated.up_row, gu, stream, nullptr, &gated);
}

}  // namespace twell::cuda::ops
