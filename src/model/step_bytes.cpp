#include "twell/model/step_bytes.hpp"

#include <algorithm>

#include "twell/error.hpp"

namespace twell::model {

StepBytes decode_step_bytes(const LlamaConfig& c, const StepShape& s) {
  TWELL_CHECK(s.batch >= 1 && s.kv_positions >= 0 && s.weight_bytes > 0 && s.kv_bytes > 0 && s.sparse_row_bytes >= 0,
              ErrorCode::invalid_argument,
              "decode_step_bytes: batch {}, {} cached positions, {} / {} bytes per element", s.batch, s.kv_positions,
              s.weight_bytes, s.kv_bytes);
  TWELL_CHECK(s.fired.empty() || static_cast<std::int64_t>(s.fired.size()) == c.num_layers, ErrorCode::invalid_argument,
              "decode_step_bytes: {} fired counts for {} layers", s.fired.size(), c.num_layers);
  const double K = static_cast<double>(c.hidden_size), N = static_cast<double>(c.intermediate_size);
  const double L = static_cast<double>(c.num_layers), B = static_cast<double>(s.batch);
  const double w = s.weight_bytes, kv = s.kv_bytes;
  StepBytes b;
  b.attention_weights = L * w * K * static_cast<double>(2 * c.q_dim() + 2 * c.kv_dim());
  double rows = 0;  // up and down rows read, over the layers
  for (std::int64_t l = 0; l < c.num_layers; ++l) {
    const double f = s.fired.empty() ? N : s.fired[static_cast<std::size_t>(l)];
    TWELL_CHECK(f >= 0 && f <= N, ErrorCode::invalid_argument, "decode_step_bytes: layer {} fires {} of {} neurons", l, f, N);
    rows += f;
  }
  const double rw = s.fired.empty() || s.sparse_row_bytes == 0 ? w : s.sparse_row_bytes;
  b.ffn_weights = w * K * L * N + rw * K * 2 * rows;
  // The keys a query sees: all cached ones and its own, or the window's.
  double keys = s.kv_positions + 1;
  if (c.sliding_window > 0) keys = std::min(keys, static_cast<double>(c.sliding_window));
  b.kv_read = 2 * L * kv * static_cast<double>(c.kv_dim()) * B * (keys - 1);  // the cached ones (the new one stays on chip)
  b.kv_write = 2 * L * kv * static_cast<double>(c.kv_dim()) * B;
  b.embedding_and_head = w * K * (B + static_cast<double>(c.vocab_size));
  b.norms = w * K * (2 * L + 1);
  return b;
}

}  // namespace twell::model
