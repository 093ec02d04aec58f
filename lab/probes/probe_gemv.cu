// twell_probe_gemv: the decode GEMV at 1–16 tokens and cuBLASLt at 1–64 (issue 59's batched decode:
// at 8 tokens the 2B model's projections ran through cuBLASLt's small-M tiles at 1.4–2.8 TB/s and its
// LM head through the CUDA-core GEMV at 1.0 TB/s, H200 timeline at 1017613; at 64 rows the 2b-gqa's
// four weight GEMMs reach 31–67 % of the copy bandwidth, timeline at 9483100). For each weight shape
// of the synthetic 2B (hidden 2048, FFN 5632, 32 heads of 64, vocabulary 32000; gate + up stacked as
// the dense FFN runs them) and M = 1, 2, 4, 8, 16, 32, 64: µs a launch and GB/s of W for
// - the library's GEMV (M ≤ 16; launch_twell_gemv: the CUDA-core kernel at one token, the
//   tensor-core kernel from 2, gemv_mma_kernel.cuh);
// - the same tensor-core kernel bounded to 3 and to 4 CTAs an SM (2–16 rows: does a whole wave of
//   CTAs take the fixed ≈ 2–3 µs a launch above bytes / bandwidth? the gate's 352 CTAs are 1.33
//   waves at the library's 2 an SM; ptxas spills 96–352 bytes a thread to fit);
// - cuBLASLt's first heuristic algorithm (what the model runtime's LtGemm runs) and the fastest of
//   8 candidates timed on first use (LtGemm's autotune), bf16 out (fp32 out for the head)
// — `layers` weight copies launched in turn (together larger than L2), captured into a CUDA graph and
// replayed with programmatic launches.
// Checks: every form against the float64 sums within the fp32 accumulation bound (K · 2⁻²⁴ · Σ|x·w|,
// plus one bf16 step of the result for bf16 output; outputs poisoned with NaN first), each token's
// bits at M equal to its bits at M = 16 (a token's sums do not depend on the batch), and the bounded
// kernels' bits equal to the library's.
//   twell_probe_gemv [layers]   (default 16)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cuda/common/device_buffer.hpp"
#include "cuda/common/launch.hpp"
#include "cuda/dense/lt_gemm.hpp"
#include "cuda/ops/gemv.hpp"
#include "cuda/ops/gemv_mma_kernel.cuh"
#include "probe_graph.cuh"

using namespace twell::cuda;
using namespace twell::probe;

namespace {

// The library's tensor-core kernel bounded to MinCtas CTAs an SM (M ≥ 2), on the library's grid.
template <int MinCtas>
void launch_bounded(const TwellGemvParams& p, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((p.n + detail::kGemvMmaRows - 1) / detail::kGemvMmaRows)),
      block(detail::kGemvMmaWarps * 32);
  if (p.m <= 8)
    launch_kernel(detail::twell_gemv_mma_kernel<1, MinCtas>, grid, block, 0, s, p);
  else
    launch_kernel(detail::twell_gemv_mma_kernel<2, MinCtas>, grid, block, 0, s, p);
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
  std::printf("device %s, %d SMs; %d weight copies a shape; programmatic launches %s\n", prop.name,
              prop.multiProcessorCount, layers, programmatic_launch_supported() ? "on" : "unsupported");
  // cuBLASLt twice: its first heuristic algorithm (what the model runtime's LtGemm runs) and the
  // fastest of 8 candidates timed on first use of a shape (LtGemm's autotune).
  LtGemm lt_heur(/*autotune=*/false), lt_tuned(/*autotune=*/true);
  constexpr int kMaxM = 64, kGemvM = 16;  // rows of x; the GEMV's largest M
  struct Wshape {
    const char* what;
    long long n;
    int k;
    bool f32;
  };
  bool all_ok = true;
  for (const Wshape ws : {Wshape{"attention output 2048 x 2048", 2048, 2048, false},
                          Wshape{"QKV 6144 x 2048", 6144, 2048, false}, Wshape{"gate 5632 x 2048", 5632, 2048, false},
                          Wshape{"gate + up 11264 x 2048", 11264, 2048, false},
                          Wshape{"down-like 2048 x 5632", 2048, 5632, false},
                          Wshape{"LM head 32000 x 2048, fp32 out", 32000, 2048, true}}) {
    const int copies = ws.n * ws.k > 20'000'000 ? std::max(2, layers / 4) : layers;
    std::vector<DeviceBuffer<__nv_bfloat16>> w(static_cast<std::size_t>(copies));
    unsigned seed = 1;
    for (auto& b : w) {
      b.resize(static_cast<std::size_t>(ws.n * ws.k));
      fill<<<1024, 256, 0, s>>>(b.get(), ws.n, ws.k, 0.02f, -1, 0.0f, seed++);
    }
    DeviceBuffer<__nv_bfloat16> x(static_cast<std::size_t>(kMaxM * ws.k));
    fill<<<64, 256, 0, s>>>(x.get(), kMaxM, ws.k, 1.0f, -1, 0.0f, 99);
    const std::size_t out_elems = static_cast<std::size_t>(kMaxM * ws.n), esz = ws.f32 ? 4 : 2;
    DeviceBuffer<unsigned char> out(out_elems * esz), out16(out_elems * esz), ref(out_elems * esz), ref2(out_elems * esz);
    const double bytes = 2.0 * static_cast<double>(ws.n) * ws.k;
    std::printf("\n%s (%.1f MB a copy, %d copies)\n%4s %12s %8s %12s %8s %12s %8s %12s %8s %12s %8s  %s\n", ws.what, bytes / 1e6,
                copies, "M", "library us", "GB/s", "3 CTAs/SM us", "GB/s", "4 CTAs/SM us", "GB/s", "Lt heur. us", "GB/s",
                "Lt tuned us", "GB/s", "checks");
    const auto params = [&](int m, const __nv_bfloat16* wp, void* o) {
      TwellGemvParams p = gemv_rows(x.get(), m, wp, ws.n, ws.k);
      if (ws.f32)
        p.g32 = static_cast<float*>(o);
      else
        p.g = static_cast<__nv_bfloat16*>(o);
      p.w_before_wait = true;
      return p;
    };
    const auto lt_run = [&](LtGemm& lt, int m, const __nv_bfloat16* wp, void* o) {
      if (ws.f32) {
        MatmulShape ms;
        ms.trans_b = true;
        ms.m = m;
        ms.n = ws.n;
        ms.k = ws.k;
        ms.lda = ws.k;
        ms.ldb = ws.k;
        ms.ldc = ws.n;
        ms.c_fp32 = true;
        lt.matmul(ms, x.get(), wp, o, s);
      } else {
        lt.run({m, ws.n, ws.k, ws.k, ws.k, ws.n}, wp, x.get(), static_cast<__nv_bfloat16*>(o), s);
      }
    };
    // Every token's bits at M = 16, the batch-independence reference.
    launch_twell_gemv(params(kGemvM, w[0].get(), out16.get()), s);
    CK(cudaStreamSynchronize(s));
    std::vector<unsigned char> h16(out_elems * esz), hout(h16.size()), href(h16.size()), href2(h16.size());
    CK(cudaMemcpy(h16.data(), out16.get(), h16.size(), cudaMemcpyDeviceToHost));
    std::vector<unsigned short> hx(static_cast<std::size_t>(kMaxM * ws.k)), hw(static_cast<std::size_t>(ws.n * ws.k));
    CK(cudaMemcpy(hx.data(), x.get(), hx.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hw.data(), w[0].get(), hw.size() * 2, cudaMemcpyDeviceToHost));
    for (const int m : {1, 2, 4, 8, 16, 32, 64}) {
      const bool gemv = m <= kGemvM;  // the library's GEMV takes up to 16 rows
      for (auto* b : {&out, &ref, &ref2}) CK(cudaMemsetAsync(b->get(), 0xFF, b->bytes(), s));  // NaN: a skipped write shows
      if (gemv) launch_twell_gemv(params(m, w[0].get(), out.get()), s);
      lt_run(lt_heur, m, w[0].get(), ref.get());
      lt_run(lt_tuned, m, w[0].get(), ref2.get());
      CK(cudaStreamSynchronize(s));
      CK(cudaMemcpy(hout.data(), out.get(), hout.size(), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(href.data(), ref.get(), href.size(), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(href2.data(), ref2.get(), href2.size(), cudaMemcpyDeviceToHost));
      // Batch independence (M ≥ 2: the tensor-core kernel; M = 1 is the CUDA-core kernel's own order).
      const bool same = !gemv || m == 1 || std::memcmp(hout.data(), h16.data(), static_cast<std::size_t>(m * ws.n) * esz) == 0;
      // Each against the float64 sums, for a sample of outputs (a NaN is outside).
      long long bad_lib = 0, bad_heur = 0, bad_tuned = 0;
      for (int t = 0; t < m; ++t)
        for (long long j = 0; j < ws.n; j += 7) {
          const ExactDot e =
              exact_dot(hx.data() + static_cast<std::size_t>(t) * ws.k, hw.data() + static_cast<std::size_t>(j) * ws.k, ws.k);
          const std::size_t at = static_cast<std::size_t>(t * ws.n + j);
          const auto value = [&](const std::vector<unsigned char>& h) {
            if (ws.f32) {
              float f;
              std::memcpy(&f, h.data() + at * 4, 4);
              return static_cast<double>(f);
            }
            unsigned short b;
            std::memcpy(&b, h.data() + at * 2, 2);
            return static_cast<double>(bf16_to_float(b));
          };
          if (gemv) bad_lib += !within_dot_bound(value(hout), e, ws.k, !ws.f32);
          bad_heur += !within_dot_bound(value(href), e, ws.k, !ws.f32);
          bad_tuned += !within_dot_bound(value(href2), e, ws.k, !ws.f32);
        }
      const long long bad = bad_lib + bad_heur + bad_tuned;
      std::string outside_what;  // which forms left the bound
      for (const auto& [n_bad, name] : {std::pair{bad_lib, "library"}, {bad_heur, "Lt heur."}, {bad_tuned, "Lt tuned"}})
        if (n_bad) outside_what += std::string(outside_what.empty() ? "" : ", ") + name + " " + std::to_string(n_bad);
      // The bounded kernels: the same arithmetic, so the library's bits.
      bool bounded_same = true;
      if (gemv && m >= 2)
        for (const auto launch : {&launch_bounded<3>, &launch_bounded<4>}) {
          CK(cudaMemsetAsync(out16.get(), 0xFF, out16.bytes(), s));
          launch(params(m, w[0].get(), out16.get()), s);
          CK(cudaStreamSynchronize(s));
          std::vector<unsigned char> hb(hout.size());
          CK(cudaMemcpy(hb.data(), out16.get(), hb.size(), cudaMemcpyDeviceToHost));
          bounded_same = bounded_same && std::memcmp(hb.data(), hout.data(), static_cast<std::size_t>(m * ws.n) * esz) == 0;
        }
      const bool ok = same && bad == 0 && bounded_same;
      all_ok = all_ok && ok;
      double us[5] = {};
      const ProgrammaticLaunch programmatic(programmatic_launch_supported());
      if (gemv)
        us[0] = time_graph(s, 30, copies, [&] {
          for (const auto& b : w) launch_twell_gemv(params(m, b.get(), out.get()), s);
        });
      if (gemv && m >= 2) {
        us[1] = time_graph(s, 30, copies, [&] {
          for (const auto& b : w) launch_bounded<3>(params(m, b.get(), out.get()), s);
        });
        us[2] = time_graph(s, 30, copies, [&] {
          for (const auto& b : w) launch_bounded<4>(params(m, b.get(), out.get()), s);
        });
      }
      us[3] = time_graph(s, 30, copies, [&] {
        for (const auto& b : w) lt_run(lt_heur, m, b.get(), ref.get());
      });
      us[4] = time_graph(s, 30, copies, [&] {
        for (const auto& b : w) lt_run(lt_tuned, m, b.get(), ref2.get());
      });
      // "µs GB/s" of a column, "-" where that form does not run at this M.
      const auto col = [&](double t) {
        char c[32];
        if (t > 0)
          std::snprintf(c, sizeof c, "%12.2f %8.0f", t, bytes / t / 1e3);
        else
          std::snprintf(c, sizeof c, "%12s %8s", "-", "-");
        return std::string(c);
      };
      std::printf("%4d %s %s %s %s %s  %s%s%s\n", m, col(us[0]).c_str(), col(us[1]).c_str(), col(us[2]).c_str(),
                  col(us[3]).c_str(), col(us[4]).c_str(),
                  !gemv ? "cuBLASLt only" : m == 1 ? "bits: n/a (CUDA cores)" : same ? "bits = at M 16" : "BITS DIFFER from M 16",
                  bad ? (", OUTSIDE THE BOUND: " + outside_what).c_str() : ", within the bound",
                  bounded_same ? "" : ", BOUNDED KERNELS' BITS DIFFER");
    }
  }
  std::printf("\nchecks: %s\n", all_ok ? "pass" : "FAIL");
  return all_ok ? 0 : 1;
}
