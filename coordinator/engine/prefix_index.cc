#include "coordinator/engine/prefix_index.h"

#include <algorithm>

#include <xxhash.h>

namespace tandem {

uint64_t PrefixBlockHash(uint64_t parent, std::span<const int32_t> tokens) {
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), parent);
}

bool PrefixIndex::Insert(int32_t block, uint64_t hash, int32_t parent_block, std::span<const int32_t> tokens) {
  if (by_block_.contains(block) || by_hash_.contains(hash)) return false;
  by_hash_.emplace(hash, block);
  by_block_.emplace(block, Entry{.hash = hash,
                                 .parent_block = parent_block,
                                 .tokens = std::vector<int32_t>(tokens.begin(), tokens.end()),
                                 .parked = std::nullopt});
  return true;
}

std::optional<int32_t> PrefixIndex::Find(uint64_t hash, int32_t parent_block, std::span<const int32_t> tokens) const {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  const Entry& entry = by_block_.at(it->second);
  if (entry.parent_block != parent_block || !std::equal(entry.tokens.begin(), entry.tokens.end(), tokens.begin(),
                                                        tokens.end())) {
    return std::nullopt;
  }
  return it->second;
}

void PrefixIndex::Park(int32_t block) {
  Entry& entry = by_block_.at(block);
  if (entry.parked) return;
  entry.parked = lru_.insert(lru_.end(), block);
}

void PrefixIndex::Unpark(int32_t block) {
  Entry& entry = by_block_.at(block);
  if (!entry.parked) return;
  lru_.erase(*entry.parked);
  entry.parked.reset();
}

std::optional<int32_t> PrefixIndex::EvictOldest() {
  if (lru_.empty()) return std::nullopt;
  const int32_t block = lru_.front();
  lru_.pop_front();
  by_hash_.erase(by_block_.at(block).hash);
  by_block_.erase(block);
  return block;
}

}  // namespace tandem
