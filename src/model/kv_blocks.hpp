#pragma once
// The free list of a paged KV pool's blocks, shared by the CPU and GPU runtimes' pools (which own
// the blocks' memory). Block ids are 0 … total − 1; a fresh list hands them out in order. Used by
// the scheduler's thread and by the sequences it destroys, under a mutex all the same, since a
// sequence may outlive its user's thread.
#include <algorithm>
#include <cstdint>
#include <mutex>
#include <vector>

#include "twell/model/runtime.hpp"

namespace twell::model {

class KvBlockList {
 public:
  explicit KvBlockList(std::int64_t total) : total_(total) {
    free_.reserve(static_cast<std::size_t>(total));
    for (std::int64_t b = total - 1; b >= 0; --b) free_.push_back(static_cast<std::int32_t>(b));  // 0 first
  }
  std::int64_t total() const noexcept { return total_; }
  std::int64_t free() const noexcept {
    std::lock_guard lk(m_);
    return static_cast<std::int64_t>(free_.size());
  }
  // Takes n blocks, appended to `out`, or none (false) when fewer than n are free.
  bool take(std::int64_t n, std::vector<std::int32_t>& out) {
    std::lock_guard lk(m_);
    if (n > static_cast<std::int64_t>(free_.size())) return false;
    for (std::int64_t i = 0; i < n; ++i) {
      out.push_back(free_.back());
      free_.pop_back();
    }
    return true;
  }
  // Gives blocks back (each taken from this list and not given back since).
  void give(const std::vector<std::int32_t>& ids) {
    std::lock_guard lk(m_);
    free_.insert(free_.end(), ids.rbegin(), ids.rend());
  }

 private:
  std::int64_t total_;
  mutable std::mutex m_;
  std::vector<std::int32_t> free_;
};

// Sequence::reserve as both runtimes' sequences implement it: room for `tokens` more positions after
// `length` within the model's context. A paged sequence (pool non-null: anything with take(n, out))
// takes the blocks the new length needs, appended to its block table, and its capacity grows to what
// they hold; a sequence of fixed capacity (pool null) only says whether it has the room.
template <class Pool>
bool reserve_blocks(Pool* pool, std::vector<std::int32_t>& table, std::int64_t length, std::int64_t tokens,
                    std::int64_t max_position, std::int64_t& capacity) {
  if (tokens < 0 || length + tokens > max_position) return false;
  if (length + tokens <= capacity) return true;
  if (pool == nullptr) return false;
  const std::int64_t need = KvPool::blocks_for(length + tokens) - static_cast<std::int64_t>(table.size());
  if (!pool->take(need, table)) return false;
  capacity = std::min(static_cast<std::int64_t>(table.size()) * kKvBlockTokens, max_position);
  return true;
}

}  // namespace twell::model
