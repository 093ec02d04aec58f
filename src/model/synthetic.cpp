// Synthetic sparse Llama checkpoints (see twell/model/synthetic.hpp for the construction).
#include "twell/model/synthetic.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "twell/bf16.hpp"
#include "twell/error.hpp"
#include "twell/host_memory.hpp"
#include "twell/io/safetensors.hpp"
#include "twell/model/runtime.hpp"
#include "cpu/blas.hpp"

namespace twell::model {
namespace {

std::uint64_t mix(std::uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// n values N(0, sd²) rounded to bf16, reproducible from (seed, stream) whatever the thread count.
std::vector<float> normal(std::size_t n, float sd, std::uint64_t seed, std::uint64_t stream) {
  std::vector<float> v(n);
  constexpr std::size_t kChunk = 1 << 16;
  const auto chunks = static_cast<std::int64_t>((n + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static)
  for (std::int64_t c = 0; c < chunks; ++c) {
    std::mt19937_64 rng(mix(seed ^ mix(stream * 1000003ull + static_cast<std::uint64_t>(c))));
    std::normal_distribution<float> d(0.0f, sd);
    const std::size_t end = std::min(n, static_cast<std::size_t>(c + 1) * kChunk);
    for (std::size_t i = static_cast<std::size_t>(c) * kChunk; i < end; ++i) v[i] = round_bf16(d(rng));
  }
  return v;
}

double phi(double z) { return 0.5 * std::erfc(-z / std::numbers::sqrt2); }

// Φ⁻¹(p) by bisection (p in (0, 1)).
double inv_phi(double p) {
  double lo = -40, hi = 40;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (phi(mid) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

// Sets layer l's gate biases from its normalised FFN input x̂ [T, K] (the probe's, through the
// already calibrated layers 0 … l − 1): Wg[n, 0] = −(mean(q_n) + std(q_n)·(quantile[n] + δ)) with
// q_n = Wg[n, 1:]·x̂[1:] / x̂[0] (g_n > 0 ⇔ q_n > −Wg[n, 0], since x̂[0] > 0) and δ the one shift that
// gives the probe the layer's target density.
void calibrate_layer(Model& m, std::int64_t l, CMatrixF input, const std::vector<double>& quantile, double target) {
  const std::int64_t K = m.config.hidden_size, N = m.config.intermediate_size, T = input.rows;
  TWELL_CHECK(T > 1, ErrorCode::internal, "synthetic model: the calibration probe captured no FFN input");
  std::vector<float> xh(input.data, input.data + T * K);
  std::vector<float> x0(static_cast<std::size_t>(T));
  for (std::int64_t t = 0; t < T; ++t) {
    x0[static_cast<std::size_t>(t)] = xh[static_cast<std::size_t>(t * K)];
    xh[static_cast<std::size_t>(t * K)] = 0.0f;
  }
  LayerWeights& w = m.layers[static_cast<std::size_t>(l)];
  std::vector<float> q(static_cast<std::size_t>(T * N));
  cpu::gemm(false, true, 1.0f, CMatrixF(xh.data(), T, K), CMatrixF(w.w_gate.data(), N, K), 0.0f, MatrixF(q.data(), T, N));
  std::vector<double> mean(static_cast<std::size_t>(N)), sd(static_cast<std::size_t>(N));
#pragma omp parallel for schedule(static)
  for (std::int64_t n = 0; n < N; ++n) {
    double sum = 0, sum2 = 0;
    for (std::int64_t t = 0; t < T; ++t) {
      const double v = q[static_cast<std::size_t>(t * N + n)] /= x0[static_cast<std::size_t>(t)];
      sum += v;
      sum2 += v * v;
    }
    mean[static_cast<std::size_t>(n)] = sum / static_cast<double>(T);
    sd[static_cast<std::size_t>(n)] = std::sqrt(std::max(0.0, sum2 / static_cast<double>(T) - mean[static_cast<std::size_t>(n)] * mean[static_cast<std::size_t>(n)]));
  }
  // q_n is not quite Gaussian (a ratio, and the tokens share context): one shift δ (in σ) for the
  // alive neurons makes the probe's own layer density equal the target, t_n = mean + σ·(Φ⁻¹(1 − d_n) + δ).
  // Each neuron's threshold at δ (dead neurons never fire), then q's rows in memory order: the same
  // comparisons as neuron by neuron, without striding down q's columns (40 probes of T·N values).
  std::vector<double> thr(static_cast<std::size_t>(N));
  auto probe_density = [&](double delta) {
    for (std::int64_t n = 0; n < N; ++n)
      thr[static_cast<std::size_t>(n)] =
          quantile[static_cast<std::size_t>(n)] >= 10.0
              ? std::numeric_limits<double>::infinity()
              : mean[static_cast<std::size_t>(n)] + sd[static_cast<std::size_t>(n)] * (quantile[static_cast<std::size_t>(n)] + delta);
    std::int64_t fired = 0;
#pragma omp parallel for reduction(+ : fired) schedule(static)
    for (std::int64_t t = 0; t < T; ++t) {
      const float* row = q.data() + t * N;
      std::int64_t f = 0;
      for (std::int64_t n = 0; n < N; ++n) f += row[n] > thr[static_cast<std::size_t>(n)];
      fired += f;
    }
    return static_cast<double>(fired) / static_cast<double>(T * N);
  };
  double lo = -3, hi = 3;  // density falls as δ grows
  for (int it = 0; it < 40; ++it) {
    const double mid = 0.5 * (lo + hi);
    (probe_density(mid) > target ? lo : hi) = mid;
  }
  const double delta = 0.5 * (lo + hi);
  for (std::int64_t n = 0; n < N; ++n) {
    const double z = quantile[static_cast<std::size_t>(n)];
    const double t = mean[static_cast<std::size_t>(n)] + sd[static_cast<std::size_t>(n)] * (z >= 10.0 ? z : z + delta);
    w.w_gate[static_cast<std::size_t>(n * K)] = round_bf16(static_cast<float>(-t));
  }
}

}  // namespace

LlamaConfig preset_config(const std::string& name) {
  LlamaConfig c;
  c.vocab_size = 49152;
  c.hidden_size = 2048;
  c.intermediate_size = 5632;
  c.num_heads = 32;
  c.num_kv_heads = 32;
  c.head_dim = 64;
  c.max_position = 2048;
  c.rms_eps = 1e-5;
  c.rope_theta = 1e5;
  c.act = Activation::relu;
  c.act_name = "relu";
  c.tied_embeddings = true;
  c.bos_ids = {0};
  c.eos_ids = {0};
  c.dtype = "bfloat16";
  if (name == "0.5b") c.num_layers = 8;
  else if (name == "1b") c.num_layers = 18;
  else if (name == "1.5b") c.num_layers = 28;
  else if (name == "2b") c.num_layers = 38;
  else if (name == "2b-gqa") {
    // The 2B with grouped-query attention: 8 KV heads for its 32 query heads (groups of 4, as
    // Llama-3's), everything else the 2B's. Its KV cache is a quarter of the 2B's.
    c.num_layers = 38;
    c.num_kv_heads = 8;
  }
  else if (name == "7b" || name == "7b-gqa") {
    // Llama-2-7B's shape (MHA, FFN 11008, vocabulary 32000, untied head, θ 1e4); "7b-gqa" is
    // Mistral-7B's (8 KV heads, FFN 14336, θ 1e6). Context 4096, as Llama 2's.
    const bool gqa = name == "7b-gqa";
    c.vocab_size = 32000;
    c.hidden_size = 4096;
    c.intermediate_size = gqa ? 14336 : 11008;
    c.num_heads = 32;
    c.num_kv_heads = gqa ? 8 : 32;
    c.head_dim = 128;
    c.num_layers = 32;
    c.max_position = 4096;
    c.rope_theta = gqa ? 1e6 : 1e4;
    c.tied_embeddings = false;
    c.bos_ids = {1};
    c.eos_ids = {2};
  } else if (name == "tiny") {
    c.vocab_size = 512;
    c.hidden_size = 256;
    c.intermediate_size = 704;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.num_layers = 4;
    c.max_position = 512;
  } else {
    fail(ErrorCode::invalid_argument, "unknown model preset '{}' (tiny, 0.5b, 1b, 1.5b, 2b, 2b-gqa, 7b, 7b-gqa)", name);
  }
  return c;
}

void SyntheticSpec::validate() const {
  TWELL_CHECK(config.num_layers > 0 && config.hidden_size > 1 && config.intermediate_size > 0 && config.vocab_size > 0,
              ErrorCode::invalid_argument, "synthetic model: empty shape");
  TWELL_CHECK(density > 0 && density < 0.5, ErrorCode::invalid_argument, "--density must lie in (0, 0.5), got {}", density);
  TWELL_CHECK(layer_density.empty() || static_cast<std::int64_t>(layer_density.size()) == config.num_layers,
              ErrorCode::invalid_argument, "{} layer densities given for {} layers", layer_density.size(), config.num_layers);
  for (double d : layer_density)
    TWELL_CHECK(d > 0 && d < 0.5, ErrorCode::invalid_argument, "layer densities must lie in (0, 0.5), got {}", d);
  TWELL_CHECK(profile == "paper" || profile == "flat", ErrorCode::invalid_argument,
              "--profile must be paper or flat, got '{}'", profile);
  TWELL_CHECK(popularity_sigma >= 0 && popularity_sigma <= 3, ErrorCode::invalid_argument,
              "--skew must lie in [0, 3], got {}", popularity_sigma);
  TWELL_CHECK(dead_share >= 0 && dead_share < 0.95, ErrorCode::invalid_argument, "--dead must lie in [0, 0.95), got {}",
              dead_share);
}

std::vector<double> target_densities(const SyntheticSpec& s) {
  s.validate();
  if (!s.layer_density.empty()) return s.layer_density;
  const auto L = static_cast<std::size_t>(s.config.num_layers);
  std::vector<double> shape(L, 1.0);
  if (s.profile == "paper")  // quiet first layers, busiest in the middle
    for (std::size_t l = 0; l < L; ++l)
      shape[l] = 0.3 + std::sin(std::numbers::pi * (static_cast<double>(l) + 0.5) / static_cast<double>(L));
  double mean = 0;
  for (double v : shape) mean += v / static_cast<double>(L);
  for (auto& v : shape) v = std::min(0.45, v / mean * s.density);
  return shape;
}

Model make_synthetic_model(const SyntheticSpec& s, const std::function<void(int, int)>& progress) {
  const std::vector<double> targets = target_densities(s);
  const LlamaConfig& c = s.config;
  check_host_memory(4.0 * static_cast<double>(c.parameters()) +
                        4.0 * static_cast<double>(c.num_layers * c.hidden_size * c.intermediate_size),
                    fmt::format("a synthetic model of {:.2f} B parameters (fp32 on the host)", static_cast<double>(c.parameters()) / 1e9));
  const std::int64_t K = c.hidden_size, N = c.intermediate_size, V = c.vocab_size, L = c.num_layers;
  const float sd = 0.02f, sd_out = 0.02f / std::sqrt(2.0f * static_cast<float>(L));
  const float bias = std::sqrt(static_cast<float>(K));  // channel 0's constant c
  Model m;
  m.config = c;
  m.dir = "(synthetic)";
  std::uint64_t stream = 0;
  m.embed = normal(static_cast<std::size_t>(V * K), 1.0f, s.seed, stream++);
  for (std::int64_t v = 0; v < V; ++v) m.embed[static_cast<std::size_t>(v * K)] = round_bf16(bias);
  m.final_norm.assign(static_cast<std::size_t>(K), 1.0f);
  if (!c.tied_embeddings) m.lm_head = normal(static_cast<std::size_t>(V * K), sd, s.seed, stream++);
  m.layers.resize(static_cast<std::size_t>(L));
  std::mt19937_64 rng(mix(s.seed ^ 0x5eed));
  std::vector<std::vector<double>> quantiles(static_cast<std::size_t>(L));  // per layer: Φ⁻¹(1 − d_n); 10 if dead
  for (std::int64_t l = 0; l < L; ++l) {
    LayerWeights& w = m.layers[static_cast<std::size_t>(l)];
    w.attn_norm.assign(static_cast<std::size_t>(K), 1.0f);
    w.ffn_norm.assign(static_cast<std::size_t>(K), 1.0f);
    w.wqkv = normal(static_cast<std::size_t>((c.q_dim() + 2 * c.kv_dim()) * K), sd, s.seed, stream++);
    w.wo = normal(static_cast<std::size_t>(K * c.q_dim()), sd_out, s.seed, stream++);
    std::fill_n(w.wo.begin(), c.q_dim(), 0.0f);  // row 0: channel 0 stays the constant
    w.w_gate = normal(static_cast<std::size_t>(N * K), sd, s.seed, stream++);
    w.w_up = normal(static_cast<std::size_t>(N * K), sd, s.seed, stream++);
    w.w_down = normal(static_cast<std::size_t>(K * N), sd_out, s.seed, stream++);
    std::fill_n(w.w_down.begin(), N, 0.0f);  // row 0
    // Per-neuron densities: dead ones, then a log-normal popularity around the layer's target
    // (mean over alive neurons = target / (1 − dead share), so the layer's mean is the target).
    const double alive_mean = targets[static_cast<std::size_t>(l)] / (1.0 - s.dead_share);
    std::normal_distribution<double> z;
    std::uniform_real_distribution<double> u;
    const double sg = s.popularity_sigma;
    std::vector<double> quantile(static_cast<std::size_t>(N));  // Φ⁻¹(1 − d_n); 10 for a dead neuron
    for (std::int64_t n = 0; n < N; ++n) {
      float* row = w.w_gate.data() + n * K;
      double norm2 = 0;
      for (std::int64_t k = 1; k < K; ++k) norm2 += static_cast<double>(row[k]) * row[k];
      const bool dead = u(rng) < s.dead_share;
      const double d = std::min(0.5, alive_mean * std::exp(sg * z(rng) - 0.5 * sg * sg));
      quantile[static_cast<std::size_t>(n)] = dead ? 10.0 : inv_phi(1.0 - d);
      const double t = std::sqrt(norm2) * quantile[static_cast<std::size_t>(n)];
      row[0] = round_bf16(static_cast<float>(-t / bias));
    }
    quantiles[static_cast<std::size_t>(l)] = std::move(quantile);
    if (progress && s.calibration_tokens <= 0) progress(static_cast<int>(l + 1), static_cast<int>(L));
  }
  if (s.calibration_tokens <= 0) return m;
  // One probe forward through the whole model (O(L), not a re-run per layer): at each layer the hook
  // calibrates that layer's gate biases from its FFN input before its FFN runs (the dense path reads
  // w_gate), so layer l + 1 sees the calibrated layer l's output.
  RuntimeOptions ro(FfnPath::dense);
  ro.ffn_input_hook = [&](std::int64_t layer, CMatrixF in) {
    calibrate_layer(m, layer, in, quantiles[static_cast<std::size_t>(layer)], targets[static_cast<std::size_t>(layer)]);
    if (progress) progress(static_cast<int>(layer + 1), static_cast<int>(L));
  };
  CpuRuntime rt(m, ro);
  const std::int64_t len = std::min<std::int64_t>(s.calibration_tokens, c.max_position);  // one sequence where it fits
  std::mt19937_64 probe_rng(mix(s.seed ^ 0xca11b));
  std::vector<std::vector<std::int32_t>> seqs;
  for (std::int64_t done = 0; done < s.calibration_tokens; done += len) {
    seqs.emplace_back(static_cast<std::size_t>(std::min(len, s.calibration_tokens - done)));
    for (auto& t : seqs.back()) t = static_cast<std::int32_t>(probe_rng() % static_cast<std::uint64_t>(V));
  }
  std::vector<std::unique_ptr<Sequence>> kv;
  std::vector<SeqStep> steps;
  for (const auto& q : seqs) kv.push_back(rt.new_sequence(static_cast<std::int64_t>(q.size())));
  for (std::size_t i = 0; i < seqs.size(); ++i) steps.push_back({kv[i].get(), seqs[i]});
  rt.forward(steps);
  return m;
}

namespace {

// save_checkpoint's work; `dir` is normalised (no trailing separator).
void write_checkpoint_dir(const Model& m, const std::filesystem::path& dir, const std::string& dir_str) {
  namespace fs = std::filesystem;
  TWELL_CHECK(!fs::exists(dir) || (fs::is_directory(dir) && fs::is_empty(dir)), ErrorCode::io,
              "{} exists and is not an empty directory: refusing to overwrite it", dir_str);
  const LlamaConfig& c = m.config;
  const std::int64_t K = c.hidden_size, N = c.intermediate_size, V = c.vocab_size;
  std::vector<std::pair<std::string, HostTensor>> t;
  auto add = [&](const std::string& name, const float* p, std::vector<std::int64_t> shape) {
    HostTensor h(DType::bf16, shape);
    for (std::int64_t i = 0; i < h.numel(); ++i) h.data<bf16>()[i] = to_bf16(p[i]);
    t.emplace_back(name, std::move(h));
  };
  add("model.embed_tokens.weight", m.embed.data(), {V, K});
  add("model.norm.weight", m.final_norm.data(), {K});
  if (!m.lm_head.empty()) add("lm_head.weight", m.lm_head.data(), {V, K});
  for (std::size_t i = 0; i < m.layers.size(); ++i) {
    const LayerWeights& w = m.layers[i];
    const std::string p = fmt::format("model.layers.{}.", i);
    add(p + "input_layernorm.weight", w.attn_norm.data(), {K});
    add(p + "post_attention_layernorm.weight", w.ffn_norm.data(), {K});
    add(p + "self_attn.q_proj.weight", w.wqkv.data(), {c.q_dim(), K});
    add(p + "self_attn.k_proj.weight", w.wqkv.data() + c.q_dim() * K, {c.kv_dim(), K});
    add(p + "self_attn.v_proj.weight", w.wqkv.data() + (c.q_dim() + c.kv_dim()) * K, {c.kv_dim(), K});
    add(p + "self_attn.o_proj.weight", w.wo.data(), {K, c.q_dim()});
    add(p + "mlp.gate_proj.weight", w.w_gate.data(), {N, K});
    add(p + "mlp.up_proj.weight", w.w_up.data(), {N, K});
    add(p + "mlp.down_proj.weight", w.w_down.data(), {K, N});
  }
  nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}},
                      {"model_type", "llama"},
                      {"vocab_size", V},
                      {"hidden_size", K},
                      {"intermediate_size", N},
                      {"num_hidden_layers", c.num_layers},
                      {"num_attention_heads", c.num_heads},
                      {"num_key_value_heads", c.num_kv_heads},
                      {"head_dim", c.head_dim},
                      {"max_position_embeddings", c.max_position},
                      {"rms_norm_eps", c.rms_eps},
                      // transformers ≥ 5 reads rope_parameters, 4.x the top-level rope_theta (and
                      // does not know rope_parameters): both, equal, so that every version reads θ.
                      {"rope_parameters", nlohmann::json::parse(rope_parameters_json(c))},
                      {"rope_theta", c.rope_theta},
                      {"hidden_act", to_string(c.act)},
                      {"tie_word_embeddings", m.lm_head.empty()},
                      {"attention_bias", false},
                      {"mlp_bias", false},
                      {"torch_dtype", "bfloat16"}};
  if (!c.bos_ids.empty()) j["bos_token_id"] = c.bos_ids[0];
  if (!c.eos_ids.empty()) j["eos_token_id"] = c.eos_ids[0];
  const fs::path tmp = (dir.has_parent_path() ? dir.parent_path() : fs::path(".")) / ("." + dir.filename().string() + ".tmp");
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  std::vector<io::TensorRef> refs;
  for (auto& [name, h] : t) refs.push_back({name, &h});
  io::write_safetensors((tmp / "model.safetensors").string(), refs, {{"format", "pt"}, {"generator", "twell gen model"}});
  {
    std::ofstream f(tmp / "config.json");
    f << j.dump(2) << "\n";
    TWELL_CHECK(f.good(), ErrorCode::io, "cannot write {}", (tmp / "config.json").string());
  }
  if (fs::exists(dir)) fs::remove(dir);  // empty, checked above
  fs::rename(tmp, dir);
}

}  // namespace

void save_checkpoint(const Model& m, const std::string& dir_str) {
  namespace fs = std::filesystem;
  TWELL_CHECK(!dir_str.empty(), ErrorCode::invalid_argument, "save_checkpoint: no directory given");
  TWELL_CHECK(!m.bf16_only, ErrorCode::invalid_argument,
              "save_checkpoint: the model was loaded with bf16 weights only (for the GPU); save an fp32-loaded one");
  fs::path dir = fs::path(dir_str).lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();  // "out/" → "out"
  TWELL_CHECK(!dir.empty() && dir.filename() != "." && dir.filename() != "..", ErrorCode::invalid_argument,
              "save_checkpoint: '{}' does not name a directory to create", dir_str);
  try {
    write_checkpoint_dir(m, dir, dir_str);
  } catch (const fs::filesystem_error& e) {
    fail(ErrorCode::io, "writing the checkpoint {}: {}", dir.string(), e.what());
  }
}

}  // namespace twell::model
