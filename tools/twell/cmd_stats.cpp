// twell stats: sparsity statistics of the FFN activations ReLU(x·w_gateᵀ) (or ReLU(x·w_upᵀ)).
#include <cstdio>
#include <memory>

#include "common.hpp"
#include "twell/cpu/ffn_ops.hpp"

namespace twell::cli {
namespace {

struct StatsArgs {
  std::string in;
  std::string json;
  bool no_gate = false;
  GenFlags gen;
  FormatFlags fmt;
};

int run_stats(StatsArgs& a) {
  const TwellConfig tcfg = a.fmt.twell();
  const HybridConfig hcfg = a.fmt.hybrid();
  if (!a.json.empty()) check_writable(a.json, "--json");
  FfnInputs in;
  if (!a.in.empty()) {
    LoadRules rules;
    rules.gated = !a.no_gate;
    rules.command = "stats";
    in = load_ffn_inputs(a.in, rules);
  } else {
    a.gen.p.gated = !a.no_gate;
    a.gen.validate();
    note(fmt::format("generating M={} K={} N={} density {:g} (seed {})", a.gen.p.m, a.gen.p.k, a.gen.p.n,
                     a.gen.p.density, a.gen.p.seed));
    in = generate_inputs(a.gen.p, false);
  }
  const FfnWeights w = in.weights();
  ffn_check_shapes(in.x_view(), w);
  // The activation pattern: ReLU of the gate product (gated) or of the up product (non-gated).
  const TwellMatrix g = cpu::ffn_gate_twell(in.x_view(), in.gated ? w.w_gate : w.w_up, tcfg);
  const ActivationStats s = activation_stats(g, hcfg.ell_width);

  fmt::print("twell stats: {} FFN activations {}, M={} K={} N={} (source: {})\n", in.gated ? "gated" : "non-gated",
             in.gated ? "ReLU(x w_gate^T)" : "ReLU(x w_up^T)", in.m, in.k, in.n, in.source);
  print_activation_stats(s, stdout);
  if (!a.json.empty()) {
    nlohmann::json j = s.to_json();
    j["source"] = in.source;
    j["gated"] = in.gated;
    j["shape"] = {{"m", in.m}, {"k", in.k}, {"n", in.n}};
    write_json_file(a.json, j);
  }
  return 0;
}

}  // namespace

void add_stats_command(CLI::App& root, std::vector<Command>& out) {
  auto a = std::make_shared<StatsArgs>();
  CLI::App* sub = root.add_subcommand("stats", "Sparsity statistics of the FFN activations");
  sub->footer("Sparsity statistics of the FFN activations ReLU(x w_gate^T) (ReLU(x w_up^T) with --no-gate):\n"
      "density, nnz per row (mean, percentiles, histogram), TwELL tile fill and overflow, hybrid tail rows,\n"
      "dead neurons and neuron popularity. Inputs from --in FILE.safetensors, or generated from the flags.");
  CLI::Option* in_opt =
      sub->add_option("--in", a->in, "Input safetensors file (x, w_gate, w_up, w_down); default: generate");
  sub->add_option("--json", a->json, "Also write the statistics as JSON to this file");
  sub->add_flag("--no-gate", a->no_gate, "Non-gated FFN (no w_gate)");
  a->gen.add(sub);
  for (CLI::Option* o : a->gen.options) in_opt->excludes(o);  // generator flags make no sense with --in
  a->fmt.add(sub);
  out.push_back({sub, [a] { return run_stats(*a); }});
}

}  // namespace twell::cli
