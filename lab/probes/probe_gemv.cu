// twell_probe_gemv: the decode GEMV's shapes against each other (issue 27's decode step: the
// attention output's projection, 2048 × 2048 at 2B, ran at ≈ 1.1 TB/s in a kernel-by-kernel
// profile, the QKV and gate GEMVs near 2 TB/s). For each weight shape, the kernel template
// (cuda/ops/gemv_kernel.cuh) with kRows W rows a warp and kWin chunk steps a load window, at 1 and 8
// tokens: µs a launch and GB/s of W, `layers` weight copies launched in turn (together larger than
// L2: every launch streams W from HBM), captured into a CUDA graph and replayed, with programmatic
// launches on (as the model runtime's decode steps run) and off. Every shape's output is compared
// with the library's (launch_twell_gemv) bit for bit: the shapes differ in speed only.
//   twell_probe_gemv [layers]   (default 16)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda/common/device_buffer.hpp"
#include "cuda/common/launch.hpp"
#include "cuda/ops/gemv.hpp"
#include "cuda/ops/gemv_kernel.cuh"
#include "probe_graph.cuh"

using namespace twell::cuda;
using namespace twell::probe;

namespace {

using Kernel = void (*)(TwellGemvParams);

struct Shape {
  const char* name;
  int rows, win;
  Kernel k1, k8;  // the kernel at MT = 1 and MT = 8
};

template <int R, int W>
Shape shape(const char* name) {
  return {name, R, W, detail::twell_gemv_kernel<1, R, W>, detail::twell_gemv_kernel<8, R, W>};
}

void launch_shape(const Shape& sh, const TwellGemvParams& p, cudaStream_t s) {
  const long long per_cta = static_cast<long long>(detail::kGemvWarps) * sh.rows;
  const dim3 grid(static_cast<unsigned>((p.n + per_cta - 1) / per_cta)), block(detail::kGemvWarps * 32);
  launch_kernel(p.m <= 1 ? sh.k1 : sh.k8, grid, block, 0, s, p);
  CK(cudaGetLastError());
}

}  // namespace

int main(int argc, char** argv) {
  const int layers = argc > 1 ? std::atoi(argv[1]) : 16;
  if (layers < 1) {
    std::fprintf(stderr, "usage: twell_probe_gemv [layers >= 1]\n");
    return 2;
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs; %d weight copies a shape\n", prop.name, prop.multiProcessorCount, layers);
  const std::vector<Shape> shapes = {shape<4, 2>("4 rows, window 2 (library)"), shape<4, 1>("4 rows, window 1"),
                                     shape<2, 2>("2 rows, window 2"),           shape<2, 4>("2 rows, window 4"),
                                     shape<1, 4>("1 row, window 4"),            shape<1, 8>("1 row, window 8")};
  struct Wshape {
    const char* what;
    long long n;
    int k;
  };
  // The synthetic 2B's decode projections (hidden 2048, FFN 5632, 32 heads of 64) and a 1B-like
  // output projection.
  for (const Wshape ws : {Wshape{"attention output 2048 x 2048", 2048, 2048}, Wshape{"QKV 6144 x 2048", 6144, 2048},
                          Wshape{"gate 5632 x 2048", 5632, 2048}, Wshape{"down-like 2048 x 5632", 2048, 5632}}) {
    std::vector<DeviceBuffer<__nv_bfloat16>> w(static_cast<std::size_t>(layers));
    unsigned seed = 1;
    for (auto& b : w) {
      b.resize(static_cast<std::size_t>(ws.n * ws.k));
      fill<<<1024, 256, 0, s>>>(b.get(), ws.n, ws.k, 0.02f, -1, 0.0f, seed++);
    }
    DeviceBuffer<__nv_bfloat16> x(static_cast<std::size_t>(8 * ws.k));
    fill<<<64, 256, 0, s>>>(x.get(), 8, ws.k, 1.0f, -1, 0.0f, 99);
    DeviceBuffer<__nv_bfloat16> ref(static_cast<std::size_t>(8 * ws.n)), out(ref.size());
    const double bytes = 2.0 * static_cast<double>(ws.n) * ws.k;
    std::printf("\n%s (%.1f MB a copy)\n%-28s %4s %10s %8s %10s %8s  %s\n", ws.what, bytes / 1e6, "shape", "M", "us PDL",
                "GB/s", "us plain", "GB/s", "bits");
    for (const int m : {1, 8}) {
      auto params = [&](const __nv_bfloat16* wp, __nv_bfloat16* g) {
        TwellGemvParams p;
        p.x = x.get();
        p.ld_x = ws.k;
        p.w = wp;
        p.g = g;
        p.ld_g = ws.n;
        p.m = m;
        p.n = ws.n;
        p.k = ws.k;
        p.relu = false;
        return p;
      };
      launch_twell_gemv(params(w[0].get(), ref.get()), s);
      CK(cudaStreamSynchronize(s));
      std::vector<unsigned short> want(ref.size()), got(ref.size());
      CK(cudaMemcpy(want.data(), ref.get(), ref.bytes(), cudaMemcpyDeviceToHost));
      for (const Shape& sh : shapes) {
        CK(cudaMemset(out.get(), 0xff, out.bytes()));
        launch_shape(sh, params(w[0].get(), out.get()), s);
        CK(cudaStreamSynchronize(s));
        CK(cudaMemcpy(got.data(), out.get(), out.bytes(), cudaMemcpyDeviceToHost));
        const bool same = std::memcmp(want.data(), got.data(), static_cast<std::size_t>(m * ws.n) * 2) == 0;
        double us[2];
        for (const bool pdl : {true, false}) {
          const ProgrammaticLaunch programmatic(pdl && programmatic_launch_supported());
          us[pdl ? 0 : 1] = time_graph(s, 50, layers, [&] {
            for (const auto& b : w) launch_shape(sh, params(b.get(), out.get()), s);
          });
        }
        std::printf("%-28s %4d %10.2f %8.0f %10.2f %8.0f  %s\n", sh.name, m, us[0], bytes / us[0] / 1e3, us[1],
                    bytes / us[1] / 1e3, same ? "same" : "DIFFER");
      }
    }
  }
  return 0;
}
