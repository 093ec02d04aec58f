// twell_probe_stream_gemm: a weight-streaming GEMM for 17–64 rows against cuBLASLt (issue 59, docs/runtime.md
// plan step 1). At 32–64 rows a decode step's four weight GEMMs run on cuBLASLt at 31–67 % of the copy
// bandwidth (the 2b-gqa's batch-64 timeline at 9483100), and each pays a kernel boundary of ≈ 2–2.7 µs
// that a kernel loading its weights before its programmatic wait brings to ≈ 0.5–0.7
// (twell_probe_step_chain at 8e5905e). The candidate, y[m, n] = bf16(Σ_k x[m, k] · W[n, k]):
// - swap AB on tensor cores: W is mma.m16n8k16's A operand (16 W rows × 16 k) and xᵀ its B (16 k ×
//   8 tokens), so the tokens are mma's N and a CTA's 64 W rows meet every token;
// - a CTA owns 64 W rows and a range of K; 8 warps, warp w the W rows 16 (w mod 4) … + 15 and half
//   the tokens (w / 4); W and x staged through shared memory by 64-k blocks in STAGES buffers
//   (cp.async, 16-byte chunks, each 128-byte row's chunks XOR-swizzled by the row so that
//   ldmatrix reads 8 rows without bank conflicts), the first STAGES − 1 W blocks issued before the
//   programmatic wait (weights: no kernel writes them), x after it;
// - K split over a thread-block cluster of `split` CTAs where N / 64 alone would leave SMs idle; the
//   partial tiles are added in cluster rank order through distributed shared memory by rank 0, so
//   the sums' order is fixed by the shape (not by M, not by timing).
// A token's sums never see another token's x (mma's columns are independent; rows past M load as
// zeros), so a token's bits at any M ≤ 64 equal its bits at M = 64: checked. Every fifth output of
// each token against float64 within K · 2⁻²⁴ · Σ|x·w| plus 2⁻⁸ |y| (a bf16 rounding; the tensor cores
// align and truncate inside a k16 step, as cuBLASLt's kernels do), outputs poisoned with NaN first;
// the programmatic launches' output (the timing graph's last) equal to a plain launch's. Timed as in
// twell_probe_gemv: `layers` weight copies launched in turn (together past the L2), captured into a
// CUDA graph and replayed, the candidate's launches programmatic (consecutive launches overlap by its
// early W loads), against cuBLASLt's first heuristic candidate (the runtime's) and its fastest of 8.
// Then at 64 rows a sweep of the split (1, 2, 4, 8) and the stages (4, 6), each checked against
// float64 (another split adds in another order: other bits).
//   twell_probe_stream_gemm [layers]   (default 16)
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/common/device_buffer.hpp"
#include "cuda/common/device_math.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/dense/lt_gemm.hpp"
#include "probe_graph.cuh"

using namespace twell::cuda;
using namespace twell::probe;
namespace cg = cooperative_groups;

namespace {

constexpr int kBN = 64;      // W rows a CTA
constexpr int kBK = 64;      // k a stage (128 bytes a row: 8 chunks of 16)
constexpr int kThreads = 256;
constexpr int kStages = 4;  // the default; the sweep also runs 6

// The device code needs sm_90 (clusters); the sm_80 image of this file holds a trap only.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
// Byte offset of 16-byte chunk ch (0 … 7) of row r in a stage's [rows][64] bf16 tile.
__device__ __forceinline__ std::uint32_t tile_offset(int r, int ch) {
  return static_cast<std::uint32_t>(r * 128 + ((ch ^ (r & 7)) << 4));
}

#endif

// NT token tiles of 8 (M ≤ 8 · NT; NT ∈ {4, 8}): warp w takes tiles (w / 4) · NT / 2 … + NT / 2 − 1,
// two a B ldmatrix. STAGES shared-memory buffers of a 64-k block each. Grid (split, N / 64),
// clusters (split, 1, 1); rank r sums k-blocks [r · kb_per, min((r + 1) · kb_per, K / 64)).
template <int NT, int STAGES>
__global__ void __launch_bounds__(kThreads) stream_gemm_kernel(const __nv_bfloat16* x, int m, const __nv_bfloat16* w,
                                                               long long n, int k, __nv_bfloat16* y, int kb_per) {
  static_assert(NT == 4 || NT == 8, "two B tiles a ldmatrix, two token halves");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // clusters are sm_90's (main refuses earlier devices)
#else
  constexpr int T = 8 * NT, kWBytes = kBN * kBK * 2, kStage = kWBytes + T * kBK * 2, kHalf = NT / 2;
  extern __shared__ __align__(128) unsigned char smem[];
  const cg::cluster_group cluster = cg::this_cluster();
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int mi = warp % 4, nh = warp / 4;  // this warp's 16 W rows and token half
  const int rank = static_cast<int>(cluster.block_rank());
  const long long n0 = static_cast<long long>(blockIdx.y) * kBN;
  const int kb0 = rank * kb_per, nkb = max(0, min(kb_per, k / kBK - kb0));
  const std::uint32_t sbase = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  const auto load_w = [&](int s, int kb) {
#pragma unroll
    for (int i = 0; i < kBN * 8 / kThreads; ++i) {
      const int c = tid + i * kThreads, r = c / 8, ch = c % 8;
      dev::cp_async16(sbase + s * kStage + tile_offset(r, ch), w + (n0 + r) * k + kb * kBK + ch * 8, true);
    }
  };
  const auto load_x = [&](int s, int kb) {
#pragma unroll
    for (int i = 0; i < T * 8 / kThreads; ++i) {
      const int c = tid + i * kThreads, r = c / 8, ch = c % 8;
      const bool valid = r < m;  // rows past M: zeros
      dev::cp_async16(sbase + s * kStage + kWBytes + tile_offset(r, ch),
                      x + static_cast<long long>(valid ? r : 0) * k + kb * kBK + ch * 8, valid);
    }
  };
  // The first STAGES − 1 blocks' W before the wait, their x after it. Commit group 0 holds those W
  // blocks and block 0's x; group b (1 ≤ b < STAGES − 1) block b's x; every later group one whole block.
  for (int s = 0; s < STAGES - 1; ++s)
    if (s < nkb) load_w(s, kb0 + s);
  dev::pdl_begin();
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nkb) load_x(s, kb0 + s);
    dev::cp_async_commit();
  }
  float acc[kHalf][4];
#pragma unroll
  for (int j = 0; j < kHalf; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
  for (int i = 0; i < nkb; ++i) {
    dev::cp_async_wait<STAGES - 2>();  // block i's group is in
    __syncthreads();                    // ... for every thread, and block i − 1's buffer is read
    const int next = i + STAGES - 1;
    if (next < nkb) {
      load_w(next % STAGES, kb0 + next);
      load_x(next % STAGES, kb0 + next);
    }
    dev::cp_async_commit();  // (an empty group past the end keeps the count)
    const std::uint32_t ws = sbase + (i % STAGES) * kStage, xs = ws + kWBytes;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      // A: lanes 0–15 rows 0–15 at k 0, lanes 16–31 at k 8: a0 (g, 2t), a1 (g + 8, 2t), a2 (g, 2t + 8), a3 (g + 8, 2t + 8).
      const int ar = mi * 16 + (lane & 15);
      unsigned a0, a1, a2, a3;
      dev::ldmatrix_x4(ws + tile_offset(ar, 2 * kk + (lane >> 4)), a0, a1, a2, a3);
#pragma unroll
      for (int j = 0; j < kHalf; j += 2) {
        // B for tiles j, j + 1: matrices (tokens 8j…, k 0), (8j…, k 8), (8j + 8…, k 0), (8j + 8…, k 8).
        const int tok = (nh * kHalf + j) * 8 + (lane & 7) + ((lane >> 4) << 3);
        unsigned b0, b1, b2, b3;
        dev::ldmatrix_x4(xs + tile_offset(tok, 2 * kk + ((lane >> 3) & 1)), b0, b1, b2, b3);
        dev::mma_16816_bf16(acc[j], a0, a1, a2, a3, b0, b1);
        dev::mma_16816_bf16(acc[j + 1], a0, a1, a2, a3, b2, b3);
      }
    }
  }
  dev::cp_async_wait<0>();
  __syncthreads();  // the stages are free: the partial tile reuses them
  float* part = reinterpret_cast<float*>(smem);  // [T][kBN]: token-major, so rank 0's stores run along n
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int j = 0; j < kHalf; ++j) {
    const int tok = (nh * kHalf + j) * 8 + 2 * t, row = mi * 16 + g;
    part[tok * kBN + row] = acc[j][0];
    part[(tok + 1) * kBN + row] = acc[j][1];
    part[tok * kBN + row + 8] = acc[j][2];
    part[(tok + 1) * kBN + row + 8] = acc[j][3];
  }
  cluster.sync();  // every rank's partial tile is written
  // Rank q writes the outputs of its slice [q · per, (q + 1) · per) of the m · 64, each the ranks'
  // partials added in rank order 0, 1, … (all of them loaded first, then added).
  const int split = static_cast<int>(cluster.num_blocks()), per = (m * kBN + split - 1) / split;
  for (int idx = rank * per + tid; idx < min((rank + 1) * per, m * kBN); idx += kThreads) {
    float pv[8];
#pragma unroll
    for (int r = 0; r < 8; ++r) pv[r] = r < split ? cluster.map_shared_rank(part, r)[idx] : 0.0f;
    float v = 0.0f;
#pragma unroll
    for (int r = 0; r < 8; ++r)
      if (r < split) v += pv[r];
    y[static_cast<long long>(idx / kBN) * n + n0 + idx % kBN] = __float2bfloat16_rn(v);
  }
  cluster.sync();  // no rank leaves while another still reads its tile
#endif
}

// The split of K: the fewest ranks (a power of two, ≤ 8) that give the SMs a CTA each, while every
// rank keeps ≥ 2 · kStages k-blocks.
int pick_split(long long n, int k, int sms) {
  int split = 1;
  while ((n / kBN) * split < sms && split < 8 && (k / kBK) / (2 * split) >= 2 * kStages) split *= 2;
  return split;
}

std::size_t smem_bytes(int nt, int stages) { return static_cast<std::size_t>(stages) * (kBN * kBK * 2 + 8 * nt * kBK * 2); }

// Once, before any launch: each instantiation's shared memory past the 48 KB default.
void set_smem_limits() {
  CK(cudaFuncSetAttribute(stream_gemm_kernel<4, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_bytes(4, 4))));
  CK(cudaFuncSetAttribute(stream_gemm_kernel<8, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_bytes(8, 4))));
  CK(cudaFuncSetAttribute(stream_gemm_kernel<4, 6>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_bytes(4, 6))));
  CK(cudaFuncSetAttribute(stream_gemm_kernel<8, 6>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_bytes(8, 6))));
}

void launch_stream_gemm(const __nv_bfloat16* x, int m, const __nv_bfloat16* w, long long n, int k, __nv_bfloat16* y,
                        int split, cudaStream_t s, int stages = kStages) {
  if (m < 1 || m > 64 || n % kBN != 0 || k % kBK != 0 || split < 1 || split > 8 || (stages != 4 && stages != 6)) {
    std::fprintf(stderr,
                 "stream_gemm: needs 1 ≤ M ≤ 64, N and K multiples of 64, split 1–8, 4 or 6 stages (M %d, N %lld, K %d, "
                 "split %d, stages %d)\n",
                 m, n, k, split, stages);
    std::exit(2);
  }
  const int kb_per = (k / kBK + split - 1) / split;
  const auto go = [&](auto kernel, int nt) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(static_cast<unsigned>(split), static_cast<unsigned>(n / kBN));
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = smem_bytes(nt, stages);
    cfg.stream = s;
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = static_cast<unsigned>(split);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = programmatic_launch_active() ? 1 : 0;
    cfg.attrs = attr;
    cfg.numAttrs = 2;
    CK(cudaLaunchKernelEx(&cfg, kernel, x, m, w, n, k, y, kb_per));
  };
  if (m <= 32)
    stages == 4 ? go(stream_gemm_kernel<4, 4>, 4) : go(stream_gemm_kernel<4, 6>, 4);
  else
    stages == 4 ? go(stream_gemm_kernel<8, 4>, 8) : go(stream_gemm_kernel<8, 6>, 8);
}

}  // namespace

int main(int argc, char** argv) {
  const int layers = argc > 1 ? std::atoi(argv[1]) : 16;
  if (layers < 1) {
    std::fprintf(stderr, "usage: twell_probe_stream_gemm [layers >= 1]\n");
    return 2;
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major < 9) {
    std::fprintf(stderr, "twell_probe_stream_gemm: needs thread-block clusters (sm_90), not sm_%d%d\n", prop.major, prop.minor);
    return 2;
  }
  set_smem_limits();
  {  // clusters of 8 CTAs with the largest shared memory: how many fit at once
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(8, 16);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = smem_bytes(8, 6);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 8;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    CK(cudaOccupancyMaxActiveClusters(&clusters, stream_gemm_kernel<8, 6>, &cfg));
    std::printf("clusters of 8 CTAs resident at once (6 stages, 64 tokens): %d\n", clusters);
  }
  const double copy = copy_gbps(s);
  std::printf("device %s, %d SMs; copy bandwidth %.0f GB/s (read + written); %d weight copies a shape; programmatic launches %s\n",
              prop.name, prop.multiProcessorCount, copy, layers, programmatic_launch_supported() ? "on" : "unsupported");
  LtGemm lt_heur(/*autotune=*/false), lt_tuned(/*autotune=*/true);
  constexpr int kMaxM = 64;
  struct Wshape {
    const char* what;
    long long n;
    int k;
  };
  bool all_ok = true;
  for (const Wshape ws : {Wshape{"attention output 2048 x 2048", 2048, 2048}, Wshape{"QKV, GQA 8 KV heads: 3072 x 2048", 3072, 2048},
                          Wshape{"QKV, MHA: 6144 x 2048", 6144, 2048}, Wshape{"gate + up 11264 x 2048", 11264, 2048},
                          Wshape{"down 2048 x 5632", 2048, 5632}}) {
    const int copies = ws.n * ws.k > 20'000'000 ? std::max(2, layers / 2) : layers;
    const int split = pick_split(ws.n, ws.k, prop.multiProcessorCount);
    std::vector<DeviceBuffer<__nv_bfloat16>> w(static_cast<std::size_t>(copies));
    unsigned seed = 1;
    for (auto& b : w) {
      b.resize(static_cast<std::size_t>(ws.n * ws.k));
      fill<<<1024, 256, 0, s>>>(b.get(), ws.n, ws.k, 0.02f, -1, 0.0f, seed++);
    }
    DeviceBuffer<__nv_bfloat16> x(static_cast<std::size_t>(kMaxM * ws.k));
    fill<<<64, 256, 0, s>>>(x.get(), kMaxM, ws.k, 1.0f, -1, 0.0f, 99);
    const std::size_t out_elems = static_cast<std::size_t>(kMaxM * ws.n);
    DeviceBuffer<__nv_bfloat16> out(out_elems), out64(out_elems), ref(out_elems), ref2(out_elems);
    const double bytes = 2.0 * static_cast<double>(ws.n) * ws.k;
    std::printf("\n%s (%.1f MB a copy, %d copies; %d CTAs, K split %d)\n%4s %12s %8s %7s %12s %8s %12s %8s  %s\n", ws.what,
                bytes / 1e6, copies, static_cast<int>(ws.n / kBN) * split, split, "M", "stream us", "GB/s", "of copy",
                "Lt heur. us", "GB/s", "Lt tuned us", "GB/s", "checks");
    const auto lt_run = [&](LtGemm& lt, int m, const __nv_bfloat16* wp, __nv_bfloat16* o) {
      lt.run({m, ws.n, ws.k, ws.k, ws.k, ws.n}, wp, x.get(), o, s);
    };
    // Every token's bits at M = 64: the batch-independence reference.
    CK(cudaMemsetAsync(out64.get(), 0xFF, out64.bytes(), s));
    launch_stream_gemm(x.get(), kMaxM, w[0].get(), ws.n, ws.k, out64.get(), split, s);
    CK(cudaStreamSynchronize(s));
    std::vector<unsigned short> h64(out_elems), hout(out_elems), href(out_elems), href2(out_elems);
    CK(cudaMemcpy(h64.data(), out64.get(), out64.bytes(), cudaMemcpyDeviceToHost));
    std::vector<unsigned short> hx(static_cast<std::size_t>(kMaxM * ws.k)), hw(static_cast<std::size_t>(ws.n * ws.k));
    CK(cudaMemcpy(hx.data(), x.get(), hx.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hw.data(), w[0].get(), hw.size() * 2, cudaMemcpyDeviceToHost));
    // Whether bf16 bits y are within the bound of token t's float64 sum at column j (of w[0]).
    const auto within = [&](int t, long long j, unsigned short y) {
      const ExactDot e =
          exact_dot(hx.data() + static_cast<std::size_t>(t) * ws.k, hw.data() + static_cast<std::size_t>(j) * ws.k, ws.k);
      return within_dot_bound(bf16_to_float(y), e, ws.k, /*bf16_out=*/true);
    };
    for (const int m : {17, 32, 48, 64}) {
      for (auto* b : {&out, &ref, &ref2}) CK(cudaMemsetAsync(b->get(), 0xFF, b->bytes(), s));  // NaN: a skipped write shows
      launch_stream_gemm(x.get(), m, w[0].get(), ws.n, ws.k, out.get(), split, s);
      lt_run(lt_heur, m, w[0].get(), ref.get());
      lt_run(lt_tuned, m, w[0].get(), ref2.get());
      CK(cudaStreamSynchronize(s));
      CK(cudaMemcpy(hout.data(), out.get(), out.bytes(), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(href.data(), ref.get(), ref.bytes(), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(href2.data(), ref2.get(), ref2.bytes(), cudaMemcpyDeviceToHost));
      // The rows past M stay poisoned (nothing writes them) and rows below M have the bits of M = 64.
      const std::size_t mn = static_cast<std::size_t>(m) * ws.n;
      const bool same = std::memcmp(hout.data(), h64.data(), mn * 2) == 0;
      bool untouched = true;
      for (std::size_t i = mn; i < out_elems && untouched; ++i) untouched = hout[i] == 0xFFFF;
      long long bad[3] = {0, 0, 0};  // stream, Lt heur., Lt tuned: sampled outputs outside the bound
      for (int t = 0; t < m; ++t)
        for (long long j = t % 5; j < ws.n; j += 5) {
          const std::size_t at = static_cast<std::size_t>(t * ws.n + j);
          const std::vector<unsigned short>* h[3] = {&hout, &href, &href2};
          for (int f = 0; f < 3; ++f) bad[f] += !within(t, j, (*h[f])[at]);
        }
      std::string outside;
      const char* names[3] = {"stream", "Lt heur.", "Lt tuned"};
      for (int f = 0; f < 3; ++f)
        if (bad[f]) outside += std::string(outside.empty() ? "" : ", ") + names[f] + " " + std::to_string(bad[f]);
      const bool ok = same && untouched && outside.empty();
      all_ok = all_ok && ok;
      double us[3] = {};
      {
        const ProgrammaticLaunch programmatic(programmatic_launch_supported());
        us[0] = time_graph(s, 30, copies, [&] {
          for (const auto& b : w) launch_stream_gemm(x.get(), m, b.get(), ws.n, ws.k, out.get(), split, s);
        });
      }
      // The timing graph's programmatic launches left the last copy's product in out: a plain launch's bits.
      launch_stream_gemm(x.get(), m, w.back().get(), ws.n, ws.k, ref.get(), split, s);
      CK(cudaStreamSynchronize(s));
      CK(cudaMemcpy(hout.data(), out.get(), out.bytes(), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(href.data(), ref.get(), ref.bytes(), cudaMemcpyDeviceToHost));
      const bool pdl_same = std::memcmp(hout.data(), href.data(), mn * 2) == 0;
      all_ok = all_ok && pdl_same;
      us[1] = time_graph(s, 30, copies, [&] {
        for (const auto& b : w) lt_run(lt_heur, m, b.get(), ref.get());
      });
      us[2] = time_graph(s, 30, copies, [&] {
        for (const auto& b : w) lt_run(lt_tuned, m, b.get(), ref2.get());
      });
      std::printf("%4d %12.2f %8.0f %6.0f%% %12.2f %8.0f %12.2f %8.0f  %s%s%s%s\n", m, us[0], bytes / us[0] / 1e3,
                  100.0 * bytes / us[0] / 1e3 / copy, us[1], bytes / us[1] / 1e3, us[2], bytes / us[2] / 1e3,
                  same ? "bits = at M 64" : "BITS DIFFER from M 64", untouched ? "" : ", ROWS PAST M WRITTEN",
                  outside.empty() ? ", within the bound" : (", OUTSIDE THE BOUND: " + outside).c_str(),
                  pdl_same ? "" : ", PROGRAMMATIC LAUNCHES' BITS DIFFER");
    }
    // At 64 rows: each split and stage count, µs a launch, against the float64 sums (a sample).
    std::printf("  sweep at M 64, µs a launch (GB/s), split x stages:");
    for (const int sp : {1, 2, 4, 8})
      for (const int st : {4, 6}) {
        if ((ws.k / kBK) / sp < st) continue;  // fewer blocks a rank than stages
        CK(cudaMemsetAsync(out.get(), 0xFF, out.bytes(), s));
        launch_stream_gemm(x.get(), kMaxM, w[0].get(), ws.n, ws.k, out.get(), sp, s, st);
        CK(cudaStreamSynchronize(s));
        CK(cudaMemcpy(hout.data(), out.get(), out.bytes(), cudaMemcpyDeviceToHost));
        long long bad = 0;
        for (int t = 0; t < kMaxM; t += 7)
          for (long long j = t % 11; j < ws.n; j += 11) bad += !within(t, j, hout[static_cast<std::size_t>(t * ws.n + j)]);
        all_ok = all_ok && bad == 0;
        const ProgrammaticLaunch programmatic(programmatic_launch_supported());
        const double t_us = time_graph(s, 30, copies, [&] {
          for (const auto& b : w) launch_stream_gemm(x.get(), kMaxM, b.get(), ws.n, ws.k, out.get(), sp, s, st);
        });
        std::printf("  %dx%d %.2f (%.0f)%s", sp, st, t_us, bytes / t_us / 1e3, bad ? " OUTSIDE THE BOUND" : "");
      }
    std::printf("\n");
  }
  std::printf("\nchecks: %s\n", all_ok ? "pass" : "FAIL");
  return all_ok ? 0 : 1;
}
