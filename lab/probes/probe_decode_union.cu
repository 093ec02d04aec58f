// twell_probe_decode_union: the decode FFN at 2–16 rows, today's kernel against the union design
// (docs/runtime.md, "Where a decode step's time goes, and what closes the gap", step 1).
//   today's  launch_twell_decode: one CTA per (256-neuron tile, row) finds the row's fired neurons,
//            forms h and a partial y in fp32 per tile; the row's last CTA (a ticket) adds the
//            partials in tile order.
//   union    kernel 1, one CTA per 128-neuron tile: each neuron's fired rows as a mask, the tile's
//            fired neurons as an ascending list; a warp per fired neuron reads its Wu row once and
//            forms h for each row that fired it. Kernel 2, one CTA per block of y's columns for
//            every row: walks the fired neurons in ascending order, reads each one's Wdᵀ slice
//            once, adds h·w for the rows that fired it, rounds once. No partials, no tickets.
// Both read the same bf16 gates: synthetic ones where every (row, neuron) fires independently at
// the given density (no popular neurons: the union is as large as it gets), one gate per weight
// set, so that the rows a replay reads (layers × union × 8 KB) are past the L2. The `layers`
// weight sets are launched in turn, captured in a CUDA graph and replayed.
// Prints µs a launch of today's kernel and of the union pair with 16, 32 and 64 columns of y a
// kernel-2 CTA, the union's size, and the checks: the union's y against today's element by element
// (the same products summed in another order, each rounded once: within one bf16 step, plus a
// slack of 2^-18 of the largest |y| for the fp32 sums' own difference), equal counts, and row 0's
// bits alone against in the batch (true of both designs: neither's sums depend on other rows).
//   twell_probe_decode_union [n [k [density [layers]]]]   (defaults: 5632 2048 0.0053 256)
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
#include "cuda/sm80/twell_decode.hpp"
#include "probe_graph.cuh"

using namespace twell::cuda;
using namespace twell::probe;

namespace {

constexpr int kTile = 128;     // neurons a kernel-1 CTA (one thread each while it finds the fired ones)
constexpr int kMaxRows = 16;   // rows a mask holds in this probe

struct UnionParams {
  const __nv_bfloat16* x;      // [m, k]
  const __nv_bfloat16* g;      // [m, ld_g] the gate after ReLU
  long long ld_g;
  const __nv_bfloat16* w_up;   // [n, k]
  const __nv_bfloat16* w_down_t;  // [n, k]
  __nv_bfloat16* y;            // [m, k]
  int m, k;
  long long n;
  unsigned* masks;             // [n] rows that fired neuron j (written for fired neurons only)
  int* list;                   // [tiles · kTile] each tile's fired neurons, ascending
  int* count;                  // [tiles]
  float* h;                    // [m, n] h of the fired (row, neuron) pairs only
  unsigned long long* nnz;     // [1] zero on entry, left zero
  unsigned long long* nnz_out; // [1] the pairs' count
};

__global__ void __launch_bounds__(kTile) union_h_kernel(UnionParams p) {
  __shared__ int s_list[kTile];
  __shared__ unsigned s_mask[kTile];
  __shared__ int s_warp[kTile / 32];
  __shared__ unsigned s_pairs[kTile / 32];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const long long tile = blockIdx.x, j = tile * kTile + tid;
  unsigned mask = 0;
  if (j < p.n)
    for (int t = 0; t < p.m; ++t)
      if (__bfloat162float(p.g[t * p.ld_g + j]) > 0.0f) mask |= 1u << t;
  const unsigned ballot = __ballot_sync(0xffffffffu, mask != 0);
  const unsigned pairs = dev::warp_sum(static_cast<unsigned>(__popc(mask)));
  if (lane == 0) {
    s_warp[warp] = __popc(ballot);
    s_pairs[warp] = pairs;
  }
  __syncthreads();
  int base = 0, cnt = 0;
  unsigned total = 0;
#pragma unroll
  for (int w = 0; w < kTile / 32; ++w) {
    base += w < warp ? s_warp[w] : 0;
    cnt += s_warp[w];
    total += s_pairs[w];
  }
  if (mask) {
    const int at = base + __popc(ballot & ((1u << lane) - 1u));
    s_list[at] = static_cast<int>(j);
    s_mask[at] = mask;
    p.list[tile * kTile + at] = static_cast<int>(j);
    p.masks[j] = mask;
  }
  if (tid == 0) {
    p.count[tile] = cnt;
    if (total) atomicAdd(p.nnz, static_cast<unsigned long long>(total));
  }
  __syncthreads();
  // h for each (row, fired neuron): the row sum in the decode kernel's order (lane's chunks, then
  // the butterfly), so h has the same bits as today's kernel gives it.
  const int kchunks = p.k / 8;
  for (int i = warp; i < cnt; i += kTile / 32) {
    const long long n = s_list[i];
    const uint4* wr = reinterpret_cast<const uint4*>(p.w_up + n * p.k);
    for (unsigned mk = s_mask[i]; mk; mk &= mk - 1) {
      const int t = __ffs(mk) - 1;
      const uint4* xr = reinterpret_cast<const uint4*>(p.x + static_cast<long long>(t) * p.k);
      float s = 0.0f;
#pragma unroll 8
      for (int c = lane; c < kchunks; c += 32) s += dev::dot8(__ldg(xr + c), __ldg(wr + c));
      s = dev::warp_sum(s);
      if (lane == 0) p.h[static_cast<long long>(t) * p.n + n] = __bfloat162float(p.g[t * p.ld_g + n]) * s;
    }
  }
}

// kCh 16-byte chunks (8 columns each) of y a CTA, for kMaxRows rows: thread (row tid / kCh,
// chunk tid % kCh). Each row's sum runs over its own fired neurons in ascending order. A tile's
// list, masks and h are staged in shared memory first (one cooperative load each), so that the
// inner loop's Wdᵀ loads depend on nothing but the staged index.
template <int kCh>
__global__ void __launch_bounds__(kMaxRows * kCh) union_down_kernel(UnionParams p, int tiles) {
  constexpr int kThreads = kMaxRows * kCh;
  __shared__ int s_n[kTile];
  __shared__ unsigned s_mask[kTile];
  __shared__ float s_h[kMaxRows][kTile];
  const int tid = threadIdx.x, t = tid / kCh, ch = tid % kCh;
  const int c = blockIdx.x * kCh + ch;  // this thread's 16-byte chunk of y's row
  const bool mine = t < p.m && c < p.k / 8;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int tile = 0; tile < tiles; ++tile) {
    const int cnt = p.count[tile];
    if (cnt == 0) continue;  // (the same for every thread of the CTA)
    __syncthreads();         // the previous tile's staged values are no longer read
    for (int i = tid; i < cnt; i += kThreads) {
      const int n = p.list[static_cast<long long>(tile) * kTile + i];
      s_n[i] = n;
      s_mask[i] = p.masks[n];
    }
    __syncthreads();
    for (int q = tid; q < p.m * cnt; q += kThreads) {  // h of the fired pairs (0 where the row did not fire)
      const int r = q / cnt, i = q % cnt;
      s_h[r][i] = ((s_mask[i] >> r) & 1u) ? p.h[static_cast<long long>(r) * p.n + s_n[i]] : 0.0f;
    }
    __syncthreads();
    if (!mine) continue;
#pragma unroll 8
    for (int i = 0; i < cnt; ++i) {
      const uint4 w = __ldg(reinterpret_cast<const uint4*>(p.w_down_t + static_cast<long long>(s_n[i]) * p.k) + c);
      if ((s_mask[i] >> t) & 1u) dev::axpy8(s_h[t][i], w, acc);
    }
  }
  if (mine) *reinterpret_cast<uint4*>(p.y + static_cast<long long>(t) * p.k + static_cast<long long>(c) * 8) = dev::pack8_bf16(acc);
  if (blockIdx.x == 0 && tid == 0) {  // kernel 1 is done (stream order): publish the count, leave it zero
    *p.nnz_out = *p.nnz;
    *p.nnz = 0;
  }
}

void launch_union(const UnionParams& p, int cols, cudaStream_t s) {
  const int tiles = static_cast<int>((p.n + kTile - 1) / kTile);
  union_h_kernel<<<tiles, kTile, 0, s>>>(p);
  CK(cudaGetLastError());
  const int kch = cols / 8, blocks = (p.k / 8 + kch - 1) / kch;
  if (kch == 2) union_down_kernel<2><<<blocks, kMaxRows * 2, 0, s>>>(p, tiles);
  else if (kch == 4) union_down_kernel<4><<<blocks, kMaxRows * 4, 0, s>>>(p, tiles);
  else union_down_kernel<8><<<blocks, kMaxRows * 8, 0, s>>>(p, tiles);
  CK(cudaGetLastError());
}

// g[t, j] = bf16(max(0, N(0, 1) − thr)): each (row, neuron) fires with probability `density`.
__global__ void fill_gate(__nv_bfloat16* g, int m, long long n, long long ld, float thr, unsigned seed) {
  for (long long i = blockIdx.x * 256ll + threadIdx.x; i < m * n; i += 256ll * gridDim.x) {
    const long long t = i / n, j = i % n;
    g[t * ld + j] = __float2bfloat16_rn(fmaxf(hash_normal(i, seed) - thr, 0.0f));
  }
}

struct Layer {
  DeviceBuffer<__nv_bfloat16> wu, wd, g;  // g: this layer's gate [kMaxRows, ld_g] (its own fired neurons)
};

}  // namespace

int main(int argc, char** argv) {
  const long long n = argc > 1 ? std::atoll(argv[1]) : 5632;
  const int k = argc > 2 ? std::atoi(argv[2]) : 2048;
  const double density = argc > 3 ? std::atof(argv[3]) : 0.0053;
  const int layers = argc > 4 ? std::atoi(argv[4]) : 256;
  if (n < 1 || n > 512LL * kTile || k < 8 || k % 8 || k > kDecodeMaxK || !(density > 0 && density < 1) || layers < 1) {
    std::fprintf(stderr, "usage: twell_probe_decode_union [n (≤ %d) [k (multiple of 8, ≤ %lld) [density (0, 1) [layers ≥ 1]]]]\n",
                 512 * kTile, static_cast<long long>(kDecodeMaxK));
    return 2;
  }
  int dev_count = 0;
  if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
    std::fprintf(stderr, "twell_probe_decode_union: no CUDA device\n");
    return 0;
  }
  const float thr = static_cast<float>(std::sqrt(2.0) * erfcinv(2.0 * density));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const long long ld_g = n + 8;
  std::vector<Layer> L(static_cast<std::size_t>(layers));
  const float sc = 1.0f / std::sqrt(static_cast<float>(k));
  unsigned seed = 1;
  for (Layer& l : L) {
    l.wu.resize(static_cast<std::size_t>(n * k));
    l.wd.resize(static_cast<std::size_t>(n * k));
    l.g.resize(static_cast<std::size_t>(kMaxRows * ld_g));
    fill<<<1024, 256, 0, s>>>(l.wu.get(), n, k, sc, -1, 0.0f, seed++);
    fill<<<1024, 256, 0, s>>>(l.wd.get(), n, k, sc, -1, 0.0f, seed++);
    fill_gate<<<256, 256, 0, s>>>(l.g.get(), kMaxRows, n, ld_g, thr, seed++);
  }
  DeviceBuffer<__nv_bfloat16> x(static_cast<std::size_t>(kMaxRows * k));
  DeviceBuffer<__nv_bfloat16> y_today(static_cast<std::size_t>(kMaxRows * k)), y_union(static_cast<std::size_t>(kMaxRows * k));
  fill<<<64, 256, 0, s>>>(x.get(), kMaxRows, k, 1.0f, -1, 0.0f, 99);
  const long long tiles256 = (n + 255) / 256, tiles128 = (n + kTile - 1) / kTile;
  DeviceBuffer<float> partials(static_cast<std::size_t>(kMaxRows * tiles256 * k)), h(static_cast<std::size_t>(kMaxRows * n));
  DeviceBuffer<unsigned int> tickets(static_cast<std::size_t>(kMaxRows + 2));
  DeviceBuffer<unsigned long long> nnz(1), nnz_out(1), nnz_u(1), nnz_u_out(1);
  DeviceBuffer<unsigned> masks(static_cast<std::size_t>(n));
  DeviceBuffer<int> list(static_cast<std::size_t>(tiles128 * kTile)), count(static_cast<std::size_t>(tiles128));
  CK(cudaMemsetAsync(tickets.get(), 0, tickets.bytes(), s));
  CK(cudaMemsetAsync(nnz.get(), 0, nnz.bytes(), s));
  CK(cudaMemsetAsync(nnz_u.get(), 0, nnz_u.bytes(), s));
  CK(cudaStreamSynchronize(s));

  auto today = [&](const Layer& l, int m, __nv_bfloat16* y) {
    TwellDecodeParams p;
    p.x = x.get();
    p.ld_x = k;
    p.w_up = l.wu.get();
    p.w_down_t = l.wd.get();
    p.y = y;
    p.ld_y = k;
    p.m = m;
    p.n = n;
    p.k = k;
    p.gated = true;
    p.g = l.g.get();
    p.ld_g = ld_g;
    p.partials = partials.get();
    p.row_tickets = tickets.get();
    p.cta_ticket = tickets.get() + m;
    p.nnz = nnz.get();
    p.nnz_out = nnz_out.get();
    launch_twell_decode(p, s);
  };
  auto union_ = [&](const Layer& l, int m, __nv_bfloat16* y, int cols) {
    UnionParams p{x.get(), l.g.get(), ld_g, l.wu.get(), l.wd.get(), y, m, k, n, masks.get(), list.get(), count.get(), h.get(),
                  nnz_u.get(), nnz_u_out.get()};
    launch_union(p, cols, s);
  };
  auto read = [&](const DeviceBuffer<__nv_bfloat16>& b, int m) {
    std::vector<__nv_bfloat16> v(static_cast<std::size_t>(m * k));
    CK(cudaMemcpyAsync(v.data(), b.get(), v.size() * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    return v;
  };
  auto read_count = [&](const DeviceBuffer<unsigned long long>& b) {
    unsigned long long v = 0;
    CK(cudaMemcpyAsync(&v, b.get(), sizeof v, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    return v;
  };

  // Each layer has its own gate, so a replay reads layers × union × 8 KB of rows: past the L2
  // (50 MB on an H200) from M = 2 on at the defaults (256 × ≈ 60 × 8 KB ≈ 120 MB).
  std::printf("n %lld k %d density %.4f, %d weight sets with their own gates (%.1f GB of Wu and Wd^T)\n", n, k, density,
              layers, 4.0 * n * k * layers / 1e9);
  std::printf("%3s %7s %7s %10s %10s %10s %10s   %s\n", "M", "pairs", "union", "today us", "union/16", "union/32",
              "union/64", "checks (y within a bf16 step of today's per element; counts; row 0 alone = in the batch)");
  const int reps = 20;
  bool ok = true;
  for (const int m : {2, 4, 8, 16}) {
    // Checks first (layer 0, every column block size): the two designs' y element by element, the
    // counts, and row 0's bits alone against in the batch.
    today(L[0], m, y_today.get());
    const auto a = read(y_today, m);
    const unsigned long long c_today = read_count(nnz_out);
    std::string verdict;
    long long uni = 0;
    for (const int cols : {16, 32, 64}) {
      union_(L[0], 1, y_union.get(), cols);  // row 0 alone (its x and gate rows are the batch's first)
      const auto solo = read(y_union, 1);
      union_(L[0], m, y_union.get(), cols);
      const auto b = read(y_union, m);
      const unsigned long long c_union = read_count(nnz_u_out);
      // Both are fp32 sums of the same products in other orders, each rounded once to bf16: at most
      // one bf16 step apart, plus the fp32 sums' own difference (a few fp32 ulps of the terms' sum;
      // a dropped term, ≈ 1e-2 here, is far above the slack).
      double ymax = 0;
      for (const __nv_bfloat16 v : a) ymax = std::max(ymax, std::fabs(static_cast<double>(__bfloat162float(v))));
      long long bad = 0;
      for (std::size_t i = 0; i < a.size(); ++i) {
        const double va = __bfloat162float(a[i]), vb = __bfloat162float(b[i]);
        if (std::fabs(va - vb) > bf16_step(std::max(std::fabs(va), std::fabs(vb))) * 1.01 + std::ldexp(ymax, -18)) ++bad;
      }
      const bool same = std::memcmp(solo.data(), b.data(), static_cast<std::size_t>(k) * sizeof(__nv_bfloat16)) == 0;
      const bool pass = bad == 0 && same && c_today == c_union;
      ok = ok && pass;
      verdict += " " + std::to_string(cols) + ": " + (pass ? std::string("ok") : "FAIL (" + std::to_string(bad) + " elements apart" +
                                                                               (same ? "" : ", row 0 differs") +
                                                                               (c_today == c_union ? "" : ", counts differ") + ")");
      if (cols == 16) {  // the union's size: neurons any of the m rows fired
        std::vector<int> cnt(static_cast<std::size_t>(tiles128));
        CK(cudaMemcpyAsync(cnt.data(), count.get(), cnt.size() * sizeof(int), cudaMemcpyDeviceToHost, s));
        CK(cudaStreamSynchronize(s));
        for (const int v : cnt) uni += v;
      }
    }
    double t_union[3];
    const double t_today = time_graph(s, reps, layers, [&] { for (const Layer& l : L) today(l, m, y_today.get()); });
    for (int i = 0; i < 3; ++i) {
      const int cols = 16 << i;
      t_union[i] = time_graph(s, reps, layers, [&] { for (const Layer& l : L) union_(l, m, y_union.get(), cols); });
    }
    std::printf("%3d %7llu %7lld %10.2f %10.2f %10.2f %10.2f  %s\n", m, c_today, uni, t_today, t_union[0], t_union[1],
                t_union[2], verdict.c_str());
  }
  std::printf("%s\n", ok ? "checks: pass" : "checks: FAIL");
  return ok ? 0 : 1;
}
