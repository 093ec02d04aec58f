// twell_probe_dispatch: where the gated FFN's automatic path stands against dense cuBLASLt at the
// densities where it runs dense (2–10 %), and what a larger hot-neuron share would buy there.
//   twell_probe_dispatch [M [reps [density ...]]] [nongated]   (defaults: 16384 20 0.02 0.03 0.05 0.10)
// Per density (K = 2048, N = 5632, twell::generate_ffn's uniform mode, gated unless `nongated`),
// each pair timed alternately, rep by rep, medians in ms:
//   - automatic vs dense, with the dense path's count every call and every 8th call
//     (ContextOptions::dense_count_period); non-gated, also with the dispatch threshold
//     (max_sparse_density_nongated) at 0.8, 1.0 and 1.2 %;
//   - the whole sparse path with the densest share f of the neurons split off as hot (dense GEMM
//     columns), f ∈ {0, 0.2, 0.3, 0.4, 0.49}, vs dense; the cold neurons' density and the rows run
//     dense; and f = 0.4 with the dense-row threshold at 1 %.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "cuda/common/check.hpp"
#include "cuda/common/device_buffer.hpp"
#include "cuda/ffn_context.hpp"
#include "ffn_cases.hpp"

using namespace twell;
using namespace twell::cuda;
using namespace twell::cuda::bench;

int main(int argc, char** argv) {
  bool gated = true;
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "nongated") gated = false;
    else args.emplace_back(argv[i]);
  }
  const std::int64_t m = args.size() > 0 ? std::stoll(args[0]) : 16384;
  const int reps = args.size() > 1 ? std::stoi(args[1]) : 20, warmup = 5;
  std::vector<double> densities;
  for (std::size_t i = 2; i < args.size(); ++i) densities.push_back(std::stod(args[i]));
  if (densities.empty()) densities = {0.02, 0.03, 0.05, 0.10};
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("probe_dispatch: no CUDA device; nothing to time\n");
    return 0;
  }
  const std::int64_t K = 2048, N = 5632;
  cudaStream_t s;
  TWELL_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::printf("probe_dispatch: %s, M = %lld, K = %lld, N = %lld, %d reps, commit %s\n", gated ? "gated" : "non-gated",
              static_cast<long long>(m), static_cast<long long>(K), static_cast<long long>(N), reps, git_commit().c_str());
  std::printf("%6s %-34s %8s %8s %6s %8s %9s %s\n", "nnz%", "variant", "ms", "dense", "x", "hot", "cold nnz%", "dense rows");
  for (const double d : densities) {
    test::FfnCase c;  // the sweep's generator and seeds (bench/ffn/ffn_cases.hpp)
    c.m = m;
    c.n = N;
    c.k = K;
    c.density = d;
    c.gated = gated;
    c.hot_density = 0.12;
    c.model_like = true;
    c.seed = 1234 + static_cast<std::uint64_t>(m);
    const test::FfnData f = test::make_ffn(c);
    const FfnWeights w = f.weights();
    std::vector<std::uint16_t> xb(f.x.size());
    for (std::size_t i = 0; i < xb.size(); ++i) xb[i] = to_bf16(f.x[i]).bits;
    DeviceBuffer<__nv_bfloat16> x(xb.size()), y(static_cast<std::size_t>(m * K)), yd(static_cast<std::size_t>(m * K));
    TWELL_CUDA_CHECK(cudaMemcpy(x.get(), xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
    auto line = [&](const std::string& what, double t, double td, std::int64_t hot, double cold, const std::string& rows) {
      std::printf("%6.2f %-34s %8.3f %8.3f %6.3f %8lld %9.3f %s\n", 100 * d, what.c_str(), t, td, td / t,
                  static_cast<long long>(hot), 100 * cold, rows.c_str());
      std::fflush(stdout);
    };
    ContextOptions base;
    base.autotune_gemm = true;
    // Automatic vs dense: the dense call's count every call and every 8th; non-gated, other thresholds.
    struct Auto {
      std::int64_t period;
      double nongated_threshold;  // ≤ 0: the default
    };
    std::vector<Auto> autos = {{1, 0}, {8, 0}};
    if (!gated)
      for (const double t : {0.008, 0.010, 0.012}) autos.push_back({8, t});
    for (const Auto a : autos) {
      ContextOptions o = base;
      o.dense_count_period = a.period;
      if (a.nongated_threshold > 0) o.max_sparse_density_nongated = a.nongated_threshold;
      FfnContext c(o);
      c.upload_weights(w, s);
      ForwardResult fr;
      const auto [td, ta] = alternating_medians_ms(
          warmup, reps, s, [&] { c.dense_forward(x.get(), m, yd.get(), s); },
          [&] { fr = c.forward(x.get(), m, y.get(), Path::automatic, s); });
      char what[64];
      std::snprintf(what, sizeof what, "auto, count period %lld, limit %.1f%%", static_cast<long long>(a.period),
                    100 * (gated ? o.max_sparse_density_gated : o.max_sparse_density_nongated));
      line(what, ta, td, c.hot_count(), -1, fr.path());
    }
    // The neurons' counts over this batch (original numbering), densest first.
    std::vector<std::uint32_t> counts;
    {
      FfnContext c(base);
      c.upload_weights(w, s);
      counts = c.count_neurons(x.get(), m, s);
    }
    std::vector<std::int64_t> order(static_cast<std::size_t>(N));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
      return counts[static_cast<std::size_t>(a)] > counts[static_cast<std::size_t>(b)];
    });
    struct Variant {
      double share, dense_rows;
    };
    for (const Variant v : {Variant{0, 0.02}, Variant{0.2, 0.02}, Variant{0.3, 0.02}, Variant{0.4, 0.02},
                            Variant{0.49, 0.02}, Variant{0.4, 0.01}, Variant{0, 0.01}}) {
      ContextOptions o = base;
      o.hot_neurons_auto = false;
      o.dense_rows_density = v.dense_rows;
      FfnContext c(o);
      c.upload_weights(w, s);
      const auto hot_n = static_cast<std::ptrdiff_t>(v.share * static_cast<double>(N));
      if (hot_n > 0) c.set_hot_neurons(std::vector<std::int64_t>(order.begin(), order.begin() + hot_n), s, &counts);
      const auto [td, ts] = alternating_medians_ms(
          warmup, reps, s, [&] { c.dense_forward(x.get(), m, yd.get(), s); },
          [&] {
            c.gate_twell(x.get(), m, s);
            c.sparse_rest(x.get(), m, y.get(), s);
          });
      c.gate_twell(x.get(), m, s);
      const TwellCounters cnt = c.read_counters(s);
      c.sparse_rest(x.get(), m, y.get(), s);
      const FfnContext::DenseRowsInfo dr = c.read_dense_rows(s);
      const double cold = static_cast<double>(cnt.nnz) / (static_cast<double>(m) * static_cast<double>(c.sparse_n(m)));
      char what[64], rows[96];
      std::snprintf(what, sizeof what, "sparse, hot share %.2f, rows >%.0f%%", v.share, 100 * v.dense_rows);
      std::snprintf(rows, sizeof rows, "%llu of %llu over the threshold (capacity %lld)",
                    static_cast<unsigned long long>(dr.dense), static_cast<unsigned long long>(dr.hot),
                    static_cast<long long>(dr.capacity));
      line(what, ts, td, c.hot_count(), cold, rows);
    }
  }
  cudaStreamDestroy(s);
  return 0;
}
