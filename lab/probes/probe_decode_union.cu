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
// Both read the same bf16 gate: a synthetic one where every (row, neuron) fires independently at
// the given density (no popular neurons: the union is as large as it gets). `layers` weight sets
// are launched in turn (together larger than L2), captured in a CUDA graph and replayed.
// Prints µs a launch per design and row count, the union's size, and two checks: the union's y
// against today's (the same terms in another order: within a few bf16 steps), and row 0's bits
// computed alone against in the batch (the union's sums do not depend on the other rows).
//   twell_probe_decode_union [n [k [density [layers [cols]]]]]   (defaults: 5632 2048 0.0053 8 64)
// cols: y columns a kernel-2 CTA owns (16, 32 or 64).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
// chunk tid % kCh). Each row's sum runs over its own fired neurons in ascending order.
template <int kCh>
__global__ void __launch_bounds__(kMaxRows * kCh) union_down_kernel(UnionParams p, int tiles) {
  const int tid = threadIdx.x, t = tid / kCh, ch = tid % kCh;
  const int c = blockIdx.x * kCh + ch;  // this thread's 16-byte chunk of y's row
  const bool mine = t < p.m && c < p.k / 8;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int tile = 0; tile < tiles; ++tile) {
    const int cnt = p.count[tile];
    const int* list = p.list + static_cast<long long>(tile) * kTile;
#pragma unroll 4
    for (int i = 0; i < cnt; ++i) {
      const long long n = list[i];
      if (mine && (p.masks[n] >> t & 1u)) {
        const float hv = p.h[static_cast<long long>(t) * p.n + n];
        dev::axpy8(hv, __ldg(reinterpret_cast<const uint4*>(p.w_down_t + n * p.k) + c), acc);
      }
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
  const int kch = cols / 8, blocks = (p.k / 8 + kch - 1) / kch;
  if (kch == 2) union_down_kernel<2><<<blocks, kMaxRows * 2, 0, s>>>(p, tiles);
  else if (kch == 4) union_down_kernel<4><<<blocks, kMaxRows * 4, 0, s>>>(p, tiles);
  else union_down_kernel<8><<<blocks, kMaxRows * 8, 0, s>>>(p, tiles);
}

// g[t, j] = bf16(max(0, N(0, 1) − thr)): each (row, neuron) fires with probability `density`.
__global__ void fill_gate(__nv_bfloat16* g, int m, long long n, long long ld, float thr, unsigned seed) {
  for (long long i = blockIdx.x * 256ll + threadIdx.x; i < m * n; i += 256ll * gridDim.x) {
    const long long t = i / n, j = i % n;
    g[t * ld + j] = __float2bfloat16_rn(fmaxf(hash_normal(i, seed) - thr, 0.0f));
  }
}

struct Layer {
  DeviceBuffer<__nv_bfloat16> wu, wd;
};

}  // namespace

int main(int argc, char** argv) {
  const long long n = argc > 1 ? std::atoll(argv[1]) : 5632;
  const int k = argc > 2 ? std::atoi(argv[2]) : 2048;
  const double density = argc > 3 ? std::atof(argv[3]) : 0.0053;
  const int layers = argc > 4 ? std::atoi(argv[4]) : 8;
  const int cols = argc > 5 ? std::atoi(argv[5]) : 64;
  if (n < 1 || k < 8 || k % 8 || k > kDecodeMaxK || !(density > 0 && density < 1) || layers < 1 ||
      (cols != 16 && cols != 32 && cols != 64)) {
    std::fprintf(stderr, "usage: twell_probe_decode_union [n [k (multiple of 8, ≤ %lld) [density (0, 1) [layers ≥ 1 [cols 16|32|64]]]]]\n",
                 static_cast<long long>(kDecodeMaxK));
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
  std::vector<Layer> L(static_cast<std::size_t>(layers));
  const float sc = 1.0f / std::sqrt(static_cast<float>(k));
  unsigned seed = 1;
  for (Layer& l : L) {
    l.wu.resize(static_cast<std::size_t>(n * k));
    l.wd.resize(static_cast<std::size_t>(n * k));
    fill<<<1024, 256, 0, s>>>(l.wu.get(), n, k, sc, -1, 0.0f, seed++);
    fill<<<1024, 256, 0, s>>>(l.wd.get(), n, k, sc, -1, 0.0f, seed++);
  }
  const long long ld_g = n + 8;
  DeviceBuffer<__nv_bfloat16> x(static_cast<std::size_t>(kMaxRows * k)), g(static_cast<std::size_t>(kMaxRows * ld_g));
  DeviceBuffer<__nv_bfloat16> y_today(static_cast<std::size_t>(kMaxRows * k)), y_union(static_cast<std::size_t>(kMaxRows * k));
  fill<<<64, 256, 0, s>>>(x.get(), kMaxRows, k, 1.0f, -1, 0.0f, 99);
  fill_gate<<<256, 256, 0, s>>>(g.get(), kMaxRows, n, ld_g, thr, 7);
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
    p.g = g.get();
    p.ld_g = ld_g;
    p.partials = partials.get();
    p.row_tickets = tickets.get();
    p.cta_ticket = tickets.get() + m;
    p.nnz = nnz.get();
    p.nnz_out = nnz_out.get();
    launch_twell_decode(p, s);
  };
  auto union_ = [&](const Layer& l, int m, __nv_bfloat16* y, const __nv_bfloat16* xs, const __nv_bfloat16* gs) {
    UnionParams p{xs, gs, ld_g, l.wu.get(), l.wd.get(), y, m, k, n, masks.get(), list.get(), count.get(), h.get(),
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

  std::printf("n %lld k %d density %.4f, %d weight sets (%.0f MB of Wu and Wd^T), kernel 2: %d columns a CTA\n", n, k,
              density, layers, 4.0 * n * k * layers / 1e6, cols);
  std::printf("%4s %8s %8s %10s %10s %8s %12s %12s %s\n", "M", "pairs", "union", "today us", "union us", "ratio",
              "max |dy|/max|y|", "row 0 alone", "counts");
  const int reps = 40;
  bool ok = true;
  for (const int m : {2, 4, 8, 16}) {
    // Checks first (layer 0): the two designs' y, the count, and row 0 alone against in the batch.
    today(L[0], m, y_today.get());
    union_(L[0], m, y_union.get(), x.get(), g.get());
    const auto a = read(y_today, m), b = read(y_union, m);
    const unsigned long long c_today = read_count(nnz_out), c_union = read_count(nnz_u_out);
    double dmax = 0, ymax = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      const double va = __bfloat162float(a[i]), vb = __bfloat162float(b[i]);
      dmax = std::max(dmax, std::fabs(va - vb));
      ymax = std::max(ymax, std::fabs(va));
    }
    union_(L[0], 1, y_union.get(), x.get(), g.get());  // row 0 alone (its x and gate rows are the batch's first)
    const auto solo = read(y_union, 1);
    const bool same = std::memcmp(solo.data(), b.data(), static_cast<std::size_t>(k) * sizeof(__nv_bfloat16)) == 0;
    // The union's size: neurons any of the m rows fired (the masks of layer 0's run).
    union_(L[0], m, y_union.get(), x.get(), g.get());
    std::vector<int> cnt(static_cast<std::size_t>(tiles128));
    CK(cudaMemcpyAsync(cnt.data(), count.get(), cnt.size() * sizeof(int), cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    long long uni = 0;
    for (const int v : cnt) uni += v;
    const double rel = ymax > 0 ? dmax / ymax : 0;
    // Both sums are fp32 over the same terms, rounded once to bf16: a few bf16 steps (2^-8) apart.
    const bool pass = rel < 4.0 / 256 && same && c_today == c_union;
    ok = ok && pass;
    const double t_today = time_graph(s, reps, layers, [&] { for (const Layer& l : L) today(l, m, y_today.get()); });
    const double t_union = time_graph(s, reps, layers, [&] { for (const Layer& l : L) union_(l, m, y_union.get(), x.get(), g.get()); });
    std::printf("%4d %8llu %8lld %10.2f %10.2f %7.2fx %12.2e %12s %s\n", m, c_today, uni, t_today, t_union,
                t_today / t_union, rel, same ? "same bits" : "DIFFERS", c_today == c_union ? "equal" : "DIFFER");
  }
  std::printf("%s\n", ok ? "checks: pass" : "checks: FAIL");
  return ok ? 0 : 1;
}
