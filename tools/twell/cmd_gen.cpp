// twell gen: synthetic FFN inputs with trained-model sparsity statistics, to a safetensors file.
#include <cmath>
#include <memory>

#include "common.hpp"
#include "twell/io/safetensors.hpp"

namespace twell::cli {
namespace {

struct GenArgs {
  GenFlags gen;
  std::string out;
  std::string dtype = "f32";
  bool no_dy = false;
  bool no_gate = false;
  double l1_coeff = 0;
  CLI::Option* l1_opt = nullptr;
};

HostTensor as_dtype(const HostTensor& t, DType dt) {
  if (dt == DType::f32) return t.to_f32();
  HostTensor o(DType::bf16, t.shape());
  const float* in = t.data<float>();
  bf16* p = o.data<bf16>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = to_bf16(in[i]);
  return o;
}

int run_gen(GenArgs& a) {
  if (a.out.empty()) fail(ErrorCode::invalid_argument, "--out is required (see `twell gen --help`)");
  a.gen.p.gated = !a.no_gate;
  a.gen.validate();
  const bool with_l1 = a.l1_opt->count() > 0;
  if (with_l1 && !std::isfinite(a.l1_coeff))
    fail(ErrorCode::invalid_argument, "--l1-coeff must be finite, got {}", a.l1_coeff);
  check_writable(a.out, "--out");
  const DType dt = a.dtype == "bf16" ? DType::bf16 : DType::f32;
  note(fmt::format("generating M={} K={} N={} density {:g} (seed {})", a.gen.p.m, a.gen.p.k, a.gen.p.n,
                   a.gen.p.density, a.gen.p.seed));
  const FfnInputs in = generate_inputs(a.gen.p, !a.no_dy);

  std::vector<std::pair<std::string, HostTensor>> ts;
  ts.emplace_back("x", as_dtype(in.x, dt));
  if (in.gated) ts.emplace_back("w_gate", as_dtype(in.w_gate, dt));
  ts.emplace_back("w_up", as_dtype(in.w_up, dt));
  ts.emplace_back("w_down", as_dtype(in.w_down, dt));
  if (in.has_dy) ts.emplace_back("dy", as_dtype(in.dy, dt));
  if (with_l1) ts.emplace_back("l1_coeff", io::scalar_f32(static_cast<float>(a.l1_coeff)));
  std::vector<io::TensorRef> refs;
  std::string listing;
  for (const auto& [name, t] : ts) {
    refs.push_back({name, &t});
    listing += fmt::format("{}{} {}", listing.empty() ? "" : ", ", name, t.shape_string());
  }
  const auto& p = a.gen.p;
  io::write_safetensors(a.out, refs,
                        {{"producer", "twell gen"},
                         {"params", fmt::format("m={} k={} n={} density={} row_spread={} hot_rows={} hot_density={} "
                                                "neuron_skew={} dead_neurons={} gated={} seed={}",
                                                p.m, p.k, p.n, p.density, p.row_spread, p.hot_rows, p.hot_density,
                                                p.neuron_skew, p.dead_neurons, p.gated, p.seed)}});
  fmt::print("wrote {} ({}): {}\n", a.out, a.dtype, listing);
  return 0;
}

}  // namespace

void add_gen_command(CLI::App& root, std::vector<Command>& out) {
  auto a = std::make_shared<GenArgs>();
  CLI::App* sub = root.add_subcommand("gen", "Write generated FFN inputs with realistic sparsity to a safetensors file");
  sub->footer("Write generated FFN inputs (x, w_gate, w_up, w_down, dy) to a safetensors file for `twell ffn`.\n"
      "ReLU(x w_gate^T) gets the statistics of trained ReLU-sparse models: a mean density, a heavy-tailed\n"
      "spread over rows, optional hot rows, skewed neuron popularity and dead neurons; same seed, same file.");
  sub->add_option("--out", a->out, "Output safetensors file (required)");
  sub->require_subcommand(0, 1);
  add_gen_model_command(*sub, out);  // `twell gen model`: before `gen` itself, which is parsed too
  a->gen.add(sub);
  sub->add_option("--dtype", a->dtype, "Storage dtype of the tensors: f32 or bf16")
      ->check(CLI::IsMember({"f32", "bf16"}));
  sub->add_flag("--no-gate", a->no_gate, "Non-gated FFN: no w_gate; the sparsity is put into w_up");
  sub->add_flag("--no-dy", a->no_dy, "Do not write dy (the gradient input of --op train)");
  a->l1_opt = sub->add_option("--l1-coeff", a->l1_coeff, "Also write the scalar l1_coeff with this value");
  out.push_back({sub, [a] { return run_gen(*a); }});
}

}  // namespace twell::cli
