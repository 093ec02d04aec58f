// twell_probe_decode_fixed_rows: the batch-1 runtime's fixed-point FFN form at 2–16 rows, with its
// neurons ordered (docs/runtime.md plan step 2; issue 59's sparse / dense at batch 8). At one row the
// form with each layer's active neurons first took 11.13 µs against 15.01 unordered, 7.91 for the
// gate alone (H200, a9b24fd): a chain that starts in the grid's first wave hides under the gate's
// stream. The batched steps run the gate, then the union's list, up and down one after another
// (≈ 17.5 µs a 2B layer at 4–8 rows, gate 7.7 of it). This probe asks whether one kernel a layer
// hides the union's chains the same way at 2–16 rows:
//   fixed    a CTA a block of 16 neurons for every row: the gate GEMV's own partial sums
//            (gemv_mma_partials, tensor cores; the GEMV's epilogue, so the same g bits), each
//            neuron's fired rows as a mask, then a warp a fired neuron: h for each row that fired it
//            (g · ⟨x[row], Wu[n]⟩, fp32), and h · Wdᵀ[n, :] added into that row's int64 accumulator
//            (cuda/common/fixed_point.cuh: exact in any order). A convert kernel (the reader) takes
//            y = bf16(acc · 2⁻³²) and zeroes the accumulators.
// The CTAs start in index order and the grid is ≈ 1.3 waves, so where a neuron sits decides whether
// its chain hides. Five weight orders, each a copy of every layer's Wg, Wu and Wdᵀ rows permuted:
//   index       as generated;
//   popularity  by the neuron's firing probability d_n, the most likely first (what the runtime's
//               counts over past tokens converge to: a realistic order), 16 a CTA in turn;
//   pop spread  the same ranks dealt one a CTA over the first wave's CTAs (rank r to CTA r mod W,
//               W the CTAs resident at once), so no warp runs two chains while others have none;
//   union       each layer's neurons that this batch fired first (the order at its best, from these
//               rows alone), contiguous; union spread: the same dealt over the first wave.
// Against, µs a layer, programmatic launches, `layers` weight sets in turn (past the L2):
//   the gate alone (the GEMV at 2–16 rows; cuBLASLt's ReLU GEMM), the engine's chains (GEMV gate +
//   decode kernel, its path at 2–3 rows; cuBLASLt gate + union list, up and down 8 × 8, from 4 rows).
// Checks (layer 0 of each order, before timing; y poisoned and the accumulators zeroed first):
// - y within a first-order bound of a float64 reference on the host from the GEMV's bf16 g (the
//   kernel's epilogue is the GEMV's, so the same bits by construction), x and the weights: h's fp32
//   dot (k · 2⁻²⁴ · Σ|x·wu| · g), the product h · wd in fp32 (2⁻²⁴ · |h · wd|), the fixed-point
//   rounding (2⁻³³ a term), half a bf16 step at |y_ref| for the final rounding; a NaN fails;
// - the fired pairs' count equals the host's, no overflow flagged, the accumulators left zero;
// - every order's y has the index order's bits (the same exact integer sums in another order);
// - once more at the largest m with every x row equal (a fired neuron fires in all m rows: masks of
//   m bits, h in ⌈m / 4⌉ passes), against the reference.
//   twell_probe_decode_fixed_rows [n [k [density [skew [layers]]]]]   (defaults: 5632 2048 0.005 1.0 64)
//   env PROBE_ROWS_M (e.g. "4,8") only those rows (2–16)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "cuda/common/device_buffer.hpp"
#include "cuda/common/device_math.cuh"
#include "cuda/common/fixed_point.cuh"
#include "cuda/common/launch.cuh"
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

constexpr int kRows = 16;  // rows the fixed form takes (the GEMV's tensor-core kernel's)
constexpr int kThreads = detail::kGemvMmaWarps * 32;
constexpr int kWin = 8;  // Wdᵀ chunk steps (of 32 chunks) in flight a warp

struct FixedRowsParams {
  TwellGemvParams gate;               // x [m, k] rows ld_x apart, w = Wg [n, k], m ≤ 16, relu
  const __nv_bfloat16* w_up;          // [n, k]
  const __nv_bfloat16* w_down_t;      // [n, k]
  long long* y_fixed;                 // [m, k] int64: Σ round(h · Wdᵀ · 2³²) added to what it holds
  unsigned* overflow;                 // [1] set to 1 where a term was left out
  unsigned long long* nnz;            // [1] the fired pairs added (the host zeroes it)
  float limit;                        // fixed_term_limit(n)
};

// One launch: the gate of 16 neurons for every row, then each fired neuron's h and down terms.
template <int NT>
__global__ void __launch_bounds__(kThreads) fixed_rows_kernel(FixedRowsParams p) {
  __shared__ float part[detail::kGemvMmaWarps][detail::kGemvMmaRows][8 * NT];
  __shared__ float s_g[detail::kGemvMmaRows][kRows];
  __shared__ unsigned s_mask[detail::kGemvMmaRows];
  __shared__ float s_terms[detail::kGemvMmaWarps][32 * 8];
  const TwellGemvParams& gp = p.gate;
  detail::gemv_mma_partials<NT>(gp, part);  // its first weight window before the programmatic wait
  __syncthreads();
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const long long n0 = static_cast<long long>(blockIdx.x) * detail::kGemvMmaRows;
  // The GEMV's epilogue: the warps' sums in warp order, ReLU, bf16 once.
  for (int o = tid; o < detail::kGemvMmaRows * kRows; o += kThreads) {
    const int row = o % detail::kGemvMmaRows, tok = o / detail::kGemvMmaRows;
    float g = 0.0f;
    if (tok < gp.m && n0 + row < gp.n) {
      float v = 0.0f;
#pragma unroll
      for (int w = 0; w < detail::kGemvMmaWarps; ++w) v += part[w][row][tok];
      g = __bfloat162float(__float2bfloat16_rn(fmaxf(v, 0.0f)));
    }
    s_g[row][tok] = g;
  }
  __syncthreads();
  if (warp == 0) {
    unsigned mask = 0;
    if (lane < detail::kGemvMmaRows)
      for (int t = 0; t < gp.m; ++t)
        if (s_g[lane][t] > 0.0f) mask |= 1u << t;
    if (lane < detail::kGemvMmaRows) s_mask[lane] = mask;
    const unsigned pairs = dev::warp_sum(static_cast<unsigned>(__popc(mask)));
    if (lane == 0 && pairs) atomicAdd(p.nnz, static_cast<unsigned long long>(pairs));
  }
  __syncthreads();
  const int kchunks = static_cast<int>(gp.k / 8);
  float* terms = s_terms[warp];
  bool in_range = true;
  for (int row = warp; row < detail::kGemvMmaRows; row += detail::kGemvMmaWarps) {
    const unsigned mask = s_mask[row];
    if (!mask) continue;
    const long long n = n0 + row;
    const char* drow = reinterpret_cast<const char*>(p.w_down_t + n * gp.k);
    for (long long b = static_cast<long long>(lane) * 128; b < gp.k * 2; b += 32 * 128)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(drow + b));
    // h for each fired row (the decode kernel's sums); lane t keeps row t's h.
    float hv = 0.0f;
    rows_up_dots(reinterpret_cast<const uint4*>(p.w_up + n * gp.k), gp.x, gp.ld_x, mask, kchunks, lane, [&](int t, float si) {
      if (lane == t) hv = s_g[row][t] * si;
    });
    // h · Wdᵀ[n, :] for each fired row: the row's chunks in windows of kWin steps, every load in
    // flight first, each step into every fired row's accumulators (dev::fixed_add_step).
    const uint4* dr = reinterpret_cast<const uint4*>(p.w_down_t + n * gp.k);
    dev::down_row_steps<kWin>(dr, kchunks, lane, [&](int step0, const float(&wf)[8]) {
      for (unsigned mk = mask; mk; mk &= mk - 1) {
        const int t = __ffs(static_cast<int>(mk)) - 1;
        const float h = __shfl_sync(0xffffffffu, hv, t);
        in_range &= dev::fixed_add_step(p.y_fixed + static_cast<long long>(t) * gp.k, 8ll * step0, gp.k, h, wf, terms, lane,
                                        p.limit);
      }
    });
  }
  if (!in_range) atomicOr(p.overflow, 1u);
}

// The reader: y = bf16(acc · 2⁻³²), the accumulators left zero.
__global__ void fixed_convert_kernel(long long* acc, __nv_bfloat16* y, long long count) {
  dev::pdl_begin();
  for (long long i = blockIdx.x * 256ll + threadIdx.x; i < count; i += 256ll * gridDim.x) {
    y[i] = __float2bfloat16_rn(dev::fixed_to_float_bf16(acc[i]));
    acc[i] = 0;
  }
}

// dst[i, :] = src[perm[i], :] (rows of k bf16, k a multiple of 8).
__global__ void gather_rows(const __nv_bfloat16* src, __nv_bfloat16* dst, const int* perm, long long n, int k) {
  const long long chunks = static_cast<long long>(k / 8);
  for (long long i = blockIdx.x * 256ll + threadIdx.x; i < n * chunks; i += 256ll * gridDim.x) {
    const long long r = i / chunks, c = i % chunks;
    reinterpret_cast<uint4*>(dst)[r * chunks + c] = reinterpret_cast<const uint4*>(src)[perm[r] * chunks + c];
  }
}

struct Layer {
  DeviceBuffer<__nv_bfloat16> wg, wu, wd;  // [n, k] each (wd = Wdᵀ)
};

std::vector<float> to_host(const __nv_bfloat16* d, std::size_t count) {
  std::vector<__nv_bfloat16> v(count);
  CK(cudaMemcpy(v.data(), d, count * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
  std::vector<float> f(count);
  for (std::size_t i = 0; i < count; ++i) f[i] = __bfloat162float(v[i]);
  return f;
}

double bf16_half_step(double v) {  // half a bf16 step at |v| (round to nearest)
  if (v == 0) return 0;
  int e = 0;
  std::frexp(std::fabs(v), &e);  // |v| = f · 2^e, 0.5 ≤ f < 1
  return std::ldexp(1.0, e - 9);
}

}  // namespace

int main(int argc, char** argv) {
  const long long n = argc > 1 ? std::atoll(argv[1]) : 5632;
  const int k = argc > 2 ? std::atoi(argv[2]) : 2048;
  const double density = argc > 3 ? std::atof(argv[3]) : 0.005;
  const double skew = argc > 4 ? std::atof(argv[4]) : 1.0;
  const int layers = argc > 5 ? std::atoi(argv[5]) : 64;
  if (n < 16 || n > kUnionMaxN || k < 128 || k % 128 || k > static_cast<int>(kGemvMaxK) || !(density > 0 && density < 0.5) ||
      !(skew >= 0) || layers < 1) {
    std::fprintf(stderr,
                 "usage: twell_probe_decode_fixed_rows [n (16 … %lld) [k (a multiple of 128, ≤ %lld) [density (0, 0.5) "
                 "[skew ≥ 0 [layers ≥ 1]]]]]\n",
                 static_cast<long long>(kUnionMaxN), static_cast<long long>(kGemvMaxK));
    return 2;
  }
  int dev_count = 0;
  if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
    std::fprintf(stderr, "twell_probe_decode_fixed_rows: no CUDA device\n");
    return 0;
  }
  std::vector<int> ms = {2, 3, 4, 8, 16};
  if (const char* e = std::getenv("PROBE_ROWS_M")) {
    ms.clear();
    for (const char* c = e; *c;) {
      char* end = nullptr;
      const long v = std::strtol(c, &end, 10);
      if (end == c || v < 2 || v > kRows) {
        std::fprintf(stderr, "PROBE_ROWS_M: rows from 2 to %d, comma-separated\n", kRows);
        return 2;
      }
      ms.push_back(static_cast<int>(v));
      c = *end == ',' ? end + 1 : end;
    }
  }
  int dev = 0;
  CK(cudaGetDevice(&dev));
  const bool union_ok = union_ffn_available(dev) && union_ffn_fits(kRows, n, k, true);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // Five weight sets: [0] as generated, [1] popularity, [2] popularity spread, [3] union, [4] union
  // spread (the last three rebuilt for each m).
  constexpr int kSets = 5;
  const char* names[kSets] = {"index", "popularity", "pop spread", "union", "union spr."};
  std::vector<std::vector<Layer>> sets(kSets);
  for (auto& set : sets) {
    set.resize(static_cast<std::size_t>(layers));
    for (Layer& l : set)
      for (auto* b : {&l.wg, &l.wu, &l.wd}) b->resize(static_cast<std::size_t>(n * k));
  }
  const float sc = 1.0f / std::sqrt(static_cast<float>(k));
  unsigned seed = 1;
  for (Layer& l : sets[0]) {
    fill<<<1024, 256, 0, s>>>(l.wg.get(), n, k, sc, -1, 0.0f, seed++);
    fill<<<1024, 256, 0, s>>>(l.wu.get(), n, k, sc, -1, 0.0f, seed++);
    fill<<<1024, 256, 0, s>>>(l.wd.get(), n, k, sc, -1, 0.0f, seed++);
    set_gate_thresholds<<<32, 256, 0, s>>>(l.wg.get(), n, k, static_cast<float>(density), static_cast<float>(skew), 0x7e5u);
  }
  CK(cudaGetLastError());
  DeviceBuffer<__nv_bfloat16> x(static_cast<std::size_t>(kRows * k));
  fill<<<64, 256, 0, s>>>(x.get(), kRows, k, 1.0f, 0, 1.0f, 0x51a7u);  // (seeds apart from the weights')
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(s));  // the host's copies below run on the legacy stream
  DeviceBuffer<int> perm(static_cast<std::size_t>(n));
  // dst's layer i: the generated layer i's rows in orders[i] (or orders[0] for every layer).
  auto permute = [&](std::vector<Layer>& dst, const std::vector<std::vector<int>>& orders) {
    for (std::size_t i = 0; i < dst.size(); ++i) {
      const std::vector<int>& order = orders[orders.size() == 1 ? 0 : i];
      CK(cudaMemcpyAsync(perm.get(), order.data(), perm.bytes(), cudaMemcpyHostToDevice, s));
      for (const auto& [from, to] : {std::pair{&sets[0][i].wg, &dst[i].wg}, std::pair{&sets[0][i].wu, &dst[i].wu},
                                     std::pair{&sets[0][i].wd, &dst[i].wd}})
        gather_rows<<<1024, 256, 0, s>>>(from->get(), to->get(), perm.get(), n, k);
      CK(cudaGetLastError());
      CK(cudaStreamSynchronize(s));  // perm is rewritten for the next layer
    }
  };
  // Popularity: the thresholds' column (a larger −z(d) is a larger d); every layer has the same
  // thresholds (one seed), so one order serves all.
  std::vector<int> popular(static_cast<std::size_t>(n)), rank_of(static_cast<std::size_t>(n));
  {
    std::vector<__nv_bfloat16> col(static_cast<std::size_t>(n));
    CK(cudaMemcpy2D(col.data(), sizeof(__nv_bfloat16), sets[0][0].wg.get(), static_cast<std::size_t>(k) * sizeof(__nv_bfloat16),
                    sizeof(__nv_bfloat16), static_cast<std::size_t>(n), cudaMemcpyDeviceToHost));
    std::vector<int> order(static_cast<std::size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return __bfloat162float(col[static_cast<std::size_t>(a)]) > __bfloat162float(col[static_cast<std::size_t>(b)]);
    });
    permute(sets[1], {order});
    popular = order;
    for (long long r = 0; r < n; ++r) rank_of[static_cast<std::size_t>(popular[static_cast<std::size_t>(r)])] = static_cast<int>(r);
  }
  // ranked[i], the i-th most wanted neuron, to a slot: ranks below 16 · W dealt one a CTA over CTAs
  // 0 … W − 1 (rank r to CTA r mod W, row r / W), the rest in rank order after them.
  auto spread = [&](const std::vector<int>& ranked, long long w) {
    if (16 * w >= static_cast<long long>(ranked.size())) return ranked;  // one wave holds every CTA
    std::vector<int> order(ranked.size());
    for (std::size_t r = 0; r < ranked.size(); ++r) {
      const long long rr = static_cast<long long>(r);
      const long long slot = rr < 16 * w ? (rr % w) * 16 + rr / w : rr;
      order[static_cast<std::size_t>(slot)] = ranked[r];
    }
    return order;
  };
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));

  DeviceBuffer<__nv_bfloat16> g(static_cast<std::size_t>(kRows * n)), y(static_cast<std::size_t>(kRows * k));
  DeviceBuffer<long long> acc(static_cast<std::size_t>(kRows * k));
  DeviceBuffer<unsigned> overflow(1);
  DeviceBuffer<unsigned long long> pairs(1);
  const long long tiles = (n + 255) / 256;
  DeviceBuffer<float> partials(static_cast<std::size_t>(kRows * tiles * k));
  DeviceBuffer<unsigned int> tickets(static_cast<std::size_t>(kRows + 2));
  DeviceBuffer<unsigned long long> nnz(1), nnz_out(1);
  DeviceBuffer<__nv_bfloat16> h_u(static_cast<std::size_t>(kRows * union_list_size(n)));
  DeviceBuffer<int> u_list(static_cast<std::size_t>(union_list_size(n))), u_counts(static_cast<std::size_t>(union_tiles(n)));
  for (auto* b : {&tickets}) CK(cudaMemsetAsync(b->get(), 0, b->bytes(), s));
  for (auto* b : {&nnz, &pairs}) CK(cudaMemsetAsync(b->get(), 0, b->bytes(), s));
  CK(cudaMemsetAsync(acc.get(), 0, acc.bytes(), s));
  CK(cudaMemsetAsync(overflow.get(), 0, overflow.bytes(), s));
  CK(cudaStreamSynchronize(s));
  LtGemm lt(/*autotune=*/true);

  auto gate_params = [&](const Layer& l, int m) {
    TwellGemvParams p = gemv_rows(x.get(), m, l.wg.get(), n, k);
    p.relu = true;
    p.w_before_wait = true;
    p.g = g.get();
    return p;
  };
  auto gemv_gate = [&](const Layer& l, int m) { launch_twell_gemv(gate_params(l, m), s); };
  auto lt_gate = [&](const Layer& l, int m) {
    lt.run(GemmShape{m, n, k, k, k, n, GemmEpilogue::relu}, l.wg.get(), x.get(), g.get(), s);
  };
  auto operands = [&](const Layer& l, int m) {
    FfnOperands o;
    o.x = x.get();
    o.ld_x = k;
    o.w_up = l.wu.get();
    o.w_down_t = l.wd.get();
    o.y = y.get();
    o.ld_y = k;
    o.m = m;
    o.n = n;
    o.k = k;
    o.gated = true;
    return o;
  };
  auto decode_chain = [&](const Layer& l, int m) {  // the engine at 2–3 rows
    gemv_gate(l, m);
    TwellDecodeParams p;
    static_cast<FfnOperands&>(p) = operands(l, m);
    p.g = g.get();
    p.ld_g = n;
    p.partials = partials.get();
    p.row_tickets = tickets.get();
    p.cta_ticket = tickets.get() + kRows;
    p.nnz = nnz.get();
    p.nnz_out = nnz_out.get();
    launch_twell_decode(p, s);
  };
  auto union_chain = [&](const Layer& l, int m) {  // the engine from 4 rows
    lt_gate(l, m);
    UnionFfnParams u;
    static_cast<FfnOperands&>(u) = operands(l, m);
    u.g = g.get();
    u.ld_g = n;
    u.list = u_list.get();
    u.counts = u_counts.get();
    u.h = h_u.get();
    launch_union_ffn(u, s);
  };
  auto fixed = [&](const Layer& l, int m, bool convert) {
    FixedRowsParams p{gate_params(l, m), l.wu.get(), l.wd.get(), acc.get(), overflow.get(), pairs.get(), fixed_term_limit(n)};
    const dim3 grid(static_cast<unsigned>((n + detail::kGemvMmaRows - 1) / detail::kGemvMmaRows)), block(kThreads);
    if (m <= 8)
      launch_kernel(fixed_rows_kernel<1>, grid, block, 0, s, p);
    else
      launch_kernel(fixed_rows_kernel<2>, grid, block, 0, s, p);
    if (convert) launch_kernel(fixed_convert_kernel, dim3(64), dim3(256), 0, s, acc.get(), y.get(), static_cast<long long>(m) * k);
  };

  // Layer 0 of a set at m rows: y against the float64 reference, the count, the flag, the zeros;
  // with `same`, y's bits must equal it (another order of the same exact sums).
  auto check = [&](const Layer& l, int m, const char* name, std::vector<float>* same) {
    CK(cudaMemsetAsync(acc.get(), 0, acc.bytes(), s));
    CK(cudaMemsetAsync(y.get(), 0xFF, y.bytes(), s));  // NaN: a skipped write shows
    CK(cudaMemsetAsync(pairs.get(), 0, pairs.bytes(), s));
    CK(cudaMemsetAsync(overflow.get(), 0, overflow.bytes(), s));
    fixed(l, m, true);
    CK(cudaStreamSynchronize(s));
    const std::vector<float> yv = to_host(y.get(), static_cast<std::size_t>(m) * k);
    unsigned long long got_pairs = 0;
    unsigned ov = 1;
    CK(cudaMemcpy(&got_pairs, pairs.get(), sizeof got_pairs, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&ov, overflow.get(), sizeof ov, cudaMemcpyDeviceToHost));
    std::vector<long long> left(static_cast<std::size_t>(m) * k);
    CK(cudaMemcpy(left.data(), acc.get(), left.size() * sizeof(long long), cudaMemcpyDeviceToHost));
    gemv_gate(l, m);
    CK(cudaStreamSynchronize(s));
    const std::vector<float> gv = to_host(g.get(), static_cast<std::size_t>(m) * n);
    const std::vector<float> xv = to_host(x.get(), static_cast<std::size_t>(m) * k);
    std::vector<double> ref(static_cast<std::size_t>(m) * k, 0.0), bound(static_cast<std::size_t>(m) * k, 0.0);
    unsigned long long want_pairs = 0;
    std::vector<float> wu(static_cast<std::size_t>(k)), wd(static_cast<std::size_t>(k));
    for (long long j = 0; j < n; ++j) {
      bool any = false;
      for (int t = 0; t < m; ++t) any = any || gv[static_cast<std::size_t>(t * n + j)] > 0.0f;
      if (!any) continue;
      wu = to_host(l.wu.get() + j * k, static_cast<std::size_t>(k));
      wd = to_host(l.wd.get() + j * k, static_cast<std::size_t>(k));
      for (int t = 0; t < m; ++t) {
        const double gj = gv[static_cast<std::size_t>(t * n + j)];
        if (!(gj > 0.0)) continue;
        ++want_pairs;
        double dot = 0.0, dabs = 0.0;
        for (int c = 0; c < k; ++c) {
          const double v = static_cast<double>(xv[static_cast<std::size_t>(t * k + c)]) * wu[static_cast<std::size_t>(c)];
          dot += v;
          dabs += std::fabs(v);
        }
        const double h = gj * dot, herr = gj * k * std::ldexp(dabs, -24);
        for (int c = 0; c < k; ++c) {
          const double w = wd[static_cast<std::size_t>(c)];
          ref[static_cast<std::size_t>(t * k + c)] += h * w;
          bound[static_cast<std::size_t>(t * k + c)] += herr * std::fabs(w) + std::ldexp(std::fabs(h * w), -24) + std::ldexp(1.0, -33);
        }
      }
    }
    double worst = 0.0;
    bool finite = true;
    for (std::size_t i = 0; i < ref.size(); ++i) {
      finite = finite && std::isfinite(yv[i]);
      const double b = bound[i] + bf16_half_step(std::fabs(ref[i]) + bound[i]);
      const double e = std::fabs(yv[i] - ref[i]);
      worst = std::max(worst, b > 0 ? e / b : (e > 0 ? INFINITY : 0.0));
    }
    const bool zeros = std::all_of(left.begin(), left.end(), [](long long v) { return v == 0; });
    bool bits = true;
    if (same && same->empty())
      *same = yv;
    else if (same)
      bits = std::memcmp(same->data(), yv.data(), yv.size() * sizeof(float)) == 0;
    const bool ok = finite && worst <= 1.0 && got_pairs == want_pairs && ov == 0 && zeros && bits;
    std::printf("    check %-10s: worst error / bound %.2f, pairs %llu / %llu, overflow %u, accumulators %s, y bits %s: %s\n",
                name, worst, got_pairs, want_pairs, ov, zeros ? "zero" : "NOT zero",
                !same ? "-" : bits ? "as the index order's" : "NOT the index order's", ok ? "ok" : "FAILED");
    return ok;
  };

  const int reps = 50;
  bool pass = true;
  std::printf("n %lld k %d density %.4f skew %.2f, %d weight sets of %.1f MB (Wg, Wu, Wd^T), five orders\n", n, k, density, skew,
              layers, 3.0 * 2.0 * n * k / 1e6);
  std::printf("(us a layer, programmatic launches; fixed = the one kernel + its convert; fixed alone = without the convert)\n");
  for (const int m : ms) {
    // The first wave: the fixed kernel's CTAs resident at once.
    int per_sm = 0;
    if (m <= 8)
      CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fixed_rows_kernel<1>, kThreads, 0));
    else
      CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fixed_rows_kernel<2>, kThreads, 0));
    const long long wave = std::min<long long>(static_cast<long long>(per_sm) * sms, (n + 15) / 16);
    permute(sets[2], {spread(popular, wave)});
    // The union order: each layer's neurons that this batch fired (any row, by the GEMV's g on the
    // generated weights) first, ascending, then the rest.
    {
      std::vector<std::vector<int>> orders, spreads;
      std::size_t u0 = 0;
      // Where layer 0's union sits: its neurons in the first wave (slots < 16 · wave) by index and by
      // popularity (contiguous and spread alike), and the CTAs holding one (contiguous; spread).
      long long wave_index = 0, wave_pop = 0;
      std::vector<char> cta_pop(static_cast<std::size_t>((n + 15) / 16), 0), cta_spread(cta_pop.size(), 0);
      for (const Layer& l : sets[0]) {
        gemv_gate(l, m);
        CK(cudaStreamSynchronize(s));
        const std::vector<float> gv = to_host(g.get(), static_cast<std::size_t>(m) * n);
        std::vector<char> fired(static_cast<std::size_t>(n), 0);
        for (long long j = 0; j < n; ++j)
          for (int t = 0; t < m; ++t) fired[static_cast<std::size_t>(j)] |= gv[static_cast<std::size_t>(t * n + j)] > 0.0f;
        std::vector<int> order;
        for (const bool want : {true, false})
          for (long long j = 0; j < n; ++j)
            if (static_cast<bool>(fired[static_cast<std::size_t>(j)]) == want) order.push_back(static_cast<int>(j));
        if (orders.empty()) {
          u0 = static_cast<std::size_t>(std::count(fired.begin(), fired.end(), 1));
          for (long long j = 0; j < n; ++j) {
            if (!fired[static_cast<std::size_t>(j)]) continue;
            const long long r = rank_of[static_cast<std::size_t>(j)];
            wave_index += j < 16 * wave;
            wave_pop += r < 16 * wave;
            cta_pop[static_cast<std::size_t>(r / 16)] = 1;
            cta_spread[static_cast<std::size_t>(16 * wave < n && r < 16 * wave ? r % wave : r / 16)] = 1;
          }
        }
        spreads.push_back(spread(order, wave));
        orders.push_back(std::move(order));
      }
      permute(sets[3], orders);
      permute(sets[4], spreads);
      std::printf("%2d rows: layer 0's union %zu neurons; first wave %lld CTAs (%d an SM); of the union in the first wave: "
                  "%lld by index, %lld by popularity; CTAs holding one by popularity: %lld contiguous, %lld spread\n",
                  m, u0, wave, per_sm, wave_index, wave_pop, static_cast<long long>(std::count(cta_pop.begin(), cta_pop.end(), 1)),
                  static_cast<long long>(std::count(cta_spread.begin(), cta_spread.end(), 1)));
    }
    std::vector<float> y_index;  // the orders' y: the same exact sums, so the same bits
    for (int o = 0; o < kSets; ++o) pass = check(sets[static_cast<std::size_t>(o)][0], m, names[o], &y_index) && pass;
    lt_gate(sets[0][0], m);  // cuBLASLt times its candidates on a shape's first use, outside the capture
    CK(cudaStreamSynchronize(s));
    const ProgrammaticLaunch pdl(programmatic_launch_supported());
    const std::vector<Layer>& base = sets[0];
    const double t_gemv = time_graph(s, reps, layers, [&] { for (const Layer& l : base) gemv_gate(l, m); });
    const double t_lt = time_graph(s, reps, layers, [&] { for (const Layer& l : base) lt_gate(l, m); });
    const double t_dec = time_graph(s, reps, layers, [&] { for (const Layer& l : base) decode_chain(l, m); });
    const double t_uni = union_ok ? time_graph(s, reps, layers, [&] { for (const Layer& l : base) union_chain(l, m); }) : NAN;
    double t_fix[kSets], t_alone[kSets];
    for (int o = 0; o < kSets; ++o) {
      const std::vector<Layer>& set = sets[static_cast<std::size_t>(o)];
      t_fix[o] = time_graph(s, reps, layers, [&] { for (const Layer& l : set) fixed(l, m, true); });
      t_alone[o] = time_graph(s, reps, layers, [&] { for (const Layer& l : set) fixed(l, m, false); });
    }
    CK(cudaMemsetAsync(acc.get(), 0, acc.bytes(), s));  // the timed launches without a convert accumulated
    CK(cudaStreamSynchronize(s));
    std::printf("    gate alone: GEMV %.2f, cuBLASLt %.2f; the engine's chains: GEMV gate + decode kernel %.2f, cuBLASLt gate + "
                "union %.2f\n",
                t_gemv, t_lt, t_dec, t_uni);
    for (int o = 0; o < kSets; ++o)
      std::printf("    fixed, %-10s order: %6.2f (alone %6.2f); the engine's best chain / this %.2fx\n", names[o], t_fix[o],
                  t_alone[o], std::min(t_dec, std::isnan(t_uni) ? t_dec : t_uni) / t_fix[o]);
  }
  unsigned ov = 0;
  CK(cudaMemcpy(&ov, overflow.get(), sizeof ov, cudaMemcpyDeviceToHost));
  if (ov) std::printf("(a fixed-point term overflowed in the last rows' timed launches)\n");
  // Every row the same (x's row 0 copied over the others): a fired neuron fires in every row, so
  // its mask has all m bits and h takes ⌈m / 4⌉ passes (at density 0.005 few neurons fire in more
  // than 4 of 16 different rows).
  {
    const int m = *std::max_element(ms.begin(), ms.end());
    for (int t = 1; t < kRows; ++t) CK(cudaMemcpyAsync(x.get() + t * k, x.get(), k * sizeof(__nv_bfloat16), cudaMemcpyDeviceToDevice, s));
    CK(cudaStreamSynchronize(s));
    std::printf("%2d equal rows:\n", m);
    pass = check(sets[0][0], m, "equal rows", nullptr) && pass;
  }
  std::printf("checks: %s\n", pass ? "pass" : "FAILED");
  return pass ? 0 : 1;
}
