// twell_probe_decode_rows: the decode FFN at 2–64 rows, today's path against a pair shaped like the
// one-token kernels (docs/runtime.md, "Where a decode step's time goes", the plan's row steps).
//   today's  2–16 rows: the gate GEMV on tensor cores (launch_twell_gemv, ReLU: g [M, N] bf16 to
//            memory), then launch_twell_decode: one CTA a (256-neuron tile, row) reads the row's g,
//            forms h and a partial y per tile in fp32; the row's last CTA (a ticket) adds the
//            partials in tile order. 17–64 rows: the dense FFN, as the runtime dispatches there
//            (cuBLASLt: gate and up in one GEMM over the stacked [Wg; Wu], bf16(ReLU(g) · u), the
//            down GEMM).
//   union    (cuda/sm90/union_ffn.hpp, the engine's) the cuBLASLt ReLU gate, then the union's list, up and down on tensor
//            cores: each neuron some row fired has its Wu and Wdᵀ rows read once for the batch, h
//            in bf16 as the dense FFN rounds it; up and down each K or the union split over a
//            thread-block cluster of 2, 4 or 8 CTAs, timed at each pair (k a multiple of 128, sm_90;
//            its checks below the table's line of each M). Its last line at each M times the list
//            and up over every neuron (g all 1: a gate's bytes, n · k) against the cuBLASLt ReLU
//            gate and a plain copy: whether a gate in the up's form, the list in its epilogue,
//            could stream Wg as fast as cuBLASLt does; then the whole union with and without its
//            list kernel (what a gate leaving the list's masks in its epilogue could save); at 2–16
//            rows the gate in the union's chain: cuBLASLt's and the GEMV's (the engine's path under
//            decode-gemv-max-rows), alone and before the union, and the up and down alone.
//   rows     kernel 1 (2–16 rows), a CTA a block of 16 neurons for every row: the gate GEMV's own
//            partial sums (gemv_mma_partials, so the same g bits) with g kept on chip; each neuron's
//            fired rows as a mask; a warp a fired neuron forms h for each row that fired it in the
//            decode kernel's order (the same h bits as today's), stores the neuron's h for the rows
//            (0 where a row did not fire) and its mask (0 for a neuron no row fired), and prefetches
//            its Wdᵀ row to L2. 17–64 rows: the cuBLASLt ReLU GEMM writes g and kernel 1 reads it
//            (the same steps after the gate).
//            Kernel 2, a CTA 32 columns of y for 8 rows: lists the neurons its rows fired in
//            ascending order (one pass over their masks); its 64 thread groups own contiguous neuron
//            ranges, a thread 8 columns of 8 rows summed over its range's listed neurons in
//            ascending order (the loads of 4 neurons in flight), the ranges' sums added in range
//            order, y rounded once. A row's terms are its own fired neurons plus exact zeros, so its
//            bits do not depend on the batch.
// What it removes at 2–16 rows: g's round trip through memory, the per-tile partials and the
// tickets; Wd's load no longer waits for h (the prefetch). At 17–64 rows: the up and down rows of
// the neurons no row fired (the union's bytes instead of the matrices'). What it adds: each kernel-2
// CTA reads every neuron's 8-byte mask once.
// Synthetic layer: x [64, K] N(0, 1) with column 0 = 1; Wg N(0, 1/K) with column 0 = −z(d_n), so
// neuron n fires on a row with probability ≈ d_n, d_n log-normal around `density` (sigma `skew`:
// popular neurons, as a trained model has; 0 = every neuron alike, the largest union); Wu and Wdᵀ
// N(0, 1/K). `layers` weight sets are launched in turn, captured in a CUDA graph and replayed, so
// the weights are past the L2.
// Checks, each M (y, g and the counts poisoned before the launches, so a skipped write shows):
// - the rows pair's y within a derived bound of a float64 reference on the host (from the bf16 g, x
//   and weights; first order in u = 2^-24: h's fp32 dot, the fp32 sums of y, one bf16 step of |y_ref|
//   for the final rounding); a NaN fails;
// - the masks and the fired pairs' count against g on the host;
// - rows 0 and M − 1 run alone give the bits they have in the batch;
// - 2–16 rows: g equals the GEMV's bit for bit, today's y is within the same bound, the counts agree;
// - 17–64 rows: today's dense y (which rounds g, u and h to bf16) within 2^-5 of the largest |y|, a
//   sanity check of the dense GEMMs' shapes, not of their exactness.
//   twell_probe_decode_rows [n [k [density [skew [layers]]]]]   (defaults: 5632 2048 0.005 1.0 64)
//   env PROBE_ROWS_M (e.g. "8,64") only those rows; PROBE_CHECK_ONLY the checks alone (times print nan)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/common/device_buffer.hpp"
#include "cuda/common/device_math.cuh"
#include "cuda/dense/lt_gemm.hpp"
#include "cuda/ops/gemv.hpp"
#include "cuda/ops/gemv_mma_kernel.cuh"
#include "cuda/sm80/twell_decode.hpp"
#include "cuda/sm90/union_ffn.hpp"
#include "probe_graph.cuh"
#include "probe_rows_h.cuh"

using namespace twell::cuda;
using namespace twell::probe;

namespace {

constexpr int kMaxRows = 64;               // rows (tokens) a mask and an h record hold
constexpr int kFusedRows = 16;             // kernel 1 computes the gate itself up to here (the GEMV's rows)
constexpr int kMaxN = 8192;                // neurons kernel 2 lists in shared memory
constexpr int kThreads = 256;
constexpr int kSlots = 4;                  // kernel 2: 16-byte column chunks a CTA (32 columns) ...
constexpr int kGroups = kThreads / kSlots;  // ... and thread groups: thread (group tid / kSlots, chunk tid % kSlots)
constexpr int kRowBlock = 8;               // kernel 2: rows a CTA

struct RowsParams {
  TwellGemvParams gate;       // x, Wg, m, n, k (relu); its g unused
  const __nv_bfloat16* g_in;  // the gate after ReLU [m, n] (required past kFusedRows rows; null: kernel 1 computes it)
  const __nv_bfloat16* w_up;  // [n, k]
  const __nv_bfloat16* w_down_t;  // [n, k]
  __nv_bfloat16* y;           // [m, k]
  __nv_bfloat16* g_out;       // optional, m ≤ kFusedRows: the gate as the GEMV writes it [m, n] (the check)
  unsigned long long* masks;  // [n] rows that fired neuron j (0: none), every neuron every launch
  float* h;                   // [n, hs] h of the fired neurons (0 where a row did not fire)
  int hs;                     // h's row stride: m rounded up to 8
  unsigned long long* nnz;    // [1] zero on entry, left zero
  unsigned long long* nnz_out;  // [1] the fired pairs' count
};

// After the gate, for the CTA's 16 neurons n0 + row (s_g[row][t]: row t's g, 0 past m): the masks
// (stored for every neuron, 0 for none), the fired pairs' count, then a warp a fired neuron: its Wdᵀ
// row prefetched to L2 and h for each row that fired it, in twell_decode_kernel's order.
__device__ __forceinline__ void form_h(const RowsParams& p, const float (&s_g)[detail::kGemvMmaRows][kMaxRows],
                                       unsigned long long (&s_mask)[detail::kGemvMmaRows], long long n0) {
  const TwellGemvParams& gp = p.gate;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  if (warp == 0) {
    unsigned long long mask = 0;
    if (lane < detail::kGemvMmaRows && n0 + lane < gp.n) {
      for (int t = 0; t < gp.m; ++t)
        if (s_g[lane][t] > 0.0f) mask |= 1ull << t;
      p.masks[n0 + lane] = mask;
    }
    if (lane < detail::kGemvMmaRows) s_mask[lane] = mask;
    const unsigned pairs = dev::warp_sum(static_cast<unsigned>(__popcll(mask)));
    if (lane == 0 && pairs) atomicAdd(p.nnz, static_cast<unsigned long long>(pairs));
  }
  __syncthreads();
  const int kchunks = static_cast<int>(gp.k / 8);
  for (int row = warp; row < detail::kGemvMmaRows; row += detail::kGemvMmaWarps) {
    const unsigned long long mask = s_mask[row];
    if (!mask) continue;
    const long long n = n0 + row;
    const char* drow = reinterpret_cast<const char*>(p.w_down_t + n * gp.k);
    for (long long b = static_cast<long long>(lane) * 128; b < gp.k * 2; b += 32 * 128)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(drow + b));
    float hv[kMaxRows / 32] = {};  // lane l: rows l, l + 32
    rows_up_dots(reinterpret_cast<const uint4*>(p.w_up + n * gp.k), gp.x, gp.ld_x, mask, kchunks, lane, [&](int t, float si) {
#pragma unroll
      for (int r = 0; r < kMaxRows / 32; ++r)
        if (lane + 32 * r == t) hv[r] = s_g[row][t] * si;  // today's s_h[j] *= s with s_h[j] = g
    });
#pragma unroll
    for (int i = 0; i < kMaxRows / 32; ++i)
      if (lane + 32 * i < p.hs) p.h[n * p.hs + lane + 32 * i] = hv[i];
  }
}

// Kernel 1 at 2–16 rows: the gate's 16 neurons on tensor cores (the GEMV's sums and epilogue), then form_h.
template <int NT>
__global__ void __launch_bounds__(kThreads) rows_gate_up_kernel(RowsParams p) {
  __shared__ float part[detail::kGemvMmaWarps][detail::kGemvMmaRows][8 * NT];
  __shared__ float s_g[detail::kGemvMmaRows][kMaxRows];
  __shared__ unsigned long long s_mask[detail::kGemvMmaRows];
  const TwellGemvParams& gp = p.gate;
  detail::gemv_mma_partials<NT>(gp, part);
  __syncthreads();
  const long long n0 = static_cast<long long>(blockIdx.x) * detail::kGemvMmaRows;
  // The GEMV's epilogue: the warps' sums in warp order, ReLU, bf16 once.
  for (int o = threadIdx.x; o < detail::kGemvMmaRows * kMaxRows; o += kThreads) {
    const int row = o % detail::kGemvMmaRows, tok = o / detail::kGemvMmaRows;
    float g = 0.0f;
    if (tok < gp.m && tok < 8 * NT) {
      float v = 0.0f;
#pragma unroll
      for (int w = 0; w < detail::kGemvMmaWarps; ++w) v += part[w][row][tok];
      g = __bfloat162float(__float2bfloat16_rn(fmaxf(v, 0.0f)));
      if (p.g_out && n0 + row < gp.n) p.g_out[tok * gp.n + n0 + row] = __float2bfloat16_rn(g);
    }
    s_g[row][tok] = g;
  }
  __syncthreads();
  form_h(p, s_g, s_mask, n0);
}

// Kernel 1 at 17–64 rows: g from memory (the cuBLASLt ReLU GEMM's), then form_h.
__global__ void __launch_bounds__(kThreads) rows_up_kernel(RowsParams p) {
  __shared__ float s_g[detail::kGemvMmaRows][kMaxRows];
  __shared__ unsigned long long s_mask[detail::kGemvMmaRows];
  const TwellGemvParams& gp = p.gate;
  const long long n0 = static_cast<long long>(blockIdx.x) * detail::kGemvMmaRows;
  for (int o = threadIdx.x; o < detail::kGemvMmaRows * kMaxRows; o += kThreads) {
    const int row = o % detail::kGemvMmaRows, tok = o / detail::kGemvMmaRows;
    s_g[row][tok] = tok < gp.m && n0 + row < gp.n ? __bfloat162float(p.g_in[tok * gp.n + n0 + row]) : 0.0f;
  }
  __syncthreads();
  form_h(p, s_g, s_mask, n0);
}

__global__ void __launch_bounds__(kThreads) rows_down_kernel(RowsParams p) {
  __shared__ int s_list[kMaxN];
  __shared__ int s_off[kThreads + 1];
  __shared__ int s_warp[kThreads / 32];
  __shared__ float s_red[kGroups][kSlots][8];
  const TwellGemvParams& gp = p.gate;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const long long n = gp.n;
  const int k = static_cast<int>(gp.k), kchunks = k / 8;
  // Listed: the neurons that a row of this CTA's block fired (a neuron only other rows fired would
  // add exact zeros). Thread tid lists neurons [tid · span, + span): group q's range is its kSlots
  // threads' spans.
  const int t0 = blockIdx.y * kRowBlock;
  const auto fired_here = [&](long long j) { return ((__ldcg(p.masks + j) >> t0) & ((1ull << kRowBlock) - 1ull)) != 0ull; };
  const int span = static_cast<int>((n + kThreads - 1) / kThreads);  // ≤ 32 (n ≤ kMaxN)
  const long long lo = static_cast<long long>(tid) * span, hi = std::min<long long>(n, lo + span);
  unsigned bits = 0;  // bit i: neuron lo + i is listed
#pragma unroll 8  // the span's loads in flight together
  for (long long j = lo; j < hi; ++j) bits |= static_cast<unsigned>(fired_here(j)) << (j - lo);
  const int cnt = __popc(bits);
  const int incl = dev::warp_inclusive_scan(cnt, lane);
  if (lane == 31) s_warp[warp] = incl;
  __syncthreads();
  int off = incl - cnt;
  for (int w = 0; w < warp; ++w) off += s_warp[w];
  s_off[tid] = off;
  if (tid == kThreads - 1) s_off[kThreads] = off + cnt;
  for (unsigned b = bits; b; b &= b - 1) s_list[off++] = static_cast<int>(lo + __ffs(static_cast<int>(b)) - 1);
  __syncthreads();
  const int q = tid / kSlots, slot = tid % kSlots;
  const int c = blockIdx.x * kSlots + slot;  // this thread's 16-byte chunk of y's row
  float acc[kRowBlock][8];
#pragma unroll
  for (int t = 0; t < kRowBlock; ++t)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[t][e] = 0.0f;
  if (c < kchunks) {
    const int end = s_off[kSlots * (q + 1)];
#pragma unroll 4
    for (int j = s_off[kSlots * q]; j < end; ++j) {
      const long long nn = s_list[j];
      const uint4 w = __ldg(reinterpret_cast<const uint4*>(p.w_down_t + nn * k) + c);
      const float4 ha = __ldcg(reinterpret_cast<const float4*>(p.h + nn * p.hs + t0));
      const float4 hb = __ldcg(reinterpret_cast<const float4*>(p.h + nn * p.hs + t0) + 1);
      const float hv[kRowBlock] = {ha.x, ha.y, ha.z, ha.w, hb.x, hb.y, hb.z, hb.w};
#pragma unroll
      for (int t = 0; t < kRowBlock; ++t) dev::axpy8(hv[t], w, acc[t]);
    }
  }
  // The groups' sums in group order, a row at a time.
  for (int t = 0; t < kRowBlock; ++t) {
#pragma unroll
    for (int e = 0; e < 8; ++e) s_red[q][slot][e] = acc[t][e];
    __syncthreads();
    if (tid < kSlots * 8) {
      const int sl = tid / 8, e = tid % 8, col = (blockIdx.x * kSlots + sl) * 8 + e;  // kSlots · 8 threads
      float sum = 0.0f;
      for (int g = 0; g < kGroups; ++g) sum += s_red[g][sl][e];
      if (t0 + t < gp.m && col < k) p.y[(t0 + t) * static_cast<long long>(k) + col] = __float2bfloat16_rn(sum);
    }
    __syncthreads();
  }
  if (blockIdx.x == 0 && blockIdx.y == 0 && tid == 0) {  // kernel 1 is done (stream order)
    *p.nnz_out = *p.nnz;
    *p.nnz = 0;
  }
}

// Kernel 1 (g from g_in where set, else the fused gate, m ≤ kFusedRows), then kernel 2. parts: bit 0
// kernel 1, bit 1 kernel 2 (one alone: the timing split; kernel 2 alone reads the last kernel 1's masks and h).
void launch_rows(const RowsParams& p, cudaStream_t s, int parts = 3) {
  const unsigned ctas = static_cast<unsigned>((p.gate.n + detail::kGemvMmaRows - 1) / detail::kGemvMmaRows);
  if (parts & 1) {
    if (p.g_in)
      rows_up_kernel<<<ctas, kThreads, 0, s>>>(p);
    else if (p.gate.m <= 8)
      rows_gate_up_kernel<1><<<ctas, kThreads, 0, s>>>(p);
    else
      rows_gate_up_kernel<2><<<ctas, kThreads, 0, s>>>(p);
    CK(cudaGetLastError());
  }
  if (!(parts & 2)) return;
  const dim3 grid(static_cast<unsigned>((p.gate.k / 8 + kSlots - 1) / kSlots),
                  static_cast<unsigned>((p.gate.m + kRowBlock - 1) / kRowBlock));
  rows_down_kernel<<<grid, kThreads, 0, s>>>(p);
  CK(cudaGetLastError());
}

// h[m, n] = bf16(ReLU(gu[:, j]) · gu[:, n + j]): the dense FFN's gated product (gu = [g | u], [m, 2n]).
__global__ void gated_product(const __nv_bfloat16* gu, __nv_bfloat16* h, int m, long long n) {
  for (long long i = blockIdx.x * 256ll + threadIdx.x; i < m * n; i += 256ll * gridDim.x) {
    const long long t = i / n, j = i % n;
    const float g = fmaxf(__bfloat162float(gu[t * 2 * n + j]), 0.0f);
    h[i] = __float2bfloat16_rn(g * __bfloat162float(gu[t * 2 * n + n + j]));
  }
}

struct Layer {
  DeviceBuffer<__nv_bfloat16> gu, wd;  // gu = [Wg; Wu] stacked [2n, k] (the dense FFN's one GEMM); wd = Wdᵀ [n, k]
  const __nv_bfloat16* wg(long long) const { return gu.get(); }
  const __nv_bfloat16* wu(long long n, int k) const { return gu.get() + n * k; }
};

std::vector<float> to_host(const __nv_bfloat16* d, std::size_t count, cudaStream_t s) {
  std::vector<__nv_bfloat16> v(count);
  CK(cudaMemcpyAsync(v.data(), d, count * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  std::vector<float> f(count);
  for (std::size_t i = 0; i < count; ++i) f[i] = __bfloat162float(v[i]);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  const long long n = argc > 1 ? std::atoll(argv[1]) : 5632;
  const int k = argc > 2 ? std::atoi(argv[2]) : 2048;
  const double density = argc > 3 ? std::atof(argv[3]) : 0.005;
  const double skew = argc > 4 ? std::atof(argv[4]) : 1.0;
  const int layers = argc > 5 ? std::atoi(argv[5]) : 64;
  if (n < 16 || n > kMaxN || k < 64 || k % 64 || k > kDecodeMaxK || !(density > 0 && density < 0.5) || !(skew >= 0) ||
      layers < 1) {
    std::fprintf(stderr,
                 "usage: twell_probe_decode_rows [n (16 … %d) [k (a multiple of 64, ≤ %lld) [density (0, 0.5) [skew ≥ 0 "
                 "[layers ≥ 1]]]]]\n",
                 kMaxN, static_cast<long long>(kDecodeMaxK));
    return 2;
  }
  int dev_count = 0;
  if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
    std::fprintf(stderr, "twell_probe_decode_rows: no CUDA device\n");
    return 0;
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<Layer> L(static_cast<std::size_t>(layers));
  const float sc = 1.0f / std::sqrt(static_cast<float>(k));
  unsigned seed = 1;
  for (Layer& l : L) {
    l.gu.resize(static_cast<std::size_t>(2 * n * k));
    l.wd.resize(static_cast<std::size_t>(n * k));
    fill<<<1024, 256, 0, s>>>(l.gu.get(), 2 * n, k, sc, -1, 0.0f, seed++);
    fill<<<1024, 256, 0, s>>>(l.wd.get(), n, k, sc, -1, 0.0f, seed++);
    set_gate_thresholds<<<32, 256, 0, s>>>(l.gu.get(), n, k, static_cast<float>(density), static_cast<float>(skew), 7);
  }
  CK(cudaGetLastError());
  DeviceBuffer<__nv_bfloat16> x(static_cast<std::size_t>(kMaxRows * k));
  fill<<<64, 256, 0, s>>>(x.get(), kMaxRows, k, 1.0f, 0, 1.0f, 99);
  DeviceBuffer<__nv_bfloat16> g_today(static_cast<std::size_t>(kMaxRows * 2 * n)), g_rows(static_cast<std::size_t>(kMaxRows * n));
  DeviceBuffer<__nv_bfloat16> h_dense(static_cast<std::size_t>(kMaxRows * n));
  DeviceBuffer<__nv_bfloat16> y_today(static_cast<std::size_t>(kMaxRows * k)), y_rows(static_cast<std::size_t>(kMaxRows * k));
  const long long tiles = (n + 255) / 256;
  DeviceBuffer<float> partials(static_cast<std::size_t>(kFusedRows * tiles * k)), h(static_cast<std::size_t>(n * kMaxRows));
  DeviceBuffer<unsigned int> tickets(static_cast<std::size_t>(kFusedRows + 2));
  DeviceBuffer<unsigned long long> nnz(1), nnz_out(1), nnz_r(1), nnz_r_out(1);
  DeviceBuffer<unsigned long long> masks(static_cast<std::size_t>(n));
  CK(cudaMemsetAsync(tickets.get(), 0, tickets.bytes(), s));
  CK(cudaMemsetAsync(nnz.get(), 0, nnz.bytes(), s));
  CK(cudaMemsetAsync(nnz_r.get(), 0, nnz_r.bytes(), s));
  CK(cudaMemsetAsync(h.get(), 0, h.bytes(), s));
  CK(cudaStreamSynchronize(s));
  LtGemm lt(/*autotune=*/true);
  // The union on tensor cores (union_ffn.hpp): its own gate output, list, counts, h and y.
  int dev = 0;
  CK(cudaGetDevice(&dev));
  const bool union_ok = union_ffn_fits(kMaxRows, n, k, true) && union_ffn_available(dev);
  DeviceBuffer<__nv_bfloat16> g_u(static_cast<std::size_t>(kMaxRows * n)), y_u(static_cast<std::size_t>(kMaxRows * k));
  DeviceBuffer<__nv_bfloat16> h_u(static_cast<std::size_t>(kMaxRows * tiles * 256));
  DeviceBuffer<int> u_list(static_cast<std::size_t>(tiles * 256)), u_counts(static_cast<std::size_t>(tiles));
  // The up's form as a dense gate: g all 1 lists every neuron, so list + up read all of Wu once
  // (n · k bf16, the gate's bytes); w_copy receives a plain copy of the same bytes (the floor).
  DeviceBuffer<__nv_bfloat16> g_ones(static_cast<std::size_t>(kMaxRows * n)), w_copy(static_cast<std::size_t>(n * k));
  {
    const std::vector<__nv_bfloat16> ones(g_ones.size(), __float2bfloat16(1.0f));
    CK(cudaMemcpyAsync(g_ones.get(), ones.data(), g_ones.bytes(), cudaMemcpyHostToDevice, s));
    CK(cudaStreamSynchronize(s));
  }

  auto gate_params = [&](const Layer& l, int m, int r0 = 0) {  // rows r0 … r0 + m − 1 of x
    TwellGemvParams g = gemv_rows(x.get() + static_cast<long long>(r0) * k, m, l.wg(n), n, k);
    g.relu = true;
    g.w_before_wait = true;
    return g;
  };
  // The cuBLASLt gate at 17–64 rows: g [m, n] = ReLU(x · Wgᵀ) (the rows pair's first step there).
  auto lt_gate = [&](const Layer& l, int m, __nv_bfloat16* g) {
    lt.run(GemmShape{m, n, k, k, k, n, GemmEpilogue::relu}, l.wg(n), x.get(), g, s);  // m, n_out, k, ldx, ldw, ldc
  };
  // The operands the decode kernel and the union share: layer l's gated FFN on x's first m rows, y rows k apart.
  auto operands = [&](const Layer& l, int m, __nv_bfloat16* y) {
    FfnOperands o;
    o.x = x.get();
    o.ld_x = k;
    o.w_up = l.wu(n, k);
    o.w_down_t = l.wd.get();
    o.y = y;
    o.ld_y = k;
    o.m = m;
    o.n = n;
    o.k = k;
    o.gated = true;
    return o;
  };
  // Today's FFN: 2–16 rows the GEMV gate + decode kernel; 17–64 the dense FFN.
  auto today = [&](const Layer& l, int m) {
    if (m > kFusedRows) {
      lt.run(GemmShape{m, 2 * n, k, k, k, 2 * n}, l.gu.get(), x.get(), g_today.get(), s);  // [g | u] = x · [Wg; Wu]ᵀ
      gated_product<<<512, 256, 0, s>>>(g_today.get(), h_dense.get(), m, n);
      CK(cudaGetLastError());
      // y [m, k] = h [m, n] · Wdᵀ [n, k]: trans_a, trans_b, m, n, k, lda, ldb, ldc
      lt.matmul(MatmulShape{false, false, m, k, n, n, k, k}, h_dense.get(), l.wd.get(), y_today.get(), s);
      return;
    }
    TwellGemvParams g = gate_params(l, m);
    g.g = g_today.get();
    launch_twell_gemv(g, s);
    TwellDecodeParams p;
    static_cast<FfnOperands&>(p) = operands(l, m, y_today.get());
    p.g = g_today.get();
    p.ld_g = n;
    p.partials = partials.get();
    p.row_tickets = tickets.get();
    p.cta_ticket = tickets.get() + m;
    p.nnz = nnz.get();
    p.nnz_out = nnz_out.get();
    launch_twell_decode(p, s);
  };
  // The rows pair on rows r0 … r0 + m − 1 of x. m > kFusedRows: the cuBLASLt gate first, unless
  // gate_done (g_rows already holds the batch's g, whose row r0 it starts from).
  auto rows = [&](const Layer& l, int m, bool check, bool gate_done = false, int r0 = 0, int parts = 3) {
    const bool fused = m <= kFusedRows && !gate_done;
    if (!fused && !gate_done) lt_gate(l, m, g_rows.get());
    RowsParams p{gate_params(l, m, r0), fused ? nullptr : g_rows.get() + static_cast<long long>(r0) * n, l.wu(n, k),
                 l.wd.get(), y_rows.get(), check && fused ? g_rows.get() : nullptr, masks.get(), h.get(), (m + 7) / 8 * 8,
                 nnz_r.get(), nnz_r_out.get()};
    launch_rows(p, s, parts);
  };
  // The union at m rows: the cuBLASLt ReLU gate (unless gate_done: g_u holds it), then its kernels.
  auto union_ffn = [&](const Layer& l, int m, int up_split, int down_split, bool gate_done = false, int parts = 3,
                       int up_clusters = 0, const __nv_bfloat16* g = nullptr) {
    if (!gate_done) lt_gate(l, m, g_u.get());
    UnionFfnParams up;
    static_cast<FfnOperands&>(up) = operands(l, m, y_u.get());
    up.ld_g = n;
    up.up_split = up_split;
    up.down_split = down_split;
    up.up_clusters = up_clusters;
    up.g = g ? g : g_u.get();
    up.list = u_list.get();
    up.counts = u_counts.get();
    up.h = h_u.get();
    launch_union_ffn(up, s, parts);
  };
  // The engine's gate on the GEMV into g_u (ffn_context.cpp's decode gate).
  auto gemv_gate_u = [&](const Layer& l, int m) {
    TwellGemvParams g = gate_params(l, m);
    g.g = g_u.get();
    g.ld_g = n;
    launch_twell_gemv(g, s);
  };
  // Before a check's launches: y and g NaN (0xFFFF), the counts a sentinel, so a write a kernel
  // skips shows.
  auto poison = [&] {
    for (auto* b : {&y_today, &y_rows, &g_today, &g_rows}) CK(cudaMemsetAsync(b->get(), 0xFF, b->bytes(), s));
    for (auto* b : {&nnz_out, &nnz_r_out}) CK(cudaMemsetAsync(b->get(), 0xFF, b->bytes(), s));
  };
  auto gate_only = [&](const Layer& l, int m) {
    if (m > kFusedRows) {
      lt_gate(l, m, g_rows.get());
      return;
    }
    TwellGemvParams g = gate_params(l, m);
    g.g = g_today.get();
    launch_twell_gemv(g, s);
  };
  auto read_count = [&](const DeviceBuffer<unsigned long long>& b) {
    unsigned long long v = 0;
    CK(cudaMemcpyAsync(&v, b.get(), sizeof v, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    return v;
  };

  // The float64 reference's inputs (layer 0).
  const std::vector<float> hx = to_host(x.get(), static_cast<std::size_t>(kMaxRows * k), s);
  const std::vector<float> hwu = to_host(L[0].wu(n, k), static_cast<std::size_t>(n * k), s);
  const std::vector<float> hwd = to_host(L[0].wd.get(), static_cast<std::size_t>(n * k), s);

  std::printf("n %lld k %d density %.4f skew %.2f, %d weight sets (%.1f GB of Wg, Wu and Wd^T)\n", n, k, density, skew, layers,
              6.0 * n * k * layers / 1e9);
  std::printf("%3s %7s %7s %9s %10s %10s %10s %7s %7s   %s\n", "M", "pairs", "union", "gate us", "today us", "rows us",
              "today/rows", "k1 us", "k2 us",
              "checks (rows: y within the float64 bound, worst error / bound; row 0 alone = in the batch; "
              "2-16 rows also: g bits as the GEMV's, today's y, counts)");
  const int reps = 20;
  // PROBE_CHECK_ONLY: the checks without the timings (a sanitizer's run); the times print as nan.
  const bool check_only = std::getenv("PROBE_CHECK_ONLY") != nullptr;
  const auto timed = [&](const std::function<void()>& body) { return check_only ? NAN : time_graph(s, reps, layers, body); };
  bool ok = true;
  // PROBE_ROWS_M (e.g. "8,64"): only those batch sizes (a profiler's run).
  std::vector<int> ms{2, 4, 8, 16, 32, 64};
  if (const char* e = std::getenv("PROBE_ROWS_M")) {
    ms.clear();
    for (const char* c = e; *c;) {
      const int v = std::atoi(c);
      if (v >= 2 && v <= kMaxRows) ms.push_back(v);
      while (*c && *c != ',') ++c;
      if (*c) ++c;
    }
  }
  // The union on tensor cores at m rows (union_ffn.hpp), each shape of its kernels (2, 4 or 8 CTAs an
  // up cluster × 2, 4 or 8 a down cluster), on its own cuBLASLt gate's g (layer 0): the tiles'
  // counts against g on the host; y of every shape within a derived float64 bound (h = g · ⟨x, Wu⟩
  // with tensor-core sums of 2⁻²³ a step, rounded to bf16: 2⁻⁸ of |h|; y's sums over the padded
  // union's slots and the ≤ 8 ranks, 2⁻²³ a step; one bf16 step of |y|); the first shape's bits
  // again from a replay (the splits fix the sums' order, so each shape has bits of its own). Then
  // its time (the gate, list, up and down) for each shape, and its kernels alone, µs a layer.
  constexpr int kShapes[9][2] = {{2, 2}, {2, 4}, {2, 8}, {4, 2}, {4, 4}, {4, 8}, {8, 2}, {8, 4}, {8, 8}};  // up split, down split
  constexpr int kNShapes = 9;
  // Shapes 5 (4 × 8) and 8 (8 × 8) again with the up grid capped at one CTA an SM (UnionFfnParams::
  // up_clusters = SMs / split, each cluster taking the 64-slot blocks in turn): the same bits as
  // the uncapped grid; fewer up CTAs wait on a programmatic launch's SM slots.
  constexpr int kCapped[2] = {5, 8};
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const auto capped_clusters = [&](int v) { return sms / kShapes[v][0]; };
  const auto union_row = [&](int m, double t_today) {
    std::vector<std::vector<float>> ys;
    std::vector<int> cnt(static_cast<std::size_t>(tiles));
    std::vector<float> gu;
    for (const auto& sh : kShapes) {
      const bool first = &sh == &kShapes[0];
      CK(cudaMemsetAsync(y_u.get(), 0xFF, y_u.bytes(), s));
      CK(cudaMemsetAsync(h_u.get(), 0xFF, h_u.bytes(), s));
      CK(cudaMemsetAsync(u_counts.get(), 0xFF, u_counts.bytes(), s));
      union_ffn(L[0], m, sh[0], sh[1], /*gate_done=*/!first);  // the others on the g the first one's gate wrote
      if (first) {
        gu = to_host(g_u.get(), static_cast<std::size_t>(m * n), s);
        CK(cudaMemcpyAsync(cnt.data(), u_counts.get(), cnt.size() * sizeof(int), cudaMemcpyDeviceToHost, s));
      }
      ys.push_back(to_host(y_u.get(), static_cast<std::size_t>(m * k), s));
    }
    union_ffn(L[0], m, kShapes[0][0], kShapes[0][1], /*gate_done=*/true);
    ys.push_back(to_host(y_u.get(), static_cast<std::size_t>(m * k), s));
    bool capped_same = true;  // plainly and programmatically launched
    for (int pdl = 0; pdl < 2; ++pdl)
      for (const int v : kCapped) {
        const ProgrammaticLaunch scope(pdl == 1);
        for (auto* b : {&y_u, &h_u}) CK(cudaMemsetAsync(b->get(), 0xFF, b->bytes(), s));
        CK(cudaMemsetAsync(u_counts.get(), 0xFF, u_counts.bytes(), s));
        union_ffn(L[0], m, kShapes[v][0], kShapes[v][1], /*gate_done=*/true, 3, capped_clusters(v));
        const std::vector<float> yc = to_host(y_u.get(), static_cast<std::size_t>(m * k), s);
        capped_same = capped_same && std::memcmp(yc.data(), ys[static_cast<std::size_t>(v)].data(), yc.size() * sizeof(float)) == 0;
      }
    {  // the same, launched programmatically (the kernels' early reads): the same bits
      const ProgrammaticLaunch pdl(true);
      CK(cudaMemsetAsync(y_u.get(), 0xFF, y_u.bytes(), s));
      CK(cudaMemsetAsync(h_u.get(), 0xFF, h_u.bytes(), s));
      union_ffn(L[0], m, kShapes[0][0], kShapes[0][1]);
      ys.push_back(to_host(y_u.get(), static_cast<std::size_t>(m * k), s));
    }
    bool counts_ok = true;
    long long uni = 0, slots = 0;
    for (long long t = 0; t < tiles; ++t) {
      int want = 0;
      for (long long j = t * 256; j < std::min<long long>(n, (t + 1) * 256); ++j) {
        bool f = false;
        for (int r = 0; r < m; ++r) f = f || gu[static_cast<std::size_t>(r * n + j)] > 0;
        want += f;
      }
      counts_ok = counts_ok && cnt[static_cast<std::size_t>(t)] == want;
      uni += want;
      slots += (want + 15) / 16 * 16;
    }
    const bool replay_same = std::memcmp(ys[0].data(), ys[kNShapes].data(), ys[0].size() * sizeof(float)) == 0 &&
                             std::memcmp(ys[0].data(), ys[kNShapes + 1].data(), ys[0].size() * sizeof(float)) == 0;
    double worst[kNShapes] = {};
    for (int r = 0; r < m; ++r) {
      std::vector<long long> fired;
      std::vector<double> hr, hd;
      for (long long j = 0; j < n; ++j) {
        const double g = gu[static_cast<std::size_t>(r * n + j)];
        if (g <= 0) continue;
        const ExactDot e = exact_dot(hx.data() + static_cast<std::size_t>(r * k), hwu.data() + static_cast<std::size_t>(j * k), k);
        const double d = e.sum, dm = e.mag;
        const double e1 = (k + 9.0) * std::ldexp(g * dm, -23);  // the sum over K (the ranks' shares, then ≤ 8 partials), the product by g, with room
        fired.push_back(j);
        hr.push_back(g * d);
        hd.push_back(std::ldexp(std::fabs(g * d) + e1, -8) + e1);
      }
      for (int c = 0; c < k; ++c) {
        double ref = 0, mag = 0, dh = 0;
        for (std::size_t i = 0; i < fired.size(); ++i) {
          const double w = hwd[static_cast<std::size_t>(fired[i] * k + c)];
          ref += hr[i] * w;
          mag += std::fabs(hr[i] * w);
          dh += hd[i] * std::fabs(w);
        }
        const double bound = bf16_step(ref) + dh + (static_cast<double>(slots) + 8.0 /* ≤ 8 ranks */) * std::ldexp(mag + dh, -23) + 1e-30;
        for (int v = 0; v < kNShapes; ++v) {
          const double e = std::fabs(ys[static_cast<std::size_t>(v)][static_cast<std::size_t>(r * k + c)] - ref) / bound;
          worst[v] = e <= 1 ? std::max(worst[v], e) : std::max(worst[v], std::isnan(e) ? INFINITY : e);
        }
      }
    }
    const double worst_all = *std::max_element(worst, worst + kNShapes);
    bool pass = counts_ok && replay_same && capped_same && worst_all <= 1;
    double t_u[kNShapes], best = INFINITY;
    for (int v = 0; v < kNShapes; ++v) {
      t_u[v] = timed( [&] { for (const Layer& l : L) union_ffn(l, m, kShapes[v][0], kShapes[v][1]); });
      best = std::min(best, t_u[v]);
    }
    double t_up[3], t_down[3];
    for (int v = 0; v < 3; ++v) t_up[v] = timed( [&] { for (const Layer& l : L) union_ffn(l, m, 2 << v, 2, true, 1); });
    for (int v = 0; v < 3; ++v)
      t_down[v] = timed( [&] { for (const Layer& l : L) union_ffn(l, m, 2, 2 << v, true, 2); });
    std::printf("    union %lld (%lld slots), whole (up split 2: down split 2 / 4 / 8; up 4: the same; up 8: the same) "
                "%.2f / %.2f / %.2f; %.2f / %.2f / %.2f; %.2f / %.2f / %.2f us, today/union %.2fx; list + up (split 2 / 4 / 8) "
                "%.2f / %.2f / %.2f, down (2 / 4 / 8) %.2f / %.2f / %.2f  %s (counts %s; worst %.2f of its bound over the shapes; "
                "replay and programmatic %s)\n",
                uni, slots, t_u[0], t_u[1], t_u[2], t_u[3], t_u[4], t_u[5], t_u[6], t_u[7], t_u[8], t_today / best, t_up[0],
                t_up[1], t_up[2], t_down[0], t_down[1], t_down[2], pass ? "ok" : "FAIL", counts_ok ? "ok" : "WRONG", worst_all,
                replay_same ? "same" : "DIFFER");
    {  // the union's kernels launched programmatically (as the runtime's decode launches its own)
      const ProgrammaticLaunch pdl(true);
      double best_p = INFINITY;
      for (int v = 0; v < kNShapes; ++v) {
        t_u[v] = timed( [&] { for (const Layer& l : L) union_ffn(l, m, kShapes[v][0], kShapes[v][1]); });
        best_p = std::min(best_p, t_u[v]);
      }
      for (int v = 0; v < 3; ++v) t_up[v] = timed( [&] { for (const Layer& l : L) union_ffn(l, m, 2 << v, 2, true, 1); });
      for (int v = 0; v < 3; ++v)
        t_down[v] = timed( [&] { for (const Layer& l : L) union_ffn(l, m, 2, 2 << v, true, 2); });
      std::printf("    programmatic: whole %.2f / %.2f / %.2f; %.2f / %.2f / %.2f; %.2f / %.2f / %.2f us, today/union %.2fx; list + up "
                  "%.2f / %.2f / %.2f, down %.2f / %.2f / %.2f\n",
                  t_u[0], t_u[1], t_u[2], t_u[3], t_u[4], t_u[5], t_u[6], t_u[7], t_u[8], t_today / best_p, t_up[0], t_up[1], t_up[2],
                  t_down[0], t_down[1], t_down[2]);
    }
    double t_cap[2][2];  // [shape][plain, programmatic]
    for (int pdl = 0; pdl < 2; ++pdl) {
      const ProgrammaticLaunch scope(pdl == 1);
      for (int i = 0; i < 2; ++i) {
        const int v = kCapped[i];
        t_cap[i][pdl] = timed([&] { for (const Layer& l : L) union_ffn(l, m, kShapes[v][0], kShapes[v][1], false, 3, capped_clusters(v)); });
      }
    }
    std::printf("    up grid capped at one CTA an SM (%d / %d clusters): whole up 4 x down 8, up 8 x down 8 %.2f / %.2f us, "
                "programmatic %.2f / %.2f us; bits %s\n",
                capped_clusters(kCapped[0]), capped_clusters(kCapped[1]), t_cap[0][0], t_cap[1][0], t_cap[0][1], t_cap[1][1],
                capped_same ? "the uncapped grid's" : "DIFFER");
    // Would a gate in the up's form (its list in the epilogue) stream Wg as fast as cuBLASLt? The
    // list + up over every neuron (g all 1) reads n · k bf16 as the gate does; beside it the
    // cuBLASLt ReLU gate at the same m, and a device copy of those bytes (TB/s: bytes read / time;
    // the copy's also counts its writes). Programmatic, as the runtime launches them.
    {
      const ProgrammaticLaunch pdl(true);
      const double bytes = 2.0 * static_cast<double>(n) * k;
      double t_all[3];
      for (int v = 0; v < 3; ++v)
        t_all[v] = timed([&] { for (const Layer& l : L) union_ffn(l, m, 2 << v, 2, true, 1, 0, g_ones.get()); });
      const double t_lt = timed([&] { for (const Layer& l : L) lt_gate(l, m, g_rows.get()); });
      const double t_cp = timed([&] {
        for (const Layer& l : L) CK(cudaMemcpyAsync(w_copy.get(), l.wu(n, k), w_copy.bytes(), cudaMemcpyDeviceToDevice, s));
      });
      const auto tbs = [&](double us) { return bytes / (us * 1e-6) / 1e12; };
      std::printf("    the up's form over all %lld neurons (a gate's bytes, %.1f MB): list + up split 2 / 4 / 8 %.2f / %.2f / %.2f us "
                  "(%.2f / %.2f / %.2f TB/s); cuBLASLt ReLU gate %.2f us (%.2f TB/s); copy %.2f us (%.2f TB/s read, %.2f moved)\n",
                  n, bytes / 1e6, t_all[0], t_all[1], t_all[2], tbs(t_all[0]), tbs(t_all[1]), tbs(t_all[2]), t_lt, tbs(t_lt), t_cp,
                  tbs(t_cp), 2 * tbs(t_cp));
    }
    // What the list kernel adds to the chain (the most a gate that leaves the list's masks in its
    // epilogue could save): the whole union at 8 × 8, programmatic, with it and without it. Without
    // it the up and down read the list the last layer's launch left: another g of the same
    // statistics, so the same work to within the union's spread (the timing only; no check).
    {
      const ProgrammaticLaunch pdl(true);
      const double t_with = timed([&] { for (const Layer& l : L) union_ffn(l, m, 8, 8); });
      const double t_without = timed([&] { for (const Layer& l : L) union_ffn(l, m, 8, 8, false, 3 | kUnionSkipList); });
      std::printf("    the list kernel in the chain: whole 8 x 8 programmatic %.2f us with it, %.2f without (%.2f us a layer)\n",
                  t_with, t_without, t_with - t_without);
    }
    // Where the GEMV's gate gains or loses in the union's chain (in the step it lost 1-2 % at 8 and
    // 16 rows, H200, 4c6df63). Programmatic: the gates alone (cuBLASLt's ReLU GEMM; the GEMV); the
    // whole union after each (the list kernel on each gate's g); the up and down alone on the list
    // the last layer's list kernel left. Layer 0 checked first: y after the GEMV gate has no NaN
    // (y poisoned before), and a second run on the same g gives the same bits.
    if (m <= kFusedRows) {
      const ProgrammaticLaunch pdl(true);
      const auto ym = static_cast<std::size_t>(m * k);
      CK(cudaMemsetAsync(y_u.get(), 0xFF, y_u.bytes(), s));  // NaN: a skipped write shows
      gemv_gate_u(L[0], m);
      union_ffn(L[0], m, 8, 8, true);
      const std::vector<float> y_once = to_host(y_u.get(), ym, s);
      CK(cudaMemsetAsync(y_u.get(), 0xFF, y_u.bytes(), s));
      union_ffn(L[0], m, 8, 8, true);
      const std::vector<float> y_twice = to_host(y_u.get(), ym, s);
      const bool y_finite = std::all_of(y_once.begin(), y_once.end(), [](float v) { return std::isfinite(v); });
      const bool same = y_finite && std::memcmp(y_once.data(), y_twice.data(), ym * sizeof(float)) == 0;
      pass = pass && same;
      const double g_lt = timed([&] { for (const Layer& l : L) lt_gate(l, m, g_u.get()); });
      const double g_gv = timed([&] { for (const Layer& l : L) gemv_gate_u(l, m); });
      const double w_lt = timed([&] { for (const Layer& l : L) union_ffn(l, m, 8, 8); });
      const double w_gv = timed([&] {
        for (const Layer& l : L) {
          gemv_gate_u(l, m);
          union_ffn(l, m, 8, 8, true);
        }
      });
      const double ud_list = timed([&] { for (const Layer& l : L) union_ffn(l, m, 8, 8, true, 3 | kUnionSkipList); });
      std::printf("    the gate in the union's chain, programmatic: gate alone cuBLASLt / GEMV %.2f / %.2f us; whole after "
                  "each %.2f / %.2f us; up + down alone on the list %.2f us; y finite and replayed: %s\n",
                  g_lt, g_gv, w_lt, w_gv, ud_list, same ? "yes" : "NO");
    }
    return pass;
  };
  for (const int m : ms) {
    const bool fused = m <= kFusedRows;
    // The rows pair on layer 0, then row 0 alone on the same g (at 17–64 rows the cuBLASLt gate
    // may round differently at another M, so row 0 reuses the batch's g there).
    poison();
    today(L[0], m);
    const std::vector<float> yt = to_host(y_today.get(), static_cast<std::size_t>(m * k), s);
    const unsigned long long c_today = fused ? read_count(nnz_out) : 0;
    std::vector<float> gt;
    if (fused) gt = to_host(g_today.get(), static_cast<std::size_t>(m * n), s);
    rows(L[0], m, true);
    const std::vector<float> gr = to_host(g_rows.get(), static_cast<std::size_t>(m * n), s);
    const std::vector<float> yr = to_host(y_rows.get(), static_cast<std::size_t>(m * k), s);
    const unsigned long long c_rows = read_count(nnz_r_out);
    std::vector<unsigned long long> hm(static_cast<std::size_t>(n));
    CK(cudaMemcpyAsync(hm.data(), masks.get(), hm.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    long long uni = 0;
    for (const unsigned long long v : hm) uni += v != 0ull;
    if (!fused) gt = gr;  // the reference's g: the one the rows pair used
    const bool g_same = !fused || std::memcmp(gt.data(), gr.data(), gt.size() * sizeof(float)) == 0;
    // The masks and the count, from g on the host.
    bool masks_ok = true;
    unsigned long long pairs = 0;
    for (long long j = 0; j < n; ++j) {
      unsigned long long want = 0;
      for (int t = 0; t < m; ++t)
        if (gt[static_cast<std::size_t>(t * n + j)] > 0) want |= 1ull << t;
      masks_ok = masks_ok && hm[static_cast<std::size_t>(j)] == want;
      pairs += static_cast<unsigned long long>(__builtin_popcountll(want));
    }
    masks_ok = masks_ok && c_rows == pairs;
    // Rows 0 and m − 1 alone against in the batch (row m − 1 is in the last 8-row block): kernel 1
    // forms the row's g itself at 2–16 rows; at 17–64 both start from the batch's g.
    bool solo_same = true;
    for (const int r : {0, m - 1}) {
      rows(L[0], 1, false, /*gate_done=*/!fused, r);
      const std::vector<float> solo = to_host(y_rows.get(), static_cast<std::size_t>(k), s);
      solo_same = solo_same && std::memcmp(solo.data(), yr.data() + static_cast<std::size_t>(r) * k, k * sizeof(float)) == 0;
    }
    (void)read_count(nnz_r_out);
    // Bound, first order in u = 2^-24: h = g · s with s an fp32 sum of K products, so
    // |δh| ≤ (K + 1) · u · |g| · Σ|x · wu|; y sums the terms h · wd over at most terms + max(tiles,
    // kGroups) + 1 fp32 additions (a path's partial sums, then theirs); one bf16 step of |y| for the
    // final rounding. (Today's dense path at 17–64 rows rounds h to bf16 first: not held to it.)
    const double adds = static_cast<double>(std::max<long long>(tiles, kGroups) + 1);
    double worst_today = 0, worst_rows = 0;  // NaN compares false: an error ratio that is not ≤ 1 sets it to inf
    const auto note = [](double& worst, double e) { worst = e <= 1 ? std::max(worst, e) : std::max(worst, std::isnan(e) ? INFINITY : e); };
    for (int t = 0; t < m; ++t) {
      std::vector<double> hr(static_cast<std::size_t>(n), 0.0), hd(static_cast<std::size_t>(n), 0.0);
      long long terms = 0;
      for (long long j = 0; j < n; ++j) {
        const double g = gt[static_cast<std::size_t>(t * n + j)];
        if (g <= 0) continue;
        const ExactDot e = exact_dot(hx.data() + static_cast<std::size_t>(t * k), hwu.data() + static_cast<std::size_t>(j * k), k);
        const double d = e.sum, dm = e.mag;
        hr[static_cast<std::size_t>(j)] = g * d;
        hd[static_cast<std::size_t>(j)] = static_cast<double>(k + 1) * std::ldexp(g * dm, -24);
        ++terms;
      }
      for (int c = 0; c < k; ++c) {
        double ref = 0, mag = 0, dh = 0;
        for (long long j = 0; j < n; ++j) {
          const double hv = hr[static_cast<std::size_t>(j)];
          if (hv == 0) continue;
          const double w = hwd[static_cast<std::size_t>(j * k + c)];
          ref += hv * w;
          mag += std::fabs(hv * w);
          dh += hd[static_cast<std::size_t>(j)] * std::fabs(w);
        }
        const double bound = bf16_step(ref) + (static_cast<double>(terms) + adds) * std::ldexp(mag, -24) + dh + 1e-30;
        if (fused) note(worst_today, std::fabs(yt[static_cast<std::size_t>(t * k + c)] - ref) / bound);
        note(worst_rows, std::fabs(yr[static_cast<std::size_t>(t * k + c)] - ref) / bound);
      }
    }
    // At 17–64 rows today's dense FFN rounds g, u and h to bf16 on the way: not held to the bound,
    // only to a shape sanity check (its y within 2^-5 of the largest |y| of the rows pair's).
    double ymax = 0, dmax = 0;
    for (std::size_t i = 0; i < yr.size(); ++i) {
      ymax = std::max(ymax, static_cast<double>(std::fabs(yr[i])));
      const double d = std::fabs(static_cast<double>(yt[i]) - yr[i]);
      dmax = std::isnan(d) ? INFINITY : std::max(dmax, d);
    }
    const bool dense_sane = fused || dmax <= std::ldexp(ymax, -5);
    const bool pass = g_same && masks_ok && worst_today <= 1 && worst_rows <= 1 && (!fused || c_today == c_rows) &&
                      solo_same && dense_sane;
    ok = ok && pass;
    char verdict[256];
    if (fused)
      std::snprintf(verdict, sizeof verdict, "%s (g %s; masks %s; worst today %.2f, rows %.2f; counts %llu / %llu; rows alone %s)",
                    pass ? "ok" : "FAIL", g_same ? "same" : "DIFFERS", masks_ok ? "ok" : "WRONG", worst_today, worst_rows,
                    c_today, c_rows, solo_same ? "same" : "DIFFER");
    else
      std::snprintf(verdict, sizeof verdict, "%s (masks %s; worst rows %.2f; rows alone %s; dense y within %.1e of max |y|)",
                    pass ? "ok" : "FAIL", masks_ok ? "ok" : "WRONG", worst_rows, solo_same ? "same" : "DIFFER",
                    ymax > 0 ? dmax / ymax : dmax);
    const double t_gate = timed( [&] { for (const Layer& l : L) gate_only(l, m); });
    const double t_today = timed( [&] { for (const Layer& l : L) today(l, m); });
    const double t_rows = timed( [&] { for (const Layer& l : L) rows(l, m, false); });
    // The split: kernel 1 alone (17–64 rows: on the g the last cuBLASLt gate left), kernel 2 alone.
    const double t_k1 = timed( [&] { for (const Layer& l : L) rows(l, m, false, !fused, 0, 1); });
    const double t_k2 = timed( [&] { for (const Layer& l : L) rows(l, m, false, !fused, 0, 2); });
    std::printf("%3d %7llu %7lld %9.2f %10.2f %10.2f %9.2fx %7.2f %7.2f  %s\n", m, c_rows, uni, t_gate, t_today, t_rows,
                t_today / t_rows, t_k1, t_k2, verdict);
    if (union_ok) ok = union_row(m, t_today) && ok;
  }
  std::printf("(µs a layer, launched plainly in a graph: today = 2-16 rows the gate GEMV + decode kernel, 17-64 the dense\n"
              " FFN (cuBLASLt gate+up, gated product, down); rows = its kernels, 17-64 with the cuBLASLt ReLU gate first;\n"
              " gate = the GEMV, 17-64 the cuBLASLt ReLU gate alone)\n");
  std::printf("%s\n", ok ? "checks: pass" : "checks: FAIL");
  return ok ? 0 : 1;
}
