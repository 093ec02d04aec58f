// twell bench model: a whole model's prefill and decode speed, the sparse FFN against the runtime's
// own dense FFN path in the same process on the same inputs (alternating, medians), with the
// densities the layers reached and the device memory each needs.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>

#include "common.hpp"
#include "runtime_flags.hpp"
#include "twell/model/activation_profile.hpp"
#include "twell/model/runtime.hpp"
#include "twell/model/step_bytes.hpp"
#include "twell/model/synthetic.hpp"

namespace twell::cli {
namespace {

struct BenchModelArgs {
  std::string model_dir;
  std::string config;
  std::string hidden_act;
  model::SyntheticSpec spec;
  std::string device;
  std::int64_t prefill_batch = 8, prefill_len = 512;
  std::vector<std::int64_t> decode_batches = {1, 8, 64};
  std::int64_t context = 128, decode_steps = 32;
  std::int64_t decode_warmup = 2;  // untimed decode steps of each runtime before a batch's timed ones
  int reps = 3;
  bool energy = true;
  std::string json;
};

struct Pair {
  std::vector<double> dense, sparse;  // seconds per rep
};

// One timed run: seconds, and the GPU's energy over the same span (−1 where it cannot be read).
struct Sample {
  double s = 0, j = -1;
};

template <typename F>
Sample measure(model::Runtime& rt, F&& body) {
  const double e0 = rt.device_energy_joules(), t0 = now_seconds();
  body();
  const double s = now_seconds() - t0, e1 = rt.device_energy_joules();
  return {s, e0 >= 0 && e1 >= 0 ? e1 - e0 : -1};
}

std::vector<std::int32_t> random_tokens(std::mt19937_64& rng, std::int64_t n, std::int64_t vocab) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (auto& e : t) e = static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(vocab));
  return t;
}

// Per layer, the FFN rows of timed runs and those that took the sparse path (the runtime's own
// counts: which path ran, not what the layer's density was).
struct PathRows {
  std::vector<std::int64_t> rows, sparse;
};

// Adds what rt's FFN counted since `before` (a copy of its ffn_stats()) to acc.
void add_path_rows(PathRows& acc, const model::Runtime& rt, const std::vector<model::FfnLayerStats>& before) {
  const auto& after = rt.ffn_stats();
  acc.rows.resize(after.size(), 0);
  acc.sparse.resize(after.size(), 0);
  for (std::size_t l = 0; l < after.size() && l < before.size(); ++l) {
    acc.rows[l] += after[l].rows - before[l].rows;
    acc.sparse[l] += after[l].sparse_rows - before[l].sparse_rows;
  }
}

// Raises *peak to the device memory in use now (where asked and readable).
void note_memory(const model::Runtime& rt, std::int64_t* peak) {
  if (peak) *peak = std::max(*peak, rt.device_memory_in_use());
}

// One prefill of `batch` sequences of `len` tokens (path: where its FFN rows went; peak: the device
// memory in use after it, its KV caches alive; each where asked).
Sample time_prefill(model::Runtime& rt, const std::vector<std::vector<std::int32_t>>& seqs, PathRows* path = nullptr,
                    std::int64_t* peak = nullptr) {
  std::vector<std::unique_ptr<model::Sequence>> kv;
  std::vector<model::SeqStep> steps;
  for (const auto& s : seqs) kv.push_back(rt.new_sequence(static_cast<std::int64_t>(s.size())));
  for (std::size_t i = 0; i < seqs.size(); ++i) steps.push_back({kv[i].get(), seqs[i]});
  const auto before = rt.ffn_stats();
  const Sample t = measure(rt, [&] { rt.forward(steps); });
  if (path) add_path_rows(*path, rt, before);
  note_memory(rt, peak);
  return t;
}

// `steps` greedy decode steps of `prompts.size()` sequences after an untimed prefill (path: where
// the timed steps' FFN rows went; peak: the device memory in use after them, KV caches alive).
Sample time_decode(model::Runtime& rt, const std::vector<std::vector<std::int32_t>>& prompts, std::int64_t steps,
                   PathRows* path = nullptr, std::int64_t* peak = nullptr) {
  std::vector<std::unique_ptr<model::Sequence>> kv;
  std::vector<model::SeqStep> st;
  for (const auto& p : prompts) kv.push_back(rt.new_sequence(static_cast<std::int64_t>(p.size()) + steps));
  for (std::size_t i = 0; i < prompts.size(); ++i) st.push_back({kv[i].get(), prompts[i]});
  std::vector<std::int32_t> next = rt.forward_argmax(st);
  const auto before = rt.ffn_stats();
  const Sample t = measure(rt, [&] {
    for (std::int64_t s = 0; s < steps; ++s) {
      for (std::size_t i = 0; i < prompts.size(); ++i) st[i] = {kv[i].get(), std::span<const std::int32_t>(&next[i], 1)};
      next = rt.forward_argmax(st);
    }
  });
  if (path) add_path_rows(*path, rt, before);
  note_memory(rt, peak);
  return t;
}

nlohmann::json path_json(const PathRows& p) {
  std::int64_t all = 0, sp = 0;
  std::vector<double> share;
  for (std::size_t l = 0; l < p.rows.size(); ++l) {
    all += p.rows[l];
    sp += p.sparse[l];
    share.push_back(p.rows[l] > 0 ? static_cast<double>(p.sparse[l]) / static_cast<double>(p.rows[l]) : -1.0);
  }
  return {{"ffn_rows", all}, {"sparse_rows", sp}, {"sparse_share_per_layer", share}};
}

void add(Pair& p, const Sample& dense, const Sample& sparse) {
  p.dense.push_back(dense.s);
  p.sparse.push_back(sparse.s);
}

int run_bench_model(BenchModelArgs& a) {
  if (a.model_dir.empty() == a.config.empty()) fail(ErrorCode::invalid_argument, "give either --model DIR or --config NAME");
  if (!a.json.empty()) check_writable(a.json, "--json");
  if (a.reps < 1) fail(ErrorCode::invalid_argument, "--reps must be ≥ 1");
  // The A/B switches in effect: TWELL_TUNING's. A benchmark measures a server's steady state: its
  // warm-up call builds a shape's cuDNN graph (cudnn-build-at=1), unless TWELL_TUNING sets a build
  // call other than the runtime's default (2).
  model::RuntimeTuning tuning = model::RuntimeTuning::from_env();
  if (tuning.cudnn_build_at == model::RuntimeTuning{}.cudnn_build_at) tuning.cudnn_build_at = 1;
  std::string why;
  const std::string device = resolve_device(a.device, &why) == DeviceKind::cuda ? "cuda" : "cpu";
  model::Model m;
  std::string source;
  if (!a.config.empty()) {
    a.spec.config = model::preset_config(a.config);
    note(fmt::format("building the synthetic {} model in memory (mean density {:.3f} %)", a.config, 100 * a.spec.density));
    m = model::make_synthetic_model(a.spec, [](int d, int t) {
      std::fprintf(stderr, "\rtwell: layer %d / %d", d, t);
      if (d == t) std::fputc('\n', stderr);
    });
    source = fmt::format("synthetic {} (density {:g}, profile {}, skew {:g}, dead {:g}, seed {})", a.config,
                         a.spec.density, a.spec.profile, a.spec.popularity_sigma, a.spec.dead_share, a.spec.seed);
  } else {
    model::LoadOptions lo;
    if (!a.hidden_act.empty()) lo.hidden_act = a.hidden_act;
    m = model::Model::load(a.model_dir, lo);
    if (const auto w = model::unknown_keys_warning(m.config); !w.empty()) fmt::print(stderr, "warning: {}\n", w);
    source = a.model_dir;
  }
  const auto& c = m.config;
  if (a.prefill_len > c.max_position || a.context + a.decode_steps > c.max_position)
    fail(ErrorCode::invalid_argument, "--prefill-len / --context + --decode-steps exceed the model's context ({})", c.max_position);
  note(fmt::format("{}: {} layers, hidden {}, FFN {} ({}), {:.1f} M parameters; device {} ({})", source, c.num_layers,
                   c.hidden_size, c.intermediate_size, model::to_string(c.act), static_cast<double>(c.parameters()) / 1e6,
                   device, why));

  // Densities the layers reach on these inputs, counted exactly on the CPU (profile_activations: the
  // dense forward, fp32), and per decode batch the union of fired neurons over that many independent
  // sequences' last tokens (as a decode step's rows are): the up and down rows a sparse step of that
  // batch must read (the byte floor below).
  std::mt19937_64 rng(a.spec.seed + 17);
  std::vector<double> density;
  std::map<std::int64_t, std::vector<double>> fired;  // decode batch → per layer, mean union over groups
  std::int64_t density_tokens = 0, density_seqs = 0;
  if (c.act == model::Activation::relu) {
    // As many sequences as the largest decode batch, together ≈ 128 tokens (32 for models over 1 B
    // parameters: the CPU's dense forward of 2 B is ≈ 4 GFLOP a token), each of at least 2.
    const std::int64_t most = a.decode_batches.empty() ? 1 : *std::max_element(a.decode_batches.begin(), a.decode_batches.end());
    const std::int64_t budget = c.parameters() > 1000000000 ? 32 : 128;
    const std::int64_t len = std::min<std::int64_t>(std::max<std::int64_t>(2, budget / most), c.max_position);
    std::vector<std::vector<std::int32_t>> seqs;
    for (std::int64_t s = 0; s < most; ++s) seqs.push_back(random_tokens(rng, len, c.vocab_size));
    const std::int64_t n = most * len;
    density_tokens = n;
    density_seqs = most;
    const model::ActivationProfile p = model::profile_activations(m, seqs, /*keep_sets=*/true);
    for (std::int64_t l = 0; l < c.num_layers; ++l) {
      double sum = 0;
      for (std::int64_t t = 0; t < n; ++t) sum += p.at(l, t);
      density.push_back(sum / static_cast<double>(n * c.intermediate_size));
    }
    for (const std::int64_t b : a.decode_batches) {
      auto& f = fired[b];
      std::vector<std::int64_t> last(static_cast<std::size_t>(b));  // sequences g·b … g·b + b − 1: their last tokens
      for (std::int64_t l = 0; l < c.num_layers; ++l) {
        double u = 0;
        for (std::int64_t g = 0; g + b <= most; g += b) {
          for (std::int64_t i = 0; i < b; ++i) last[static_cast<std::size_t>(i)] = (g + i + 1) * len - 1;
          u += static_cast<double>(p.fired_union(l, last));
        }
        f.push_back(u / static_cast<double>(most / b));
      }
    }
  }
  double mean_density = 0;
  for (double d : density) mean_density += d / static_cast<double>(density.size());

  // Memory: each runtime alone, the most in use (the whole device, as cudaMemGetInfo says) after its
  // prefill and after decode steps at the largest batch, their KV caches alive: weights, caches,
  // workspaces grown to those calls.
  std::int64_t mem_dense = -1, mem_sparse = -1;
  const auto prefill_seqs = [&] {
    std::vector<std::vector<std::int32_t>> s;
    for (std::int64_t b = 0; b < a.prefill_batch; ++b) s.push_back(random_tokens(rng, a.prefill_len, c.vocab_size));
    return s;
  }();
  auto make = [&](model::FfnPath path) { return model::make_runtime(m, device, {path}, tuning); };
  if (device == "cuda") {
    for (int which = 0; which < 2; ++which) {
      auto rt = make(which ? model::FfnPath::automatic : model::FfnPath::dense);
      std::int64_t& peak = which ? mem_sparse : mem_dense;
      time_prefill(*rt, prefill_seqs, nullptr, &peak);
      if (!a.decode_batches.empty()) {
        std::vector<std::vector<std::int32_t>> prompts;
        const std::int64_t b = *std::max_element(a.decode_batches.begin(), a.decode_batches.end());
        for (std::int64_t i = 0; i < b; ++i) prompts.push_back(random_tokens(rng, a.context, c.vocab_size));
        time_decode(*rt, prompts, std::min<std::int64_t>(2, a.decode_steps), nullptr, &peak);
      }
    }
  }
  auto dense = make(model::FfnPath::dense);
  auto sparse = make(c.act == model::Activation::relu ? model::FfnPath::automatic : model::FfnPath::dense);

  // Agreement of the dense path and the sparse path forced on every layer, all positions of 256
  // tokens (automatic would run dense at this size).
  double agree = 0;
  if (c.act == model::Activation::relu) {
    auto forced = model::make_runtime(m, device, {model::FfnPath::sparse});  // TWELL_TUNING's switches as they are
    const std::int64_t n = std::min<std::int64_t>(256, c.max_position);
    std::vector<std::vector<std::int32_t>> s = {random_tokens(rng, n, c.vocab_size)};
    std::vector<std::vector<float>> out;
    for (auto* rt : {dense.get(), forced.get()}) {
      auto seq = rt->new_sequence(n);
      model::SeqStep st{seq.get(), s[0]};
      out.push_back(rt->forward(std::span<const model::SeqStep>(&st, 1), true));
    }
    double d = 0, mx = 0;
    for (std::size_t i = 0; i < out[0].size(); ++i) {
      d = std::max(d, static_cast<double>(std::fabs(out[1][i] - out[0][i])));
      mx = std::max(mx, static_cast<double>(std::fabs(out[0][i])));
    }
    agree = d / std::max(mx, 1e-30);
  }

  struct Row {
    std::string phase;
    std::int64_t batch, tokens;  // tokens per rep
    Pair t;
    PathRows path;  // the sparse runtime's timed runs
  };
  std::vector<Row> rows;
  const int total = static_cast<int>(1 + a.decode_batches.size()) * a.reps;
  int done = 0;
  auto progress = [&](const std::string& what) {
    std::fprintf(stderr, "\rtwell: [%d/%d] %s            ", ++done, total, what.c_str());
    std::fflush(stderr);
  };
  // The memory's copy bandwidth, measured before the rows and again after them (the byte-floor table
  // below): on the H200 one process read 4.20 TB/s and another 3.79 after decode rows of 8–64 (bench/
  // results/2026-12-02-h200-session-78.md), so a single reading could set the bar low.
  const auto measure_copy = [&] {
    try {
      return sparse->copy_bandwidth();
    } catch (const std::exception& e) {  // a device or host too full for the copy's buffers
      note(fmt::format("copy bandwidth not measured: {}", e.what()));
      return -1.0;
    }
  };
  const double copy_before = measure_copy();
  // Warm-up: one call of each shape on each runtime (cuBLASLt plans, the FFN's first counted call).
  time_prefill(*dense, prefill_seqs);
  time_prefill(*sparse, prefill_seqs);
  {
    Row r{"prefill", a.prefill_batch, a.prefill_batch * a.prefill_len, {}, {}};
    for (int i = 0; i < a.reps; ++i) {
      progress(fmt::format("prefill {} x {}", a.prefill_batch, a.prefill_len));
      const Sample d = time_prefill(*dense, prefill_seqs);
      add(r.t, d, time_prefill(*sparse, prefill_seqs, &r.path));
    }
    rows.push_back(r);
  }
  for (std::int64_t b : a.decode_batches) {
    std::vector<std::vector<std::int32_t>> prompts;
    for (std::int64_t i = 0; i < b; ++i) prompts.push_back(random_tokens(rng, a.context, c.vocab_size));
    // Warm-up (in sequences that fit the context): graphs captured, and with --decode-warmup the
    // state a long-running server has (the one-token FFN's neuron order, the dispatch's counts).
    for (std::int64_t left = a.decode_warmup; left > 0;) {
      const std::int64_t steps = std::min(left, c.max_position - a.context);
      time_decode(*dense, prompts, steps);
      time_decode(*sparse, prompts, steps);
      left -= steps;
    }
    Row r{"decode", b, b * a.decode_steps, {}, {}};
    for (int i = 0; i < a.reps; ++i) {
      progress(fmt::format("decode batch {}", b));
      const Sample d = time_decode(*dense, prompts, a.decode_steps);
      add(r.t, d, time_decode(*sparse, prompts, a.decode_steps, &r.path));
    }
    rows.push_back(r);
  }
  // Energy (GPU): each row once more per runtime, at least ~1 s of work in one counter span (the
  // NVML counter moves in steps of tens of ms, too coarse for the timed runs above).
  std::vector<std::pair<double, double>> energy(rows.size(), {-1.0, -1.0});  // J/token: dense, sparse
  if (a.energy && device == "cuda" && dense->device_energy_joules() >= 0) {
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::fprintf(stderr, "\rtwell: energy run %zu/%zu (%s batch %lld)            ", i + 1, rows.size(), r.phase.c_str(),
                   static_cast<long long>(r.batch));
      for (int which = 0; which < 2; ++which) {
        model::Runtime& rt = which ? *sparse : *dense;
        const double t = median(which ? r.t.sparse : r.t.dense);
        double& out = which ? energy[i].second : energy[i].first;
        if (r.phase == "prefill") {
          const auto k = static_cast<std::int64_t>(std::ceil(1.0 / t));
          const Sample e = measure(rt, [&] {
            for (std::int64_t j = 0; j < k; ++j) time_prefill(rt, prefill_seqs);
          });
          if (e.j >= 0) out = e.j / static_cast<double>(k * r.tokens);
        } else {
          std::vector<std::vector<std::int32_t>> prompts;
          for (std::int64_t b = 0; b < r.batch; ++b) prompts.push_back(random_tokens(rng, a.context, c.vocab_size));
          const double step = t / static_cast<double>(a.decode_steps);
          const std::int64_t steps =
              std::clamp<std::int64_t>(static_cast<std::int64_t>(std::ceil(1.0 / step)), 1, c.max_position - a.context);
          const Sample e = time_decode(rt, prompts, steps);
          if (e.j >= 0) out = e.j / static_cast<double>(steps * r.batch);
        }
      }
    }
  }
  std::fputc('\n', stderr);

  std::int64_t sparse_layers = 0;
  for (const auto& s : sparse->ffn_stats()) sparse_layers += s.sparse_rows > 0;
  fmt::print("twell bench model: {}\n", source);
  fmt::print("device {} | commit {} | {}\n", device == "cuda" ? dense->device() : cpu_name(), git_commit(), iso_time_utc());
  if (!density.empty())
    fmt::print("FFN density measured on {} random tokens ({} sequences): mean {:.3f} % ({:.1f} of {} per token), layers "
               "{:.2f}–{:.2f} %\n",
               density_tokens, density_seqs, 100 * mean_density, mean_density * static_cast<double>(c.intermediate_size), c.intermediate_size,
               100 * *std::min_element(density.begin(), density.end()), 100 * *std::max_element(density.begin(), density.end()));
  fmt::print("sparse runtime: {} of {} layers ran the sparse FFN at least once; logits of the sparse path (forced) vs the "
             "dense path, 256 positions: max rel diff {:.2e}\n",
             sparse_layers, c.num_layers, agree);
  fmt::print("\n| phase | batch | tokens per run | dense tokens/s | sparse tokens/s | sparse / dense | dense ms/step | sparse ms/step "
             "| dense mJ/token | sparse mJ/token |\n");
  fmt::print("|---|---|---|---|---|---|---|---|---|---|\n");
  auto mj = [](double j) { return j < 0 ? std::string("n/a") : fmt::format("{:.2f}", 1e3 * j); };
  nlohmann::json jr = nlohmann::json::array();
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const double td = median(r.t.dense), ts = median(r.t.sparse);
    const double steps = r.phase == "decode" ? static_cast<double>(a.decode_steps) : 1.0;
    const auto [jd, js] = energy[i];
    fmt::print("| {} | {} | {} | {:.0f} | {:.0f} | {:.3f}x | {:.3f} | {:.3f} | {} | {} |\n", r.phase, r.batch, r.tokens,
               static_cast<double>(r.tokens) / td, static_cast<double>(r.tokens) / ts, td / ts, 1e3 * td / steps,
               1e3 * ts / steps, mj(jd), mj(js));
    jr.push_back({{"phase", r.phase}, {"batch", r.batch}, {"tokens", r.tokens}, {"dense_s", r.t.dense},
                  {"sparse_s", r.t.sparse}, {"dense_tokens_per_s", static_cast<double>(r.tokens) / td},
                  {"sparse_tokens_per_s", static_cast<double>(r.tokens) / ts}, {"speedup", td / ts},
                  {"dense_joules_per_token", jd}, {"sparse_joules_per_token", js},
                  {"sparse_runtime_path", path_json(r.path)}});
  }
  // The byte floor of each decode row (step_bytes.hpp): what a step must read and write at least,
  // the bandwidth the measured steps reached on it, and the copy bandwidth of the same memory, the
  // higher of its two readings (before the rows and now), so that a share of it is never flattered
  // by a low one; the ceiling ratio is dense bytes over sparse bytes (the sparse step reading the up
  // and down rows of the batch's union of fired neurons, measured above).
  const double copy_after = measure_copy();
  const double copy_bw = std::max(copy_before, copy_after);
  const double kv_position = static_cast<double>(a.context) + static_cast<double>(a.decode_steps - 1) / 2;
  nlohmann::json jbytes = nlohmann::json::array();
  bool header = false;
  for (const Row& r : rows) {
    if (r.phase != "decode") continue;
    // Each runtime's element sizes at this batch (bf16 on the GPU; the CPU's fp32 and bf16 copies).
    model::StepShape sd = dense->decode_step_shape(r.batch), ss = sparse->decode_step_shape(r.batch);
    sd.kv_positions = ss.kv_positions = kv_position;
    const double bd = model::decode_step_bytes(c, sd).total();
    const auto f = fired.find(r.batch);
    double bs = -1;
    if (f != fired.end()) {
      ss.fired = f->second;
      bs = model::decode_step_bytes(c, ss).total();
    }
    const double steps_d = static_cast<double>(a.decode_steps) / median(r.t.dense);
    const double steps_s = static_cast<double>(a.decode_steps) / median(r.t.sparse);
    if (!header) {
      const auto gbs = [](double bw) { return bw > 0 ? fmt::format("{:.0f}", bw / 1e9) : std::string("n/a"); };
      fmt::print("\nbyte floor of a decode step (weights, KV cache of {:.0f} positions, each read once); copy bandwidth {}\n",
                 kv_position,
                 copy_bw > 0 ? fmt::format("{} GB/s (the higher of two readings in this process: {} before the rows, {} after)",
                                           gbs(copy_bw), gbs(copy_before), gbs(copy_after))
                             : std::string("n/a"));
      fmt::print("| batch | dense MB/step | sparse MB/step (union of the batch's fired rows) | speed ceiling sparse / dense (bytes dense / sparse) | "
                 "dense GB/s | of copy | sparse GB/s | of copy | sparse / own dense, measured |\n");
      fmt::print("|---|---|---|---|---|---|---|---|---|\n");
      header = true;
    }
    const auto pct = [&](double bw) { return copy_bw > 0 ? fmt::format("{:.0f} %", 100 * bw / copy_bw) : std::string("n/a"); };
    const auto opt = [](double v, const char* f) { return v > 0 ? fmt::format(fmt::runtime(f), v) : std::string("n/a"); };
    fmt::print("| {} | {:.1f} | {} | {} | {:.0f} | {} | {} | {} | {:.3f}x |\n", r.batch, bd / 1e6, opt(bs / 1e6, "{:.1f}"),
               opt(bs > 0 ? bd / bs : -1, "{:.3f}x"), bd * steps_d / 1e9, pct(bd * steps_d),
               opt(bs > 0 ? bs * steps_s / 1e9 : -1, "{:.0f}"), bs > 0 ? pct(bs * steps_s) : std::string("n/a"),
               steps_s / steps_d);
    jbytes.push_back({{"batch", r.batch}, {"kv_positions", kv_position}, {"dense_bytes_per_step", bd},
                      {"sparse_bytes_per_step", bs}, {"ceiling_ratio", bs > 0 ? bd / bs : -1.0},
                      {"dense_bandwidth", bd * steps_d}, {"sparse_bandwidth", bs > 0 ? bs * steps_s : -1.0},
                      {"fired_per_layer", f != fired.end() ? nlohmann::json(f->second) : nlohmann::json()}});
  }
  // Where the sparse runtime's FFN rows went in each row's timed runs, and the layers that did not
  // always take the sparse path (the dispatch's choice per layer and call).
  fmt::print("\nsparse runtime, timed runs: share of FFN rows on the sparse path\n");
  for (const Row& r : rows) {
    std::int64_t all = 0, sp = 0;
    std::string mixed;
    for (std::size_t l = 0; l < r.path.rows.size(); ++l) {
      all += r.path.rows[l];
      sp += r.path.sparse[l];
      if (r.path.sparse[l] < r.path.rows[l])
        mixed += fmt::format(" {}:{:.0f}%", l, 100.0 * static_cast<double>(r.path.sparse[l]) / static_cast<double>(r.path.rows[l]));
    }
    if (all > 0)
      fmt::print("  {} batch {}: {:.1f} %{}\n", r.phase, r.batch, 100.0 * static_cast<double>(sp) / static_cast<double>(all),
                 mixed.empty() ? std::string(", every layer sparse") : ", layers not always sparse (layer:share)" + mixed);
  }
  if (mem_dense >= 0)
    fmt::print("\npeak device memory in use, each runtime alone (the whole device; KV caches of the {} x {} prefill and of "
               "decode at batch {} alive): dense {:.2f} GB, sparse {:.2f} GB\n",
               a.prefill_batch, a.prefill_len,
               a.decode_batches.empty() ? 0 : *std::max_element(a.decode_batches.begin(), a.decode_batches.end()),
               static_cast<double>(mem_dense) / 1e9, static_cast<double>(mem_sparse) / 1e9);
  fmt::print("A/B switches in effect (TWELL_TUNING; cudnn-build-at=1 is this benchmark's default): {}\n",
             tuning.describe().empty() ? "every one at its default" : tuning.describe());
  if (device == "cuda") {
    fmt::print("CUDA graphs for decode steps: {} (replays: dense {}, sparse {})\n", tuning.cuda_graphs ? "on" : "off",
               dense->graph_launches(), sparse->graph_launches());
    fmt::print("prefill attention: {}; programmatic launches: {}\n", dense->prefill_attention(),
               dense->programmatic_launch() ? "on"
               : tuning.programmatic_launch ? "off (this GPU or build does not take them)"
                                            : "off (TWELL_TUNING=no-pdl)");
    fmt::print("fused one-row decode (off: no-fused-decode): {}; the sparse runtime's fixed-point one-token FFN "
               "output (off: no-fixed-point-decode): {}; its neurons most active first (off: "
               "no-decode-neuron-order): {}\n",
               dense->fused_decode() ? "on" : "off", sparse->fixed_point_decode() ? "on" : "off",
               tuning.decode_neuron_order ? "on" : "off");
  }
  // Which path the sparse runtime's FFN rows took (over every run above: prefill and decode).
  std::int64_t ffn_rows = 0, ffn_sparse_rows = 0;
  for (const auto& s : sparse->ffn_stats()) {
    ffn_rows += s.rows;
    ffn_sparse_rows += s.sparse_rows;
  }
  if (ffn_rows > 0)
    fmt::print("sparse runtime: {:.1f} % of FFN rows on the sparse path (decode steps sparse up to a layer density of {})\n",
               100.0 * static_cast<double>(ffn_sparse_rows) / static_cast<double>(ffn_rows),
               tuning.decode_max_density >= 0 ? fmt::format("{:g} %", 100 * tuning.decode_max_density)
                                              : std::string("the engine's default"));
  fmt::print("(both runtimes run the same attention, norms and LM head; only the FFN path differs. Decode steps include\n"
             " the greedy pick and its copy back to the host, as a user's generation does. Energy: the whole GPU's NVML\n"
             " counter over a separate run of each row lasting about a second.)\n");
  if (!a.json.empty()) {
    nlohmann::json j = {{"source", source},
                        {"device", device == "cuda" ? dense->device() : cpu_name()},
                        {"commit", git_commit()},
                        {"date", iso_time_utc()},
                        {"layers", c.num_layers},
                        {"hidden", c.hidden_size},
                        {"intermediate", c.intermediate_size},
                        {"density_per_layer", density},
                        {"copy_bandwidth", copy_bw},  // bytes read + written per second; < 0: not measured
                        {"copy_bandwidth_before", copy_before}, {"copy_bandwidth_after", copy_after},
                        {"decode_byte_floor", jbytes},
                        {"logits_rel_diff_sparse_vs_dense", agree},
                        {"reps", a.reps},
                        {"decode_steps", a.decode_steps},
                        {"decode_warmup", a.decode_warmup},
                        {"context", a.context},
                        {"tuning", tuning.describe()},  // TWELL_TUNING's items in effect ("": every default)
                        {"cuda_graphs", tuning.cuda_graphs},
                        {"prefill_attention", dense->prefill_attention()},
                        {"programmatic_launch", dense->programmatic_launch()},
                        {"fused_decode", dense->fused_decode()},
                        {"fixed_point_decode", sparse->fixed_point_decode()},
                        {"decode_neuron_order", tuning.decode_neuron_order},
                        {"decode_max_density", tuning.decode_max_density},  // < 0: the engine's default
                        {"decode_max_rows", tuning.decode_max_rows},        // < 0: the engine's default
                        {"decode_gemv_max_rows", tuning.decode_gemv_max_rows},  // the same
                        {"union_max_rows", tuning.union_max_rows},          // < 0: the engine's default
                        {"union_min_rows", tuning.union_min_rows},          // < 0: the engine's default
                        {"union_up_split", tuning.union_up_split},          // the same
                        {"union_down_split", tuning.union_down_split},
                        {"union_up_clusters", tuning.union_up_clusters},
                        {"sparse_runtime_ffn_rows", {{"all", ffn_rows}, {"sparse", ffn_sparse_rows}}},
                        {"peak_memory_bytes", {{"dense", mem_dense}, {"sparse", mem_sparse}}},  // −1 on the CPU
                        {"rows", jr}};
    write_json_file(a.json, j);
  }
  return 0;
}

}  // namespace

void add_bench_model_command(CLI::App& bench, std::vector<Command>& out) {
  auto a = std::make_shared<BenchModelArgs>();
  CLI::App* sub = bench.add_subcommand("model", "A whole model's prefill and decode speed, sparse FFN vs dense FFN");
  sub->footer(
      "Times prefill (a batch of prompts) and greedy decode (batches of sequences, one token per step) through\n"
      "two runtimes over the same weights: the dense FFN path and twell's automatic sparse/dense dispatch.\n"
      "Runs alternate rep by rep; medians are reported. A checkpoint (--model) or a synthetic model built in\n"
      "memory at the paper's shapes (--config, see `twell gen model --help` for the density options).\n"
      "Each decode row also gets its byte floor (weights and KV cache read once; a sparse step reads the up\n"
      "and down rows of the neurons its batch fired, counted on the CPU), the bandwidth each runtime reached\n"
      "on it, and the memory's copy bandwidth measured in the same process (before the rows and after; the\n"
      "higher reading is the one each share is of).\n"
      "Example: twell bench model --config 2b --density 0.005\n" +
      std::string(kTuningHelp));
  sub->add_option("--model", a->model_dir, "Checkpoint directory (Hugging Face layout)");
  sub->add_option("--config", a->config, "Synthetic model: tiny, 0.5b, 1b, 1.5b, 2b (the paper's shapes), 2b-gqa (the 2B with 8 KV heads), 7b (Llama-2-7B), 7b-gqa (Mistral-7B)")
      ->check(CLI::IsMember({"tiny", "0.5b", "1b", "1.5b", "2b", "2b-gqa", "7b", "7b-gqa"}));
  sub->add_option("--density", a->spec.density, "Synthetic: mean FFN density");
  sub->add_option("--profile", a->spec.profile, "Synthetic: paper or flat")->check(CLI::IsMember({"paper", "flat"}));
  sub->add_option("--skew", a->spec.popularity_sigma, "Synthetic: log-normal sigma of neuron popularity");
  sub->add_option("--dead", a->spec.dead_share, "Synthetic: share of dead neurons");
  sub->add_option("--seed", a->spec.seed, "Seed (synthetic weights and the random tokens)");
  sub->add_option("--hidden-act", a->hidden_act, "Override the checkpoint's hidden_act");
  sub->add_option("--device", a->device, "cpu or cuda (default: cuda when usable)");
  sub->add_option("--prefill-batch", a->prefill_batch, "Prompts per prefill")->check(CLI::Range(1, 4096));
  sub->add_option("--prefill-len", a->prefill_len, "Tokens per prompt")->check(CLI::Range(1, 1 << 20));
  sub->add_option("--decode-batch", a->decode_batches, "Decode batch sizes")->check(CLI::Range(1, 4096));
  sub->add_option("--context", a->context, "Prompt tokens before decoding")->check(CLI::Range(1, 1 << 20));
  sub->add_option("--decode-steps", a->decode_steps, "Timed decode steps")->check(CLI::Range(1, 1 << 20));
  sub->add_option("--reps", a->reps, "Timed repetitions of each run (medians)")->check(CLI::Range(1, 1000));
  sub->add_option("--decode-warmup", a->decode_warmup,
                  "Untimed decode steps of each runtime before each batch's timed ones (a long-running server's state: "
                  "graphs captured, the sparse FFN's neuron order sorted by its counts at steps 8, 16, 32, ...)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  sub->add_flag("!--no-energy", a->energy, "Skip the energy runs (about a second per row and runtime)");
  sub->add_option("--json", a->json, "Write the results here");
  out.push_back({sub, [a] { return run_bench_model(*a); }});
}

}  // namespace twell::cli
