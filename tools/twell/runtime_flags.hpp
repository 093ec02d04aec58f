#pragma once
// The runtime switches `twell generate` and `twell bench model` share, bound straight to the
// model::RuntimeOptions fields they set (their defaults are the options' own).
#include <string>

#include <CLI/CLI.hpp>

#include "twell/model/runtime.hpp"

namespace twell::cli {

// --ffn auto|dense|sparse: the FFN path of ReLU layers, bound to a RuntimeOptions::ffn_path.
inline void add_ffn_path_option(CLI::App* sub, model::FfnPath& path) {
  sub->add_option_function<std::string>(
         "--ffn",
         [&path](const std::string& s) {
           path = s == "dense" ? model::FfnPath::dense : s == "sparse" ? model::FfnPath::sparse : model::FfnPath::automatic;
         },
         "FFN path of ReLU layers: auto (by measured density), dense, sparse")
      ->check(CLI::IsMember({"auto", "dense", "sparse"}))
      ->default_str("auto");
}

inline void add_runtime_flags(CLI::App* sub, model::RuntimeOptions& o) {
  sub->add_flag("!--no-cuda-graphs", o.cuda_graphs, "GPU: launch decode steps kernel by kernel (default: replay CUDA graphs)");
  sub->add_flag("!--no-cudnn-attention", o.cudnn_attention,
                "GPU: prefill attention by twell's own tensor-core kernel even where cuDNN's fused SDPA is built in");
  sub->add_flag("!--no-fused-decode", o.fused_decode,
                "GPU: a one-row step's attention norm, QKV, RoPE and cache store as separate kernels (default: one)");
  sub->add_flag("!--no-fixed-point-decode", o.fixed_point_decode,
                "GPU: a batch-1 decode step's sparse FFN runs its down kernel (default: its output as an exact "
                "fixed-point sum, one kernel fewer a layer)");
  sub->add_flag("!--no-decode-neuron-order", o.decode_neuron_order,
                "GPU: a batch-1 decode step's sparse FFN runs its neurons in index order (default: the most active "
                "first, as counted so far; the same results)");
  sub->add_option("--cudnn-build-at", o.cudnn_build_at,
                  "GPU: a prefill shape's cuDNN attention graph is built at its N-th call (a build takes 0.2-1.7 s; "
                  "earlier calls run twell's own kernel)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  sub->add_flag("!--no-cpu-bf16", o.cpu_bf16_weights,
                "CPU: decode steps on the fp32 weights too (default: on bf16 copies of weights whose values are bf16)");
  sub->add_option("--decode-max-density", o.decode_max_density,
                  "GPU: run a ReLU layer's decode steps sparse while its newest count is at most this density "
                  "(default: the engine's measured threshold)")
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--decode-max-rows", o.decode_max_rows,
                  "GPU: steps of up to this many rows run the ReLU layers' decode kernels (default: the engine's 16; "
                  "for measuring batched decode)")
      ->check(CLI::Range(1, 2047));
  sub->add_flag("!--no-pdl", o.programmatic_launch,
                "GPU (Hopper): launch the runtime's own kernels plainly (default: programmatic dependent launches)");
}

}  // namespace twell::cli
