// twell_probe_decode: one decode step of a synthetic model on the GPU, kernel by kernel, for a
// profiler (diagnostics for issue 27's decode targets).
//   twell_probe_decode [config [density [batch [steps [graphs]]]]]   (defaults: 2b 0.005 1 8)
// Builds the synthetic model (calibrated on 256 tokens), then for the dense FFN path and the
// automatic path in turn: a runtime without CUDA graphs (every kernel launched, so a profiler sees
// each one), a prefill of 128 tokens per sequence, `steps` warm-up decode steps, and one decode step
// between cudaProfilerStart / cudaProfilerStop. Under
//   ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv
// the first profiled step is the dense path's, the second the automatic one's (each ends with the
// LM head's argmax kernel); lab/profiles/decode_profile.py sums them per kernel.
// With a fifth argument `graphs`, the profiled steps are the graph-replayed ones instead (for
// ncu --graph-profiling graph: the GPU time of a whole step, against its wall time printed here).
// Without a profiler it prints each runtime's decode step time (CUDA graphs off and on).
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cuda/sm80/twell_dense_rows.hpp"
#include "twell/model/runtime.hpp"
#include "probe_decoder.hpp"

using namespace twell;
using probe::Decoder;
using probe::start;

int main(int argc, char** argv) try {
  const std::string config = argc > 1 ? argv[1] : "2b";
  const double density = argc > 2 ? std::stod(argv[2]) : 0.005;
  const std::int64_t batch = argc > 3 ? std::stoll(argv[3]) : 1;
  const int steps = argc > 4 ? std::stoi(argv[4]) : 8;
  const bool profile_graphs = argc > 5 && std::string(argv[5]) == "graphs";
  const model::Model m = probe::synthetic_model(config, density, "probe_decode");
  {  // host cost of one CUB scratch-size query (FfnContext::reserve made one on every call until it returned early)
    const auto t0 = std::chrono::steady_clock::now();
    std::size_t sink = 0;
    for (int i = 0; i < 1000; ++i) sink += cuda::dense_rows_plan_temp_bytes(1 + i % 16);
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 1000;
    std::printf("host: dense_rows_plan_temp_bytes %.2f us a call (%zu)\n", us, sink % 7);
  }
  std::mt19937_64 rng(7);
  const std::int64_t capacity = 128 + 2 * steps + 64;
  for (const model::FfnPath path : {model::FfnPath::dense, model::FfnPath::automatic}) {
    const char* name = path == model::FfnPath::dense ? "dense" : "automatic";
    for (const bool graphs : {false, true}) {
      Decoder d = start(m, path, graphs, batch, capacity, rng);
      for (int s = 0; s < steps; ++s) d.step();
      std::vector<double> ms;
      const std::int64_t replays = d.rt->graph_launches();
      for (int s = 0; s < steps; ++s) ms.push_back(d.step());
      std::sort(ms.begin(), ms.end());
      std::printf("%-9s graphs %-3s batch %lld: decode step %.3f ms (median of %d; min %.3f, max %.3f; %lld graph replays)\n",
                  name, graphs ? "on" : "off", static_cast<long long>(batch), ms[ms.size() / 2], steps, ms.front(),
                  ms.back(), static_cast<long long>(d.rt->graph_launches() - replays));
      if (graphs == profile_graphs) {  // the profiled step
        cudaDeviceSynchronize();
        cudaProfilerStart();
        d.step();
        cudaDeviceSynchronize();
        cudaProfilerStop();
      }
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "probe_decode: %s\n", e.what());
  return 1;
}
