// twell gen model: a synthetic sparse Llama checkpoint at the paper's shapes.
#include <cstdio>
#include <memory>

#include "common.hpp"
#include "twell/model/runtime.hpp"
#include "twell/model/synthetic.hpp"

namespace twell::cli {
namespace {

struct GenModelArgs {
  std::string config = "tiny";
  std::string out;
  std::int64_t layers = 0;
  model::SyntheticSpec spec;
  std::int64_t check_tokens = 256;
};

int run_gen_model(GenModelArgs& a) {
  a.spec.config = model::preset_config(a.config);
  if (a.layers > 0) a.spec.config.num_layers = a.layers;
  const auto targets = model::target_densities(a.spec);
  const auto& c = a.spec.config;
  note(fmt::format("building {} ({} layers, hidden {}, FFN {}, {:.1f} M parameters), mean density {:.3f} % ({:.1f} of {})",
                   a.config, c.num_layers, c.hidden_size, c.intermediate_size, static_cast<double>(c.parameters()) / 1e6,
                   100 * a.spec.density, a.spec.density * static_cast<double>(c.intermediate_size), c.intermediate_size));
  const model::Model m = model::make_synthetic_model(a.spec, [](int done, int total) {
    std::fprintf(stderr, "\rtwell: layer %d / %d", done, total);
    if (done == total) std::fputc('\n', stderr);
  });
  // Measure what the layers reach on random tokens, exactly (the CPU runtime's dense path counts).
  if (a.check_tokens > 0) {
    model::CpuRuntime rt(m, {model::FfnPath::dense, 0});
    std::vector<std::int32_t> toks(static_cast<std::size_t>(std::min(a.check_tokens, c.max_position)));
    std::uint64_t x = a.spec.seed;
    for (auto& t : toks) t = static_cast<std::int32_t>((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 33) % static_cast<std::int32_t>(c.vocab_size);
    auto seq = rt.new_sequence(static_cast<std::int64_t>(toks.size()));
    model::SeqStep st{seq.get(), toks};
    rt.forward(std::span<const model::SeqStep>(&st, 1));
    std::string line;
    for (std::size_t l = 0; l < rt.ffn_stats().size(); ++l)
      line += fmt::format("{}{:.2f}/{:.2f}", l ? " " : "", 100 * rt.ffn_stats()[l].last_density, 100 * targets[l]);
    note(fmt::format("density per layer, measured/target % on {} random tokens: {}", toks.size(), line));
  }
  note(fmt::format("writing {} ...", a.out));
  model::save_checkpoint(m, a.out);
  fmt::print("wrote {}: config.json + model.safetensors (bf16, hidden_act relu)\n", a.out);
  return 0;
}

}  // namespace

void add_gen_model_command(CLI::App& gen, std::vector<Command>& out) {
  auto a = std::make_shared<GenModelArgs>();
  CLI::App* sub = gen.add_subcommand("model", "Write a synthetic sparse ReLU Llama checkpoint (Hugging Face layout)");
  sub->footer(
      "A Llama checkpoint with random weights whose ReLU FFNs fire at a chosen per-layer density on real-looking\n"
      "inputs (a constant residual channel acts as a per-neuron threshold, as the 'massive activations' of\n"
      "trained models do), with skewed neuron popularity and dead neurons. For benchmarks at the paper's\n"
      "shapes: twell bench model --model DIR. transformers loads it as any LlamaForCausalLM.");
  sub->add_option("--config", a->config, "Shape: tiny, 0.5b, 1b, 1.5b, 2b (the paper's SparseLM shapes), 2b-gqa (the 2B with 8 KV heads), 7b (Llama-2-7B), 7b-gqa (Mistral-7B)")
      ->check(CLI::IsMember({"tiny", "0.5b", "1b", "1.5b", "2b", "2b-gqa", "7b", "7b-gqa"}));
  sub->add_option("--out", a->out, "Output directory (must not exist, or be empty)")->required();
  sub->add_option("--layers", a->layers, "Override the preset's layer count")->check(CLI::Range(1, 1000));
  sub->add_option("--density", a->spec.density, "Mean FFN density over the layers (0.0051: 29 of 5632)");
  sub->add_option("--profile", a->spec.profile, "Per-layer densities: paper (quiet early, busy middle) or flat")
      ->check(CLI::IsMember({"paper", "flat"}));
  sub->add_option("--skew", a->spec.popularity_sigma, "Log-normal sigma of neuron popularity (0: uniform)");
  sub->add_option("--dead", a->spec.dead_share, "Share of neurons that never fire");
  sub->add_option("--seed", a->spec.seed, "Random seed");
  sub->add_option("--check-tokens", a->check_tokens, "Measure the densities reached on this many random tokens (0: skip)");
  out.push_back({sub, [a] { return run_gen_model(*a); }});
}

}  // namespace twell::cli
