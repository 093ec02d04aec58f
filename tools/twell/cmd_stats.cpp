// twell stats: sparsity statistics of the FFN activations ReLU(x·w_gateᵀ) (or ReLU(x·w_upᵀ)) of
// one layer's inputs, or (--model, --text) of a whole model on real text: per layer, per position
// and per token (the paper's §5 analysis), as tables, JSON and an SVG picture.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>

#include "common.hpp"
#include "twell/cpu/ffn_ops.hpp"
#include "twell/model/activation_profile.hpp"
#include "twell/model/model.hpp"
#include "twell/model/tokenizer.hpp"

namespace twell::cli {
namespace {

struct StatsArgs {
  std::string in;
  std::string json;
  // model mode
  std::string model, text, hidden_act, svg;
  std::int64_t max_tokens = 2048, context = 0, top = 10;
  bool no_gate = false;
  GenFlags gen;
  FormatFlags fmt;
};

// A token's text for a table: its bytes with control and non-printing ASCII escaped.
std::string printable(const std::string& bytes) {
  std::string out;
  for (const unsigned char ch : bytes) {
    if (ch == '\n') out += "\\n";
    else if (ch == '\t') out += "\\t";
    else if (ch == '|') out += "\\|";
    else if (ch == '`') out += "\\x60";  // would end the table's code span
    else if (ch < 0x20 || ch == 0x7f) out += fmt::format("\\x{:02x}", ch);
    else out += static_cast<char>(ch);
  }
  return out;
}

// Positions in buckets 0, 1, 2–3, 4–7, …: the bucket of p.
int position_bucket(std::int64_t p) { return p == 0 ? 0 : 1 + static_cast<int>(std::floor(std::log2(static_cast<double>(p)))); }
std::string bucket_name(int b) {
  if (b == 0) return "0";
  const std::int64_t lo = std::int64_t{1} << (b - 1), hi = (std::int64_t{1} << b) - 1;
  return lo == hi ? std::to_string(lo) : fmt::format("{}–{}", lo, hi);
}

// A heat map of active neurons per token (rows: layers; columns: the first tokens) beside each
// layer's mean, as a standalone SVG.
std::string profile_svg(const model::ActivationProfile& p, const std::string& title) {
  const std::int64_t T = std::min<std::int64_t>(p.token_count(), 1024), L = p.layers;
  const int cw = T > 512 ? 1 : T > 256 ? 2 : 4, ch = 12, left = 60, top = 40, bar = 160;
  const int width = left + static_cast<int>(T) * cw + 40 + bar + 20, height = top + static_cast<int>(L) * ch + 50;
  std::int32_t vmax = 1;
  for (std::int64_t l = 0; l < L; ++l)
    for (std::int64_t t = 0; t < T; ++t) vmax = std::max(vmax, p.at(l, t));
  std::vector<double> mean(static_cast<std::size_t>(L), 0.0);
  for (std::int64_t l = 0; l < L; ++l) {
    for (std::int64_t t = 0; t < p.token_count(); ++t) mean[static_cast<std::size_t>(l)] += p.at(l, t);
    mean[static_cast<std::size_t>(l)] /= static_cast<double>(p.token_count());
  }
  const double mmax = std::max(1e-9, *std::max_element(mean.begin(), mean.end()));
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"10\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{}\" y=\"16\" font-size=\"13\">{}</text>\n"
      "<text x=\"{}\" y=\"30\">active neurons per token (darker: more; max {} of {}); first {} tokens</text>\n",
      width, height, left, title, left, vmax, p.neurons, T);
  for (std::int64_t l = 0; l < L; ++l) {
    const int y = top + static_cast<int>(l) * ch;
    if (l % std::max<std::int64_t>(1, L / 16) == 0)
      svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">layer {}</text>\n", left - 4, y + ch - 2, l);
    for (std::int64_t t = 0; t < T; ++t) {
      const double v = static_cast<double>(p.at(l, t)) / vmax;
      const int shade = static_cast<int>(std::lround(255.0 * (1.0 - std::sqrt(v))));
      svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"rgb({},{},255)\"/>\n",
                         left + static_cast<int>(t) * cw, y, cw, ch - 1, shade, shade);
    }
    const int bx = left + static_cast<int>(T) * cw + 40;
    const double w = bar * mean[static_cast<std::size_t>(l)] / mmax;
    svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"#d62728\"/>\n", bx, y, w, ch - 2);
  }
  const int bx = left + static_cast<int>(T) * cw + 40, by = top + static_cast<int>(L) * ch + 14;
  svg += fmt::format("<text x=\"{}\" y=\"{}\">mean per token (max {:.1f}, {:.3f} %)</text>\n", bx, by, mmax,
                     100.0 * mmax / static_cast<double>(p.neurons));
  svg += fmt::format("<text x=\"{}\" y=\"{}\">token position →</text>\n</svg>\n", left, by);
  return svg;
}

int run_model_stats(StatsArgs& a) {
  if (a.text.empty()) fail(ErrorCode::invalid_argument, "--model needs --text FILE (the text to run)");
  if (!a.json.empty()) check_writable(a.json, "--json");
  if (!a.svg.empty()) check_writable(a.svg, "--svg");
  model::LoadOptions lo;
  if (!a.hidden_act.empty()) lo.hidden_act = a.hidden_act;
  const model::Model m = model::Model::load(a.model, lo);
  if (const auto w = model::unknown_keys_warning(m.config); !w.empty()) fmt::print(stderr, "warning: {}\n", w);
  const model::Tokenizer tok = model::Tokenizer::from_file(a.model + "/tokenizer.json");
  const auto& c = m.config;
  TWELL_CHECK(tok.vocab_size() <= c.vocab_size, ErrorCode::corrupt,
              "tokenizer.json has {} tokens but the model's vocabulary holds {}", tok.vocab_size(), c.vocab_size);
  const std::string text = read_text_file(a.text, "--text");
  std::vector<std::int32_t> ids = tok.encode(text);
  if (ids.empty()) fail(ErrorCode::invalid_argument, "--text: '{}' encodes to no tokens", a.text);
  const std::int64_t total = static_cast<std::int64_t>(ids.size());
  if (total > a.max_tokens) ids.resize(static_cast<std::size_t>(a.max_tokens));
  // Sequences of at most `context` tokens (default: the model's context), each from position 0.
  const std::int64_t ctx = a.context > 0 ? std::min(a.context, c.max_position) : c.max_position;
  std::vector<std::vector<std::int32_t>> seqs;
  for (std::size_t i = 0; i < ids.size(); i += static_cast<std::size_t>(ctx))
    seqs.emplace_back(ids.begin() + static_cast<long>(i),
                      ids.begin() + static_cast<long>(std::min(ids.size(), i + static_cast<std::size_t>(ctx))));
  note(fmt::format("{}: {} layers, FFN {} ({}); {} of {} tokens of '{}' in {} sequence(s) of at most {} on the CPU",
                   a.model, c.num_layers, c.intermediate_size, model::to_string(c.act), ids.size(), total, a.text,
                   seqs.size(), ctx));
  const model::ActivationProfile p = model::profile_activations(m, seqs);
  const std::int64_t T = p.token_count(), L = p.layers, N = p.neurons;
  const double dn = static_cast<double>(N);

  fmt::print("twell stats: {} on {} tokens of {} ({} sequence(s) of at most {}); FFN activation {}: {}\n", a.model, T,
             a.text, seqs.size(), ctx, model::to_string(c.act),
             c.act == model::Activation::relu ? "active = gate > 0" : "active = act(gate) != 0 (not a ReLU model)");
  fmt::print("\n| layer | active per token | density | min | max | dead neurons (never active) | hot neurons (active on ≥ 50 % of tokens) |\n"
             "|---|---:|---:|---:|---:|---:|---:|\n");
  nlohmann::json jl = nlohmann::json::array();
  double all = 0;
  for (std::int64_t l = 0; l < L; ++l) {
    std::int64_t sum = 0;
    std::int32_t lo_v = p.at(l, 0), hi_v = p.at(l, 0);
    for (std::int64_t t = 0; t < T; ++t) {
      sum += p.at(l, t);
      lo_v = std::min(lo_v, p.at(l, t));
      hi_v = std::max(hi_v, p.at(l, t));
    }
    const double mean = static_cast<double>(sum) / static_cast<double>(T);
    all += mean;
    const std::int64_t dead = p.dead(l), hot = p.hot(l, 0.5);
    fmt::print("| {} | {:.1f} | {:.3f} % | {} | {} | {} ({:.1f} %) | {} ({:.1f} %) |\n", l, mean, 100 * mean / dn, lo_v,
               hi_v, dead, 100.0 * static_cast<double>(dead) / dn, hot, 100.0 * static_cast<double>(hot) / dn);
    jl.push_back({{"layer", l}, {"active_per_token", mean}, {"density", mean / dn}, {"min", lo_v}, {"max", hi_v},
                  {"dead", dead}, {"hot_50pct", hot}});
  }
  fmt::print("| all | {:.1f} | {:.3f} % | | | | |\n", all / static_cast<double>(L), 100 * all / static_cast<double>(L) / dn);

  // By position (mean over layers and tokens at positions in the bucket).
  std::vector<double> bsum;
  std::vector<std::int64_t> bcount;
  std::vector<double> per_token(static_cast<std::size_t>(T), 0.0);  // mean over layers
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t l = 0; l < L; ++l) per_token[static_cast<std::size_t>(t)] += p.at(l, t);
    per_token[static_cast<std::size_t>(t)] /= static_cast<double>(L);
    const auto b = static_cast<std::size_t>(position_bucket(p.position[static_cast<std::size_t>(t)]));
    if (bsum.size() <= b) {
      bsum.resize(b + 1, 0.0);
      bcount.resize(b + 1, 0);
    }
    bsum[b] += per_token[static_cast<std::size_t>(t)];
    ++bcount[b];
  }
  fmt::print("\n| positions | tokens | active per token (mean over layers) |\n|---|---:|---:|\n");
  nlohmann::json jp = nlohmann::json::array();
  for (std::size_t b = 0; b < bsum.size(); ++b) {
    if (bcount[b] == 0) continue;
    const double v = bsum[b] / static_cast<double>(bcount[b]);
    fmt::print("| {} | {} | {:.1f} |\n", bucket_name(static_cast<int>(b)), bcount[b], v);
    jp.push_back({{"positions", bucket_name(static_cast<int>(b))}, {"tokens", bcount[b]}, {"active_per_token", v}});
  }

  // Tokens with the most and the fewest active neurons (mean over layers).
  std::vector<std::int64_t> order(static_cast<std::size_t>(T));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t x, std::int64_t y) {
    return per_token[static_cast<std::size_t>(x)] > per_token[static_cast<std::size_t>(y)];
  });
  const auto row_json = [&](std::int64_t t) {
    return nlohmann::json{{"index", t},
                          {"id", p.tokens[static_cast<std::size_t>(t)]},
                          {"text", tok.token_bytes(p.tokens[static_cast<std::size_t>(t)])},
                          {"position", p.position[static_cast<std::size_t>(t)]},
                          {"active_per_token", per_token[static_cast<std::size_t>(t)]}};
  };
  nlohmann::json most = nlohmann::json::array(), fewest = nlohmann::json::array();
  const std::int64_t top = std::min(a.top, T);
  for (int which = 0; which < 2; ++which) {
    fmt::print("\ntokens with the {} active neurons (mean over layers):\n| token | id | position | active |\n|---|---:|---:|---:|\n",
               which == 0 ? "most" : "fewest");
    for (std::int64_t i = 0; i < top; ++i) {
      const std::int64_t t = which == 0 ? order[static_cast<std::size_t>(i)] : order[static_cast<std::size_t>(T - 1 - i)];
      fmt::print("| `{}` | {} | {} | {:.1f} |\n", printable(tok.token_bytes(p.tokens[static_cast<std::size_t>(t)])),
                 p.tokens[static_cast<std::size_t>(t)], p.position[static_cast<std::size_t>(t)],
                 per_token[static_cast<std::size_t>(t)]);
      (which == 0 ? most : fewest).push_back(row_json(t));
    }
  }
  if (!a.json.empty()) {
    nlohmann::json act = nlohmann::json::array();
    for (std::int64_t l = 0; l < L; ++l)
      act.push_back(std::vector<std::int32_t>(p.active.begin() + l * T, p.active.begin() + (l + 1) * T));
    nlohmann::json j = {{"model", a.model},  {"text", a.text},         {"activation", model::to_string(c.act)},
                        {"layers", L},       {"neurons", N},           {"tokens", p.tokens},
                        {"position", p.position}, {"sequence", p.sequence}, {"per_layer", jl},
                        {"by_position", jp}, {"most_active", most},    {"fewest_active", fewest},
                        {"active", act}};
    // Token texts may hold invalid UTF-8 (a byte-level token cut inside a character): replace.
    write_json_file(a.json, nlohmann::json::parse(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)));
  }
  if (!a.svg.empty()) {
    std::string title = fmt::format("{}: {} tokens, FFN {} ({})", a.model, T, N, model::to_string(c.act));
    std::string safe;
    for (char ch : title) safe += ch == '<' ? std::string("&lt;") : ch == '&' ? std::string("&amp;") : std::string(1, ch);
    write_text_file(a.svg, profile_svg(p, safe));
  }
  return 0;
}

int run_stats(StatsArgs& a) {
  if (!a.model.empty()) return run_model_stats(a);
  if (!a.text.empty()) fail(ErrorCode::invalid_argument, "--text needs --model DIR");
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
  sub->footer(sub->get_footer() +
              "\n\nWith --model DIR --text FILE: a whole model's FFN activations on real text (CPU forward, exact):\n"
              "per layer (active neurons per token, density, dead neurons), per position, and the tokens with the\n"
              "most and fewest active neurons; --json for every count, --svg for a picture.\n"
              "Example: twell stats --model DIR --text article.txt --svg stats.svg");
  CLI::Option* model_opt = sub->add_option("--model", a->model, "A Hugging Face Llama checkpoint directory (with tokenizer.json)");
  sub->add_option("--text", a->text, "With --model: the text file to run");
  sub->add_option("--max-tokens", a->max_tokens, "With --model: run at most this many tokens of the text")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 24));
  sub->add_option("--context", a->context, "With --model: tokens per sequence (default: the model's context)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 24));
  sub->add_option("--hidden-act", a->hidden_act, "With --model: override config.json's hidden_act (relu, silu, ...)");
  sub->add_option("--top", a->top, "With --model: tokens listed with the most / fewest active neurons")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{100000}));
  sub->add_option("--svg", a->svg, "With --model: also draw the counts (layers x tokens) as an SVG file");
  model_opt->excludes(in_opt);
  for (CLI::Option* o : a->gen.options) model_opt->excludes(o);
  for (const char* name : {"--tile", "--compression", "--ell-width", "--no-gate"}) model_opt->excludes(name);
  for (const char* name : {"--max-tokens", "--context", "--hidden-act", "--top", "--svg"}) sub->get_option(name)->needs(model_opt);
  out.push_back({sub, [a] { return run_stats(*a); }});
}

}  // namespace twell::cli
