// KvBlockList (src/model/kv_blocks.hpp), the paged KV pool's bookkeeping, on its own: references,
// the prefix index and its checks, and the prefix cache (published blocks nobody holds, evicted
// least recently given back first when a take() finds no free block).
#include <gtest/gtest.h>

#include <cstdint>
#include <algorithm>
#include <numeric>
#include <vector>

#include "model/kv_blocks.hpp"

namespace twell::model {
namespace {

std::vector<std::int32_t> block_tokens(std::int32_t first) {
  std::vector<std::int32_t> t(kKvBlockTokens);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// A sequence of `blocks` full blocks of tokens first, first + 1, … taken from the list and published.
PagedBlocks filled(KvBlockList& list, std::int32_t first, int blocks) {
  PagedBlocks p;
  EXPECT_TRUE(list.take(blocks, p.ids));
  for (int b = 0; b < blocks; ++b) p.record(block_tokens(first + b * static_cast<std::int32_t>(kKvBlockTokens)));
  p.publish(list);
  return p;
}

std::vector<std::int32_t> prompt(std::int32_t first, int blocks) {  // those blocks' tokens and one more
  std::vector<std::int32_t> t(static_cast<std::size_t>(blocks * kKvBlockTokens + 1));
  std::iota(t.begin(), t.end(), first);
  return t;
}

TEST(KvBlockList, FinishedPrefixesStayCachedUntilTheirMemoryIsNeeded) {
  KvBlockList list(8);
  PagedBlocks a = filled(list, 100, 3);
  EXPECT_EQ(list.free(), 5);
  EXPECT_EQ(list.cached(), 0);
  a.release(list);  // a finished request: its published blocks stay, cached, and count as free
  EXPECT_EQ(list.free(), 8);
  EXPECT_EQ(list.cached(), 3);
  PagedBlocks b;
  EXPECT_EQ(b.share_prefix(list, prompt(100, 3)), 3 * kKvBlockTokens) << "the next request with that prefix";
  EXPECT_EQ(list.cached(), 0);
  EXPECT_EQ(list.free(), 5);
  b.release(list);
  // Takes use free blocks first; the cache goes only when nothing else is left.
  std::vector<std::int32_t> five;
  EXPECT_TRUE(list.take(5, five));
  EXPECT_EQ(list.cached(), 3);
  PagedBlocks c;
  EXPECT_EQ(c.share_prefix(list, prompt(100, 3)), 3 * kKvBlockTokens);
  c.release(list);
  // One more block: the least recently given back cached block, the prefix's last one (blocks go
  // back last first), so the first two still serve a prompt.
  std::vector<std::int32_t> one;
  EXPECT_TRUE(list.take(1, one));
  EXPECT_EQ(list.cached(), 2);
  PagedBlocks d;
  EXPECT_EQ(d.share_prefix(list, prompt(100, 3)), 2 * kKvBlockTokens);
  EXPECT_EQ(list.free(), 0);
  std::vector<std::int32_t> none;
  EXPECT_FALSE(list.take(1, none)) << "held blocks are never taken";
  EXPECT_TRUE(none.empty());
  d.release(list);
  list.give(five);
  list.give(one);
  EXPECT_EQ(list.free(), 8);
}

TEST(KvBlockList, AnEvictedPrefixLeavesTheIndex) {
  KvBlockList list(3);
  PagedBlocks a = filled(list, 0, 2);  // x (tokens 0…15), then y after x
  const std::int32_t x = a.ids[0], y = a.ids[1];
  a.release(list);  // y given back first, then x: y is the older
  std::vector<std::int32_t> got;
  EXPECT_TRUE(list.take(2, got));  // the free block, then y
  EXPECT_EQ(got[1], y);
  PagedBlocks b;
  EXPECT_EQ(b.share_prefix(list, prompt(0, 2)), kKvBlockTokens) << "x alone is left";
  EXPECT_EQ(b.ids[0], x);
  b.release(list);
  list.give(got);
  std::vector<std::int32_t> all;
  EXPECT_TRUE(list.take(3, all));  // x goes too
  list.give(all);
  PagedBlocks c;
  EXPECT_EQ(c.share_prefix(list, prompt(0, 2)), 0) << "nothing of the prefix is left";
}

// A block taken fresh starts a new generation: a cached block published after its predecessor's
// old contents is not shared after the new ones, even under the same key and predecessor id.
TEST(KvBlockList, ABlockPublishedAfterRecycledContentsIsNotShared) {
  KvBlockList list(3);
  PagedBlocks a = filled(list, 0, 2);  // x, then y after x
  const std::int32_t x = a.ids[0], y = a.ids[1];
  const std::uint64_t ky = a.keys[1];
  ASSERT_EQ(list.share(x, block_tokens(16), ky), y);  // one more reference to y alone
  a.release(list);  // x cached; y still held
  EXPECT_EQ(list.cached(), 1);
  std::vector<std::int32_t> got;
  EXPECT_TRUE(list.take(2, got));  // the free block, then x (evicted, taken fresh)
  ASSERT_EQ(got[1], x);
  list.give(std::vector<std::int32_t>{y});  // y cached now, published after x's old generation
  EXPECT_EQ(list.cached(), 1);
  // x is written with the same tokens again and published (the same key, the same id).
  PagedBlocks again;
  again.ids = {x};
  again.record(block_tokens(0));
  again.publish(list);
  PagedBlocks b;
  EXPECT_EQ(b.share_prefix(list, prompt(0, 2)), kKvBlockTokens) << "x again, but not y after it";
  b.release(list);
  list.give(std::vector<std::int32_t>{got[0]});
  again.release(list);
}

TEST(KvBlockList, APublishReplacesACachedBlockOfItsKey) {
  KvBlockList list(4);
  PagedBlocks a = filled(list, 7, 1);
  const std::int32_t old = a.ids[0];
  a.release(list);
  EXPECT_EQ(list.cached(), 1);
  // Another sequence computes the same tokens itself (it did not share) and publishes: the cached
  // block gives way, is free, and the new one serves the prefix.
  PagedBlocks b = filled(list, 7, 1);
  EXPECT_NE(b.ids[0], old);
  EXPECT_EQ(list.cached(), 0);
  EXPECT_EQ(list.free(), 3);
  PagedBlocks c;
  EXPECT_EQ(c.share_prefix(list, prompt(7, 1)), kKvBlockTokens);
  EXPECT_EQ(c.ids[0], b.ids[0]);
  // A held block keeps its key: a third copy stays unpublished and is free when given back.
  PagedBlocks d = filled(list, 7, 1);
  d.release(list);
  EXPECT_EQ(list.cached(), 0);
  c.release(list);
  b.release(list);
  EXPECT_EQ(list.cached(), 1);
  EXPECT_EQ(list.free(), 4);
}

TEST(KvBlockList, WithoutTheCacheAFinishedPrefixIsGone) {
  KvBlockList list(4, /*cache=*/false);
  PagedBlocks a = filled(list, 0, 2);
  PagedBlocks b;
  EXPECT_EQ(b.share_prefix(list, prompt(0, 2)), 2 * kKvBlockTokens) << "running sequences still share";
  b.release(list);
  a.release(list);
  EXPECT_EQ(list.cached(), 0);
  EXPECT_EQ(list.free(), 4);
  PagedBlocks c;
  EXPECT_EQ(c.share_prefix(list, prompt(0, 2)), 0);
}

TEST(KvBlockList, AHashCollisionIsNotShared) {
  KvBlockList list(4);
  PagedBlocks a = filled(list, 50, 1);
  // The same key with other tokens, or after another predecessor: refused.
  const std::uint64_t k = a.keys[0];
  std::vector<std::int32_t> other = block_tokens(51);
  EXPECT_EQ(list.share(-1, other, k), -1);
  EXPECT_EQ(list.share(a.ids[0], block_tokens(50), k), -1);
  EXPECT_EQ(list.share(-1, block_tokens(50), k), a.ids[0]);
  list.give(std::vector<std::int32_t>{a.ids[0]});
  a.release(list);
}

}  // namespace
}  // namespace twell::model
