#pragma once
// The decode probes' driver (twell_probe_decode, twell_probe_timeline): a runtime over a model with
// `batch` sequences of `prompt` random tokens each (128 unless given), prefilled, then greedy decode steps one call
// at a time; the synthetic model they run.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "twell/model/runtime.hpp"
#include "twell/model/synthetic.hpp"

namespace twell::probe {

struct Decoder {
  std::unique_ptr<model::Runtime> rt;
  std::vector<std::unique_ptr<model::Sequence>> kv;
  std::vector<std::int32_t> next;

  // One decode step of every sequence (greedy); returns the wall time in ms.
  double step() {
    std::vector<model::SeqStep> st;
    for (std::size_t i = 0; i < kv.size(); ++i) st.push_back({kv[i].get(), std::span<const std::int32_t>(&next[i], 1)});
    const auto t0 = std::chrono::steady_clock::now();
    next = rt->forward_argmax(st);  // copies the tokens back: synchronous
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
};

inline Decoder start(const model::Model& m, model::FfnPath path, bool graphs, std::int64_t batch, std::int64_t capacity,
              std::mt19937_64& rng, int prompt = 128) {
  model::RuntimeTuning t = model::RuntimeTuning::from_env();  // TWELL_TUNING's other switches
  t.cuda_graphs = graphs;
  Decoder d;
  d.rt = model::make_runtime(m, "cuda", {path}, t);
  std::vector<std::vector<std::int32_t>> prompts(static_cast<std::size_t>(batch));
  std::vector<model::SeqStep> st;
  for (auto& p : prompts) {
    for (int i = 0; i < prompt; ++i) p.push_back(static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(m.config.vocab_size)));
    d.kv.push_back(d.rt->new_sequence(capacity));
    st.push_back({d.kv.back().get(), p});
  }
  d.next = d.rt->forward_argmax(st);
  return d;
}

// The synthetic model of a preset at a density (calibrated on 256 tokens), announced on stderr.
inline model::Model synthetic_model(const std::string& config, double density, const char* who) {
  model::SyntheticSpec spec;
  spec.config = model::preset_config(config);
  spec.density = density;
  spec.calibration_tokens = 256;
  std::fprintf(stderr, "%s: building the synthetic %s model (density %.3f %%)\n", who, config.c_str(), 100 * density);
  return model::make_synthetic_model(spec);
}

}  // namespace twell::probe
