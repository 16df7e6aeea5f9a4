// The KV cache in fixed-size blocks, each sequence owning a block table, so
// that sequences grow without copying and beams share their common prefix by
// reference count: forking a beam copies its block table, not its cache, and
// the first write into a shared block copies that one block (copy-on-write;
// in a beam step only the partly filled last block is ever written).
//
// Legend: L layers, B block_size (positions per block), Hkv·hd = kv_dim,
// value_dim the value rows' width (kv_dim; 0 under DeepSeek's latent
// attention, whose key row, the latent and the rope key, is all it caches).
// One block holds, for every layer, B positions of K and of V:
//   keys[block]:   [L, B, kv_dim] f32      values[block]: [L, B, value_dim] f32
// laid out as one run of floats per block: [L, B, kv_dim] then [L, B, value_dim].
//
// Where the blocks live is the KvBlockStorage's business: host memory by
// default (the CPU backend reads them through KeyRow/ValueRow), device
// memory for the CUDA backend (coordinator/cuda_backend.h), in which case the
// addresses KeyRow/ValueRow/BlockData return are device addresses that only
// the owning backend's kernels may dereference.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/scratch_memory.h"
#include "coordinator/engine/prefix_index.h"

namespace tandem {

// The memory behind a KvBlockPool: chunks of whole blocks, allocated as the
// pool grows and never moved or freed before the storage is destroyed.
// Called from the pool's thread (the engine thread) only.
class KvBlockStorage {
 public:
  virtual ~KvBlockStorage() = default;
  // The base address of `bytes` of new block memory (host or device, as the
  // storage defines; zero-filled). ResourceExhausted when out of memory.
  virtual absl::StatusOr<float*> AllocateChunk(int64_t bytes) = 0;
  // Copies one block's `bytes` (every layer's K and V) from `src` to `dst`,
  // both addresses inside chunks of this storage; ordered before any later
  // use of `dst` by the storage's user (the CUDA storage copies on the
  // backend's stream).
  virtual absl::Status CopyBlock(const float* src, float* dst, int64_t bytes) = 0;
  // True when the pool's addresses are host memory the CPU may read/write.
  virtual bool host_accessible() const = 0;
};

// The default storage: host memory, zero-filled, on huge pages where the
// kernel grants them.
class HostKvBlockStorage final : public KvBlockStorage {
 public:
  absl::StatusOr<float*> AllocateChunk(int64_t bytes) override;
  absl::Status CopyBlock(const float* src, float* dst, int64_t bytes) override;
  bool host_accessible() const override { return true; }

 private:
  std::vector<ScratchMemory> chunks_;
};

// Positions per block at most: one block holds every layer's K and V for
// them (a full Mixtral: 256 KiB per position), allocated 32 blocks at a time.
inline constexpr int64_t kMaxKvBlockSize = 1024;

struct KvCacheOptions {
  int64_t num_layers = 0;
  int64_t kv_dim = 0;       // a key row's floats
  int64_t value_dim = -1;   // a value row's: -1 means kv_dim; 0: no value rows
  int64_t block_size = 16;  // 1..kMaxKvBlockSize
  int64_t max_blocks = 0;   // memory limit: blocks are allocated lazily up to this
};

// Owns the block storage. Called from the engine thread only.
class KvBlockPool {
 public:
  // `storage` null: host memory (HostKvBlockStorage). InvalidArgument naming
  // the option when one is out of range or the sizes overflow.
  static absl::StatusOr<std::unique_ptr<KvBlockPool>> Create(const KvCacheOptions& options,
                                                             std::unique_ptr<KvBlockStorage> storage = nullptr);

  // A free block, else a new one while fewer than max_blocks exist, else the
  // least recently used cached prefix block (evicted from the prompt
  // cache). ResourceExhausted when max_blocks are held by sequences.
  absl::StatusOr<int32_t> Allocate();
  void Retain(int32_t block);
  void Release(int32_t block);
  int32_t ref_count(int32_t block) const { return ref_counts_[block]; }
  // A private copy of a shared block (every layer's K and V); drops one
  // reference to `block`. ResourceExhausted when the pool is full.
  absl::StatusOr<int32_t> CopyOnWrite(int32_t block);

  // The prompt cache (prefix_index.h). Indexes `block`, a full block of a
  // sequence holding `tokens` after `parent_block` (-1: first), `hash` its
  // chain hash (PrefixBlockHash). Returns the block the index holds for this
  // prefix: `block`, or one indexed before with the same content.
  int32_t PublishPrefixBlock(int32_t block, uint64_t hash, int32_t parent_block, std::span<const int32_t> tokens);
  // The indexed block for that prefix with one more reference (the caller
  // now holds it, e.g. through SequenceKv::AdoptPrefix); nullopt if none.
  std::optional<int32_t> AcquirePrefixBlock(uint64_t hash, int32_t parent_block, std::span<const int32_t> tokens);
  // Indexed blocks no sequence holds: free memory that still answers lookups.
  int64_t blocks_cached() const { return prefix_index_.parked(); }
  int64_t prefix_evictions() const { return prefix_evictions_; }

  float* Keys(int32_t block, int64_t layer);    // [B, kv_dim]
  float* Values(int32_t block, int64_t layer);  // [B, value_dim]
  // The start of one block: [L, B, kv_dim] + [L, B, value_dim] f32 (host or device memory).
  float* BlockData(int32_t block) { return BlockBase(block); }
  const KvBlockStorage* storage() const { return storage_.get(); }

  const KvCacheOptions& options() const { return options_; }
  int64_t blocks_in_use() const { return blocks_in_use_; }  // held by sequences
  int64_t max_blocks() const { return options_.max_blocks; }
  int64_t copies_on_write() const { return copies_on_write_; }
  int64_t value_dim() const { return options_.value_dim < 0 ? options_.kv_dim : options_.value_dim; }
  int64_t bytes_per_block() const {
    return options_.num_layers * options_.block_size * (options_.kv_dim + value_dim()) * 4;
  }

 private:
  KvBlockPool(const KvCacheOptions& options, std::unique_ptr<KvBlockStorage> storage)
      : options_(options), storage_(std::move(storage)) {}
  static constexpr int64_t kBlocksPerChunk = 32;
  float* BlockBase(int32_t block);

  KvCacheOptions options_;
  std::unique_ptr<KvBlockStorage> storage_;
  std::vector<float*> chunks_;  // kBlocksPerChunk blocks each, owned by storage_
  std::vector<int32_t> ref_counts_;
  std::vector<int32_t> free_list_;
  PrefixIndex prefix_index_;
  int64_t blocks_in_use_ = 0;
  int64_t copies_on_write_ = 0;
  int64_t prefix_evictions_ = 0;
};

// One sequence's block table and length. Releases its blocks on destruction.
class SequenceKv {
 public:
  explicit SequenceKv(KvBlockPool* pool) : pool_(pool) {}
  ~SequenceKv();
  SequenceKv(const SequenceKv&) = delete;
  SequenceKv& operator=(const SequenceKv&) = delete;

  int64_t length() const { return length_; }
  // Makes room for positions [length, new_length), copying any shared block
  // those positions fall in; ResourceExhausted if the pool is full.
  absl::Status Reserve(int64_t new_length);
  // Takes `blocks`, full blocks of a cached prompt prefix whose references
  // the caller acquired (KvBlockPool::AcquirePrefixBlock), as this empty
  // sequence's first positions.
  void AdoptPrefix(std::vector<int32_t> blocks);
  // Becomes a fork of `parent`: the same positions, sharing its blocks (this
  // sequence's own blocks are released first). Copies no cache data.
  void ForkFrom(const SequenceKv& parent);
  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  void set_length(int64_t length) { length_ = length; }
  // Whether a Forward has run over this sequence (or its fork parent's): a
  // sequence starting from a cached prefix is new at a position past 0.
  bool started() const { return started_; }
  void MarkStarted() { started_ = true; }
  // The block table: position p lives in block blocks()[p / B] at row p % B.
  const std::vector<int32_t>& blocks() const { return blocks_; }
  KvBlockPool* pool() const { return pool_; }

  float* KeyRow(int64_t layer, int64_t position) {
    return pool_->Keys(blocks_[position / block_size()], layer) + (position % block_size()) * pool_->options().kv_dim;
  }
  float* ValueRow(int64_t layer, int64_t position) {
    return pool_->Values(blocks_[position / block_size()], layer) + (position % block_size()) * pool_->value_dim();
  }
  // Appends the key (then, with values, the value) rows of positions [0,
  // end) of `layer` to `rows`, as KeyRow/ValueRow give them: one block-table
  // lookup per block rather than per position (a decode step's attention
  // looked up every cached position of every layer).
  void AppendKeyRows(int64_t layer, int64_t end, std::vector<const float*>& rows) const {
    AppendRows(layer, end, /*values=*/false, rows);
  }
  void AppendValueRows(int64_t layer, int64_t end, std::vector<const float*>& rows) const {
    AppendRows(layer, end, /*values=*/true, rows);
  }

 private:
  int64_t block_size() const { return pool_->options().block_size; }
  void AppendRows(int64_t layer, int64_t end, bool values, std::vector<const float*>& rows) const;
  KvBlockPool* pool_;
  std::vector<int32_t> blocks_;
  int64_t length_ = 0;
  bool started_ = false;
};

}  // namespace tandem
