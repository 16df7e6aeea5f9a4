#include "coordinator/engine/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace tandem {

// Chunks of 1 MiB or more are ScratchMemory's huge-page mappings: on 2 MiB
// boundaries and advised for transparent huge pages, which nothing else gets
// where THP is "madvise", the common default. One head's key rows
// are kv_dim floats apart, a new 4 KiB page per row at Mixtral's width, and
// with the weights streaming through the TLB between layers every row read
// cost a page walk. Measured on mixtral-8x7b:2 Q4_K_M decode after a
// 512-token prompt (Zen 5, 2 threads): attention 4.16-4.24 -> 3.61-3.77 ms
// per token (both layers, projections included).
absl::StatusOr<float*> HostKvBlockStorage::AllocateChunk(int64_t bytes) {
  if (bytes <= 0) return absl::InvalidArgumentError(absl::StrCat("KV cache: a chunk of ", bytes, " bytes"));
  ScratchMemory chunk;
  void* p = chunk.Reserve(static_cast<size_t>(bytes));
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache: cannot allocate ", bytes, " bytes of host memory"));
  }
  std::memset(p, 0, static_cast<size_t>(bytes));  // the storage's contract: zero-filled
  chunks_.push_back(std::move(chunk));
  return static_cast<float*>(p);
}

absl::Status HostKvBlockStorage::CopyBlock(const float* src, float* dst, int64_t bytes) {
  std::copy_n(src, static_cast<size_t>(bytes) / sizeof(float), dst);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvBlockPool>> KvBlockPool::Create(const KvCacheOptions& options,
                                                                 std::unique_ptr<KvBlockStorage> storage) {
  if (options.value_dim < -1) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache value_dim ", options.value_dim, " is negative"));
  }
  if (options.num_layers <= 0 || options.kv_dim <= 0 || options.block_size <= 0 || options.max_blocks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache options must be positive: layers ", options.num_layers,
                                                   ", kv_dim ", options.kv_dim, ", block_size ", options.block_size,
                                                   ", max_blocks ", options.max_blocks));
  }
  if (options.block_size > kMaxKvBlockSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache block_size ", options.block_size, " is more than ", kMaxKvBlockSize, " positions"));
  }
  if (options.max_blocks > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache max_blocks ", options.max_blocks, " exceeds 2^31 - 1"));
  }
  int64_t block_bytes = 0, pool_bytes = 0;
  const int64_t row_floats = options.kv_dim + (options.value_dim < 0 ? options.kv_dim : options.value_dim);
  if (__builtin_mul_overflow(int64_t{4} * options.num_layers, options.block_size, &block_bytes) ||
      __builtin_mul_overflow(block_bytes, row_floats, &block_bytes) ||
      __builtin_mul_overflow(block_bytes, options.max_blocks, &pool_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache of ", options.max_blocks, " blocks x ", options.block_size,
                                                   " positions x ", options.num_layers, " layers x kv_dim ",
                                                   options.kv_dim, " overflows 64-bit byte counts"));
  }
  if (storage == nullptr) storage = std::make_unique<HostKvBlockStorage>();
  return std::unique_ptr<KvBlockPool>(new KvBlockPool(options, std::move(storage)));
}

float* KvBlockPool::BlockBase(int32_t block) {
  const int64_t floats_per_block = bytes_per_block() / 4;
  return chunks_[block / kBlocksPerChunk] + (block % kBlocksPerChunk) * floats_per_block;
}

absl::StatusOr<int32_t> KvBlockPool::Allocate() {
  if (free_list_.empty() && static_cast<int64_t>(ref_counts_.size()) >= options_.max_blocks) {
    // Every block exists: reuse the oldest cached prefix before refusing.
    if (std::optional<int32_t> evicted = prefix_index_.EvictOldest()) {
      free_list_.push_back(*evicted);
      ++prefix_evictions_;
    }
  }
  if (free_list_.empty()) {
    const int64_t allocated = static_cast<int64_t>(ref_counts_.size());
    if (allocated >= options_.max_blocks) {
      return absl::ResourceExhaustedError(absl::StrCat("KV cache full: all ", options_.max_blocks, " blocks of ",
                                                       options_.block_size, " positions are in use"));
    }
    // The last chunk holds only the blocks left under max_blocks.
    const int64_t blocks = std::min<int64_t>(kBlocksPerChunk, options_.max_blocks - allocated);
    absl::StatusOr<float*> chunk = storage_->AllocateChunk(blocks * bytes_per_block());
    if (!chunk.ok()) return chunk.status();
    chunks_.push_back(*chunk);
    const int64_t end = std::min(allocated + kBlocksPerChunk, options_.max_blocks);
    ref_counts_.resize(static_cast<size_t>(allocated + kBlocksPerChunk), 0);
    for (int64_t b = end - 1; b >= allocated; --b) free_list_.push_back(static_cast<int32_t>(b));
  }
  const int32_t block = free_list_.back();
  free_list_.pop_back();
  ref_counts_[block] = 1;
  ++blocks_in_use_;
  return block;
}

void KvBlockPool::Retain(int32_t block) { ++ref_counts_[block]; }

int32_t KvBlockPool::PublishPrefixBlock(int32_t block, uint64_t hash, int32_t parent_block,
                                        std::span<const int32_t> tokens) {
  if (std::optional<int32_t> held = prefix_index_.Find(hash, parent_block, tokens)) return *held;
  prefix_index_.Insert(block, hash, parent_block, tokens);
  return block;
}

std::optional<int32_t> KvBlockPool::AcquirePrefixBlock(uint64_t hash, int32_t parent_block,
                                                       std::span<const int32_t> tokens) {
  std::optional<int32_t> block = prefix_index_.Find(hash, parent_block, tokens);
  if (!block) return std::nullopt;
  if (ref_counts_[*block]++ == 0) {
    prefix_index_.Unpark(*block);
    ++blocks_in_use_;
  }
  return block;
}

absl::StatusOr<int32_t> KvBlockPool::CopyOnWrite(int32_t block) {
  absl::StatusOr<int32_t> copy = Allocate();
  if (!copy.ok()) return copy.status();
  if (absl::Status copied = storage_->CopyBlock(BlockBase(block), BlockBase(*copy), bytes_per_block()); !copied.ok()) {
    Release(*copy);
    return copied;
  }
  Release(block);
  ++copies_on_write_;
  return *copy;
}

void KvBlockPool::Release(int32_t block) {
  if (--ref_counts_[block] == 0) {
    // An indexed block stays cached for the next prompt with its prefix.
    if (prefix_index_.Contains(block)) {
      prefix_index_.Park(block);
    } else {
      free_list_.push_back(block);
    }
    --blocks_in_use_;
  }
}

float* KvBlockPool::Keys(int32_t block, int64_t layer) {
  return BlockBase(block) + layer * options_.block_size * options_.kv_dim;
}

float* KvBlockPool::Values(int32_t block, int64_t layer) {
  return BlockBase(block) + options_.num_layers * options_.block_size * options_.kv_dim +
         layer * options_.block_size * value_dim();
}

void SequenceKv::AppendRows(int64_t layer, int64_t end, bool values, std::vector<const float*>& rows) const {
  const int64_t block = block_size(), kv_dim = values ? pool_->value_dim() : pool_->options().kv_dim;
  for (int64_t first = 0; first < end; first += block) {
    const int32_t id = blocks_[static_cast<size_t>(first / block)];
    const float* base = values ? pool_->Values(id, layer) : pool_->Keys(id, layer);
    for (int64_t row = 0; row < std::min(block, end - first); ++row) rows.push_back(base + row * kv_dim);
  }
}

SequenceKv::~SequenceKv() {
  // Last block first: a cached prefix's later blocks are then older in the
  // prompt cache than the blocks they follow, and evicted first.
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) pool_->Release(*it);
}

void SequenceKv::AdoptPrefix(std::vector<int32_t> blocks) {
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) pool_->Release(*it);
  blocks_ = std::move(blocks);
  length_ = static_cast<int64_t>(blocks_.size()) * block_size();
}

absl::Status SequenceKv::Reserve(int64_t new_length) {
  const int64_t needed = (new_length + block_size() - 1) / block_size();
  // Blocks already held that the new positions will be written into.
  const int64_t held = std::min(needed, static_cast<int64_t>(blocks_.size()));
  for (int64_t b = length_ / block_size(); b < held; ++b) {
    if (pool_->ref_count(blocks_[b]) == 1) continue;
    absl::StatusOr<int32_t> copy = pool_->CopyOnWrite(blocks_[b]);
    if (!copy.ok()) return copy.status();
    blocks_[b] = *copy;
  }
  while (static_cast<int64_t>(blocks_.size()) < needed) {
    absl::StatusOr<int32_t> block = pool_->Allocate();
    if (!block.ok()) return block.status();
    blocks_.push_back(*block);
  }
  return absl::OkStatus();
}

void SequenceKv::ForkFrom(const SequenceKv& parent) {
  if (&parent == this) return;
  for (int32_t block : parent.blocks_) pool_->Retain(block);
  for (int32_t block : blocks_) pool_->Release(block);
  blocks_ = parent.blocks_;
  length_ = parent.length_;
  started_ = true;  // it continues its parent
}

}  // namespace tandem
