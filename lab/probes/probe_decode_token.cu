// twell_probe_decode_token: one token's decode FFN, kernel against kernel (diagnostics for issue
// 27's decode targets): the one-token kernels (twell_decode_token) against the gate GEMV +
// decode kernel pair they replaced, and the gate GEMV alone (the weight stream's floor: the
// fused kernels read the same gate rows plus ~2 · density of the up/down rows).
//   twell_probe_decode_token [n [k [density [layers]]]]   (defaults: 5632 2048 0.005 16)
// `layers` weight sets are launched in turn (each larger than L2 together: every launch streams
// its gate rows from HBM), captured in a CUDA graph and replayed; prints µs per launch and the
// gate rows' GB/s. Then the batch-1 runtime's form by parts (programmatic launches, each launch
// after the last: docs/runtime.md plan step 3): the fixed-point kernel with the norm folded in, the
// same without the norm (x given), the same at density 0 (the residual's last channel dominant, so
// no neuron fires: no up row, down row or fixed-point adds), the two-kernel form, the gate GEMV
// alone, and the runtime's form with each layer's active neurons first (its neuron order at its
// best); the differences place the tail's time.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "cuda/common/device_buffer.hpp"
#include "cuda/common/launch.hpp"
#include "cuda/ops/gemv.hpp"
#include "cuda/sm80/twell_decode.hpp"
#include "cuda/sm80/twell_decode_token.hpp"
#include "probe_graph.cuh"

using namespace twell::cuda;
using namespace twell::probe;

namespace {

struct Layer {
  DeviceBuffer<__nv_bfloat16> wg, wu, wd;
};

}  // namespace

int main(int argc, char** argv) {
  const long long n = argc > 1 ? std::atoll(argv[1]) : 5632;
  const int k = argc > 2 ? std::atoi(argv[2]) : 2048;
  const double density = argc > 3 ? std::atof(argv[3]) : 0.005;
  const int layers = argc > 4 ? std::atoi(argv[4]) : 16;
  // Pre-activation ≈ N(0, 1) − t with x's last element 1 and the gate's last column −t.
  const float t = static_cast<float>(std::sqrt(2.0) * erfcinv(2.0 * density));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<Layer> L(static_cast<std::size_t>(layers));
  const float sc = 1.0f / std::sqrt(static_cast<float>(k - 1));
  unsigned seed = 1;
  for (Layer& l : L) {
    l.wg.resize(static_cast<std::size_t>(n * k));
    l.wu.resize(static_cast<std::size_t>(n * k));
    l.wd.resize(static_cast<std::size_t>(n * k));
    fill<<<1024, 256, 0, s>>>(l.wg.get(), n, k, sc, k - 1, -t, seed++);
    fill<<<1024, 256, 0, s>>>(l.wu.get(), n, k, sc, -1, 0.0f, seed++);
    fill<<<1024, 256, 0, s>>>(l.wd.get(), n, k, sc, -1, 0.0f, seed++);
  }
  DeviceBuffer<__nv_bfloat16> x(static_cast<std::size_t>(k)), y(static_cast<std::size_t>(k)), g(static_cast<std::size_t>(n + 8));
  fill<<<8, 256, 0, s>>>(x.get(), 1, k, 1.0f, k - 1, 1.0f, 99);
  const long long tiles = (n + 255) / 256;
  DeviceBuffer<float> partials(static_cast<std::size_t>(tiles * k)), h(static_cast<std::size_t>(n));
  DeviceBuffer<unsigned int> tickets(2);
  DeviceBuffer<unsigned char> flags(static_cast<std::size_t>(decode_token_flag_bytes(n)));
  DeviceBuffer<unsigned long long> nnz(1), nnz_out(1);
  CK(cudaMemsetAsync(tickets.get(), 0, tickets.bytes(), s));
  CK(cudaMemsetAsync(flags.get(), 0, flags.bytes(), s));
  CK(cudaMemsetAsync(nnz.get(), 0, nnz.bytes(), s));
  CK(cudaStreamSynchronize(s));

  // early: its weights before the programmatic wait (TwellGemvParams::w_before_wait)
  auto gemv = [&](const Layer& l, bool early = false) {
    TwellGemvParams p;
    p.x = x.get();
    p.ld_x = k;
    p.w = l.wg.get();
    p.g = g.get();
    p.ld_g = n + 8;
    p.m = 1;
    p.n = n;
    p.k = k;
    p.w_before_wait = early;
    launch_twell_gemv(p, s);
  };
  auto operands = [&](const Layer& l, FfnOperands& o) {
    o.x = x.get();
    o.ld_x = k;
    o.w_up = l.wu.get();
    o.w_down_t = l.wd.get();
    o.y = y.get();
    o.ld_y = k;
    o.m = 1;
    o.n = n;
    o.k = k;
  };
  auto decode = [&](const Layer& l) {
    TwellDecodeParams p;
    operands(l, p);
    p.g = g.get();
    p.ld_g = n + 8;
    p.partials = partials.get();
    p.row_tickets = tickets.get();
    p.cta_ticket = tickets.get() + 1;
    p.nnz = nnz.get();
    p.nnz_out = nnz_out.get();
    launch_twell_decode(p, s);
  };
  auto token = [&](const Layer& l) {
    TwellDecodeTokenParams p;
    operands(l, p);
    p.w_first = l.wg.get();
    p.h = h.get();
    p.flags = flags.get();
    p.nnz_out = nnz_out.get();
    launch_twell_decode_token(p, s);
  };
  // The measured density (the fused kernel's count, layer 0).
  token(L[0]);
  unsigned long long cnt = 0;
  CK(cudaMemcpyAsync(&cnt, nnz_out.get(), sizeof cnt, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  std::printf("n %lld k %d: %llu active (%.3f %%), %d layers of weights, gate rows %.1f MB per launch\n", n, k, cnt,
              100.0 * static_cast<double>(cnt) / static_cast<double>(n), layers, 2.0 * n * k / 1e6);
  const int reps = 50;
  const double bytes = 2.0 * static_cast<double>(n) * k;
  auto report = [&](const char* name, double us) {
    std::printf("%-34s %8.2f us  (gate rows at %6.0f GB/s)\n", name, us, bytes / us / 1e3);
  };
  report("gemv (gate only)", time_graph(s, reps, layers, [&] { for (const Layer& l : L) gemv(l); }));
  report("gemv + decode kernel", time_graph(s, reps, layers, [&] { for (const Layer& l : L) { gemv(l); decode(l); } }));
  report("decode_token (gate fused in) + down", time_graph(s, reps, layers, [&] { for (const Layer& l : L) token(l); }));

  // By parts, as the runtime launches a batch-1 FFN (fixed point, norm folded in), programmatic.
  // r: x in fp32 (the norm of x with unit weights is ≈ x: its rms ≈ 1), or r0: only the last
  // channel (the gate's threshold column) non-zero, so every pre-activation is −t · √k.
  std::vector<__nv_bfloat16> hxb(static_cast<std::size_t>(k));
  CK(cudaMemcpyAsync(hxb.data(), x.get(), hxb.size() * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  std::vector<float> hr(static_cast<std::size_t>(k)), hr0(static_cast<std::size_t>(k), 0.0f), ones(static_cast<std::size_t>(k), 1.0f);
  for (int c = 0; c < k; ++c) hr[static_cast<std::size_t>(c)] = __bfloat162float(hxb[static_cast<std::size_t>(c)]);
  hr0[static_cast<std::size_t>(k - 1)] = 1000.0f;
  DeviceBuffer<float> r(static_cast<std::size_t>(k)), r0(static_cast<std::size_t>(k)), nw(static_cast<std::size_t>(k));
  DeviceBuffer<long long> y_fixed(static_cast<std::size_t>(k));
  DeviceBuffer<unsigned> overflow(1);
  CK(cudaMemcpyAsync(r0.get(), hr0.data(), r0.bytes(), cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(nw.get(), ones.data(), nw.bytes(), cudaMemcpyHostToDevice, s));
  CK(cudaMemsetAsync(y_fixed.get(), 0, y_fixed.bytes(), s));
  CK(cudaMemsetAsync(overflow.get(), 0, overflow.bytes(), s));
  CK(cudaStreamSynchronize(s));
  // The norm reads r and (with no first or delta) stores nothing back, so r stays as set.
  std::vector<DeviceBuffer<std::int32_t>> orders;  // [layer]: filled below
  auto fixed = [&](const Layer& l, const float* rr, bool ordered = false, std::uint32_t* hits = nullptr) {
    TwellDecodeTokenParams p;
    operands(l, p);
    p.w_first = l.wg.get();
    p.y_fixed = y_fixed.get();
    p.overflow = overflow.get();
    p.hits = hits;
    if (ordered) p.order = orders[static_cast<std::size_t>(&l - L.data())].get();
    if (rr) {
      p.norm.r = const_cast<float*>(rr);
      p.norm.w = nw.get();
      p.norm.eps = 1e-6f;
    }
    launch_twell_decode_token(p, s);
  };
  CK(cudaMemcpyAsync(r.get(), hr.data(), r.bytes(), cudaMemcpyHostToDevice, s));
  CK(cudaStreamSynchronize(s));
  // The runtime orders each layer's neurons by their counts (TwellDecodeTokenParams::order,
  // decode_token_reorder), so the active ones run their chains in the first wave while the later
  // CTAs still stream the gate. Here each layer's order comes from the timed form's own active
  // set (hits of one call on r): the order's best case; the runtime's counts come from many tokens.
  {
    DeviceBuffer<std::uint32_t> hits(static_cast<std::size_t>(n));
    for (const Layer& l : L) {
      CK(cudaMemsetAsync(hits.get(), 0, hits.bytes(), s));
      fixed(l, r.get(), false, hits.get());
      orders.emplace_back(static_cast<std::size_t>(n));
      launch_decode_token_reorder(hits.get(), orders.back().get(), n, s);
    }
    CK(cudaMemsetAsync(y_fixed.get(), 0, y_fixed.bytes(), s));
    CK(cudaStreamSynchronize(s));
  }
  {
    const ProgrammaticLaunch pdl(programmatic_launch_supported());
    std::printf("by parts, programmatic launches %s:\n", programmatic_launch_active() ? "on" : "off (not supported here)");
    const double t_norm = time_graph(s, reps, layers, [&] { for (const Layer& l : L) fixed(l, r.get()); });
    const double t_x = time_graph(s, reps, layers, [&] { for (const Layer& l : L) fixed(l, nullptr); });
    const double t_zero = time_graph(s, reps, layers, [&] { for (const Layer& l : L) fixed(l, r0.get()); });
    const double t_two = time_graph(s, reps, layers, [&] { for (const Layer& l : L) token(l); });
    const double t_gate = time_graph(s, reps, layers, [&] { for (const Layer& l : L) gemv(l, true); });
    const double t_ord = time_graph(s, reps, layers, [&] { for (const Layer& l : L) fixed(l, r.get(), true); });
    report("  fixed point, norm folded in", t_norm);
    report("  fixed point, x given", t_x);
    report("  fixed point, norm, density 0", t_zero);
    report("  two kernels (h, then down), x given", t_two);
    report("  gate GEMV alone (weights before wait)", t_gate);
    report("  fixed point, norm, active first", t_ord);
    std::printf("  the norm %.2f us; the active neurons' chains (up, down, adds) %.2f us, %.2f with the active first; past "
                "the gate's stream %.2f us\n",
                t_norm - t_x, t_norm - t_zero, t_ord - t_zero, t_x - t_gate);
    unsigned ov = 0;
    CK(cudaMemcpyAsync(&ov, overflow.get(), sizeof ov, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    if (ov) std::printf("  (a fixed-point term overflowed: the fixed-point times ran a shortened chain)\n");
  }
  return 0;
}
