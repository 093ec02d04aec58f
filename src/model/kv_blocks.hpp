#pragma once
// A paged KV pool's bookkeeping, shared by the CPU and GPU runtimes' pools (which own the blocks'
// memory): the free list, each block's reference count, and the prefix index that lets sequences
// share full blocks of the same tokens. And a paged sequence's side of it (PagedBlocks).
//
// Prefix sharing. A block is full when all kKvBlockTokens of its positions are written; its keys
// and values are then a function of the tokens at positions 0 … its end (and never written again:
// a paged sequence only appends, and gives its blocks back rather than rewrite them). A full block
// is published under those tokens; a new sequence whose prompt starts with the same tokens takes
// the published blocks (one more reference each) instead of computing them. A lookup compares the
// block's own tokens and its predecessor's block id and generation, not only a hash, so a hash
// collision can never hand out another prefix's keys.
//
// Prefix cache. A published block that its last holder gives back stays in the index, cached (a
// finished request's system prompt serves the next request that starts with it), until a take()
// finds no free block: then the least recently given back cached block leaves the index and is
// taken. Cached blocks count as free (free()), so admission and reservations see them as room. A
// block taken fresh starts a new generation, which invalidates blocks published after its old
// contents (their predecessor check fails) without finding them.
//
// Used by the scheduler's thread and by the sequences it destroys, under a mutex all the same,
// since a sequence may outlive its user's thread.
#include <algorithm>
#include <cstdint>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "twell/model/runtime.hpp"

namespace twell::model {

class KvBlockList {
 public:
  // cache: keep published blocks nobody holds (the prefix cache); false: they leave the index and are
  // free at once (TWELL_TUNING=no-prefix-cache).
  explicit KvBlockList(std::int64_t total, bool cache = true)
      : total_(total), cache_(cache), refs_(static_cast<std::size_t>(total), 0), key_(refs_.size(), 0), parent_(refs_.size(), kUnpublished),
        parent_gen_(refs_.size(), 0), gen_(refs_.size(), 0), prev_(refs_.size(), -1), next_(refs_.size(), -1),
        tokens_(refs_.size() * kKvBlockTokens, 0) {
    free_.reserve(static_cast<std::size_t>(total));
    for (std::int64_t b = total - 1; b >= 0; --b) free_.push_back(static_cast<std::int32_t>(b));  // 0 first
  }
  std::int64_t total() const noexcept { return total_; }
  // Blocks a take() can have: the free ones and the cached ones.
  std::int64_t free() const noexcept {
    std::lock_guard lk(m_);
    return static_cast<std::int64_t>(free_.size()) + cached_;
  }
  // Published blocks nobody holds (kept for their prefix until their memory is needed).
  std::int64_t cached() const noexcept {
    std::lock_guard lk(m_);
    return cached_;
  }
  // Takes n blocks (one reference each), appended to `out`, or none (false) when fewer are free:
  // free blocks first, then cached ones, the least recently given back first.
  bool take(std::int64_t n, std::vector<std::int32_t>& out) {
    std::lock_guard lk(m_);
    if (n > static_cast<std::int64_t>(free_.size()) + cached_) return false;
    for (std::int64_t i = 0; i < n; ++i) {
      if (free_.empty()) evict_oldest();
      const std::int32_t b = free_.back();
      free_.pop_back();
      refs_[static_cast<std::size_t>(b)] = 1;
      ++gen_[static_cast<std::size_t>(b)];  // new contents: blocks published after the old ones no longer follow it
      out.push_back(b);
    }
    return true;
  }
  // Drops one reference to each block; a block nobody holds is cached if published, else free.
  // Given in reverse, so that a sequence's later blocks are evicted before the prefix they extend.
  void give(std::span<const std::int32_t> ids) {
    std::lock_guard lk(m_);
    for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
      const auto b = static_cast<std::size_t>(*it);
      if (--refs_[b] > 0) continue;
      if (parent_[b] == kUnpublished) {
        free_.push_back(*it);
      } else if (cache_) {
        link_newest(*it);
      } else {
        index_.erase(key_[b]);
        parent_[b] = kUnpublished;
        free_.push_back(*it);
      }
    }
  }
  // Publishes block b, now full of `tokens` (kKvBlockTokens of them) after block `parent` (-1: the
  // sequence's first), under `key` (KvBlockList::key of the two). A key whose block someone holds
  // keeps it (the same tokens after the same blocks: the same keys and values); a cached one gives
  // way (it may follow contents its predecessor no longer holds) and is free.
  void publish(std::int32_t b, std::int32_t parent, std::span<const std::int32_t> tokens, std::uint64_t key) {
    std::lock_guard lk(m_);
    const auto i = static_cast<std::size_t>(b);
    if (parent_[i] != kUnpublished) return;
    const auto [it, fresh] = index_.try_emplace(key, b);
    if (!fresh) {
      if (refs_[static_cast<std::size_t>(it->second)] > 0) return;
      uncache(it->second);
      it->second = b;
    }
    key_[i] = key;
    parent_[i] = parent;
    parent_gen_[i] = generation(parent);
    std::copy(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<std::ptrdiff_t>(i * kKvBlockTokens));
  }
  // The published block of `tokens` after block `parent`, with one more reference (a cached one
  // leaves the cache), or -1.
  std::int32_t share(std::int32_t parent, std::span<const std::int32_t> tokens, std::uint64_t key) {
    std::lock_guard lk(m_);
    const auto it = index_.find(key);
    if (it == index_.end()) return -1;
    const auto i = static_cast<std::size_t>(it->second);
    if (parent_[i] != parent || parent_gen_[i] != generation(parent) ||
        !std::equal(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<std::ptrdiff_t>(i * kKvBlockTokens)))
      return -1;  // a hash collision, or published after contents its predecessor no longer holds
    if (refs_[i] == 0) unlink(it->second);
    ++refs_[i];
    return it->second;
  }
  // The key of a full block: its tokens after the key of the block before it (0 for the first).
  static std::uint64_t key(std::uint64_t before, std::span<const std::int32_t> tokens) noexcept {
    std::uint64_t h = before ^ 0x9e3779b97f4a7c15ull;
    for (const std::int32_t t : tokens) {  // splitmix64 steps over the ids
      h += static_cast<std::uint64_t>(static_cast<std::uint32_t>(t)) + 0x9e3779b97f4a7c15ull;
      h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
      h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
      h ^= h >> 31;
    }
    return h;
  }

 private:
  static constexpr std::int32_t kUnpublished = -2;  // parent_ of a block not in the index
  std::uint32_t generation(std::int32_t b) const noexcept { return b < 0 ? 0 : gen_[static_cast<std::size_t>(b)]; }
  // The cache: a list over block ids through prev_ / next_, oldest_ the next to go.
  void link_newest(std::int32_t b) {
    const auto i = static_cast<std::size_t>(b);
    prev_[i] = newest_;
    next_[i] = -1;
    (newest_ < 0 ? oldest_ : next_[static_cast<std::size_t>(newest_)]) = b;
    newest_ = b;
    ++cached_;
  }
  void unlink(std::int32_t b) {
    const auto i = static_cast<std::size_t>(b);
    (prev_[i] < 0 ? oldest_ : next_[static_cast<std::size_t>(prev_[i])]) = next_[i];
    (next_[i] < 0 ? newest_ : prev_[static_cast<std::size_t>(next_[i])]) = prev_[i];
    prev_[i] = next_[i] = -1;
    --cached_;
  }
  // A cached block leaves the cache and the index (its entry is the caller's to erase or reuse) and is free.
  void uncache(std::int32_t b) {
    unlink(b);
    parent_[static_cast<std::size_t>(b)] = kUnpublished;
    free_.push_back(b);
  }
  // The oldest cached block leaves the index and becomes free.
  void evict_oldest() {
    const std::int32_t b = oldest_;
    index_.erase(key_[static_cast<std::size_t>(b)]);  // a published block owns its key's entry
    uncache(b);
  }

  std::int64_t total_;
  bool cache_;
  mutable std::mutex m_;
  std::vector<std::int32_t> free_;
  std::vector<std::int32_t> refs_;
  std::vector<std::uint64_t> key_;
  std::vector<std::int32_t> parent_;       // kUnpublished, or the published block's predecessor (-1: none)
  std::vector<std::uint32_t> parent_gen_;  // the predecessor's generation when the block was published
  std::vector<std::uint32_t> gen_;         // bumped each time the block is taken (its contents change)
  std::vector<std::int32_t> prev_, next_;  // the cache's list (-1: none)
  std::int32_t oldest_ = -1, newest_ = -1;
  std::int64_t cached_ = 0;
  std::vector<std::int32_t> tokens_;  // [total, kKvBlockTokens]: a published block's tokens
  std::unordered_map<std::uint64_t, std::int32_t> index_;
};

// A paged sequence's blocks (both runtimes): its block table (positions [16·i, 16·i + 16) in block
// ids[i]), the tokens at its positions (always as many as its length), and its full blocks' keys.
struct PagedBlocks {
  std::vector<std::int32_t> ids;
  std::vector<std::int32_t> tokens;
  std::vector<std::uint64_t> keys;  // the published full blocks' keys, in order

  // Takes the published blocks of `prefix`'s first full blocks, as far as they match, leaving at
  // least one token of prefix uncovered (the caller computes that one for its logits). Returns the
  // positions the blocks hold (the sequence's starting length).
  std::int64_t share_prefix(KvBlockList& list, std::span<const std::int32_t> prefix) {
    const auto n = static_cast<std::int64_t>(prefix.size());
    for (std::int64_t b = 0; (b + 1) * kKvBlockTokens < n; ++b) {
      const auto blk = prefix.subspan(static_cast<std::size_t>(b * kKvBlockTokens), kKvBlockTokens);
      const std::uint64_t k = KvBlockList::key(keys.empty() ? 0 : keys.back(), blk);
      const std::int32_t id = list.share(ids.empty() ? -1 : ids.back(), blk, k);
      if (id < 0) break;
      ids.push_back(id);
      keys.push_back(k);
      tokens.insert(tokens.end(), blk.begin(), blk.end());
    }
    return static_cast<std::int64_t>(tokens.size());
  }
  // The tokens written at the next positions (with the sequence's length, so the two never part).
  void record(std::span<const std::int32_t> written) { tokens.insert(tokens.end(), written.begin(), written.end()); }
  // The last n positions are to be written again (a GPU step run again): never a published block's,
  // since publish() runs only once a call's writes are final.
  void drop(std::int64_t n) { tokens.resize(tokens.size() - static_cast<std::size_t>(n)); }
  // Publishes every full block not yet published. Called once a forward call has written its tokens
  // for good (after a step run again, not before it), so a published block is final: its sequence
  // writes only past it, and so does every sequence that shares it.
  void publish(KvBlockList& list) {
    while (static_cast<std::int64_t>(keys.size() + 1) * kKvBlockTokens <= static_cast<std::int64_t>(tokens.size())) {
      const std::size_t b = keys.size();
      const std::span<const std::int32_t> blk(tokens.data() + b * kKvBlockTokens, kKvBlockTokens);
      keys.push_back(KvBlockList::key(b == 0 ? 0 : keys[b - 1], blk));
      list.publish(ids[b], b == 0 ? -1 : ids[b - 1], blk, keys.back());
    }
  }
  // Gives every block back (the sequence empty).
  void release(KvBlockList& list) {
    list.give(ids);
    ids.clear();
    tokens.clear();
    keys.clear();
  }
};

// Sequence::reserve as both runtimes' sequences implement it: room for `tokens` more positions after
// `length` within the model's context. A paged sequence (list non-null) takes the blocks the new
// length needs, appended to its block table, and its capacity grows to what they hold; a sequence
// of fixed capacity (list null) only says whether it has the room.
inline bool reserve_blocks(KvBlockList* list, std::vector<std::int32_t>& table, std::int64_t length,
                           std::int64_t tokens, std::int64_t max_position, std::int64_t& capacity) {
  if (tokens < 0 || length + tokens > max_position) return false;
  if (length + tokens <= capacity) return true;
  if (list == nullptr) return false;
  const std::int64_t need = KvPool::blocks_for(length + tokens) - static_cast<std::int64_t>(table.size());
  if (!list->take(need, table)) return false;
  capacity = std::min(static_cast<std::int64_t>(table.size()) * kKvBlockTokens, max_position);
  return true;
}

// The block side of both runtimes' sequences. Paged: blocks of a shared pool (kept alive here), the
// first ones the published blocks of its prompt's prefix, taken as it grows, given back when it is
// destroyed or cleared. Fixed capacity: whatever storage the runtime gives it (table_.ids may list a
// private pool's blocks, in order); reserve only says whether it has the room.
class BlockSequence : public Sequence {
 public:
  ~BlockSequence() override {
    if (list_) list_->give(table_.ids);
  }
  bool reserve(std::int64_t tokens) override {
    return reserve_blocks(list_, table_.ids, length_, tokens, max_position_, capacity_);
  }
  std::int64_t blocks() const noexcept override { return list_ ? static_cast<std::int64_t>(table_.ids.size()) : 0; }
  void clear() override {  // a paged sequence's blocks may be shared: give them back, never rewrite them
    if (list_) {
      table_.release(*list_);
      capacity_ = 0;
      released();
    }
    length_ = 0;
  }

 protected:
  // Fixed capacity (pool: its private storage's owner, or null).
  BlockSequence(std::shared_ptr<KvPool> pool, std::int64_t capacity, std::int64_t max_position)
      : pool_(std::move(pool)), max_position_(max_position) {
    capacity_ = capacity;
  }
  // Paged, from `list` (pool's), starting on the published blocks of prefix.
  BlockSequence(std::shared_ptr<KvPool> pool, KvBlockList& list, std::int64_t max_position,
                std::span<const std::int32_t> prefix)
      : pool_(std::move(pool)), list_(&list), max_position_(max_position) {
    length_ = capacity_ = table_.share_prefix(list, prefix);
  }
  // A paged sequence keeps its tokens beside its length (PagedBlocks::record / drop), and publishes
  // its full blocks once a call's writes are final (publish).
  void advance(std::span<const std::int32_t> tokens) {
    length_ += static_cast<std::int64_t>(tokens.size());
    if (list_) table_.record(tokens);
  }
  void rewind(std::int64_t n) {
    length_ -= n;
    if (list_) table_.drop(n);
  }
  void publish() {
    if (list_) table_.publish(*list_);
  }
  virtual void released() {}  // clear() gave the blocks back (a device copy of the table is stale)
  bool paged() const noexcept { return list_ != nullptr; }

  std::shared_ptr<KvPool> pool_;
  KvBlockList* list_ = nullptr;  // paged: pool_'s block list
  PagedBlocks table_;
  std::int64_t max_position_;
};

}  // namespace twell::model
