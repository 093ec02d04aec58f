// twell_probe_l2: how fast the SMs can pull random 4 KB weight rows out of L2, against how many
// bytes each SM keeps in flight. The token-major kernels (the fused up+down, the training forward
// and backward) read one 4 KB row (K = 2048 bf16) per non-zero at random, and measured faster
// with more warps per SM (lab/notes/2026-11-cuda-perf-log.md, twelfth session): this probe says where the
// ceiling is and whether bulk copies (cp.async.bulk into a shared-memory ring, rows in flight
// costing no registers) get closer to it than loads through registers.
//   twell_probe_l2 [reps]        (default 10; prints nothing to time without a GPU)
// Each CTA (128 threads, as the kernels at K = 2048) reads kRowsPerCta rows chosen by a hash of
// (CTA, index) from a buffer of `rows` rows and folds them into a checksum; 16384 CTAs per launch.
// Resident CTAs per SM are set by padding the dynamic shared memory and reported as measured by
// the occupancy API. Rates: bytes the CTAs read / time (medians of `reps` launches, L2 warm).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda/sm90/hopper_ptx.cuh"

namespace {

constexpr int kRowBytes = 4096;
constexpr int kThreads = 128;      // two 16-byte chunks of a row per thread
constexpr int kRowsPerCta = 32;    // ≈ a token's non-zeros at 0.5 % of N = 5632 (28)
constexpr unsigned kCtas = 16384;  // M = 16384 tokens

__device__ __forceinline__ std::uint32_t row_of(std::uint32_t cta, std::uint32_t j, std::uint32_t rows) {
  std::uint32_t h = cta * 0x9E3779B9u + j * 0x85EBCA6Bu;
  h ^= h >> 15;
  h *= 0x2C1B3C6Du;
  h ^= h >> 12;
  return h % rows;
}

__device__ __forceinline__ std::uint32_t fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

// Loads through registers: U rows in flight per thread (2·U 16-byte loads), as the kernels do.
template <int U>
__global__ void __launch_bounds__(kThreads) lsu_rows(const uint4* w, std::uint32_t rows, std::uint32_t* out) {
  std::uint32_t acc = 0;  // (the dynamic shared memory of the launch only sets the occupancy)
  for (int j0 = 0; j0 < kRowsPerCta; j0 += U) {
    uint4 v[U][2];
#pragma unroll
    for (int q = 0; q < U; ++q) {
      const uint4* r = w + static_cast<std::size_t>(row_of(blockIdx.x, j0 + q, rows)) * (kRowBytes / 16);
      v[q][0] = __ldg(r + threadIdx.x);
      v[q][1] = __ldg(r + threadIdx.x + kThreads);
    }
#pragma unroll
    for (int q = 0; q < U; ++q) acc ^= fold(v[q][0]) ^ fold(v[q][1]);
  }
  if (acc == 0x9E3779B9u) out[blockIdx.x] = acc;  // keeps the loads; practically never true
}

// Bulk copies: thread 0 keeps S rows in flight into a ring of S shared-memory slots, each
// completing on its own mbarrier; all threads read a slot once it has landed.
template <int S>
__global__ void __launch_bounds__(kThreads) bulk_rows(const unsigned char* w, std::uint32_t rows, std::uint32_t* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace twell::cuda::sm90;
  extern __shared__ __align__(128) unsigned char ring[];  // S · 4 KB (+ occupancy padding)
  __shared__ __align__(8) std::uint64_t bar[S];
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) mbar_init(smem_u32(&bar[s]), 1);
    mbar_fence_init();
  }
  __syncthreads();
  const auto issue = [&](int j) {
    const int s = j % S;
    const std::uint32_t b = smem_u32(&bar[s]);
    mbar_arrive_expect_tx(b, kRowBytes);
    bulk_load_g2s(smem_u32(ring + s * kRowBytes), w + static_cast<std::size_t>(row_of(blockIdx.x, j, rows)) * kRowBytes,
                  kRowBytes, b);
  };
  if (threadIdx.x == 0)
    for (int j = 0; j < S && j < kRowsPerCta; ++j) issue(j);
  std::uint32_t acc = 0;
  for (int j = 0; j < kRowsPerCta; ++j) {
    const int s = j % S;
    mbar_wait(smem_u32(&bar[s]), static_cast<std::uint32_t>(j / S) & 1u);
    const uint4* r = reinterpret_cast<const uint4*>(ring + s * kRowBytes);
    acc ^= fold(r[threadIdx.x]) ^ fold(r[threadIdx.x + kThreads]);
    __syncthreads();  // every thread has read slot s: it may be refilled
    if (threadIdx.x == 0 && j + S < kRowsPerCta) issue(j + S);
  }
  if (acc == 0x9E3779B9u) out[blockIdx.x] = acc;
#else
  if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = rows + (w != nullptr);  // not built for this GPU
#endif
}

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::printf("probe_l2: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

// Median time (ms) of `reps` launches after two warm-up launches. (Not host::median_ms: this .cu
// builds as C++17 under CMake 3.25.1, see lab/CMakeLists.txt, where the twell headers it
// would pull in do not compile.)
template <typename Launch>
double median_ms(int reps, Launch&& launch) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  launch();
  launch();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a);
    launch();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Dynamic shared memory (≥ need) for `blocks` resident CTAs per SM, and the CTAs per SM it gives.
template <typename Kernel>
std::pair<std::size_t, int> smem_for(Kernel kernel, int blocks, std::size_t need, std::size_t per_sm) {
  std::size_t smem = std::max(need, per_sm / static_cast<std::size_t>(blocks) - 1024 - 256);
  smem = std::min<std::size_t>(smem, 227 * 1024);
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  int got = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&got, kernel, kThreads, smem);
  return {smem, got};
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::stoi(argv[1])) : 10;
  int dev = 0, sms = 0, major = 0, l2 = 0, per_sm = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    std::printf("probe_l2: no GPU; nothing to time\n");
    return 0;
  }
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev);
  cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
  std::uint32_t* out = nullptr;
  unsigned char* w = nullptr;
  const std::size_t max_rows = 11264;  // Wu and Wdᵀ at N = 5632: 46 MB
  if (!ok(cudaMalloc(&w, max_rows * kRowBytes), "cudaMalloc") || !ok(cudaMalloc(&out, kCtas * sizeof(std::uint32_t)), "cudaMalloc"))
    return 1;
  cudaMemset(w, 0x3c, max_rows * kRowBytes);
  const double bytes = static_cast<double>(kCtas) * kRowsPerCta * kRowBytes;
  std::printf("%d SMs, L2 %d MB; %u CTAs × %d random 4 KB rows (%.2f GB) per launch\n", sms, l2 >> 20, kCtas, kRowsPerCta,
              bytes * 1e-9);
  std::printf("%-6s %8s %9s %12s %14s %9s %8s\n", "mode", "buffer", "CTAs/SM", "rows/thread", "in flight/SM", "ms", "TB/s");
  for (const std::size_t rows : {max_rows, std::size_t{4096}}) {  // 46 MB (the weights), 16 MB
    const auto r32 = static_cast<std::uint32_t>(rows);
    auto lsu = [&](auto u, int blocks) {
      constexpr int U = decltype(u)::value;
      const std::pair<std::size_t, int> sg = smem_for(lsu_rows<U>, blocks, 16, static_cast<std::size_t>(per_sm));
      const std::size_t smem = sg.first;
      const int got = sg.second;
      const double ms = median_ms(reps, [&] {
        lsu_rows<U><<<kCtas, kThreads, smem>>>(reinterpret_cast<const uint4*>(w), r32, out);
      });
      std::printf("%-6s %5zu MB %9d %12d %11d KB %9.3f %8.2f\n", "lsu", rows * kRowBytes >> 20, got, U, got * U * kRowBytes / 1024,
                  ms, bytes / ms * 1e-9);
    };
    auto bulk = [&](auto sl, int blocks) {
      constexpr int S = decltype(sl)::value;
      const std::pair<std::size_t, int> sg =
          smem_for(bulk_rows<S>, blocks, static_cast<std::size_t>(S) * kRowBytes, static_cast<std::size_t>(per_sm));
      const std::size_t smem = sg.first;
      const int got = sg.second;
      const double ms = median_ms(reps, [&] { bulk_rows<S><<<kCtas, kThreads, smem>>>(w, r32, out); });
      std::printf("%-6s %5zu MB %9d %12d %11d KB %9.3f %8.2f\n", "bulk", rows * kRowBytes >> 20, got, S, got * S * kRowBytes / 1024,
                  ms, bytes / ms * 1e-9);
    };
    using I2 = std::integral_constant<int, 2>;
    using I4 = std::integral_constant<int, 4>;
    using I8 = std::integral_constant<int, 8>;
    using I16 = std::integral_constant<int, 16>;
    for (int blocks : {4, 6, 8, 16}) {
      lsu(I2{}, blocks);
      lsu(I4{}, blocks);
      lsu(I8{}, blocks);
    }
    if (major >= 9)
      for (int blocks : {2, 4, 6, 8}) {
        bulk(I4{}, blocks);
        bulk(I8{}, blocks);
        if (blocks <= 2) bulk(I16{}, blocks);
      }
    if (!ok(cudaDeviceSynchronize(), "launch")) return 1;
  }
  cudaFree(w);
  cudaFree(out);
  return 0;
}
