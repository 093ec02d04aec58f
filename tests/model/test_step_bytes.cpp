// decode_step_bytes (include/twell/model/step_bytes.hpp) against counts written out by hand.
#include <gtest/gtest.h>

#include <vector>

#include "twell/error.hpp"
#include "twell/model/step_bytes.hpp"
#include "twell/model/synthetic.hpp"

namespace twell::model {
namespace {

// The tiny preset: vocabulary 512, hidden 256, FFN 704, 4 layers, 4 query heads and 2 KV heads of 64.
TEST(StepBytes, CountsEachWeightAndCachedValueOnce) {
  const LlamaConfig c = preset_config("tiny");
  ASSERT_EQ(c.q_dim(), 256);
  ASSERT_EQ(c.kv_dim(), 128);
  StepShape s;
  s.batch = 3;
  s.kv_positions = 100;
  const StepBytes d = decode_step_bytes(c, s);
  EXPECT_DOUBLE_EQ(d.attention_weights, 4.0 * 2 * 256 * (256 + 128 + 128 + 256));  // Q, K, V, O: [256 × ·] bf16
  EXPECT_DOUBLE_EQ(d.ffn_weights, 4.0 * 2 * 3 * 704 * 256);                      // gate, up, down whole
  EXPECT_DOUBLE_EQ(d.kv_read, 4.0 * 2 * 2 * 128 * 3 * 100);   // keys and values of 100 positions, 3 sequences
  EXPECT_DOUBLE_EQ(d.kv_write, 4.0 * 2 * 2 * 128 * 3);        // the new position's
  EXPECT_DOUBLE_EQ(d.embedding_and_head, 2.0 * 256 * (3 + 512));
  EXPECT_DOUBLE_EQ(d.norms, 2.0 * 256 * 9);
  EXPECT_DOUBLE_EQ(d.total(), d.attention_weights + d.ffn_weights + d.kv_read + d.kv_write + d.embedding_and_head + d.norms);

  // Sparse: the gate whole, the up and down rows of each layer's fired neurons only.
  const std::vector<double> fired = {10, 0, 704, 35.5};
  s.fired = fired;
  EXPECT_DOUBLE_EQ(decode_step_bytes(c, s).ffn_weights, 2.0 * 256 * (4 * 704 + 2 * (10 + 0 + 704 + 35.5)));
  s.sparse_row_bytes = 4;  // the CPU's sparse rows are fp32 beside a bf16 gate
  EXPECT_DOUBLE_EQ(decode_step_bytes(c, s).ffn_weights, 2.0 * 256 * 4 * 704 + 4.0 * 256 * 2 * (10 + 0 + 704 + 35.5));
  s.sparse_row_bytes = 0;
  // fp32 caches (the CPU runtime), and a window shorter than the context.
  s.kv_bytes = 4;
  LlamaConfig w = c;
  w.sliding_window = 32;
  EXPECT_DOUBLE_EQ(decode_step_bytes(w, s).kv_read, 4.0 * 2 * 4 * 128 * 3 * 31);
  EXPECT_DOUBLE_EQ(decode_step_bytes(c, s).kv_read, 2 * d.kv_read);
}

// The 2b-gqa preset is the 2B with 8 KV heads for its 32 query heads: its K and V projections and its
// KV cache are a quarter of the 2B's, everything else the same bytes.
TEST(StepBytes, GqaPresetQuartersOnlyTheKeysAndValues) {
  const LlamaConfig m = preset_config("2b"), g = preset_config("2b-gqa");
  ASSERT_EQ(m.num_kv_heads, 32);
  ASSERT_EQ(g.num_kv_heads, 8);
  ASSERT_EQ(g.num_heads, m.num_heads);
  StepShape s;
  s.batch = 8;
  s.kv_positions = 512;
  const StepBytes a = decode_step_bytes(m, s), b = decode_step_bytes(g, s);
  EXPECT_DOUBLE_EQ(b.kv_read, a.kv_read / 4);
  EXPECT_DOUBLE_EQ(b.kv_write, a.kv_write / 4);
  // Q and O: 2 × 2048 × 2048 a layer; K and V: 2 × 2048 × 512 (GQA) against 2 × 2048 × 2048.
  EXPECT_DOUBLE_EQ(a.attention_weights - b.attention_weights, 38.0 * 2 * 2 * 2048 * (2048 - 512));
  EXPECT_DOUBLE_EQ(b.ffn_weights, a.ffn_weights);
  EXPECT_DOUBLE_EQ(b.embedding_and_head, a.embedding_and_head);
  EXPECT_DOUBLE_EQ(b.norms, a.norms);
}

TEST(StepBytes, RefusesWhatIsNoStep) {
  const LlamaConfig c = preset_config("tiny");
  StepShape s;
  s.batch = 0;
  EXPECT_THROW(decode_step_bytes(c, s), Error);
  s.batch = 1;
  const std::vector<double> three = {1, 2, 3}, over = {1, 2, 3, 705};
  s.fired = three;
  EXPECT_THROW(decode_step_bytes(c, s), Error);  // one count per layer
  s.fired = over;
  EXPECT_THROW(decode_step_bytes(c, s), Error);  // more than the layer's neurons
}

}  // namespace
}  // namespace twell::model
