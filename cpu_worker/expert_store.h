// The expert weights one CPU worker holds, in one named shared-memory region
// on the worker's NUMA node, so that another process (the coordinator's GPU
// migration engine) can map the same bytes read-only instead of keeping a
// second copy.
//
// Region layout: see common/expert_store_view.h (ExpertStoreHeader, then the
// slice table, then per slice w1 [S, D], w3 [S, D], w2 [D, S], each matrix
// 4096-byte aligned; S = the slice's rows of I, D = hidden size). Matrices
// keep the model's types: float, or a GGUF's blocks when its experts are
// kept quantized (a split then cuts w2 on block boundaries). The
// format lives in common/ because the coordinator, which never includes
// cpu_worker/, maps the region with ExpertStoreView.
//
// The region is bound to the worker's node before any page exists and pages
// are first touched by the worker's pinned threads, so they live there
// (binding alone decides on a NUMA machine; first touch is what places
// them where binding is unavailable).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/thread_pool.h"
#include "common/model/expert_partition.h"
#include "common/model/expert_store_view.h"
#include "common/model/model_weights.h"
#include "common/model/tensor_names.h"
#include "common/platform/shm_region.h"

namespace tandem {

struct ExpertStoreOptions {
  std::string region_name;  // POSIX shm name, e.g. "/tandem-<run>-w0"; unlinked when the store dies
  // Append a random suffix to region_name (ShmCreateOptions::unique_suffix);
  // ExpertStore::region_name() reports the full name.
  bool unique_suffix = false;
  ExpertDivision division = ExpertDivision::kSplit;
  int worker_index = 0;
  int num_workers = 1;
  int numa_node = -1;          // -1: no binding (single-node machine or unknown)
  ThreadPool* pool = nullptr;  // pinned compute threads: they first-touch the pages
  // The order of the copied Q4_K/Q6_K matrices: kGroupMajor for a worker
  // whose GEMV reads it (PreferredBlockOrder, linear.h); recorded in the
  // header. Each row is hashed before it is reordered. The model's views
  // must be in ggml's order.
  BlockOrder block_order = BlockOrder::kGgml;
  // Set: the slices' bytes are written by this instead of copied from the
  // model's expert views (which may then be null): a synthetic model's
  // experts generated straight into the region, so the worker never holds
  // them twice. Writes elements [begin, end) (row-major in the full tensor
  // `role` of (layer, expert), kExpertW1/W2/W3) to `out`, contiguously.
  // Called on `pool`'s threads, for disjoint outputs.
  std::function<void(int layer, int expert, WeightRole role, int64_t begin, int64_t end, void* out)> fill;
};

// Owns the region. Immutable after Create (the worker maps it read-only once
// filled, so a stray write faults instead of corrupting what the GPU copies);
// any thread may read.
class ExpertStore {
 public:
  // Creates the region (O_EXCL), binds it to options.numa_node, copies this
  // worker's slices of `model` into it on options.pool, hashing every row
  // as it lands (slice_hashes), writes the header last. InvalidArgument for bad options or model shapes (naming the
  // field or layer/expert); AlreadyExists naming the region when a live process holds the name (a stale region of a
  // killed worker is reclaimed, see ShmRegion); ResourceExhausted when /dev/shm lacks the space (instead of a SIGBUS
  // half-way through the copy); the errno's status for other system-call failures. On error nothing is left behind.
  static absl::StatusOr<std::unique_ptr<ExpertStore>> Create(const ModelWeights& model,
                                                             const ExpertStoreOptions& options);
  // Maps an existing region read-only and validates it (ExpertStoreView::Open).
  static absl::StatusOr<ExpertStoreView> OpenReadOnly(const std::string& region_name);
  // Unmaps and unlinks the name (ShmRegion); other processes' mappings stay valid.
  ~ExpertStore() = default;
  ExpertStore(const ExpertStore&) = delete;
  ExpertStore& operator=(const ExpertStore&) = delete;

  // The weights of this worker's part of (layer, expert): w1/w3 [S, D], w2 [D, S];
  // nullptr when this worker holds no part of it (shard).
  const ExpertWeights* Find(int layer, int expert) const { return index_.Find(layer, expert); }
  const ExpertSlice* FindSlice(int layer, int expert) const { return index_.FindSlice(layer, expert); }
  const std::vector<ExpertSlice>& slices() const { return index_.slices; }
  const ExpertStoreInfo& info() const { return index_.info; }
  const std::string& region_name() const { return region_.name(); }
  size_t region_bytes() const { return region_.size(); }
  // The hash of each slice's stored bytes (slices() order) and of them all,
  // computed while the store was filled (common/model/expert_content.h).
  const std::vector<uint64_t>& slice_hashes() const { return slice_hashes_; }
  // Its matrices' types, e.g. "BF16" or "Q4_K+Q6_K" (ExpertDTypesText).
  std::string dtypes() const;
  // Bytes of every stored matrix (without the alignment padding): what a
  // whole pass over this worker's experts reads.
  int64_t expert_bytes() const { return expert_bytes_; }
  uint64_t content_hash() const { return content_hash_; }

 private:
  ExpertStore() = default;
  std::vector<uint64_t> slice_hashes_;
  uint64_t content_hash_ = 0;
  int64_t expert_bytes_ = 0;
  ShmRegion region_;        // owner: unmapped and unlinked with the store
  ExpertStoreIndex index_;  // slices, their weights (views into region_), lookup
};

}  // namespace tandem
