#pragma once
// Synthetic sparse Llama checkpoints for benchmarks at the paper's shapes (DESIGN §5).
//
// Random weights give ≈ 50 % FFN density; trained ReLU + L1 models give ≈ 0.5 %. The generator
// builds the "massive activation" residual channel real LLMs carry: hidden channel 0 of every
// embedding is a constant c = √K that attention and FFN outputs leave alone (their output rows 0
// are zero), and gate column 0 turns it into a per-neuron threshold. Neuron n of layer l fires for
// a token iff Wg[n, 1:]·r > t_n, r being the residual stream without channel 0 (RMSNorm scales
// both sides alike); with r's entries ≈ N(0, 1), Wg[n, 1:]·r ≈ N(0, |Wg[n, 1:]|²), so
// t_n = |Wg[n, 1:]|·Φ⁻¹(1 − d_n) gives neuron n the density d_n. Per layer the d_n follow a
// log-normal popularity (skewed, as trained models' are) around the layer's target, with a share
// of dead neurons (t_n at 10 σ); the layer targets follow a profile (quiet early layers, busier
// middle ones). Residual-branch outputs are scaled by 1/√(2L) (GPT-2's rule). Through the depth r's
// variance still grows and channel 0 leaks a constant into V, so each layer is then calibrated on a
// probe batch run through the layers before it: with q_n = Wg[n, 1:]·x̂[1:] / x̂[0] over the probe's
// tokens (x̂ the layer's normalised FFN input), t_n = mean(q_n) + std(q_n)·Φ⁻¹(1 − d_n) and
// Wg[n, 0] = −t_n. The runtime's per-layer counts report the densities reached.
// The result is a valid Hugging Face Llama (hidden_act "relu") that transformers loads.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "twell/model/model.hpp"

namespace twell::model {

// The paper's SparseLM shapes: "0.5b", "1b", "1.5b", "2b" (hidden 2048, FFN 5632, 32 heads of 64,
// MHA, vocab 49152, RoPE θ 1e5, tied, 8 / 18 / 28 / 38 layers), and "tiny" (4 layers, hidden 256,
// FFN 704, 4 heads / 2 KV heads, vocab 512) for tests.
LlamaConfig preset_config(const std::string& name);

struct SyntheticSpec {
  LlamaConfig config;
  double density = 29.0 / 5632;      // mean FFN density over the layers (the paper's 1.5B: 29 of 5632)
  std::vector<double> layer_density;  // per layer; empty: `profile` around `density`
  std::string profile = "paper";      // "paper" (quiet early, busiest in the middle) or "flat"
  double popularity_sigma = 1.0;      // σ of the log-normal neuron popularity (0: uniform)
  double dead_share = 0.3;            // neurons that never fire (the paper: > 30 %)
  std::uint64_t seed = 1;
  // Tokens of the probe batch that calibrates each layer's thresholds on the activations the layers
  // before it produce (0: the analytic thresholds alone, which drift with depth).
  std::int64_t calibration_tokens = 1024;
  void validate() const;              // throws ErrorCode::invalid_argument naming the field
};

// The layer targets the spec asks for.
std::vector<double> target_densities(const SyntheticSpec& s);

// Builds the model in memory (values rounded to bf16, so that a saved copy is the same model).
// progress(done, total) is called per layer.
Model make_synthetic_model(const SyntheticSpec& s, const std::function<void(int, int)>& progress = {});

// Writes config.json and model.safetensors (bf16) into `dir` (created; must not exist or be empty):
// into a temporary directory beside it, then renamed.
void save_checkpoint(const Model& m, const std::string& dir);

}  // namespace twell::model
