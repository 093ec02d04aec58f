// twell_probe_decode_rows: the decode FFN at 2–16 rows, today's pair against a pair shaped like the
// one-token kernels (docs/runtime.md, "Where a decode step's time goes", the plan's 2–16 row step).
//   today's  the gate GEMV on tensor cores (launch_twell_gemv, ReLU: g [M, N] bf16 to memory), then
//            launch_twell_decode: one CTA a (256-neuron tile, row) reads the row's g, forms h and a
//            partial y per tile in fp32; the row's last CTA (a ticket) adds the partials in tile order.
//   rows     kernel 1, a CTA a block of 16 neurons for every row (the gate GEMV's own partial sums,
//            gemv_mma_partials, so the same g bits): g kept on chip, each neuron's fired rows as a
//            mask; a warp a fired neuron forms h for each row that fired it in the decode kernel's
//            order (the same h bits as today's), stores the neuron's h for 16 rows (0 where a row did
//            not fire) and its mask (0 for a neuron no row fired), and prefetches its Wdᵀ row to L2.
//            Kernel 2, a CTA 64 columns of y for 8 rows: lists the fired neurons in ascending order;
//            its 32 thread groups own contiguous neuron ranges, a thread 8 columns of 8 rows summed
//            over its range's fired neurons in ascending order (every load of a step in flight), the
//            ranges' sums added in range order, y rounded once. A row's terms are its own fired
//            neurons plus exact zeros, so its bits do not depend on the batch.
// What it removes: g's round trip through memory and its re-read, the per-tile partials and the
// tickets; Wd's load no longer waits for h (the prefetch). What it adds: kernel 2 reads every
// neuron's mask (4 bytes each) once a CTA.
// Synthetic layer: x [16, K] N(0, 1) with column 0 = 1; Wg N(0, 1/K) with column 0 = −z(d_n), so
// neuron n fires on a row with probability ≈ d_n, d_n log-normal around `density` (sigma `skew`:
// popular neurons, as a trained model has; 0 = every neuron alike, the largest union); Wu and Wdᵀ
// N(0, 1/K). `layers` weight sets are launched in turn, captured in a CUDA graph and replayed, so
// the gate's rows are past the L2.
// Checks, each M: the rows pair's g equals the GEMV's bit for bit; both pairs' y within a derived
// bound of a float64 reference on the host (from the bf16 g, x and weights: one bf16 step of
// |y_ref| for the final rounding, plus (K + terms) · 2^-24 · Σ|h||Wd| for the fp32 sums); equal
// counts of fired (row, neuron) pairs; row 0's bits alone against in the batch (rows pair).
//   twell_probe_decode_rows [n [k [density [skew [layers]]]]]   (defaults: 5632 2048 0.005 1.0 64)
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
#include "cuda/ops/gemv.hpp"
#include "cuda/ops/gemv_mma_kernel.cuh"
#include "cuda/sm80/twell_decode.hpp"
#include "probe_graph.cuh"

using namespace twell::cuda;
using namespace twell::probe;

namespace {

constexpr int kMaxRows = 16;               // rows (tokens) a mask and an h record hold
constexpr int kMaxN = 8192;                // neurons kernel 2 lists in shared memory
constexpr int kThreads = 256;
constexpr int kGroups = 32, kSlots = 8;    // kernel 2: thread (group tid / 8, 16-byte column chunk tid % 8)
constexpr int kRowBlock = 8;               // kernel 2: rows a CTA

struct RowsParams {
  TwellGemvParams gate;       // x, Wg, m, n, k (relu); g unused unless g_out
  const __nv_bfloat16* w_up;  // [n, k]
  const __nv_bfloat16* w_down_t;  // [n, k]
  __nv_bfloat16* y;           // [m, k]
  __nv_bfloat16* g_out;       // optional [m, n]: the gate as the GEMV writes it (the check)
  unsigned* masks;            // [n] rows that fired neuron j (0: none), every neuron every launch
  float* h;                   // [n, kMaxRows] h of the fired neurons (0 where a row did not fire)
  unsigned long long* nnz;    // [1] zero on entry, left zero
  unsigned long long* nnz_out;  // [1] the fired pairs' count
};

template <int NT>
__global__ void __launch_bounds__(kThreads) rows_gate_up_kernel(RowsParams p) {
  __shared__ float part[detail::kGemvMmaWarps][detail::kGemvMmaRows][8 * NT];
  __shared__ float s_g[detail::kGemvMmaRows][kMaxRows];
  __shared__ unsigned s_mask[detail::kGemvMmaRows];
  const TwellGemvParams& gp = p.gate;
  detail::gemv_mma_partials<NT>(gp, part);
  __syncthreads();
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const long long n0 = static_cast<long long>(blockIdx.x) * detail::kGemvMmaRows;
  // The GEMV's epilogue: the warps' sums in warp order, ReLU, bf16 once.
  for (int o = tid; o < detail::kGemvMmaRows * kMaxRows; o += kThreads) {
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
  if (warp == 0) {
    unsigned mask = 0;
    if (lane < detail::kGemvMmaRows && n0 + lane < gp.n) {
      for (int t = 0; t < gp.m; ++t)
        if (s_g[lane][t] > 0.0f) mask |= 1u << t;
      p.masks[n0 + lane] = mask;
    }
    if (lane < detail::kGemvMmaRows) s_mask[lane] = mask;
    const unsigned pairs = dev::warp_sum(static_cast<unsigned>(__popc(mask)));
    if (lane == 0 && pairs) atomicAdd(p.nnz, static_cast<unsigned long long>(pairs));
  }
  __syncthreads();
  const int kchunks = static_cast<int>(gp.k / 8);
  for (int row = warp; row < detail::kGemvMmaRows; row += detail::kGemvMmaWarps) {
    const unsigned mask = s_mask[row];
    if (!mask) continue;
    const long long n = n0 + row;
    const char* drow = reinterpret_cast<const char*>(p.w_down_t + n * gp.k);
    for (long long b = static_cast<long long>(lane) * 128; b < gp.k * 2; b += 32 * 128)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(drow + b));
    const uint4* wr = reinterpret_cast<const uint4*>(p.w_up + n * gp.k);
    float hv = 0.0f;  // lane t < kMaxRows: row t's h
    for (unsigned mk = mask; mk; mk &= mk - 1) {
      const int t = __ffs(static_cast<int>(mk)) - 1;
      const uint4* xr = reinterpret_cast<const uint4*>(gp.x + t * gp.ld_x);
      float s = 0.0f;
#pragma unroll 8  // twell_decode_kernel's loop: the same sum in the same order
      for (int c = lane; c < kchunks; c += 32) s += dev::dot8(__ldg(xr + c), __ldg(wr + c));
      s = dev::warp_sum(s);
      if (lane == t) hv = s_g[row][t] * s;  // today's s_h[j] *= s with s_h[j] = g
    }
    if (lane < kMaxRows) p.h[n * kMaxRows + lane] = hv;
  }
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
  // Thread tid lists neurons [tid · span, + span): group q's range is its 8 threads' spans.
  const int span = static_cast<int>((n + kThreads - 1) / kThreads);
  const long long lo = static_cast<long long>(tid) * span, hi = std::min<long long>(n, lo + span);
  int cnt = 0;
  for (long long j = lo; j < hi; ++j) cnt += __ldcg(p.masks + j) != 0u;
  const int incl = dev::warp_inclusive_scan(cnt, lane);
  if (lane == 31) s_warp[warp] = incl;
  __syncthreads();
  int off = incl - cnt;
  for (int w = 0; w < warp; ++w) off += s_warp[w];
  s_off[tid] = off;
  if (tid == kThreads - 1) s_off[kThreads] = off + cnt;
  for (long long j = lo; j < hi; ++j)
    if (__ldcg(p.masks + j) != 0u) s_list[off++] = static_cast<int>(j);
  __syncthreads();
  const int q = tid / kSlots, slot = tid % kSlots;
  const int c = blockIdx.x * kSlots + slot;  // this thread's 16-byte chunk of y's row
  const int t0 = blockIdx.y * kRowBlock;
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
      const float4 ha = __ldcg(reinterpret_cast<const float4*>(p.h + nn * kMaxRows + t0));
      const float4 hb = __ldcg(reinterpret_cast<const float4*>(p.h + nn * kMaxRows + t0) + 1);
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
      const int sl = tid / 8, e = tid % 8, col = (blockIdx.x * kSlots + sl) * 8 + e;
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

void launch_rows(const RowsParams& p, cudaStream_t s) {
  const unsigned ctas = static_cast<unsigned>((p.gate.n + detail::kGemvMmaRows - 1) / detail::kGemvMmaRows);
  if (p.gate.m <= 8)
    rows_gate_up_kernel<1><<<ctas, kThreads, 0, s>>>(p);
  else
    rows_gate_up_kernel<2><<<ctas, kThreads, 0, s>>>(p);
  CK(cudaGetLastError());
  const dim3 grid(static_cast<unsigned>((p.gate.k / 8 + kSlots - 1) / kSlots),
                  static_cast<unsigned>((p.gate.m + kRowBlock - 1) / kRowBlock));
  rows_down_kernel<<<grid, kThreads, 0, s>>>(p);
  CK(cudaGetLastError());
}

// Wg's column 0 = −z(d_n): neuron n fires where N(0, σ≈1) > z(d_n), d_n = density · e^(skew·u − skew²/2), u ~ N(0, 1).
__global__ void set_gate_thresholds(__nv_bfloat16* wg, long long n, int k, float density, float skew, unsigned seed) {
  for (long long j = blockIdx.x * 256ll + threadIdx.x; j < n; j += 256ll * gridDim.x) {
    const float d = fminf(density * expf(skew * hash_normal(static_cast<unsigned long long>(j), seed) - 0.5f * skew * skew), 0.5f);
    wg[j * k] = __float2bfloat16_rn(-sqrtf(2.0f) * erfcinvf(2.0f * d));
  }
}

struct Layer {
  DeviceBuffer<__nv_bfloat16> wg, wu, wd;
};

// One bf16 step (2^-7 of the leading power of two) at |v|.
double bf16_step(double v) {
  int e = 0;
  std::frexp(std::max(std::fabs(v), 1e-30), &e);  // v = f · 2^e, f in [0.5, 1)
  return std::ldexp(1.0, e - 8);
}

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
    for (auto* b : {&l.wg, &l.wu, &l.wd}) {
      b->resize(static_cast<std::size_t>(n * k));
      fill<<<1024, 256, 0, s>>>(b->get(), n, k, sc, -1, 0.0f, seed++);
    }
    set_gate_thresholds<<<32, 256, 0, s>>>(l.wg.get(), n, k, static_cast<float>(density), static_cast<float>(skew), 7);
  }
  CK(cudaGetLastError());
  DeviceBuffer<__nv_bfloat16> x(static_cast<std::size_t>(kMaxRows * k));
  fill<<<64, 256, 0, s>>>(x.get(), kMaxRows, k, 1.0f, 0, 1.0f, 99);
  DeviceBuffer<__nv_bfloat16> g_today(static_cast<std::size_t>(kMaxRows * n)), g_rows(static_cast<std::size_t>(kMaxRows * n));
  DeviceBuffer<__nv_bfloat16> y_today(static_cast<std::size_t>(kMaxRows * k)), y_rows(static_cast<std::size_t>(kMaxRows * k));
  const long long tiles = (n + 255) / 256;
  DeviceBuffer<float> partials(static_cast<std::size_t>(kMaxRows * tiles * k)), h(static_cast<std::size_t>(n * kMaxRows));
  DeviceBuffer<unsigned int> tickets(static_cast<std::size_t>(kMaxRows + 2));
  DeviceBuffer<unsigned long long> nnz(1), nnz_out(1), nnz_r(1), nnz_r_out(1);
  DeviceBuffer<unsigned> masks(static_cast<std::size_t>(n));
  CK(cudaMemsetAsync(tickets.get(), 0, tickets.bytes(), s));
  CK(cudaMemsetAsync(nnz.get(), 0, nnz.bytes(), s));
  CK(cudaMemsetAsync(nnz_r.get(), 0, nnz_r.bytes(), s));
  CK(cudaMemsetAsync(h.get(), 0, h.bytes(), s));
  CK(cudaStreamSynchronize(s));

  auto gate_params = [&](const Layer& l, int m) {
    TwellGemvParams g;
    g.x = x.get();
    g.ld_x = k;
    g.w = l.wg.get();
    g.ld_g = n;
    g.m = m;
    g.n = n;
    g.k = k;
    g.relu = true;
    g.w_before_wait = true;
    return g;
  };
  auto today = [&](const Layer& l, int m, bool gate) {
    if (gate) {
      TwellGemvParams g = gate_params(l, m);
      g.g = g_today.get();
      launch_twell_gemv(g, s);
    }
    TwellDecodeParams p;
    p.x = x.get();
    p.ld_x = k;
    p.w_up = l.wu.get();
    p.w_down_t = l.wd.get();
    p.y = y_today.get();
    p.ld_y = k;
    p.m = m;
    p.n = n;
    p.k = k;
    p.gated = true;
    p.g = g_today.get();
    p.ld_g = n;
    p.partials = partials.get();
    p.row_tickets = tickets.get();
    p.cta_ticket = tickets.get() + m;
    p.nnz = nnz.get();
    p.nnz_out = nnz_out.get();
    launch_twell_decode(p, s);
  };
  auto rows = [&](const Layer& l, int m, bool check) {
    RowsParams p{gate_params(l, m), l.wu.get(), l.wd.get(), y_rows.get(), check ? g_rows.get() : nullptr, masks.get(), h.get(),
                 nnz_r.get(), nnz_r_out.get()};
    launch_rows(p, s);
  };
  auto gate_only = [&](const Layer& l, int m) {
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
  const std::vector<float> hwu = to_host(L[0].wu.get(), static_cast<std::size_t>(n * k), s);
  const std::vector<float> hwd = to_host(L[0].wd.get(), static_cast<std::size_t>(n * k), s);

  std::printf("n %lld k %d density %.4f skew %.2f, %d weight sets (%.1f GB of Wg, Wu and Wd^T)\n", n, k, density, skew, layers,
              6.0 * n * k * layers / 1e9);
  std::printf("%3s %7s %7s %9s %10s %10s %9s   %s\n", "M", "pairs", "union", "gate us", "today us", "rows us", "today/rows",
              "checks (g bits; y within the float64 bound, worst error / bound; counts; row 0 alone = in the batch)");
  const int reps = 20;
  bool ok = true;
  for (const int m : {2, 4, 8, 16}) {
    today(L[0], m, true);
    const std::vector<float> gt = to_host(g_today.get(), static_cast<std::size_t>(m * n), s);
    const std::vector<float> yt = to_host(y_today.get(), static_cast<std::size_t>(m * k), s);
    const unsigned long long c_today = read_count(nnz_out);
    rows(L[0], 1, true);  // row 0 alone (its x is the batch's first)
    const std::vector<float> solo = to_host(y_rows.get(), static_cast<std::size_t>(k), s);
    rows(L[0], m, true);
    const std::vector<float> gr = to_host(g_rows.get(), static_cast<std::size_t>(m * n), s);
    const std::vector<float> yr = to_host(y_rows.get(), static_cast<std::size_t>(m * k), s);
    const unsigned long long c_rows = read_count(nnz_r_out);
    std::vector<unsigned> hm(static_cast<std::size_t>(n));
    CK(cudaMemcpyAsync(hm.data(), masks.get(), hm.size() * sizeof(unsigned), cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    long long uni = 0;
    for (const unsigned v : hm) uni += v != 0u;
    // The reference from the GEMV's g (bf16 values), x and the weights, in float64.
    const bool g_same = std::memcmp(gt.data(), gr.data(), gt.size() * sizeof(float)) == 0;
    double worst_today = 0, worst_rows = 0;
    // Bound, first order in u = 2^-24: h = g · s with s an fp32 sum of K products, so
    // |δh| ≤ (K + 1) · u · |g| · Σ|x · wu|; y sums the terms h · wd over at most terms + max(tiles,
    // kGroups) + 1 fp32 additions (a path's partial sums, then theirs); one bf16 step of |y| for the
    // final rounding.
    const double adds = static_cast<double>(std::max<long long>(tiles, kGroups) + 1);
    for (int t = 0; t < m; ++t) {
      std::vector<double> hr(static_cast<std::size_t>(n), 0.0), hd(static_cast<std::size_t>(n), 0.0);
      long long terms = 0;
      for (long long j = 0; j < n; ++j) {
        const double g = gt[static_cast<std::size_t>(t * n + j)];
        if (g <= 0) continue;
        double d = 0, dm = 0;
        for (int c = 0; c < k; ++c) {
          const double pr = static_cast<double>(hx[static_cast<std::size_t>(t * k + c)]) * hwu[static_cast<std::size_t>(j * k + c)];
          d += pr;
          dm += std::fabs(pr);
        }
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
        worst_today = std::max(worst_today, std::fabs(yt[static_cast<std::size_t>(t * k + c)] - ref) / bound);
        worst_rows = std::max(worst_rows, std::fabs(yr[static_cast<std::size_t>(t * k + c)] - ref) / bound);
      }
    }
    const bool same_row0 = std::memcmp(solo.data(), yr.data(), static_cast<std::size_t>(k) * sizeof(float)) == 0;
    const bool pass = g_same && worst_today <= 1 && worst_rows <= 1 && c_today == c_rows && same_row0;
    ok = ok && pass;
    char verdict[256];
    std::snprintf(verdict, sizeof verdict, "%s (g %s; worst today %.2f, rows %.2f; counts %llu / %llu; row 0 %s)", pass ? "ok" : "FAIL",
                  g_same ? "same" : "DIFFERS", worst_today, worst_rows, c_today, c_rows, same_row0 ? "same" : "DIFFERS");
    const double t_gate = time_graph(s, reps, layers, [&] { for (const Layer& l : L) gate_only(l, m); });
    const double t_today = time_graph(s, reps, layers, [&] { for (const Layer& l : L) today(l, m, true); });
    const double t_rows = time_graph(s, reps, layers, [&] { for (const Layer& l : L) rows(l, m, false); });
    std::printf("%3d %7llu %7lld %9.2f %10.2f %10.2f %9.2fx  %s\n", m, c_today, uni, t_gate, t_today, t_rows, t_today / t_rows,
                verdict);
  }
  std::printf("(µs a layer: today = gate GEMV + decode kernel, rows = its two kernels; launched plainly in a graph)\n");
  std::printf("%s\n", ok ? "checks: pass" : "checks: FAIL");
  return ok ? 0 : 1;
}
