// The on-memory format of a CPU worker's expert store region (written by
// cpu_worker/expert_store.h) and a read-only view of one, for processes that
// map the same bytes: the coordinator's GPU migration engine reads the
// weights the worker computes from, so host RAM holds one copy
// (ARCHITECTURE.md, Processes). It lives in common/ because the coordinator
// and gpu_worker/ never include cpu_worker/.
//
// A Q4_K or Q6_K matrix is in the header's block_order (dtype.h; the
// worker converts its copy after hashing it, so content hashes are those
// of ggml's order whatever the store holds).
//
// Region layout (offsets from the start of the region, little-endian, as the
// writer's and readers' x86-64 hosts are):
//   [0, 104)                ExpertStoreHeader
//   [104, 104 + 64 * count) the slice table: one ExpertStoreEntry per slice,
//                           in (layer, expert) order
//   [data_offset, ...)      per slice, each matrix kExpertStoreAlignment-aligned:
//     w1: [S, D]  rows intermediate_begin..end of gate_proj, stored dtype
//     w3: [S, D]  the same rows of up_proj
//     w2: [D, S]  columns intermediate_begin..end of down_proj, row-major
//   (S = intermediate_end - intermediate_begin, D = hidden size)
// Each matrix has its own dtype (the entry's): a float type, or a ggml block
// type whose rows are whole blocks (DTypeRowBytes bytes each), as a GGUF
// kept quantized stores them (a Q4_K_M file mixes Q4_K, Q5_K and Q6_K). A
// quantized w2 slice is whole blocks of each row: intermediate_begin and S
// are multiples of its block size (PartitionExperts cuts it so).
// The magic is written last, after every byte above it: a region whose magic
// is still zero is being filled (FailedPrecondition), one with any other
// wrong value is corrupt (DataLoss).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/dtype.h"
#include "common/model/expert_partition.h"
#include "common/model/model_weights.h"
#include "common/platform/shm_region.h"

namespace tandem {

inline constexpr uint64_t kExpertStoreMagic = 0x545058454D444E54ull;  // the bytes "TNDMEXPT", read little-endian
// 2: per-matrix dtypes in the table, block-quantized matrices.
// 3: the header's block_order.
inline constexpr uint32_t kExpertStoreVersion = 3;
// Page size: matrices start on page boundaries, so binding, DMA registration
// (cudaHostRegister) and the kernels' vector loads all see aligned memory.
inline constexpr uint64_t kExpertStoreAlignment = 4096;

struct ExpertStoreHeader {
  uint64_t magic = 0;         // kExpertStoreMagic, the bytes "TNDMEXPT"
  uint32_t version = 0;       // kExpertStoreVersion
  uint32_t dtype = 0;         // DType of the first slice's w1 (each entry has its matrices' own)
  uint64_t region_bytes = 0;  // the whole region: equals the shm object's size
  uint64_t table_offset = 0;  // sizeof(ExpertStoreHeader)
  uint64_t data_offset = 0;   // first matrix: header + table rounded up to the alignment
  uint64_t slice_count = 0;
  uint64_t config_hash = 0;  // ModelFingerprint of the model it came from (common/model_fingerprint.h)
  uint64_t tensors_hash = 0;
  int64_t hidden_size = 0;        // D
  int64_t intermediate_size = 0;  // I of a whole expert
  int32_t num_layers = 0;
  int32_t num_experts = 0;
  uint32_t division = 0;  // ExpertDivision
  int32_t worker_index = 0;
  int32_t num_workers = 0;
  // BlockOrder of the region's Q4_K and Q6_K matrices (dtype.h): a worker
  // whose GEMV reads group-major blocks stores them so; other types have one.
  uint32_t block_order = 0;
};
static_assert(sizeof(ExpertStoreHeader) == 104);

struct ExpertStoreEntry {
  int32_t layer = 0;
  int32_t expert = 0;
  int64_t intermediate_begin = 0;
  int64_t intermediate_end = 0;
  uint64_t w1_offset = 0;                                   // [S, D]
  uint64_t w3_offset = 0;                                   // [S, D]
  uint64_t w2_offset = 0;                                   // [D, S]
  uint32_t w1_dtype = static_cast<uint32_t>(DType::kBF16);  // DType of each matrix
  uint32_t w3_dtype = static_cast<uint32_t>(DType::kBF16);
  uint32_t w2_dtype = static_cast<uint32_t>(DType::kBF16);
  uint32_t reserved = 0;
};
static_assert(sizeof(ExpertStoreEntry) == 64);

// What a region holds, from its header.
struct ExpertStoreInfo {
  DType dtype = DType::kBF16;  // the first slice's w1; ExpertWeights carry each matrix's
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int num_layers = 0;
  int num_experts = 0;
  ExpertDivision division = ExpertDivision::kSplit;
  int worker_index = 0;
  int num_workers = 0;
  // Of the Q4_K/Q6_K matrices (the weights' LinearWeight::order says it per matrix).
  BlockOrder block_order = BlockOrder::kGgml;
  // The writer's ModelFingerprint config_hash / tensors_hash: a reader checks
  // them against its own model's before trusting the bytes.
  uint64_t config_hash = 0;
  uint64_t tensors_hash = 0;
};

// A validated region's slices and their weights as views into it; shared by
// the writer (after filling) and readers, so both index the same way.
struct ExpertStoreIndex {
  ExpertStoreInfo info;
  std::vector<ExpertSlice> slices;     // table order: (layer, expert)
  std::vector<ExpertWeights> weights;  // parallel to slices: w1/w3 [S, D], w2 [D, S]
  std::vector<int32_t> by_expert;      // [layer * E + expert] -> index into slices, or -1

  const ExpertWeights* Find(int layer, int expert) const;
  const ExpertSlice* FindSlice(int layer, int expert) const;
};

// Checks a mapped region from end to end: magic, version, dtype, sizes, the
// table inside the region, every entry's layer/expert/range in bounds and
// unique, its dtypes known and its quantized rows whole blocks, every matrix
// aligned and inside the region. DataLoss naming
// `region_name` and the field or entry; FailedPrecondition when the magic is
// still zero (the writer is filling it).
absl::StatusOr<ExpertStoreIndex> IndexExpertStoreRegion(const void* base, size_t bytes, const std::string& region_name);

// A region mapped read-only (or, where a reader must page-lock it for DMA
// and its GPU cannot lock read-only mappings, read-write; readers never
// write it either way). Movable; unmaps on destruction (never unlinks:
// the writer owns the name; ShmRegion::OwnerAlive tells whether it lives). The pages stay valid after the writer
// unlinks the name or exits.
class ExpertStoreView {
 public:
  // ShmRegion::Open with `access`, then IndexExpertStoreRegion. NotFound
  // when no region has that name; DataLoss when it is empty or corrupt;
  // FailedPrecondition while its writer is still filling it.
  static absl::StatusOr<ExpertStoreView> Open(const std::string& region_name, ShmAccess access = ShmAccess::kReadOnly);

  ExpertStoreView(ExpertStoreView&& other) noexcept = default;
  ExpertStoreView& operator=(ExpertStoreView&& other) noexcept = default;
  ExpertStoreView(const ExpertStoreView&) = delete;
  ExpertStoreView& operator=(const ExpertStoreView&) = delete;

  // nullptr when the region holds no part of (layer, expert).
  const ExpertWeights* Find(int layer, int expert) const { return index_.Find(layer, expert); }
  const ExpertSlice* FindSlice(int layer, int expert) const { return index_.FindSlice(layer, expert); }
  const std::vector<ExpertSlice>& slices() const { return index_.slices; }
  const ExpertStoreInfo& info() const { return index_.info; }
  const std::string& region_name() const { return region_.name(); }
  // The whole mapping, e.g. to register it for DMA once.
  const void* data() const { return region_.data(); }
  size_t region_bytes() const { return region_.size(); }

 private:
  ExpertStoreView() = default;

  ShmRegion region_;  // moving it keeps the mapping's address, so index_'s views stay valid
  ExpertStoreIndex index_;
};

}  // namespace tandem
