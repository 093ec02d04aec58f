#pragma once
// The fewest bytes one decode step of a Llama model must move through memory: every weight it uses
// read once, the KV cache read once and the new keys and values written once, whatever the kernels.
// A step's time can be no shorter than these bytes over the memory's copy bandwidth; `twell bench
// model` prints them beside each decode row, and the achieved bandwidth (bytes / measured time).
//
// A sparse step reads the gate's weights whole (every neuron's gate must be computed) and, of the up
// and down projections, only the rows of the neurons some row of the batch fired (the union over the
// batch): rows fired by several of the batch's tokens are read once for all of them.
#include <cstdint>
#include <span>

#include "twell/model/config.hpp"

namespace twell::model {

struct StepShape {
  std::int64_t batch = 1;        // sequences, one new token each
  double kv_positions = 0;       // positions already in each sequence's cache (mean over the timed steps)
  int weight_bytes = 2;          // bytes per weight as the runtime holds them (bf16: 2)
  int kv_bytes = 2;              // bytes per cached key or value element (GPU bf16: 2; CPU fp32: 4)
  int sparse_row_bytes = 0;      // bytes per weight of the up and down rows a sparse step reads (0: weight_bytes)
  // Per layer, the neurons whose up and down rows the step reads (the batch's union of fired
  // neurons); empty: every neuron (the dense step).
  std::span<const double> fired;
};

struct StepBytes {
  double attention_weights = 0;  // the Q, K, V and O projections
  double ffn_weights = 0;        // the gate whole; up and down: every row (dense) or the fired ones
  double kv_read = 0, kv_write = 0;
  double embedding_and_head = 0;  // the batch's embedding rows and the LM head (or tied embeddings)
  double norms = 0;               // RMSNorm weights
  double total() const noexcept {
    return attention_weights + ffn_weights + kv_read + kv_write + embedding_and_head + norms;
  }
};

// The bytes of one decode step of `shape` through a model of `c` (a sliding window caps the keys
// read at its length). fired, if given, has one entry per layer, each in [0, intermediate_size].
StepBytes decode_step_bytes(const LlamaConfig& c, const StepShape& shape);

}  // namespace twell::model
