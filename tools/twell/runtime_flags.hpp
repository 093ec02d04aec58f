#pragma once
// The runtime options the model commands share, bound straight to the model::RuntimeOptions fields
// they set (their defaults are the options' own). The A/B switches of the runtime's optimizations
// are no flags: they come from TWELL_TUNING (model::RuntimeTuning::from_env).
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

// The help epilogue's line for the runtime's A/B switches, which are not flags (RuntimeTuning).
inline constexpr const char* kTuningHelp =
    "A/B switches of the GPU runtime's optimizations: TWELL_TUNING (docs/runtime.md)";

}  // namespace twell::cli
