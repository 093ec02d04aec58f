// twell_probe_sampler: the host sampler's time a row at a 49 152-token vocabulary (SmolLM2's), for
// temperature alone and with top-p 0.9: 200 draws from one row of N(0, σ²) logits — σ = 3 (a peaked
// row: a small nucleus) and σ = 1, 0.3 (flat rows: the nucleus holds most of the vocabulary, as on
// the synthetic checkpoints' random weights) — and the sum of the picked ids (the same sum before
// and after a change that must keep the picks).
//   build/cpu/lab/twell_probe_sampler   (configured with -DTWELL_BUILD_LAB=ON)
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "twell/model/sampler.hpp"

int main() {
  constexpr int kVocab = 49152, kDraws = 200;
  const std::vector<std::int32_t> history(100, 5);
  for (const float sigma : {3.0f, 1.0f, 0.3f}) {
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> logits(kVocab);
  for (auto& e : logits) e = normal(gen);
  for (const double top_p : {1.0, 0.9}) {
    twell::model::SamplingOptions o;
    o.temperature = 0.8;
    o.top_p = top_p;
    o.seed = 3;
    twell::model::Sampler s(o);
    long long ids = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kDraws; ++i) ids += s.sample(logits, history);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / kDraws;
    std::printf("sigma %.1f, temperature 0.8, top-p %.2f: %.3f ms a row (sum of the picked ids %lld)\n", sigma, top_p,
                ms, ids);
  }
  }
  return 0;
}
