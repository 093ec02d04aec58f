#pragma once
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace twell::cuda::bench {
// Appends "train_points" to `out` and table lines to `lines` (see bench_train.cpp).
void run_train_sweep(bool quick, int warmup, int reps, cudaStream_t s, nlohmann::json& out,
                     std::vector<std::string>& lines);
}  // namespace twell::cuda::bench
