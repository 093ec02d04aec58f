#pragma once
// Which FFN neurons fire on real text: per layer and token, the neurons whose activation is non-zero
// (the paper's §5 analysis: sparsity by layer, by position, by token; dead neurons). Runs a model's
// CPU forward and counts on each layer's FFN input, exactly (fp32; ReLU: gate > 0, as the FFN
// engine's count; other activations: act(gate) ≠ 0, which a smooth activation gives almost always).
#include <cstdint>
#include <span>
#include <vector>

#include "twell/model/model.hpp"

namespace twell::model {

struct ActivationProfile {
  std::int64_t layers = 0, neurons = 0;
  std::vector<std::int32_t> tokens;     // every sequence's ids, one after another
  std::vector<std::int64_t> sequence;   // token t's sequence (its index in the input)
  std::vector<std::int64_t> position;   // token t's position in its sequence
  std::vector<std::int32_t> active;     // [layers][tokens]: non-zero activations of layer l at token t
  std::vector<std::int64_t> neuron_hits;  // [layers][neurons]: tokens at which each neuron fired
  // With keep_sets: which neurons fired, [layers][tokens][words] bits (words = ⌈neurons / 64⌉);
  // else empty.
  std::vector<std::uint64_t> fired;

  std::int64_t token_count() const noexcept { return static_cast<std::int64_t>(tokens.size()); }
  std::int32_t at(std::int64_t layer, std::int64_t token) const noexcept {
    return active[static_cast<std::size_t>(layer * token_count() + token)];
  }
  // Neurons of `layer` that never fired on these tokens.
  std::int64_t dead(std::int64_t layer) const noexcept;
  // Neurons of `layer` that fired on at least `share` of these tokens (the FFN engine's "hot"
  // neurons, which it runs dense, are of this kind).
  std::int64_t hot(std::int64_t layer, double share) const noexcept;
  // Neurons of `layer` that fired at any of tokens [first, first + count): the rows a step over those
  // tokens must read once for all of them (needs keep_sets; count ≥ 1, within the tokens).
  std::int64_t fired_union(std::int64_t layer, std::int64_t first, std::int64_t count) const;
  // The same over any tokens (indices into tokens; at least one, each within them).
  std::int64_t fired_union(std::int64_t layer, std::span<const std::int64_t> which) const;
};

// Runs each sequence from position 0 through a CPU runtime over `model` (one forward call per
// sequence; each must fit the model's context) and counts as above; keep_sets also keeps each
// token's set of fired neurons (fired_union; layers · tokens · neurons / 8 bytes).
ActivationProfile profile_activations(const Model& model, std::span<const std::vector<std::int32_t>> sequences,
                                      bool keep_sets = false);

}  // namespace twell::model
