// Legend: L layers, E experts, D hidden size, I intermediate size, S rows of
// I in one slice.
#include "cpu_worker/expert_store.h"

#include <sys/mman.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/clock.h"
#include "common/base/log.h"
#include "common/base/parallel_status.h"
#include "common/base/progress.h"
#include "common/base/status_macros.h"
#include "common/model/expert_content.h"
#include "common/model/gguf_tensor_source.h"
#include "common/model/model_fingerprint.h"
#include "common/platform/numa_topology.h"
#include "common/quant/block_order.h"

namespace tandem {
namespace {

// One parallel copy task moves about this much: enough to amortise the task
// counter, small enough that every pinned thread gets a share of each matrix.
constexpr int64_t kCopyChunkBytes = int64_t{1} << 20;

std::string FormatBytes(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  return b >= (1 << 30) ? absl::StrFormat("%.2f GiB", b / (1 << 30)) : absl::StrFormat("%.2f MiB", b / (1 << 20));
}

uint64_t RoundUp(uint64_t value, uint64_t alignment) { return (value + alignment - 1) / alignment * alignment; }

// rows x row_bytes from src (row stride src_stride) to dst (row stride
// dst_stride): rows [first, first + rows) of matrix `role` of slice `slice`.
struct CopyTask {
  char* dst = nullptr;
  const char* src = nullptr;
  int64_t rows = 0;
  int64_t row_bytes = 0;
  int64_t src_stride = 0;
  int64_t dst_stride = 0;
  size_t slice = 0;
  WeightRole role = WeightRole::kExpertW1;
  int64_t first = 0;  // the first row's index in the stored matrix
  // Q4_K/Q6_K rows put in group-major order after they are hashed.
  bool to_group_major = false;
  GgmlType type = GgmlType::kF32;
};

// Cuts a rows x row_bytes copy into tasks of about kCopyChunkBytes.
void AddCopy(std::vector<CopyTask>& tasks, char* dst, const char* src, int64_t rows, int64_t row_bytes,
             int64_t src_stride, int64_t dst_stride, size_t slice, WeightRole role, DType dtype, BlockOrder order) {
  const int64_t rows_per_task = std::max<int64_t>(1, kCopyChunkBytes / row_bytes);
  const bool to_group_major = order == BlockOrder::kGroupMajor && HasGroupMajorOrder(dtype);
  for (int64_t r = 0; r < rows; r += rows_per_task) {
    tasks.push_back(CopyTask{dst + r * dst_stride, src + r * src_stride, std::min(rows_per_task, rows - r), row_bytes,
                             src_stride, dst_stride, slice, role, r, to_group_major,
                             to_group_major ? GgmlFromDType(dtype) : GgmlType::kF32});
  }
}

// The seed of stored row `row` of matrix `role` of slice `s` (expert_content.h).
uint64_t StoredRowSeed(const ExpertSlice& s, WeightRole role, int64_t row) {
  return role == WeightRole::kExpertW2 ? ExpertRowSeed(s.layer, s.expert, role, row, s.intermediate_begin)
                                       : ExpertRowSeed(s.layer, s.expert, role, s.intermediate_begin + row, 0);
}

// Copies the task's rows and hashes each right after it lands (still in
// L1), in the file's order, then reorders it if asked: the sum of the rows'
// hashes.
absl::StatusOr<uint64_t> RunCopy(const CopyTask& task, const ExpertSlice& slice) {
  uint64_t sum = 0;
  for (int64_t r = 0; r < task.rows; ++r) {
    char* dst = task.dst + r * task.dst_stride;
    std::memcpy(dst, task.src + r * task.src_stride, static_cast<size_t>(task.row_bytes));
    sum += HashExpertRow(dst, static_cast<size_t>(task.row_bytes), StoredRowSeed(slice, task.role, task.first + r));
    if (task.to_group_major) {
      TANDEM_RETURN_IF_ERROR(ToGroupMajorOrder(
          task.type, absl::MakeSpan(reinterpret_cast<uint8_t*>(dst), static_cast<size_t>(task.row_bytes))));
    }
  }
  return sum;
}

// Per slice, the sum of its stored rows' hashes, added to by the pool's
// threads as their tasks finish.
class SliceHashes {
 public:
  explicit SliceHashes(size_t n) : sums_(new std::atomic<uint64_t>[n]), n_(n) {
    for (size_t i = 0; i < n; ++i) sums_[i].store(0);
  }
  void Add(size_t slice, uint64_t sum) { sums_[slice].fetch_add(sum, std::memory_order_relaxed); }
  std::vector<uint64_t> Values() const {
    std::vector<uint64_t> values(n_);
    for (size_t i = 0; i < n_; ++i) values[i] = sums_[i].load();
    return values;
  }

 private:
  std::unique_ptr<std::atomic<uint64_t>[]> sums_;
  size_t n_;
};

// Runs task(t) for t in [0, n) on the pool, or inline without one.
void RunTasks(ThreadPool* pool, size_t n, const std::function<void(int64_t)>& task) {
  if (pool != nullptr) {
    pool->ParallelFor(static_cast<int64_t>(n), [&](int64_t t, int) { task(t); });
  } else {
    for (size_t t = 0; t < n; ++t) task(static_cast<int64_t>(t));
  }
}

// A copied matrix may be of any type whose rows are whole blocks (each
// entry records its matrices' dtypes); a generated one (options.fill, which
// writes elements) must be a float type, the same for all.
absl::Status CheckMatrix(const LinearWeight& w, DType fill_dtype, int64_t n, int64_t k, int layer, int expert,
                         const char* name, bool generated) {
  const std::string where = absl::StrCat("model layer ", layer, " expert ", expert, " ", name);
  if (!generated && w.data == nullptr) return absl::InvalidArgumentError(absl::StrCat(where, " has no data"));
  if (w.n != n || w.k != k)
    return absl::InvalidArgumentError(absl::StrCat(where, " is [", w.n, ", ", w.k, "], expected [", n, ", ", k, "]"));
  // Rows are hashed as they land, in the file's order (expert_content.h).
  if (w.order != BlockOrder::kGgml)
    return absl::InvalidArgumentError(
        absl::StrCat(where, " is in ", BlockOrderName(w.order),
                     " block order: the store copies ggml's (load with block_order ggml)"));
  if (k % DTypeBlockSize(w.dtype) != 0)
    return absl::InvalidArgumentError(absl::StrCat(where, " is ", std::string(DTypeName(w.dtype)), " with rows of ", k,
                                                   " values, not whole ", DTypeBlockSize(w.dtype), "-value blocks"));
  if (!generated) return absl::OkStatus();
  TANDEM_RETURN_IF_ERROR(RequireFloatDType(w.dtype, where, "an expert store generated in place"));
  if (w.dtype != fill_dtype)
    return absl::InvalidArgumentError(absl::StrCat(where, " is ", std::string(DTypeName(w.dtype)),
                                                   ", other experts are ", std::string(DTypeName(fill_dtype)),
                                                   " (a generated region holds one dtype)"));
  return absl::OkStatus();
}

// What Create's steps share: this worker's slices, the model's shapes and
// where each slice's matrices lie in the region.
struct StoreLayout {
  std::vector<ExpertSlice> slices;
  std::vector<std::array<DType, 3>> dtypes;  // parallel to slices: w1, w3, w2
  DType dtype = DType::kF32;                 // the first slice's w1 (the header's)
  int64_t hidden = 0;                        // D
  int64_t intermediate = 0;                  // I
  int64_t element = 0;                       // options.fill only: bytes of one (float) weight
  int64_t expert_bytes = 0;                  // every stored matrix, unpadded
  std::vector<ExpertStoreEntry> table;
  uint64_t data_offset = 0;
  uint64_t region_bytes = 0;
};

// This worker's slices, after checking the model holds every one of them
// in one dtype with the config's shapes.
absl::StatusOr<StoreLayout> CheckModel(const ModelWeights& model, const ExpertStoreOptions& options) {
  const ModelConfig& config = model.config;
  StoreLayout layout;
  // A quantized down_proj is cut along I on its blocks' boundaries.
  TANDEM_ASSIGN_OR_RETURN(layout.slices, PartitionExperts(config, options.division, options.worker_index,
                                                          options.num_workers, ExpertSplitBlockOf(model)));
  const int64_t hidden = layout.hidden = config.hidden_size;
  const int64_t intermediate = layout.intermediate = config.intermediate_size;
  if (hidden < 1) return absl::InvalidArgumentError(absl::StrCat("config hidden_size must be >= 1, got ", hidden));
  if (static_cast<int64_t>(model.layers.size()) != config.num_hidden_layers)
    return absl::InvalidArgumentError(absl::StrCat("model has ", model.layers.size(),
                                                   " layers, config num_hidden_layers ", config.num_hidden_layers));
  for (size_t l = 0; l < model.layers.size(); ++l) {
    // A dense layer has none.
    const int64_t expected = config.moe_layer(static_cast<int64_t>(l)) ? config.num_local_experts : 0;
    if (static_cast<int64_t>(model.layers[l].experts.size()) != expected)
      return absl::InvalidArgumentError(
          absl::StrCat("model layer ", l, " has ", model.layers[l].experts.size(), " experts, the config ", expected));
  }
  const DType dtype = layout.dtype = model.layers[static_cast<size_t>(config.first_moe_layer())].experts[0].w1.dtype;
  const bool generated = static_cast<bool>(options.fill);
  for (const ExpertSlice& s : layout.slices) {
    const ExpertWeights& w = model.layers[static_cast<size_t>(s.layer)].experts[static_cast<size_t>(s.expert)];
    TANDEM_RETURN_IF_ERROR(
        CheckMatrix(w.w1, dtype, intermediate, hidden, s.layer, s.expert, "gate_proj (w1)", generated));
    TANDEM_RETURN_IF_ERROR(
        CheckMatrix(w.w3, dtype, intermediate, hidden, s.layer, s.expert, "up_proj (w3)", generated));
    TANDEM_RETURN_IF_ERROR(
        CheckMatrix(w.w2, dtype, hidden, intermediate, s.layer, s.expert, "down_proj (w2)", generated));
    layout.dtypes.push_back({w.w1.dtype, w.w3.dtype, w.w2.dtype});
  }
  layout.element = generated ? static_cast<int64_t>(DTypeSize(dtype)) : 0;
  return layout;
}

// Layout (common/expert_store_view.h): header, table, then the matrices.
void LayOutRegion(StoreLayout& layout) {
  const std::vector<ExpertSlice>& slices = layout.slices;
  layout.table.resize(slices.size());
  layout.data_offset =
      RoundUp(sizeof(ExpertStoreHeader) + slices.size() * sizeof(ExpertStoreEntry), kExpertStoreAlignment);
  uint64_t offset = layout.data_offset;
  layout.expert_bytes = 0;
  for (size_t i = 0; i < slices.size(); ++i) {
    const auto [w1, w3, w2] = layout.dtypes[i];
    const int64_t s = slices[i].size(), d = layout.hidden;
    const int64_t bytes[3] = {s * DTypeRowBytes(w1, d), s * DTypeRowBytes(w3, d), d * DTypeRowBytes(w2, s)};
    ExpertStoreEntry& entry = layout.table[i];
    entry = ExpertStoreEntry{.layer = slices[i].layer,
                             .expert = slices[i].expert,
                             .intermediate_begin = slices[i].intermediate_begin,
                             .intermediate_end = slices[i].intermediate_end,
                             .w1_dtype = static_cast<uint32_t>(w1),
                             .w3_dtype = static_cast<uint32_t>(w3),
                             .w2_dtype = static_cast<uint32_t>(w2)};
    uint64_t* offsets[3] = {&entry.w1_offset, &entry.w3_offset, &entry.w2_offset};
    for (int m = 0; m < 3; ++m) {
      *offsets[m] = offset;
      offset += RoundUp(static_cast<uint64_t>(bytes[m]), kExpertStoreAlignment);
      layout.expert_bytes += bytes[m];
    }
  }
  layout.region_bytes = offset;
}

// tmpfs allocates on first touch: a region larger than the shm
// filesystem's free space would truncate fine and then SIGBUS half-way
// through the copy. (glibc's shm_open lives in /dev/shm.)
absl::Status CheckShmSpace(const std::string& name, uint64_t region_bytes) {
  struct statvfs fs;
  if (statvfs("/dev/shm", &fs) == 0) {
    const uint64_t available = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
    if (region_bytes > available)
      return absl::ResourceExhaustedError(
          absl::StrFormat("expert store region %s needs %s but /dev/shm has %s free (mount it larger)", name,
                          FormatBytes(region_bytes), FormatBytes(available)));
  }
  return absl::OkStatus();
}

// ftruncate + mmap only: no page exists yet, so binding decides where every
// page goes. Unlinked again (the ShmRegion dies) when binding fails.
absl::StatusOr<ShmRegion> CreateBoundRegion(const std::string& name, uint64_t region_bytes, int numa_node,
                                            bool unique_suffix) {
  absl::StatusOr<ShmRegion> region =
      ShmRegion::Create(name, region_bytes, ShmCreateOptions{.unique_suffix = unique_suffix});
  if (!region.ok())
    return absl::Status(region.status().code(), absl::StrCat("expert store: ", region.status().message()));
  // Before any page exists, so every page is allocated on the node.
  if (numa_node >= 0) {
    absl::Status bound = BindMemoryToNode(region->data(), region_bytes, numa_node);
    if (!bound.ok())
      return absl::Status(bound.code(), absl::StrCat("expert store region ", region->name(), ": ", bound.message()));
  }
  return region;
}

// Copies on the pinned threads (first touch). w1/w3 slices are contiguous
// rows of the source; a w2 slice is a column range, copied row by row (for
// a block type: whole blocks, CheckModel's partition starts and ends it on
// block boundaries). Every stored row is hashed as it is written
// (expert_content.h).
absl::Status CopySlices(const ModelWeights& model, const StoreLayout& layout, BlockOrder order, ThreadPool* pool,
                        char* base, SliceHashes& hashes, ProgressReporter& progress) {
  const int64_t hidden = layout.hidden;
  std::vector<CopyTask> tasks;
  for (size_t i = 0; i < layout.slices.size(); ++i) {
    const ExpertSlice& s = layout.slices[i];
    const ExpertStoreEntry& entry = layout.table[i];
    const ExpertWeights& w = model.layers[static_cast<size_t>(s.layer)].experts[static_cast<size_t>(s.expert)];
    const int64_t row1 = w.w1.row_bytes(), row3 = w.w3.row_bytes();  // a w1/w3 row
    AddCopy(tasks, base + entry.w1_offset, static_cast<const char*>(w.w1.data) + s.intermediate_begin * row1, s.size(),
            row1, row1, row1, i, WeightRole::kExpertW1, w.w1.dtype, order);
    AddCopy(tasks, base + entry.w3_offset, static_cast<const char*>(w.w3.data) + s.intermediate_begin * row3, s.size(),
            row3, row3, row3, i, WeightRole::kExpertW3, w.w3.dtype, order);
    const int64_t part = DTypeRowBytes(w.w2.dtype, s.size());  // a stored w2 row
    AddCopy(tasks, base + entry.w2_offset,
            static_cast<const char*>(w.w2.data) + DTypeRowBytes(w.w2.dtype, s.intermediate_begin), hidden, part,
            w.w2.row_bytes(), part, i, WeightRole::kExpertW2, w.w2.dtype, order);
  }
  return ParallelTasks(pool, static_cast<int64_t>(tasks.size()), [&](int64_t t) -> absl::Status {
    const CopyTask& task = tasks[static_cast<size_t>(t)];
    TANDEM_ASSIGN_OR_RETURN(const uint64_t sum, RunCopy(task, layout.slices[task.slice]));
    hashes.Add(task.slice, sum);
    progress.Add(task.rows * task.row_bytes);
    return absl::OkStatus();
  });
}

// The same slicing as CopySlices, generated in place by options.fill:
// w1/w3 rows [b, e) are elements [b*D, e*D) of the tensor; w2 row r's
// columns [b, e) are elements [r*I + b, r*I + e). Tasks of about
// kCopyChunkBytes, as for copies.
void FillSlices(const StoreLayout& layout, const ExpertStoreOptions& options, char* base, SliceHashes& hashes,
                ProgressReporter& progress) {
  const std::vector<ExpertSlice>& slices = layout.slices;
  const int64_t hidden = layout.hidden, intermediate = layout.intermediate, element = layout.element;
  struct FillTask {
    size_t slice;
    WeightRole role;
    int64_t row_begin, row_end;  // rows of the slice's matrix in the region
  };
  std::vector<FillTask> fills;
  for (size_t i = 0; i < slices.size(); ++i) {
    const int64_t w13_rows = std::max<int64_t>(1, kCopyChunkBytes / (hidden * element));
    const int64_t w2_rows = std::max<int64_t>(1, kCopyChunkBytes / (slices[i].size() * element));
    for (WeightRole role : {WeightRole::kExpertW1, WeightRole::kExpertW3}) {
      for (int64_t r = 0; r < slices[i].size(); r += w13_rows)
        fills.push_back({i, role, r, std::min(slices[i].size(), r + w13_rows)});
    }
    for (int64_t r = 0; r < hidden; r += w2_rows)
      fills.push_back({i, WeightRole::kExpertW2, r, std::min(hidden, r + w2_rows)});
  }
  // Each stored row hashed right after it is generated; the task's sum.
  auto run = [&](const FillTask& f) -> uint64_t {
    const ExpertSlice& s = slices[f.slice];
    const ExpertStoreEntry& entry = layout.table[f.slice];
    uint64_t sum = 0;
    if (f.role == WeightRole::kExpertW2) {
      char* out = base + entry.w2_offset;
      const int64_t row_bytes = s.size() * element;
      for (int64_t r = f.row_begin; r < f.row_end; ++r) {
        options.fill(s.layer, s.expert, f.role, r * intermediate + s.intermediate_begin,
                     r * intermediate + s.intermediate_end, out + r * row_bytes);
        sum += HashExpertRow(out + r * row_bytes, static_cast<size_t>(row_bytes), StoredRowSeed(s, f.role, r));
      }
      return sum;
    }
    char* out = base + (f.role == WeightRole::kExpertW1 ? entry.w1_offset : entry.w3_offset);
    options.fill(s.layer, s.expert, f.role, (s.intermediate_begin + f.row_begin) * hidden,
                 (s.intermediate_begin + f.row_end) * hidden, out + f.row_begin * hidden * element);
    for (int64_t r = f.row_begin; r < f.row_end; ++r) {
      sum +=
          HashExpertRow(out + r * hidden * element, static_cast<size_t>(hidden * element), StoredRowSeed(s, f.role, r));
    }
    return sum;
  };
  RunTasks(options.pool, fills.size(), [&](int64_t t) {
    const FillTask& f = fills[static_cast<size_t>(t)];
    hashes.Add(f.slice, run(f));
    const int64_t row_bytes = (f.role == WeightRole::kExpertW2 ? slices[f.slice].size() : hidden) * element;
    progress.Add((f.row_end - f.row_begin) * row_bytes);
  });
}

// Table and header, the magic last: a reader that sees it sees the rest.
void WriteHeader(const StoreLayout& layout, const ModelFingerprint& fingerprint, const ModelConfig& config,
                 const ExpertStoreOptions& options, char* base) {
  std::memcpy(base + sizeof(ExpertStoreHeader), layout.table.data(), layout.table.size() * sizeof(ExpertStoreEntry));
  ExpertStoreHeader header;
  header.version = kExpertStoreVersion;
  header.dtype = static_cast<uint32_t>(layout.dtype);
  header.region_bytes = layout.region_bytes;
  header.table_offset = sizeof(ExpertStoreHeader);
  header.data_offset = layout.data_offset;
  header.slice_count = layout.slices.size();
  header.config_hash = fingerprint.config_hash;
  header.tensors_hash = fingerprint.tensors_hash;
  header.hidden_size = layout.hidden;
  header.intermediate_size = layout.intermediate;
  header.num_layers = static_cast<int32_t>(config.num_hidden_layers);
  header.num_experts = static_cast<int32_t>(config.num_local_experts);
  header.division = static_cast<uint32_t>(options.division);
  header.worker_index = options.worker_index;
  header.num_workers = options.num_workers;
  header.block_order = static_cast<uint32_t>(options.block_order);
  std::memcpy(base, &header, sizeof(header));
  __atomic_store_n(reinterpret_cast<uint64_t*>(base), kExpertStoreMagic, __ATOMIC_RELEASE);
}

// Whether the store holds Q4_K/Q6_K matrices in group-major order.
bool ReordersBlocks(const StoreLayout& layout, const ExpertStoreOptions& options) {
  if (options.block_order != BlockOrder::kGroupMajor) return false;
  for (const std::array<DType, 3>& dtypes : layout.dtypes) {
    for (DType dtype : dtypes) {
      if (HasGroupMajorOrder(dtype)) return true;
    }
  }
  return false;
}

void LogCreated(const std::string& name, const StoreLayout& layout, const ExpertStoreOptions& options, double seconds,
                uint64_t content_hash, const std::string& dtypes) {
  LOG_INFO("expert store ", name, ": ", ExpertDivisionName(options.division), " worker ", options.worker_index, "/",
           options.num_workers, ", ", layout.slices.size(), " slices of ", dtypes, ", ",
           FormatBytes(layout.expert_bytes), " of weights in ", FormatBytes(layout.region_bytes),
           options.numa_node >= 0 ? absl::StrCat(" on NUMA node ", options.numa_node) : std::string(" unbound"),
           options.fill ? ", generated in place by " : ", filled by ",
           options.pool != nullptr ? options.pool->num_threads() : 1, " thread(s) in ",
           absl::StrFormat("%.2f s (%.2f GB/s)", seconds, static_cast<double>(layout.region_bytes) / 1e9 / seconds),
           ", content hash ", ContentHashString(content_hash),
           ReordersBlocks(layout, options) ? "; Q4_K/Q6_K blocks in group-major order" : "");
}

}  // namespace

absl::StatusOr<std::unique_ptr<ExpertStore>> ExpertStore::Create(const ModelWeights& model,
                                                                 const ExpertStoreOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  TANDEM_RETURN_IF_ERROR(ValidateShmName(options.region_name, "ExpertStoreOptions.region_name"));
  const std::string& name = options.region_name;
  TANDEM_ASSIGN_OR_RETURN(StoreLayout layout, CheckModel(model, options));
  // The model's identity, recorded so a reader can check it is the same model.
  ModelFingerprint fingerprint = FingerprintConfig(model.config, layout.dtype);
  if (model.source != nullptr) {
    TANDEM_ASSIGN_OR_RETURN(fingerprint, FingerprintModel(model.config, *model.source));
  }
  LayOutRegion(layout);
  TANDEM_RETURN_IF_ERROR(CheckShmSpace(name, layout.region_bytes));
  std::unique_ptr<ExpertStore> store(new ExpertStore());
  TANDEM_ASSIGN_OR_RETURN(store->region_,
                          CreateBoundRegion(name, layout.region_bytes, options.numa_node, options.unique_suffix));
  const std::string& region = store->region_.name();  // with its random suffix, if asked
  void* mapping = store->region_.data();
  char* base = static_cast<char*>(mapping);
  SliceHashes hashes(layout.slices.size());
  {
    ProgressReporter progress(absl::StrCat("filling expert store ", region), layout.expert_bytes);
    if (options.fill) {
      FillSlices(layout, options, base, hashes, progress);
    } else {
      TANDEM_RETURN_IF_ERROR(CopySlices(model, layout, options.block_order, options.pool, base, hashes, progress));
    }
  }
  store->slice_hashes_ = hashes.Values();
  store->content_hash_ = CombineExpertContentHashes(layout.slices, store->slice_hashes_);
  WriteHeader(layout, fingerprint, model.config, options, base);

  // Immutable from now on: a stray write faults here instead of silently
  // corrupting what the coordinator copies to the GPU.
  if (mprotect(mapping, layout.region_bytes, PROT_READ) != 0) {
    const int error = errno;
    return absl::ErrnoToStatus(error, absl::StrCat("mprotect of expert store region ", region));
  }
  // The same validation readers run: writer and readers index alike.
  TANDEM_ASSIGN_OR_RETURN(store->index_, IndexExpertStoreRegion(mapping, layout.region_bytes, region));
  store->expert_bytes_ = layout.expert_bytes;
  LogCreated(region, layout, options, SecondsSince(start), store->content_hash_, store->dtypes());
  return store;
}

std::string ExpertStore::dtypes() const { return ExpertDTypesText(index_.weights); }

absl::StatusOr<ExpertStoreView> ExpertStore::OpenReadOnly(const std::string& region_name) {
  return ExpertStoreView::Open(region_name);
}

}  // namespace tandem
