#pragma once
// Checks every runtime makes before it changes any sequence (runtime.hpp's contract).
#include <span>

#include "twell/model/runtime.hpp"

namespace twell::model {

// 0 < capacity ≤ the model's context.
void check_sequence_capacity(const LlamaConfig& c, std::int64_t capacity);
// Steps non-empty, each with a sequence seen once, tokens that fit its cache and lie in the vocabulary.
void check_forward_steps(const LlamaConfig& c, std::span<const SeqStep> steps);

}  // namespace twell::model
