#pragma once
// cpu::TrainState ⇄ one byte buffer, so that the training forward's sparse state can travel as a
// uint8 tensor (PyTorch saves it for backward, checkpointing recomputes it, nothing leaks). Layout:
// a header (magic, version, shapes) then each HybridMatrix's arrays in declaration order. Reading
// checks sizes against the header and validates both matrices (ErrorCode::corrupt otherwise).
#include <cstdint>
#include <span>
#include <vector>

#include "twell/cpu/ffn_ops.hpp"

namespace twell::python {

std::vector<std::uint8_t> state_to_bytes(const cpu::TrainState& s);
cpu::TrainState state_from_bytes(std::span<const std::uint8_t> bytes);

}  // namespace twell::python
