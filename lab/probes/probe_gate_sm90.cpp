// twell_probe_gate_sm90: times the sm90 gate GEMM + TwELL epilogue (sm90/gate_pack.hpp) by cluster
// size, with and without its epilogue, against the cuBLASLt GEMM of the same shape, in one process;
// and its gated-product epilogue (the hot neurons' part) against cuBLASLt + the elementwise pass.
//   twell_probe_gate_sm90 [M N K [density [reps [hot_rows hot_density]]]]
//   (defaults: 16384 5632 2048 0.005 20 0 0)
// Inputs: x ~ N(0, 1) and W ~ N(0, 1/K) in bf16, with x[:, 0] = 1 and W[:, 0] = Φ⁻¹(density), so
// about `density` of the gate is positive; in a fraction hot_rows of the rows (every ⌈1/hot_rows⌉-th)
// x[r, 0] = Φ⁻¹(hot_density) / Φ⁻¹(density), so about hot_density of those rows is (hot tokens).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "cuda/common/check.hpp"
#include "cuda/common/device_buffer.hpp"
#include "cuda/dense/lt_gemm.hpp"
#include "cuda/ops/model_ops.hpp"
#include "cuda/sm80/twell_kernels.hpp"
#include "cuda/sm90/gate_pack.hpp"
#include "twell/bf16.hpp"

using namespace twell;
using namespace twell::cuda;

namespace {
// The production kernel, or the lab's build of it where a diagnostic is set (timing_mode, profile).
void gate(const GatePackParams& p, cudaStream_t s) {
  if (p.timing_mode != 0 || p.profile != nullptr)
    launch_twell_gate_pack_sm90_lab(p, s);
  else
    launch_twell_gate_pack_sm90(p, s);
}
}  // namespace

int main(int argc, char** argv) {
  const std::int64_t m = argc > 1 ? std::stoll(argv[1]) : 16384, n = argc > 2 ? std::stoll(argv[2]) : 5632,
                     k = argc > 3 ? std::stoll(argv[3]) : 2048;
  const double density = argc > 4 ? std::stod(argv[4]) : 0.005;
  const int reps = argc > 5 ? std::stoi(argv[5]) : 20;
  const double hot_rows = argc > 7 ? std::stod(argv[6]) : 0.0, hot_density = argc > 7 ? std::stod(argv[7]) : 0.0;
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || !gate_pack_sm90_available(dev)) {
    std::printf("probe_gate_sm90: no GPU that runs the sm90 gate kernel; nothing to time\n");
    return 0;
  }
  TWELL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  std::mt19937_64 rng(7);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<std::uint16_t> xh(static_cast<std::size_t>(m * k)), wh(static_cast<std::size_t>(n * k));
  // Φ⁻¹(q) by bisection on erfc.
  const auto quantile = [](double q) {
    double lo = -10, hi = 10;
    for (int i = 0; i < 100; ++i) {
      const double mid = 0.5 * (lo + hi);
      (0.5 * std::erfc(-mid / std::sqrt(2.0)) < q ? lo : hi) = mid;
    }
    return lo;
  };
  const double lo = quantile(density);
  const std::int64_t hot_every = hot_rows > 0 ? static_cast<std::int64_t>(std::ceil(1.0 / hot_rows)) : 0;
  const float hot_x0 = hot_rows > 0 ? static_cast<float>(quantile(hot_density) / lo) : 1.0f;
  for (std::int64_t r = 0; r < m; ++r) {
    const float x0 = hot_every > 0 && r % hot_every == 0 ? hot_x0 : 1.0f;
    for (std::int64_t c = 0; c < k; ++c) xh[static_cast<std::size_t>(r * k + c)] = to_bf16(c == 0 ? x0 : static_cast<float>(nd(rng))).bits;
  }
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t c = 0; c < k; ++c)
      wh[static_cast<std::size_t>(r * k + c)] =
          to_bf16(c == 0 ? static_cast<float>(lo) : static_cast<float>(nd(rng) / std::sqrt(static_cast<double>(k)))).bits;
  DeviceBuffer<__nv_bfloat16> x(xh.size()), w(wh.size()), g(static_cast<std::size_t>(m * ((n + 7) / 8 * 8)));
  const std::int64_t tiles = (n + 255) / 256;
  DeviceBuffer<std::uint32_t> words(static_cast<std::size_t>(m * tiles * 32)), ovf(static_cast<std::size_t>(m));
  DeviceBuffer<TwellCounters> counters(1);
  TWELL_CUDA_CHECK(cudaMemcpy(x.get(), xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
  TWELL_CUDA_CHECK(cudaMemcpy(w.get(), wh.data(), wh.size() * 2, cudaMemcpyHostToDevice));
  cudaStream_t s;
  TWELL_CUDA_CHECK(cudaStreamCreate(&s));
  LtGemm lt(/*autotune=*/true);
  const GemmShape gs{m, n, k, k, k, (n + 7) / 8 * 8, GemmEpilogue::none};
  const double t_gemm = host::median_ms(3, reps, s, [&] { lt.run(gs, w.get(), x.get(), g.get(), s); });
  const double flop = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  std::printf("M=%lld N=%lld K=%lld density %.3f%%, hot rows %.1f %% at %.1f %%, %d SMs\n", static_cast<long long>(m),
              static_cast<long long>(n), static_cast<long long>(k), 100 * density, 100 * hot_rows, 100 * hot_density, sms);
  std::printf("%-52s %8.3f ms %6.0f TF/s\n", "cuBLASLt GEMM (autotuned)", t_gemm, flop / t_gemm * 1e-9);
  // The kernel's parameters on this probe's buffers, by cluster size and timing mode.
  auto params = [&](int cl, int mode, bool stm, bool heavy = true, bool masks = true) {
    GatePackParams p;
    p.x = x.get();
    p.w = w.get();
    p.m = m;
    p.n = n;
    p.k = k;
    p.words = words.get();
    p.row_overflow = ovf.get();
    p.counters = counters.get();
    p.gate = g.get();
    p.ld_gate = (n + 7) / 8 * 8;
    p.sm_count = sms;
    p.cluster = cl;
    p.timing_mode = mode;
    p.stage_stmatrix = stm;
    p.heavy_rows = heavy;
    p.word_masks = masks;
    return p;
  };
  // The consumers' word masks off (the packers scan the staged rows) against on, alternately.
  {
    const GatePackParams on = params(2, 0, true), off = params(2, 0, true, true, false);
    const GatePackParams on3 = params(2, 3, true), off3 = params(2, 3, true, true, false);
    const auto [t_off, t_on] = host::alternating_medians_ms(3, reps, s, [&] { gate(off, s); },
                                                            [&] { gate(on, s); });
    const auto [t_off3, t_on3] = host::alternating_medians_ms(3, reps, s, [&] { gate(off3, s); },
                                                              [&] { gate(on3, s); });
    std::printf("word masks off / on, cluster 2, stmatrix: %.3f / %.3f ms alternating (%.3fx); packed without stores %.3f / %.3f "
                "(%.3fx)\n", t_off, t_on, t_on / t_off, t_off3, t_on3, t_on3 / t_off3);
  }
  // The packers' heavy-row warp pass off against on (cluster 2, stmatrix), alternately, and each
  // against the GEMM.
  {
    const GatePackParams on = params(2, 0, true), off = params(2, 0, true, false);
    const auto [t_off, t_on] = host::alternating_medians_ms(3, reps, s, [&] { gate(off, s); },
                                                            [&] { gate(on, s); });
    const auto [tg, t_on2] = host::alternating_medians_ms(3, reps, s, [&] { lt.run(gs, w.get(), x.get(), g.get(), s); },
                                                          [&] { gate(on, s); });
    TwellCounters c{};
    TWELL_CUDA_CHECK(cudaMemcpy(&c, counters.get(), sizeof c, cudaMemcpyDeviceToHost));
    std::printf("heavy rows by lane / by warp, cluster 2, stmatrix: %.3f / %.3f ms alternating (%.3fx); by warp %.3fx the GEMM "
                "(%.3f ms alternating); nnz %.3f %%, %llu overflowed blocks in %llu rows\n",
                t_off, t_on, t_on / t_off, t_on2 / tg, tg,
                100.0 * static_cast<double>(c.nnz) / (static_cast<double>(m) * static_cast<double>(n)),
                static_cast<unsigned long long>(c.overflow_tiles), static_cast<unsigned long long>(c.overflow_rows));
  }
  for (int cl : {1, 2})
    for (int mode : {0, 1, 2, 3})
      for (bool stm : {false, true}) {
        if (mode == 1 && stm) continue;  // no epilogue: nothing is staged
        const GatePackParams p = params(cl, mode, stm);
        // Alternating with the GEMM rep by rep, so that clock and power drift over the run weigh
        // on both alike (timed one after the other, the later kernel read up to 0.05 ms slower).
        const auto [tg, t] = host::alternating_medians_ms(
            3, reps, s, [&] { lt.run(gs, w.get(), x.get(), g.get(), s); }, [&] { gate(p, s); });
        static const char* const kMode[] = {"", ", no epilogue", ", staged, not packed", ", packed, no stores"};
        const std::string name =
            "sm90 gate, cluster " + std::to_string(cl) + (mode == 1 ? "" : stm ? ", stmatrix" : ", st.shared") + kMode[mode];
        std::printf("%-52s %8.3f ms %6.0f TF/s  %.3fx the GEMM (%.3f ms alternating)\n", name.c_str(), t, flop / t * 1e-9,
                    t / tg, tg);
      }
  // The hot neurons' part of the sparse path (FfnContext::hot_up) at 512 and 1408 hot neurons (the
  // 0.5 % and 1 % points): [g | u] by the cuBLASLt GEMM (heuristic algorithm, as FfnContext runs it)
  // then the elementwise product, against the sm90 gated-product kernel; and the GEMM alone against
  // that kernel. W's first 2·hot rows serve as the hot gate and up rows.
  for (const std::int64_t hot : {std::int64_t{512}, std::int64_t{1408}}) {
    if (2 * hot > n) continue;
    const std::int64_t ldh = (hot + 7) / 8 * 8;
    const std::size_t row = static_cast<std::size_t>(k) * 2;
    DeviceBuffer<__nv_bfloat16> wst(static_cast<std::size_t>(2 * ldh * k)),
        wil(static_cast<std::size_t>(gated_product_rows(hot) * k)), gu(static_cast<std::size_t>(m * 2 * ldh));
    TWELL_CUDA_CHECK(cudaMemset(wst.get(), 0, wst.bytes()));
    TWELL_CUDA_CHECK(cudaMemcpy(wst.get(), w.get(), static_cast<std::size_t>(hot) * row, cudaMemcpyDeviceToDevice));
    TWELL_CUDA_CHECK(
        cudaMemcpy(wst.get() + ldh * k, w.get() + hot * k, static_cast<std::size_t>(hot) * row, cudaMemcpyDeviceToDevice));
    pack_gated_product_weights(w.get(), w.get() + hot * k, hot, k, wil.get(), s);
    LtGemm heur(/*autotune=*/false);
    const GemmShape hs{m, 2 * ldh, k, k, k, 2 * ldh, GemmEpilogue::none};
    GatedProductParams gp;
    gp.x = x.get();
    gp.w = wil.get();
    gp.m = m;
    gp.n = gated_product_rows(hot);
    gp.k = k;
    gp.h = gu.get();
    gp.ld_h = 2 * ldh;
    gp.h_cols = hot;
    gp.sm_count = sms;
    const auto gemm_only = [&] { heur.run(hs, wst.get(), x.get(), gu.get(), s); };
    const auto two_step = [&] {
      gemm_only();
      ops::gated_product(gu.get(), gu.get() + ldh, 2 * ldh, gu.get(), 2 * ldh, m, hot, 0, s);
    };
    const auto one = [&] { launch_gated_product_sm90(gp, s); };
    const auto [t2, t1] = host::alternating_medians_ms(3, reps, s, two_step, one);
    const auto [tg, t1b] = host::alternating_medians_ms(3, reps, s, gemm_only, one);
    const double hflop = 2.0 * static_cast<double>(m) * static_cast<double>(2 * hot) * static_cast<double>(k);
    std::printf("hot product, %lld neurons: cuBLASLt [g | u] + elementwise / sm90 kernel %.3f / %.3f ms alternating; "
                "the GEMM alone / sm90 kernel %.3f / %.3f ms (%.0f / %.0f TF/s)\n",
                static_cast<long long>(hot), t2, t1, tg, t1b, hflop / tg * 1e-9, hflop / t1b * 1e-9);
  }
  // Where a CTA's time goes (clock64 sums from one launch, cluster 2): packing per tile by warp,
  // the packers' wait for a staged tile, the consumers' wait for the staging tile to be free.
  for (int mode : {0, 3})
    for (int variant : {0, 1, 2, 3}) {  // st.shared, stmatrix, stmatrix with heavy rows by lane, stmatrix scanning
      const bool stm = variant > 0, heavy = variant != 2, masks = variant != 3;
      if (mode == 3 && (variant == 0 || variant == 2)) continue;
      DeviceBuffer<unsigned long long> prof(static_cast<std::size_t>(sms) * kGatePackProfileSlots);
      TWELL_CUDA_CHECK(cudaMemset(prof.get(), 0, prof.size() * sizeof(unsigned long long)));
      GatePackParams p = params(2, mode, stm, heavy, masks);
      p.profile = prof.get();
      gate(p, s);
      TWELL_CUDA_CHECK(cudaStreamSynchronize(s));
      std::vector<unsigned long long> h(prof.size());
      TWELL_CUDA_CHECK(cudaMemcpy(h.data(), prof.get(), h.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
      double sum[kGatePackProfileSlots] = {}, worst = 0;
      for (int b = 0; b < sms; ++b) {
        for (int i = 0; i < kGatePackProfileSlots; ++i) sum[i] += static_cast<double>(h[static_cast<std::size_t>(b) * kGatePackProfileSlots + i]);
        worst = std::max(worst, static_cast<double>(h[static_cast<std::size_t>(b) * kGatePackProfileSlots + 6]));
      }
      const double tiles = std::max(1.0, sum[5]);
      std::printf("profile (cluster 2, %s%s), kcycles per tile: packing warp 1/2/3 %.1f / %.1f / %.1f, warp 1 waiting for a tile %.1f, "
                  "consumers waiting for the staging tile %.1f; CTA %.1f (slowest CTA %.0f kcycles, %.1f tiles per CTA)\n",
                  !stm ? "st.shared" : !heavy ? "stmatrix, heavy rows by lane" : !masks ? "stmatrix, scan" : "stmatrix",
                  mode == 3 ? ", no stores" : "", sum[0] / tiles / 1e3, sum[1] / tiles / 1e3, sum[2] / tiles / 1e3,
                  sum[3] / tiles / 1e3, sum[4] / tiles / 1e3, sum[6] / tiles / 1e3, worst / 1e3, tiles / sms);
    }
  TWELL_CUDA_CHECK(cudaStreamDestroy(s));
  return 0;
}
