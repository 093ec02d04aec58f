// twell_probe_decode_attention: the decode attention (cuda::ops::attention, one CTA of 8 warps per
// (row, query head), scores then P·V, exact fp32) against the bytes it must read, at the batches and
// contexts a server runs (issue 59: at batch 64 and context 512 the 2B model's KV cache is most of a
// step's bytes, and PyTorch moved a step's bytes at ≈ 3.1 TB/s where twell moved them at ≈ 2.6).
// For each shape: µs a launch, graph-replayed over `layers` caches launched in turn (together past
// the L2), the KV bytes a launch must read (rows × keys × KV heads × D × 2 × 2 B; query heads of a
// GQA group read their KV head's rows again, from L2 at best) and the bandwidth on them, beside the
// device-to-device copy bandwidth measured in the same process. Checks: every output finite, and one
// (row, head) per shape against a float64 softmax over the same bf16 values (within 2⁻⁸ relative of
// the largest |output| — the output is bf16 — plus the fp32 sums' own error).
//   twell_probe_decode_attention [max GB of caches (default 12)]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda/common/device_buffer.hpp"
#include "cuda/common/launch.hpp"
#include "cuda/ops/model_ops.hpp"
#include "probe_graph.cuh"

using namespace twell::cuda;
using namespace twell::probe;

namespace {

float bf16_to_float(unsigned short b) {
  const unsigned u = static_cast<unsigned>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

double copy_gbps(cudaStream_t s) {
  const std::size_t bytes = 1ull << 30;
  DeviceBuffer<unsigned char> a(bytes), b(bytes);
  CK(cudaMemsetAsync(a.get(), 1, bytes, s));
  for (int i = 0; i < 2; ++i) CK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, s));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0, s));
  for (int i = 0; i < 10; ++i) CK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, s));
  CK(cudaEventRecord(e1, s));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  return 2.0 * bytes * 10 / (ms * 1e-3) / 1e9;  // read + write
}

}  // namespace

int main(int argc, char** argv) {
  const double max_gb = argc > 1 ? std::atof(argv[1]) : 12.0;
  if (!(max_gb > 0.1)) {
    std::fprintf(stderr, "usage: twell_probe_decode_attention [max GB of caches > 0.1]\n");
    return 2;
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const double copy = copy_gbps(s);
  std::printf("device %s, %d SMs, L2 %.0f MB; copy bandwidth %.0f GB/s (bytes read + written a second, as twell bench model reports it)\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize / 1e6, copy);
  struct Model {
    const char* name;
    int heads, kv_heads, d;
  };
  bool all_ok = true;
  for (const Model md : {Model{"2B (MHA, 32 heads of 64)", 32, 32, 64}, Model{"GQA 32/8 heads of 64", 32, 8, 64},
                         Model{"7B-GQA (32/8 heads of 128)", 32, 8, 128}}) {
    std::printf("\n%s\n%5s %6s %7s %10s %10s %8s %8s  %s\n", md.name, "rows", "keys", "layers", "us", "KV MB", "GB/s",
                "of copy", "checks");
    const std::int64_t kv_dim = static_cast<std::int64_t>(md.kv_heads) * md.d, q_dim = static_cast<std::int64_t>(md.heads) * md.d;
    for (const int rows : {1, 8, 32, 64})
      for (const int ctx : {144, 512, 2048}) {
        const int keys = ctx + 1;  // the new token's key is in the cache too
        if (keys > ops::attention_max_keys(md.d)) continue;
        const double kv_bytes = 2.0 * 2.0 * rows * keys * kv_dim;  // a launch's K and V rows
        // Enough layers that a replay's caches pass the L2 several times over, within max_gb.
        int layers = static_cast<int>(std::ceil(4.0 * prop.l2CacheSize / kv_bytes));
        layers = std::max(1, std::min(layers, static_cast<int>(max_gb * 1e9 / kv_bytes)));
        if (layers < 1 || kv_bytes > max_gb * 1e9) continue;
        const std::int64_t layer_stride = static_cast<std::int64_t>(keys) * kv_dim;  // elements a layer of a row
        // One cache per row: [layers][keys][kv_dim] for K and for V.
        std::vector<DeviceBuffer<__nv_bfloat16>> kc(static_cast<std::size_t>(rows)), vc(kc.size());
        unsigned seed = 7;
        for (int r = 0; r < rows; ++r) {
          kc[r].resize(static_cast<std::size_t>(layers * layer_stride));
          vc[r].resize(kc[r].size());
          fill<<<256, 256, 0, s>>>(kc[r].get(), static_cast<long long>(layers) * keys, static_cast<int>(kv_dim), 1.0f, -1, 0.0f, seed++);
          fill<<<256, 256, 0, s>>>(vc[r].get(), static_cast<long long>(layers) * keys, static_cast<int>(kv_dim), 1.0f, -1, 0.0f, seed++);
        }
        std::vector<ops::RowKv> hrows(static_cast<std::size_t>(rows));
        for (int r = 0; r < rows; ++r) {
          hrows[r].k = kc[r].get();
          hrows[r].v = vc[r].get();
          hrows[r].layer_stride = layer_stride;
          hrows[r].pos = ctx;
        }
        DeviceBuffer<ops::RowKv> drows(hrows.size());
        CK(cudaMemcpy(drows.get(), hrows.data(), hrows.size() * sizeof(ops::RowKv), cudaMemcpyHostToDevice));
        DeviceBuffer<__nv_bfloat16> qkv(static_cast<std::size_t>(rows * (q_dim + 2 * kv_dim))),
            out(static_cast<std::size_t>(rows * q_dim));
        fill<<<64, 256, 0, s>>>(qkv.get(), rows, static_cast<int>(q_dim + 2 * kv_dim), 1.0f, -1, 0.0f, 99);
        const auto launch = [&](int l) {
          ops::attention(qkv.get(), rows, md.heads, md.kv_heads, md.d, drows.get(), l, keys, out.get(), s,
                         /*old_keys_ready=*/true);
        };
        // Check: layer 0, the last row, the last head, against float64.
        launch(0);
        CK(cudaStreamSynchronize(s));
        std::vector<unsigned short> ho(out.size()), hq(qkv.size()), hk(static_cast<std::size_t>(keys * kv_dim)),
            hv(hk.size());
        CK(cudaMemcpy(ho.data(), out.get(), out.bytes(), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hq.data(), qkv.get(), qkv.bytes(), cudaMemcpyDeviceToHost));
        const int r = rows - 1, h = md.heads - 1, kvh = h / (md.heads / md.kv_heads);
        CK(cudaMemcpy(hk.data(), kc[r].get(), hk.size() * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hv.data(), vc[r].get(), hv.size() * 2, cudaMemcpyDeviceToHost));
        bool finite = true;
        for (const unsigned short b : ho) finite = finite && (b & 0x7f80u) != 0x7f80u;
        std::vector<double> sc(static_cast<std::size_t>(keys));
        double mx = -1e300;
        for (int t = 0; t < keys; ++t) {
          double a = 0;
          for (int i = 0; i < md.d; ++i)
            a += static_cast<double>(bf16_to_float(hq[static_cast<std::size_t>(r * (q_dim + 2 * kv_dim) + h * md.d + i)])) *
                 bf16_to_float(hk[static_cast<std::size_t>(t * kv_dim + kvh * md.d + i)]);
          sc[t] = a / std::sqrt(static_cast<double>(md.d));
          mx = std::max(mx, sc[t]);
        }
        double z = 0;
        for (double& v : sc) z += (v = std::exp(v - mx));
        double worst = 0, big = 0;
        std::vector<double> want(static_cast<std::size_t>(md.d), 0.0);
        for (int i = 0; i < md.d; ++i) {
          for (int t = 0; t < keys; ++t) want[i] += sc[t] / z * bf16_to_float(hv[static_cast<std::size_t>(t * kv_dim + kvh * md.d + i)]);
          big = std::max(big, std::abs(want[i]));
        }
        for (int i = 0; i < md.d; ++i)
          worst = std::max(worst, std::abs(bf16_to_float(ho[static_cast<std::size_t>(r * q_dim + h * md.d + i)]) - want[i]));
        const bool close = worst <= std::ldexp(big, -8) + keys * std::ldexp(1.0, -20);
        const bool ok = finite && close;
        all_ok = all_ok && ok;
        const ProgrammaticLaunch programmatic(programmatic_launch_supported());
        const double us = time_graph(s, 20, layers, [&] {
          for (int l = 0; l < layers; ++l) launch(l);
        });
        std::printf("%5d %6d %7d %10.2f %10.2f %8.0f %7.0f%%  %s (worst %.2e of max %.2e)\n", rows, keys, layers, us,
                    kv_bytes / 1e6, kv_bytes / us / 1e3, 100.0 * kv_bytes / us / 1e3 / copy, ok ? "ok" : "FAIL",
                    worst, big);
      }
  }
  std::printf("\nchecks: %s\n", all_ok ? "pass" : "FAIL");
  return all_ok ? 0 : 1;
}
