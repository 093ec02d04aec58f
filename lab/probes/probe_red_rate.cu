// twell_probe_red_rate: how long an active neuron's down terms take in the fixed-point one-token
// FFN, and what bounds them. The phase stamps (session 73) read 7.3 µs from a fired warp's up row to
// its last reduction issued, whether 1 or 8 warps of its CTA fire; starting the warps at different
// columns changed nothing (the rotation A/B). Here W warps each walk a bf16 row of k columns (L2-hot)
// and add h · w into int64 accumulators, as cuda/common/fixed_point.cuh does, with nothing else
// running:
//   fixed-term  the form up to session 73, kept here: each term converted and reduced in turn
//               (fixed_add: a test and a branch a term), into one shared int64 [k]
//   fixed       dev::fixed_add_step as the tree has it, into one shared int64 [k]
//   fixed-own   the same, each warp its own int64 [k] (no address shared between warps)
//   fixed-st    the same terms, stored (st.global, each warp its own [k]): the walk without reductions
//   f32         red.global.add.f32 of the same terms into one shared float [k]
// For each (mode, CTAs, fired warps a CTA): the median and the largest, over the warps and launches,
// of the µs (globaltimer) from a warp's start to its last reduction issued, and the launch's length
// (events, an average over back-to-back launches: the reductions performed, plus the launch).
// Lane 0 stamps; the warps that do not fire exit at once. No fence follows the reductions: with
// one, ptxas emits them as ATOMG (a returning atomic) rather than REDG, which the kernel issues.
//   twell_probe_red_rate [k [launches]]   (defaults 2048 200)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/common/fixed_point.cuh"

namespace {

namespace dev = twell::cuda::dev;

#define CHECK(x)                                                                               \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

enum Mode { kFixedTerm, kFixed, kFixedOwn, kFixedSt, kF32, kModes };
const char* const kModeName[kModes] = {"fixed-term", "fixed", "fixed-own", "fixed-st", "f32"};

constexpr int kThreads = 256, kWarps = kThreads / 32, kWin = 8;

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

struct Params {
  const __nv_bfloat16* w;  // [warps][k], warp i's row
  long long* acc;          // [warps][k] (fixed-own, fixed-st) or [k]
  float* accf;             // [k]
  int k, fired;            // fired warps a CTA
  float limit;             // fixed_term_limit(5632), the 2B's N
  unsigned long long* t;   // [warps][2]: start, issued
  unsigned* overflow;
};

template <int kMode>
__global__ void __launch_bounds__(kThreads) red_kernel(Params p) {
  const int lane = threadIdx.x % 32, wi = threadIdx.x / 32;
  if (wi >= p.fired) return;
  const int warp = blockIdx.x * p.fired + wi;
  __shared__ float s_terms[kWarps][32 * 8];
  float* terms = s_terms[wi];
  const float h = 0.75f, limit = p.limit;
  const uint4* dr = reinterpret_cast<const uint4*>(p.w + static_cast<long long>(warp) * p.k);
  const int kchunks = p.k / 8;
  long long* acc = kMode == kFixed || kMode == kFixedTerm ? p.acc : p.acc + static_cast<long long>(warp) * p.k;
  __syncwarp();
  const unsigned long long t0 = now_ns();
  bool in_range = true;
  dev::down_row_steps<kWin>(dr, kchunks, lane, [&](int step0, const float(&wf)[8]) {
    const long long col0 = 8ll * step0;
    if constexpr (kMode == kFixed || kMode == kFixedOwn) {
      in_range &= dev::fixed_add_step(acc, col0, p.k, h, wf, terms, lane, limit);
    } else {
      __syncwarp();
#pragma unroll
      for (int e = 0; e < 8; ++e) terms[8 * lane + e] = h * wf[e];
      __syncwarp();
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const long long col = col0 + 32 * e + lane;
        if (col >= p.k) continue;
        const float t = terms[32 * e + lane];
        if constexpr (kMode == kF32) {
          atomicAdd(p.accf + col, t);
        } else if constexpr (kMode == kFixedSt) {
          acc[col] = __float2ll_rn(t * 0x1p32f);
        } else {  // kFixedTerm: fixed_add up to session 73
          if (!(fabsf(t) < limit)) {
            in_range = false;
            continue;
          }
          atomicAdd(reinterpret_cast<unsigned long long*>(acc + col), static_cast<unsigned long long>(__float2ll_rn(t * 0x1p32f)));
        }
      }
    }
  });
  __syncwarp();
  const unsigned long long t1 = now_ns();
  if (!in_range) atomicOr(p.overflow, 1u);
  if (lane == 0) {
    p.t[2 * warp] = t0;
    p.t[2 * warp + 1] = t1;
  }
}

template <int kMode>
void launch(const Params& p, int ctas, cudaStream_t s) {
  red_kernel<kMode><<<ctas, kThreads, 0, s>>>(p);
}

void launch_mode(int mode, const Params& p, int ctas, cudaStream_t s) {
  switch (mode) {
    case kFixedTerm: launch<kFixedTerm>(p, ctas, s); break;
    case kFixed: launch<kFixed>(p, ctas, s); break;
    case kFixedOwn: launch<kFixedOwn>(p, ctas, s); break;
    case kFixedSt: launch<kFixedSt>(p, ctas, s); break;
    default: launch<kF32>(p, ctas, s); break;
  }
}

double pct(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * (v.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  const int k = argc > 1 ? std::atoi(argv[1]) : 2048;
  const int launches = argc > 2 ? std::atoi(argv[2]) : 200;
  if (k <= 0 || k % 256 != 0 || launches <= 0) {
    std::fprintf(stderr, "usage: twell_probe_red_rate [k (a multiple of 256) [launches]]\n");
    return 2;
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# twell_probe_red_rate on %s (%d SMs), k = %d, %d launches a row\n\n", prop.name,
              prop.multiProcessorCount, k, launches);
  const int kMaxWarps = 64 * kWarps;
  std::vector<__nv_bfloat16> hw(static_cast<size_t>(kMaxWarps) * k);
  unsigned x = 12345u;
  for (auto& v : hw) {
    x = x * 1664525u + 1013904223u;
    v = __float2bfloat16((static_cast<float>(x >> 8) / 16777216.0f - 0.5f) * 0.01f);
  }
  Params p{};
  __nv_bfloat16* w;
  CHECK(cudaMalloc(&w, hw.size() * sizeof(__nv_bfloat16)));
  CHECK(cudaMemcpy(w, hw.data(), hw.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
  p.w = w;
  CHECK(cudaMalloc(&p.acc, static_cast<size_t>(kMaxWarps) * k * sizeof(long long)));
  CHECK(cudaMalloc(&p.accf, static_cast<size_t>(k) * sizeof(float)));
  CHECK(cudaMalloc(&p.t, static_cast<size_t>(kMaxWarps) * 2 * sizeof(unsigned long long)));
  CHECK(cudaMalloc(&p.overflow, sizeof(unsigned)));
  CHECK(cudaMemset(p.acc, 0, static_cast<size_t>(kMaxWarps) * k * sizeof(long long)));
  CHECK(cudaMemset(p.accf, 0, static_cast<size_t>(k) * sizeof(float)));
  CHECK(cudaMemset(p.overflow, 0, sizeof(unsigned)));
  p.k = k;
  p.limit = twell::cuda::fixed_term_limit(5632);
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  struct Shape {
    int ctas, fired;
  };
  const Shape shapes[] = {{1, 1}, {1, 8}, {4, 1}, {4, 7}, {28, 1}, {8, 8}, {64, 8}};
  std::printf("| mode | CTAs × fired warps | warps | issued, µs: median | max | launch, µs (events) |\n");
  std::printf("|---|---|---:|---:|---:|---:|\n");
  for (int mode = 0; mode < kModes; ++mode) {
    for (const Shape& sh : shapes) {
      p.fired = sh.fired;
      const int warps = sh.ctas * sh.fired;
      for (int i = 0; i < 10; ++i) launch_mode(mode, p, sh.ctas, s);  // rows into L2
      CHECK(cudaStreamSynchronize(s));
      std::vector<double> issued;
      std::vector<unsigned long long> t(static_cast<size_t>(warps) * 2);
      for (int i = 0; i < launches; ++i) {
        launch_mode(mode, p, sh.ctas, s);
        CHECK(cudaMemcpyAsync(t.data(), p.t, t.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        for (int wi = 0; wi < warps; ++wi) issued.push_back((t[2 * wi + 1] - t[2 * wi]) * 1e-3);
      }
      CHECK(cudaEventRecord(e0, s));
      for (int i = 0; i < launches; ++i) launch_mode(mode, p, sh.ctas, s);
      CHECK(cudaEventRecord(e1, s));
      CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, e0, e1));
      CHECK(cudaGetLastError());
      std::printf("| %s | %d × %d | %d | %.2f | %.2f | %.2f |\n", kModeName[mode], sh.ctas, sh.fired, warps,
                  pct(issued, 0.5), pct(issued, 1.0), 1e3 * ms / launches);
    }
  }
  unsigned ov = 0;
  CHECK(cudaMemcpy(&ov, p.overflow, sizeof(unsigned), cudaMemcpyDeviceToHost));
  std::printf("\noverflow flag: %u (0 expected: |h · w| < 0.004 against the limit)\n", ov);
  return ov == 0 ? 0 : 1;
}
