// twell_probe_step_chain: what a kernel boundary costs inside a decode step, and what one persistent
// kernel with grid barriers instead would buy (docs/runtime.md, "Where a decode step's time goes",
// plan step 1). A layer is a list of phases, each streaming one weight of B MB that no kernel writes;
// each phase depends on the one before (a CTA folds another CTA's result of the previous phase into
// its own, read after the wait or the barrier). `layers` layers lie side by side (together past the
// L2), read in turn. Forms, each timed as µs a layer:
//   kernels        one kernel a phase on the persistent kernel's grid (the SMs × the CTAs an SM that
//                  every form fits, 4 at its 62 registers: one full wave), launched
//                  programmatically in a CUDA graph: a kernel waits for the previous one
//                  (griddepcontrol.wait), then lets the next one be scheduled (as twell's kernels do);
//   kernels+early  the same, each kernel's first window of loads issued before its wait (allowed:
//                  no kernel writes the weights), as twell's GEMV does with w_before_wait;
//   persistent     one cooperative kernel for all layers, the same CTAs; a grid barrier between phases;
//   persistent+pf  the same, each thread asking L2 for its first window of the next phase before it
//                  enters the barrier;
//   stream         the persistent kernel with no barrier and no dependency: the bytes alone.
// Printed: µs a layer, the read bandwidth, its share of the copy bandwidth measured in the same
// process (HBM traffic both), and the cost a phase boundary above `stream` ((t − t_stream) / phases).
// Check: in every form CTA b's result of phase p is the XOR of its words of phase p and (added once,
// by thread 0) CTA (b + 1) mod G's result of phase p − 1, so the last phase's results chain through
// every word of every phase; each form's must equal the `kernels` form's (stream-ordered). Each form
// runs once on results zeroed just before it: a word skipped, or a dependency read before the
// barrier released it (a zero), changes them.
//   twell_probe_step_chain [layers [MB,MB,...]]   (defaults: 8 and the two presets below)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cuda/common/launch.cuh"
#include "probe_graph.cuh"

using namespace twell::cuda;
using namespace twell::probe;

namespace {

constexpr int kThreads = 256;
constexpr int kWin = 8;  // 16-byte loads a thread has in flight

__device__ __forceinline__ unsigned fold(const uint4& v) { return v.x ^ v.y ^ v.z ^ v.w; }

// Words i, i + s, …, i + (kWin − 1)·s of w below n (zeros past n).
__device__ __forceinline__ void load_window(uint4 (&v)[kWin], const uint4* w, long long i, long long s, long long n) {
#pragma unroll
  for (int j = 0; j < kWin; ++j) v[j] = i + j * s < n ? __ldcs(w + i + j * s) : make_uint4(0, 0, 0, 0);
}

// XOR of w's words from i on, stride s (a grid-stride stream), the first window already in v.
__device__ __forceinline__ unsigned stream_rest(uint4 (&v)[kWin], const uint4* w, long long i, long long s, long long n) {
  unsigned acc = 0;
  for (;;) {
#pragma unroll
    for (int j = 0; j < kWin; ++j) acc ^= fold(v[j]);
    i += kWin * s;
    if (i >= n) return acc;
    load_window(v, w, i, s, n);
  }
}

// The CTA's XOR of its threads' values, stored by thread 0.
__device__ __forceinline__ void store_fold(unsigned acc, unsigned* out) {
  __shared__ unsigned red[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned a = 0;
    for (int w = 0; w < kThreads / 32; ++w) a ^= red[w];
    *out = a;
  }
  __syncthreads();  // red is reused by the next phase (persistent kernel)
}

// One phase as its own kernel: streams w [n words], folds in CTA (b + 1) mod G's result of the
// previous phase (prev, null for the first), stores its result in out[blockIdx.x].
template <bool kEarly>
__global__ void __launch_bounds__(kThreads) phase_kernel(const uint4* w, long long n, const unsigned* prev, unsigned* out) {
  const long long s = static_cast<long long>(gridDim.x) * kThreads, i = blockIdx.x * static_cast<long long>(kThreads) + threadIdx.x;
  uint4 v[kWin];
  if (kEarly) load_window(v, w, i, s, n);
  dev::pdl_begin();
  if (!kEarly) load_window(v, w, i, s, n);
  unsigned acc = threadIdx.x == 0 && prev ? __ldcg(prev + (blockIdx.x + 1) % gridDim.x) : 0u;  // once a CTA
  acc ^= stream_rest(v, w, i, s, n);
  store_fold(acc, out + blockIdx.x);
}

// All CTAs resident (a cooperative launch): a sense-counting barrier on bar[0] (arrivals) and
// bar[1] (the generation). Thread 0 of each CTA arrives; the last one resets the count and starts
// the next generation; the others spin on it.
__device__ __forceinline__ void grid_barrier(unsigned* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned* gen = bar + 1;
    const unsigned my = *gen;
    __threadfence();
    if (atomicAdd(bar, 1u) == gridDim.x - 1) {
      bar[0] = 0;
      __threadfence();
      atomicAdd(bar + 1, 1u);
    } else {
      while (*gen == my) {
      }
    }
    __threadfence();
  }
  __syncthreads();
}

// Every phase of every layer in one kernel: phase p streams base[off[p], off[p + 1]). kBarrier: a
// grid barrier between phases and the dependency on CTA (b + 1) mod G's previous result; kPrefetch:
// the next phase's first window asked of L2 before the barrier (one thread a 128-byte line).
template <bool kBarrier, bool kPrefetch>
__global__ void __launch_bounds__(kThreads) persistent_kernel(const uint4* base, const long long* off, int phases,
                                                               unsigned* out, unsigned* bar) {
  const long long s = static_cast<long long>(gridDim.x) * kThreads, i = blockIdx.x * static_cast<long long>(kThreads) + threadIdx.x;
  for (int p = 0; p < phases; ++p) {
    const uint4* w = base + off[p];
    const long long n = off[p + 1] - off[p];
    uint4 v[kWin];
    load_window(v, w, i, s, n);
    unsigned acc = kBarrier && p > 0 && threadIdx.x == 0  // once a CTA
                       ? __ldcg(out + static_cast<long long>(p - 1) * gridDim.x + (blockIdx.x + 1) % gridDim.x)
                       : 0u;
    acc ^= stream_rest(v, w, i, s, n);
    store_fold(acc, out + static_cast<long long>(p) * gridDim.x + blockIdx.x);
    if (kPrefetch && p + 1 < phases && i % 8 == 0) {
      const uint4* wn = base + off[p + 1];
      const long long nn = off[p + 2] - off[p + 1];
#pragma unroll
      for (int j = 0; j < kWin; ++j)
        if (i + j * s < nn) asm volatile("prefetch.global.L2 [%0];" ::"l"(wn + i + j * s));
    }
    if (kBarrier && p + 1 < phases) grid_barrier(bar);
  }
}

std::vector<double> parse_mb(const char* arg) {
  std::vector<double> v;
  for (const char* c = arg; *c;) {
    char* end = nullptr;
    const double x = std::strtod(c, &end);
    if (end == c || !(x > 0)) return {};
    v.push_back(x);
    c = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') return {};
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  const int layers = argc > 1 ? std::atoi(argv[1]) : 8;
  struct Preset {
    std::string name;
    std::vector<double> mb;
  };
  std::vector<Preset> presets;
  if (argc > 2) {
    presets.push_back({std::string("custom ") + argv[2], parse_mb(argv[2])});
  } else {
    // The 2B's batch-1 layer at context 513 as twell runs it: QKV, the attention's KV (32 heads,
    // 513 keys), the output projection, the gate, then up and down (dense: whole; sparse at 0.5 %:
    // 28 rows of 4 KB each).
    presets.push_back({"2B dense layer (QKV, KV, O, gate, up, down)", {25.17, 4.2, 8.39, 23.07, 23.07, 23.07}});
    presets.push_back({"2B sparse layer (QKV, KV, O, gate, active up, active down)", {25.17, 4.2, 8.39, 23.07, 0.115, 0.115}});
  }
  if (layers < 1 || presets[0].mb.empty()) {
    std::fprintf(stderr, "usage: twell_probe_step_chain [layers ≥ 1 [MB,MB,... (each > 0)]]\n");
    return 2;
  }
  int dev_count = 0;
  if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
    std::fprintf(stderr, "twell_probe_step_chain: no CUDA device\n");
    return 0;
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  int coop = 0;
  CK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, 0));
  const double copy = copy_gbps(s);
  std::printf("device %s, %d SMs, L2 %.0f MB; copy bandwidth %.0f GB/s (read + written); %d layers a replay\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize / 1e6, copy, layers);
  // One grid for every form: the CTAs an SM that the persistent kernel fits (all resident).
  int occ = 1 << 30;
  const auto fits = [&](const void* kernel) {
    int o = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, kernel, kThreads, 0));
    occ = std::min(occ, o);
  };
  fits(reinterpret_cast<const void*>(persistent_kernel<true, true>));
  fits(reinterpret_cast<const void*>(persistent_kernel<true, false>));
  fits(reinterpret_cast<const void*>(persistent_kernel<false, false>));
  fits(reinterpret_cast<const void*>(phase_kernel<true>));
  fits(reinterpret_cast<const void*>(phase_kernel<false>));
  const int grid = prop.multiProcessorCount * occ;
  bool ok = true;
  for (const Preset& pr : presets) {
    const int per = static_cast<int>(pr.mb.size()), phases = per * layers;
    std::vector<long long> off(static_cast<std::size_t>(phases + 2), 0);
    for (int p = 0; p < phases; ++p)
      off[static_cast<std::size_t>(p + 1)] = off[static_cast<std::size_t>(p)] + static_cast<long long>(pr.mb[static_cast<std::size_t>(p % per)] * 1e6 / 16);
    off[static_cast<std::size_t>(phases + 1)] = off[static_cast<std::size_t>(phases)];  // the prefetch's "next" past the last
    const long long words = off[static_cast<std::size_t>(phases)];
    const double layer_bytes = 16.0 * static_cast<double>(words) / layers;
    uint4* base = nullptr;
    CK(cudaMalloc(&base, static_cast<std::size_t>(words) * 16));
    // Words of pseudo-random bits (the weights' values do not matter, only that skipped words show).
    fill<<<1024, 256, 0, s>>>(reinterpret_cast<__nv_bfloat16*>(base), words, 8, 1.0f, -1, 0.0f, 5);
    CK(cudaGetLastError());
    long long* d_off = nullptr;
    unsigned *out = nullptr, *bar = nullptr;
    CK(cudaMalloc(&d_off, off.size() * sizeof(long long)));
    CK(cudaMemcpy(d_off, off.data(), off.size() * sizeof(long long), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&out, static_cast<std::size_t>(phases) * grid * sizeof(unsigned)));
    CK(cudaMalloc(&bar, 2 * sizeof(unsigned)));
    CK(cudaMemset(bar, 0, 2 * sizeof(unsigned)));
    const auto kernels = [&](bool early) {
      for (int p = 0; p < phases; ++p) {
        const unsigned* prev = p ? out + static_cast<long long>(p - 1) * grid : nullptr;
        unsigned* o = out + static_cast<long long>(p) * grid;
        const long long n = off[static_cast<std::size_t>(p + 1)] - off[static_cast<std::size_t>(p)];
        if (early)
          launch_kernel(phase_kernel<true>, dim3(grid), dim3(kThreads), 0, s, base + off[static_cast<std::size_t>(p)], n, prev, o);
        else
          launch_kernel(phase_kernel<false>, dim3(grid), dim3(kThreads), 0, s, base + off[static_cast<std::size_t>(p)], n, prev, o);
      }
    };
    // cooperative: all CTAs resident, which the grid barrier needs (the barrier-free stream does not).
    const auto persistent = [&](auto kernel, bool cooperative = true) {
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(grid);
      cfg.blockDim = dim3(kThreads);
      cfg.stream = s;
      cudaLaunchAttribute attr{};
      attr.id = cudaLaunchAttributeCooperative;
      attr.val.cooperative = 1;
      cfg.attrs = &attr;
      cfg.numAttrs = cooperative ? 1 : 0;
      CK(cudaLaunchKernelEx(&cfg, kernel, static_cast<const uint4*>(base), static_cast<const long long*>(d_off), phases, out, bar));
    };
    // One run of a form on zeroed results; its last phase's CTA results (each chains through every phase).
    const auto checked = [&](const std::function<void()>& body) {
      CK(cudaMemsetAsync(out, 0, static_cast<std::size_t>(phases) * grid * sizeof(unsigned), s));
      body();
      std::vector<unsigned> h(static_cast<std::size_t>(grid));
      CK(cudaMemcpyAsync(h.data(), out + static_cast<long long>(phases - 1) * grid, h.size() * sizeof(unsigned),
                         cudaMemcpyDeviceToHost, s));
      CK(cudaStreamSynchronize(s));
      return h;
    };
    // µs a layer of body (one launch for every layer), after one launch to warm up.
    const auto time_events = [&](int reps, const std::function<void()>& body) {
      body();
      return 1000.0 * elapsed_ms(s, [&] {
               for (int r = 0; r < reps; ++r) body();
             }) /
             (reps * layers);
    };
    std::printf("\n%s: %.1f MB a layer in %d phases; a grid of %d CTAs (%d an SM)\n", pr.name.c_str(), layer_bytes / 1e6, per,
                grid, occ);
    std::printf("%-16s %10s %9s %8s %22s  %s\n", "form", "us/layer", "GB/s", "of copy", "us a boundary > stream", "check");
    struct Row {
      const char* name;
      double us;
      std::vector<unsigned> fold;
    };
    std::vector<Row> rows;
    {
      const ProgrammaticLaunch programmatic(programmatic_launch_supported());
      std::vector<unsigned> f = checked([&] { kernels(false); });
      rows.push_back({"kernels", time_graph(s, 20, layers, [&] { kernels(false); }), f});
      f = checked([&] { kernels(true); });
      rows.push_back({"kernels+early", time_graph(s, 20, layers, [&] { kernels(true); }), f});
    }
    if (coop) {
      std::vector<unsigned> f = checked([&] { persistent(persistent_kernel<true, false>); });
      rows.push_back({"persistent", time_events(20, [&] { persistent(persistent_kernel<true, false>); }), f});
      f = checked([&] { persistent(persistent_kernel<true, true>); });
      rows.push_back({"persistent+pf", time_events(20, [&] { persistent(persistent_kernel<true, true>); }), f});
    }
    const double t_stream = time_events(20, [&] { persistent(persistent_kernel<false, false>, false); });
    for (const Row& r : rows) {
      const bool same = r.fold == rows[0].fold;
      ok = ok && same;
      std::printf("%-16s %10.2f %9.0f %7.0f%% %22.2f  %s\n", r.name, r.us, layer_bytes / r.us / 1e3, 100.0 * layer_bytes / r.us / 1e3 / copy,
                  (r.us - t_stream) / per, same ? "same fold as kernels" : "FOLD DIFFERS");
    }
    std::printf("%-16s %10.2f %9.0f %7.0f%% %22s  %s\n", "stream", t_stream, layer_bytes / t_stream / 1e3,
                100.0 * layer_bytes / t_stream / 1e3 / copy, "-", "(no dependency: not checked)");
    if (!coop) std::printf("(no cooperative launch on this device: the persistent forms are left out)\n");
    CK(cudaFree(base));
    CK(cudaFree(d_off));
    CK(cudaFree(out));
    CK(cudaFree(bar));
  }
  std::printf("\nchecks: %s\n", ok ? "pass" : "FAIL");
  return ok ? 0 : 1;
}
