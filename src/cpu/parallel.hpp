#pragma once
// When a CPU loop is worth an OpenMP parallel region.
#include <cstdint>

namespace twell::cpu {

// Loops over less work than this (elements, or multiply-adds) run on the calling thread. A region's
// fork and join costs a few µs on 2 cores and far more on many-core virtual machines (on the GPU
// machine's 16 vCPUs, regions over ≈ 1 ms of sampler work cost ≈ 6 ms a token), against ≈ 1 ns an
// element: a one-token decode step's norms, adds, RoPE and sparse FFN products are all below it.
inline constexpr std::int64_t kParallelMinWork = std::int64_t{1} << 16;

}  // namespace twell::cpu
