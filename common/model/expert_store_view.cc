#include "common/model/expert_store_view.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

// Bounds a corrupt header's table so indexing it cannot ask for absurd
// memory: far above any real model (Mixtral 8x22B: 56 layers x 8 experts).
constexpr int64_t kMaxLayerExperts = int64_t{1} << 24;

absl::Status Corrupt(const std::string& region_name, const std::string& what) {
  return absl::DataLossError(absl::StrCat("expert store region ", region_name, " is corrupt: ", what));
}

constexpr uint32_t kLastDType = static_cast<uint32_t>(kNumDTypes - 1);

// rows x DTypeRowBytes(dtype, cols) bytes, or -1 when it overflows or
// exceeds `limit`.
int64_t MatrixBytes(int64_t rows, int64_t cols, DType dtype, uint64_t limit) {
  const unsigned __int128 bytes = static_cast<unsigned __int128>(rows) *
                                  static_cast<unsigned __int128>(cols / DTypeBlockSize(dtype)) *
                                  static_cast<unsigned __int128>(DTypeBlockBytes(dtype));
  return bytes > limit ? -1 : static_cast<int64_t>(bytes);
}

// The header of a region of `bytes` at `base`, checked field by field: the
// magic (acquired), version, sizes and the table's and data's bounds.
absl::StatusOr<const ExpertStoreHeader*> CheckHeader(const void* base, size_t bytes, const std::string& region_name) {
  if (base == nullptr || bytes < sizeof(ExpertStoreHeader))
    return Corrupt(region_name,
                   absl::StrCat(bytes, " bytes, smaller than its ", sizeof(ExpertStoreHeader), "-byte header"));
  const auto* header = static_cast<const ExpertStoreHeader*>(base);
  // Acquire pairs with the writer's release store of the magic: every byte
  // written before it is visible once the magic is.
  const uint64_t magic = __atomic_load_n(&header->magic, __ATOMIC_ACQUIRE);
  if (magic == 0)
    return absl::FailedPreconditionError(
        absl::StrCat("expert store region ", region_name, " is not ready: its writer is still filling it"));
  if (magic != kExpertStoreMagic)
    return Corrupt(region_name, absl::StrCat("magic 0x", absl::Hex(magic), ", expected 0x",
                                             absl::Hex(kExpertStoreMagic), " (\"TNDMEXPT\")"));
  if (header->version != kExpertStoreVersion)
    return Corrupt(region_name,
                   absl::StrCat("version ", header->version, ", this build reads version ", kExpertStoreVersion));
  if (header->region_bytes != bytes)
    return Corrupt(region_name, absl::StrCat("header says region_bytes ", header->region_bytes, " but the region is ",
                                             bytes, " bytes"));
  if (header->dtype > kLastDType)
    return Corrupt(region_name, absl::StrCat("dtype ", header->dtype, " is not a type tandem stores"));
  if (header->block_order > static_cast<uint32_t>(BlockOrder::kGroupMajor))
    return Corrupt(region_name,
                   absl::StrCat("block_order ", header->block_order, " is not ggml (0) or group-major (1)"));
  if (header->division > static_cast<uint32_t>(ExpertDivision::kShard))
    return Corrupt(region_name, absl::StrCat("division ", header->division, " is not split or shard"));
  if (header->hidden_size < 1 || header->intermediate_size < 1 || header->hidden_size > static_cast<int64_t>(bytes) ||
      header->intermediate_size > static_cast<int64_t>(bytes))
    return Corrupt(region_name, absl::StrCat("hidden_size ", header->hidden_size, ", intermediate_size ",
                                             header->intermediate_size));
  if (header->num_layers < 1 || header->num_experts < 1 ||
      int64_t{header->num_layers} * header->num_experts > kMaxLayerExperts)
    return Corrupt(region_name, absl::StrCat("num_layers ", header->num_layers, ", num_experts ", header->num_experts));
  if (header->num_workers < 1 || header->worker_index < 0 || header->worker_index >= header->num_workers)
    return Corrupt(region_name,
                   absl::StrCat("worker_index ", header->worker_index, " of num_workers ", header->num_workers));
  if (header->table_offset != sizeof(ExpertStoreHeader))
    return Corrupt(region_name,
                   absl::StrCat("table_offset ", header->table_offset, ", expected ", sizeof(ExpertStoreHeader)));
  const uint64_t max_slices = int64_t{header->num_layers} * header->num_experts;
  if (header->slice_count > max_slices ||
      header->slice_count > (bytes - header->table_offset) / sizeof(ExpertStoreEntry))
    return Corrupt(region_name, absl::StrCat("slice_count ", header->slice_count, " (", header->num_layers,
                                             " layers x ", header->num_experts, " experts, ", bytes, " bytes)"));
  const uint64_t table_end = header->table_offset + header->slice_count * sizeof(ExpertStoreEntry);
  if (header->data_offset < table_end || header->data_offset > bytes ||
      header->data_offset % kExpertStoreAlignment != 0)
    return Corrupt(region_name, absl::StrCat("data_offset ", header->data_offset, " (table ends at ", table_end,
                                             ", region ", bytes, " bytes, alignment ", kExpertStoreAlignment, ")"));
  return header;
}

ExpertStoreInfo InfoOf(const ExpertStoreHeader& header) {
  return ExpertStoreInfo{.dtype = static_cast<DType>(header.dtype),
                         .hidden_size = header.hidden_size,
                         .intermediate_size = header.intermediate_size,
                         .num_layers = header.num_layers,
                         .num_experts = header.num_experts,
                         .division = static_cast<ExpertDivision>(header.division),
                         .worker_index = header.worker_index,
                         .num_workers = header.num_workers,
                         .block_order = static_cast<BlockOrder>(header.block_order),
                         .config_hash = header.config_hash,
                         .tensors_hash = header.tensors_hash};
}

// One matrix of an entry: its dtype known, its rows whole blocks (a w2
// slice also starting on one), inside the data and aligned; its view.
absl::StatusOr<LinearWeight> CheckMatrix(const void* base, size_t bytes, const std::string& region_name,
                                         const ExpertStoreHeader& header, const std::string& where, const char* name,
                                         uint32_t dtype_value, uint64_t offset, int64_t rows, int64_t cols,
                                         int64_t col0) {
  if (dtype_value > kLastDType)
    return Corrupt(region_name, absl::StrCat(where, " ", name, "_dtype ", dtype_value, " is not a type tandem stores"));
  const DType dtype = static_cast<DType>(dtype_value);
  const int64_t block = DTypeBlockSize(dtype);
  if (cols % block != 0 || col0 % block != 0)
    return Corrupt(region_name,
                   absl::StrCat(where, " ", name, " is ", std::string(DTypeName(dtype)), " with rows of ", cols,
                                " values from column ", col0, ", not whole ", block, "-value blocks"));
  const int64_t matrix_bytes = MatrixBytes(rows, cols, dtype, bytes);
  if (matrix_bytes < 0)
    return Corrupt(region_name,
                   absl::StrCat(where, " has a [", rows, ", ", cols, "] ", name, " larger than the region"));
  if (offset < header.data_offset || offset % kExpertStoreAlignment != 0 || offset > bytes ||
      static_cast<uint64_t>(matrix_bytes) > bytes - offset)
    return Corrupt(region_name, absl::StrCat(where, " ", name, "_offset ", offset, " + ", matrix_bytes,
                                             " bytes is outside the data [", header.data_offset, ", ", bytes,
                                             ") or not ", kExpertStoreAlignment, "-aligned"));
  const BlockOrder order = HasGroupMajorOrder(dtype) ? static_cast<BlockOrder>(header.block_order) : BlockOrder::kGgml;
  return LinearWeight{static_cast<const char*>(base) + offset, dtype, rows, cols, order};
}

// Table entry i, checked (in range, in (layer, expert) order after
// *previous_key, its rows and matrices inside the data), into `index`.
absl::Status AddSlice(const void* base, size_t bytes, const std::string& region_name, const ExpertStoreHeader& header,
                      uint64_t i, const ExpertStoreEntry& entry, int64_t* previous_key, ExpertStoreIndex* index) {
  const int64_t hidden = header.hidden_size;
  const std::string where = absl::StrCat("slice ", i, " (layer ", entry.layer, " expert ", entry.expert, ")");
  if (entry.layer < 0 || entry.layer >= header.num_layers || entry.expert < 0 || entry.expert >= header.num_experts)
    return Corrupt(region_name, absl::StrCat(where, " is outside ", header.num_layers, " layers x ", header.num_experts,
                                             " experts"));
  const int64_t key = int64_t{entry.layer} * header.num_experts + entry.expert;
  if (key <= *previous_key)
    return Corrupt(region_name, absl::StrCat(where, " is out of (layer, expert) order or repeated"));
  *previous_key = key;
  if (entry.intermediate_begin < 0 || entry.intermediate_begin >= entry.intermediate_end ||
      entry.intermediate_end > header.intermediate_size)
    return Corrupt(region_name, absl::StrCat(where, " has rows [", entry.intermediate_begin, ", ",
                                             entry.intermediate_end, ") outside [0, ", header.intermediate_size, ")"));
  const int64_t rows = entry.intermediate_end - entry.intermediate_begin;
  ExpertWeights weights;
  TANDEM_ASSIGN_OR_RETURN(weights.w1, CheckMatrix(base, bytes, region_name, header, where, "w1", entry.w1_dtype,
                                                  entry.w1_offset, rows, hidden, 0));
  TANDEM_ASSIGN_OR_RETURN(weights.w3, CheckMatrix(base, bytes, region_name, header, where, "w3", entry.w3_dtype,
                                                  entry.w3_offset, rows, hidden, 0));
  TANDEM_ASSIGN_OR_RETURN(weights.w2, CheckMatrix(base, bytes, region_name, header, where, "w2", entry.w2_dtype,
                                                  entry.w2_offset, hidden, rows, entry.intermediate_begin));
  index->by_expert[static_cast<size_t>(key)] = static_cast<int32_t>(index->slices.size());
  index->slices.push_back(ExpertSlice{entry.layer, entry.expert, entry.intermediate_begin, entry.intermediate_end});
  index->weights.push_back(weights);
  return absl::OkStatus();
}

}  // namespace

const ExpertWeights* ExpertStoreIndex::Find(int layer, int expert) const {
  if (layer < 0 || layer >= info.num_layers || expert < 0 || expert >= info.num_experts) return nullptr;
  const int32_t i =
      by_expert[static_cast<size_t>(layer) * static_cast<size_t>(info.num_experts) + static_cast<size_t>(expert)];
  return i < 0 ? nullptr : &weights[static_cast<size_t>(i)];
}

const ExpertSlice* ExpertStoreIndex::FindSlice(int layer, int expert) const {
  const ExpertWeights* found = Find(layer, expert);
  return found == nullptr ? nullptr : &slices[static_cast<size_t>(found - weights.data())];
}

absl::StatusOr<ExpertStoreIndex> IndexExpertStoreRegion(const void* base, size_t bytes,
                                                        const std::string& region_name) {
  TANDEM_ASSIGN_OR_RETURN(const ExpertStoreHeader* header, CheckHeader(base, bytes, region_name));
  ExpertStoreIndex index;
  index.info = InfoOf(*header);
  const uint64_t max_slices = int64_t{header->num_layers} * header->num_experts;
  index.by_expert.assign(static_cast<size_t>(max_slices), -1);
  index.slices.reserve(static_cast<size_t>(header->slice_count));
  index.weights.reserve(static_cast<size_t>(header->slice_count));
  const auto* table = reinterpret_cast<const ExpertStoreEntry*>(static_cast<const char*>(base) + header->table_offset);
  int64_t previous_key = -1;
  for (uint64_t i = 0; i < header->slice_count; ++i) {
    ExpertStoreEntry entry;
    std::memcpy(&entry, &table[i], sizeof(entry));  // the table is only 8-byte aligned; copy, don't alias
    TANDEM_RETURN_IF_ERROR(AddSlice(base, bytes, region_name, *header, i, entry, &previous_key, &index));
  }
  return index;
}

absl::StatusOr<ExpertStoreView> ExpertStoreView::Open(const std::string& region_name, ShmAccess access) {
  ExpertStoreView view;
  TANDEM_ASSIGN_OR_RETURN(view.region_, ShmRegion::Open(region_name, access));
  TANDEM_ASSIGN_OR_RETURN(view.index_, IndexExpertStoreRegion(view.region_.data(), view.region_.size(), region_name));
  return view;
}

}  // namespace tandem
