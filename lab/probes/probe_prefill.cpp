// twell_probe_prefill: one prefill of a synthetic model on the GPU, kernel by kernel, for a profiler
// (diagnostics for issue 27's prefill targets: where the time of an 8 × 512 prefill goes).
//   twell_probe_prefill [config|DIR [density [batch [length [reps]]]]]   (defaults: 2b 0.005 8 512 3)
// Builds the synthetic model (calibrated on 256 tokens) or loads the checkpoint in DIR (a folder
// with config.json, e.g. from `twell gen model`: the same weights a PyTorch profile reads), then for the dense FFN path and the
// automatic path in turn: a runtime, `reps` timed prefills of `batch` fresh sequences of `length`
// random tokens (each after one warm-up), and one more prefill between cudaProfilerStart /
// cudaProfilerStop. Under
//   ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv
// the first profiled prefill is the dense path's, the second the automatic one's (each ends with the
// LM head's argmax kernel); lab/profiles/decode_profile.py sums them per kernel, as it does decode
// steps. Without a profiler it prints each runtime's prefill time and tokens/s.
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cstdio>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "twell/model/runtime.hpp"
#include "twell/model/synthetic.hpp"

using namespace twell;

namespace {

// One prefill of fresh sequences (greedy next token); returns the wall time in ms (forward_argmax
// copies the tokens back, so the GPU work has ended).
double prefill(model::Runtime& rt, const std::vector<std::vector<std::int32_t>>& prompts) {
  std::vector<std::unique_ptr<model::Sequence>> kv;
  std::vector<model::SeqStep> st;
  for (const auto& p : prompts) {
    kv.push_back(rt.new_sequence(static_cast<std::int64_t>(p.size()) + 1));
    st.push_back({kv.back().get(), p});
  }
  const auto t0 = std::chrono::steady_clock::now();
  rt.forward_argmax(st);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string config = argc > 1 ? argv[1] : "2b";
  const double density = argc > 2 ? std::stod(argv[2]) : 0.005;
  const std::int64_t batch = argc > 3 ? std::stoll(argv[3]) : 8;
  const std::int64_t length = argc > 4 ? std::stoll(argv[4]) : 512;
  const int reps = argc > 5 ? std::stoi(argv[5]) : 3;
  if (batch < 1 || length < 1 || reps < 1) {
    std::fprintf(stderr, "usage: twell_probe_prefill [config [density [batch [length [reps]]]]] (all positive)\n");
    return 2;
  }
  const bool dir = std::filesystem::exists(std::filesystem::path(config) / "config.json");
  model::SyntheticSpec spec;
  if (!dir) {
    spec.config = model::preset_config(config);
    spec.density = density;
    spec.calibration_tokens = 256;
  }
  std::fprintf(stderr, "probe_prefill: %s %s\n", dir ? "loading" : "building the synthetic model", config.c_str());
  const model::Model m = dir ? model::Model::load(config) : model::make_synthetic_model(spec);
  std::mt19937_64 rng(7);
  std::vector<std::vector<std::int32_t>> prompts(static_cast<std::size_t>(batch));
  for (auto& p : prompts)
    for (std::int64_t i = 0; i < length; ++i)
      p.push_back(static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(m.config.vocab_size)));
  for (const model::FfnPath path : {model::FfnPath::dense, model::FfnPath::automatic}) {
    const char* name = path == model::FfnPath::dense ? "dense" : "automatic";
    model::RuntimeTuning t = model::RuntimeTuning::from_env();  // TWELL_TUNING's other switches
    t.cudnn_build_at = 1;  // the warm-up call builds cuDNN's graph
    auto rt = model::make_runtime(m, "cuda", {path}, t);
    std::vector<double> ms;
    for (int r = 0; r < reps; ++r) {
      prefill(*rt, prompts);  // warm-up: workspaces grown, cuDNN graphs built
      ms.push_back(prefill(*rt, prompts));
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    std::printf("%-9s prefill %lld x %lld: %.3f ms (median of %d; min %.3f, max %.3f), %.0f tokens/s; attention: %s\n",
                name, static_cast<long long>(batch), static_cast<long long>(length), med, reps, ms.front(), ms.back(),
                static_cast<double>(batch * length) / med * 1e3, rt->prefill_attention().c_str());
    cudaDeviceSynchronize();
    cudaProfilerStart();
    prefill(*rt, prompts);
    cudaDeviceSynchronize();
    cudaProfilerStop();
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "probe_prefill: %s\n", e.what());
  return 1;
}
