// Per-layer, per-token counts of non-zero FFN activations (see activation_profile.hpp).
#include "twell/model/activation_profile.hpp"

#include <algorithm>
#include <bit>

#include "cpu/blas.hpp"
#include "model/activation.hpp"
#include "twell/error.hpp"
#include "twell/model/runtime.hpp"

namespace twell::model {

std::int64_t ActivationProfile::dead(std::int64_t layer) const noexcept {
  const auto first = neuron_hits.begin() + layer * neurons;
  return std::count(first, first + neurons, std::int64_t{0});
}

std::int64_t ActivationProfile::hot(std::int64_t layer, double share) const noexcept {
  const auto first = neuron_hits.begin() + layer * neurons;
  const double t = share * static_cast<double>(token_count());
  return std::count_if(first, first + neurons, [&](std::int64_t h) { return static_cast<double>(h) >= t; });
}

std::int64_t ActivationProfile::fired_union(std::int64_t layer, std::int64_t first, std::int64_t count) const {
  TWELL_CHECK(count >= 1 && first >= 0, ErrorCode::invalid_argument, "fired_union: tokens [{}, {})", first, first + count);
  std::vector<std::int64_t> which(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) which[static_cast<std::size_t>(i)] = first + i;
  return fired_union(layer, which);
}

std::int64_t ActivationProfile::fired_union(std::int64_t layer, std::span<const std::int64_t> which) const {
  const std::int64_t T = token_count(), W = (neurons + 63) / 64;
  TWELL_CHECK(!fired.empty(), ErrorCode::invalid_argument, "fired_union: the profile kept no sets (keep_sets)");
  TWELL_CHECK(layer >= 0 && layer < layers && !which.empty(), ErrorCode::invalid_argument,
              "fired_union: layer {} of {}, {} tokens", layer, layers, which.size());
  for (const std::int64_t t : which)
    TWELL_CHECK(t >= 0 && t < T, ErrorCode::invalid_argument, "fired_union: token {} outside the {} tokens", t, T);
  std::int64_t n = 0;
  for (std::int64_t w = 0; w < W; ++w) {
    std::uint64_t any = 0;
    for (const std::int64_t t : which) any |= fired[static_cast<std::size_t>((layer * T + t) * W + w)];
    n += std::popcount(any);
  }
  return n;
}

ActivationProfile profile_activations(const Model& model, std::span<const std::vector<std::int32_t>> sequences,
                                      bool keep_sets) {
  const LlamaConfig& c = model.config;
  const std::int64_t L = c.num_layers, N = c.intermediate_size, K = c.hidden_size;
  ActivationProfile p;
  p.layers = L;
  p.neurons = N;
  for (std::size_t s = 0; s < sequences.size(); ++s) {
    TWELL_CHECK(!sequences[s].empty(), ErrorCode::invalid_argument, "profile_activations: sequence {} is empty", s);
    for (std::size_t j = 0; j < sequences[s].size(); ++j) {
      p.tokens.push_back(sequences[s][j]);
      p.sequence.push_back(static_cast<std::int64_t>(s));
      p.position.push_back(static_cast<std::int64_t>(j));
    }
  }
  const std::int64_t T = p.token_count();
  TWELL_CHECK(T > 0, ErrorCode::invalid_argument, "profile_activations: no tokens");
  p.active.assign(static_cast<std::size_t>(L * T), 0);
  p.neuron_hits.assign(static_cast<std::size_t>(L * N), 0);
  const std::int64_t W = (N + 63) / 64;
  if (keep_sets) p.fired.assign(static_cast<std::size_t>(L * T * W), 0);
  std::int64_t row0 = 0;  // the current sequence's first token
  std::vector<float> g;
  RuntimeOptions opt(FfnPath::dense);
  opt.ffn_input_hook = [&](std::int64_t layer, CMatrixF x) {
    const std::int64_t rows = x.rows;
    g.resize(static_cast<std::size_t>(rows * N));
    const auto& w = model.layers[static_cast<std::size_t>(layer)].w_gate;
    cpu::gemm(false, true, 1.0f, x, CMatrixF(w.data(), N, K), 0.0f, MatrixF(g.data(), rows, N));
    std::int64_t* hits = p.neuron_hits.data() + layer * N;
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* gr = g.data() + r * N;
      std::uint64_t* set = keep_sets ? p.fired.data() + (layer * T + row0 + r) * W : nullptr;
      std::int32_t n = 0;
      for (std::int64_t j = 0; j < N; ++j)
        if (c.act == Activation::relu ? gr[j] > 0.0f : activate(c.act, gr[j]) != 0.0f) {
          ++n;
          ++hits[j];
          if (set) set[j / 64] |= std::uint64_t{1} << (j % 64);
        }
      p.active[static_cast<std::size_t>(layer * T + row0 + r)] = n;
    }
  };
  CpuRuntime rt(model, opt);
  for (const auto& seq : sequences) {
    auto kv = rt.new_sequence(static_cast<std::int64_t>(seq.size()));
    const SeqStep step{kv.get(), seq};
    rt.forward(std::span<const SeqStep>(&step, 1));
    row0 += static_cast<std::int64_t>(seq.size());
  }
  return p;
}

}  // namespace twell::model
