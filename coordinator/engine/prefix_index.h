// The prompt cache's index: full KV blocks by the content of the token
// prefix they end, so a new request whose prompt starts with tokens already
// computed shares those blocks instead of computing them again (vLLM's
// automatic prefix caching, over tandem's block KV cache).
//
// A block is named by its chain hash: the hash of the previous block's chain
// hash and this block's tokens. A lookup also compares the tokens and the
// parent block itself (the block the caller matched one step before), so a
// hash collision costs a miss, never another prompt's cache.
//
// Blocks no sequence holds stay indexed and cached, least recently used
// first in line to be reused when the pool needs a block (the same memory
// budget as the rest of the cache). A sequence parks its blocks last first,
// so a prefix's later blocks are evicted before the blocks they follow. Owned by a KvBlockPool; called from the
// pool's thread only.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace tandem {

// The chain hash of a block holding `tokens` after the prefix hashed `parent`
// (0 for the first block).
uint64_t PrefixBlockHash(uint64_t parent, std::span<const int32_t> tokens);

class PrefixIndex {
 public:
  // Indexes `block` as holding `tokens` after the block `parent_block`
  // (-1 for a sequence's first block), `hash` being its chain hash. A block
  // already indexed, or a prefix already held by another block, is left as it
  // is (the first one stays). Returns whether `block` was indexed.
  bool Insert(int32_t block, uint64_t hash, int32_t parent_block, std::span<const int32_t> tokens);
  // The block holding exactly `tokens` after `parent_block` whose chain hash
  // is `hash`, if indexed.
  std::optional<int32_t> Find(uint64_t hash, int32_t parent_block, std::span<const int32_t> tokens) const;
  bool Contains(int32_t block) const { return by_block_.contains(block); }

  // A block no sequence holds any more: it waits, cached, as the most
  // recently used. Only for indexed blocks.
  void Park(int32_t block);
  // A parked block that a sequence holds again.
  void Unpark(int32_t block);
  // Drops the least recently used parked block from the index and returns
  // it, now a plain free block; nullopt when none is parked.
  std::optional<int32_t> EvictOldest();

  int64_t indexed() const { return static_cast<int64_t>(by_block_.size()); }
  int64_t parked() const { return static_cast<int64_t>(lru_.size()); }

 private:
  struct Entry {
    uint64_t hash = 0;
    int32_t parent_block = -1;
    std::vector<int32_t> tokens;
    std::optional<std::list<int32_t>::iterator> parked;  // position in lru_
  };
  absl::flat_hash_map<uint64_t, int32_t> by_hash_;
  absl::flat_hash_map<int32_t, Entry> by_block_;
  std::list<int32_t> lru_;  // parked blocks, least recently used first
};

}  // namespace tandem
