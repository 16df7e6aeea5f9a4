// Legend: L layers, E experts, D hidden size, I intermediate size, S rows of
// I in one slice.
#include "cpu_worker/expert_store.h"

#include <sys/mman.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/log.h"
#include "common/model/expert_content.h"
#include "common/model/model_fingerprint.h"
#include "common/platform/numa_topology.h"
#include "common/base/status_macros.h"

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
};

// Cuts a rows x row_bytes copy into tasks of about kCopyChunkBytes.
void AddCopy(std::vector<CopyTask>& tasks, char* dst, const char* src, int64_t rows, int64_t row_bytes,
             int64_t src_stride, int64_t dst_stride, size_t slice, WeightRole role) {
  const int64_t rows_per_task = std::max<int64_t>(1, kCopyChunkBytes / row_bytes);
  for (int64_t r = 0; r < rows; r += rows_per_task) {
    tasks.push_back(CopyTask{dst + r * dst_stride, src + r * src_stride, std::min(rows_per_task, rows - r), row_bytes,
                             src_stride, dst_stride, slice, role, r});
  }
}

// The seed of stored row `row` of matrix `role` of slice `s` (expert_content.h).
uint64_t StoredRowSeed(const ExpertSlice& s, WeightRole role, int64_t row) {
  return role == WeightRole::kExpertW2 ? ExpertRowSeed(s.layer, s.expert, role, row, s.intermediate_begin)
                                       : ExpertRowSeed(s.layer, s.expert, role, s.intermediate_begin + row, 0);
}

// Copies the task's rows and hashes each right after it lands (still in
// L1): the sum of the rows' hashes.
uint64_t RunCopy(const CopyTask& task, const ExpertSlice& slice) {
  uint64_t sum = 0;
  for (int64_t r = 0; r < task.rows; ++r) {
    char* dst = task.dst + r * task.dst_stride;
    std::memcpy(dst, task.src + r * task.src_stride, static_cast<size_t>(task.row_bytes));
    sum += HashExpertRow(dst, static_cast<size_t>(task.row_bytes), StoredRowSeed(slice, task.role, task.first + r));
  }
  return sum;
}

absl::Status CheckMatrix(const LinearWeight& w, DType dtype, int64_t n, int64_t k, int layer, int expert,
                         const char* name, bool need_data) {
  const std::string where = absl::StrCat("model layer ", layer, " expert ", expert, " ", name);
  if (need_data && w.data == nullptr) return absl::InvalidArgumentError(absl::StrCat(where, " has no data"));
  if (w.n != n || w.k != k)
    return absl::InvalidArgumentError(absl::StrCat(where, " is [", w.n, ", ", w.k, "], expected [", n, ", ", k, "]"));
  if (w.dtype != dtype)
    return absl::InvalidArgumentError(absl::StrCat(where, " is ", std::string(DTypeName(w.dtype)),
                                                   ", other experts are ", std::string(DTypeName(dtype)),
                                                   " (a region holds one dtype)"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ExpertStore>> ExpertStore::Create(const ModelWeights& model,
                                                                 const ExpertStoreOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  TANDEM_RETURN_IF_ERROR(ValidateShmName(options.region_name, "ExpertStoreOptions.region_name"));
  const std::string& name = options.region_name;
  const ModelConfig& config = model.config;
  TANDEM_ASSIGN_OR_RETURN(std::vector<ExpertSlice> slices,
                          PartitionExperts(config, options.division, options.worker_index, options.num_workers));
  const int64_t hidden = config.hidden_size;
  const int64_t intermediate = config.intermediate_size;
  if (hidden < 1) return absl::InvalidArgumentError(absl::StrCat("config hidden_size must be >= 1, got ", hidden));
  if (static_cast<int64_t>(model.layers.size()) != config.num_hidden_layers)
    return absl::InvalidArgumentError(absl::StrCat("model has ", model.layers.size(),
                                                   " layers, config num_hidden_layers ", config.num_hidden_layers));
  for (size_t l = 0; l < model.layers.size(); ++l)
    if (static_cast<int64_t>(model.layers[l].experts.size()) != config.num_local_experts)
      return absl::InvalidArgumentError(absl::StrCat("model layer ", l, " has ", model.layers[l].experts.size(),
                                                     " experts, config num_local_experts ", config.num_local_experts));
  const DType dtype = model.layers[0].experts[0].w1.dtype;
  for (const ExpertSlice& s : slices) {
    const ExpertWeights& w = model.layers[static_cast<size_t>(s.layer)].experts[static_cast<size_t>(s.expert)];
    const bool need_data = !options.fill;
    TANDEM_RETURN_IF_ERROR(CheckMatrix(w.w1, dtype, intermediate, hidden, s.layer, s.expert, "gate_proj (w1)", need_data));
    TANDEM_RETURN_IF_ERROR(CheckMatrix(w.w3, dtype, intermediate, hidden, s.layer, s.expert, "up_proj (w3)", need_data));
    TANDEM_RETURN_IF_ERROR(CheckMatrix(w.w2, dtype, hidden, intermediate, s.layer, s.expert, "down_proj (w2)", need_data));
  }

  // The model's identity, recorded so a reader can check it is the same model.
  ModelFingerprint fingerprint = FingerprintConfig(config, dtype);
  if (model.source != nullptr) {
    TANDEM_ASSIGN_OR_RETURN(fingerprint, FingerprintModel(config, *model.source));
  }

  // Layout (common/expert_store_view.h): header, table, then the matrices.
  const int64_t element = static_cast<int64_t>(DTypeSize(dtype));
  std::vector<ExpertStoreEntry> table(slices.size());
  const uint64_t data_offset =
      RoundUp(sizeof(ExpertStoreHeader) + slices.size() * sizeof(ExpertStoreEntry), kExpertStoreAlignment);
  uint64_t offset = data_offset;
  for (size_t i = 0; i < slices.size(); ++i) {
    const uint64_t matrix = RoundUp(static_cast<uint64_t>(slices[i].size() * hidden * element), kExpertStoreAlignment);
    table[i] = ExpertStoreEntry{.layer = slices[i].layer,
                                .expert = slices[i].expert,
                                .intermediate_begin = slices[i].intermediate_begin,
                                .intermediate_end = slices[i].intermediate_end,
                                .w1_offset = offset,
                                .w3_offset = offset + matrix,
                                .w2_offset = offset + 2 * matrix};
    offset += 3 * matrix;
  }
  const uint64_t region_bytes = offset;

  // tmpfs allocates on first touch: a region larger than the shm
  // filesystem's free space would truncate fine and then SIGBUS half-way
  // through the copy. (glibc's shm_open lives in /dev/shm.)
  struct statvfs fs;
  if (statvfs("/dev/shm", &fs) == 0) {
    const uint64_t available = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
    if (region_bytes > available)
      return absl::ResourceExhaustedError(
          absl::StrFormat("expert store region %s needs %s but /dev/shm has %s free (mount it larger)", name,
                          FormatBytes(region_bytes), FormatBytes(available)));
  }
  // ftruncate + mmap only: no page exists yet, so binding below decides
  // where every page goes.
  std::unique_ptr<ExpertStore> store(new ExpertStore());
  {
    absl::StatusOr<ShmRegion> region =
        ShmRegion::Create(name, region_bytes, ShmCreateOptions{.unique_suffix = options.unique_suffix});
    if (!region.ok())
      return absl::Status(region.status().code(), absl::StrCat("expert store: ", region.status().message()));
    store->region_ = std::move(region).value();
  }
  void* mapping = store->region_.data();
  const std::string& region = store->region_.name();  // with its random suffix, if asked

  // Before any page exists, so every page is allocated on the node.
  if (options.numa_node >= 0) {
    absl::Status bound = BindMemoryToNode(mapping, region_bytes, options.numa_node);
    if (!bound.ok())
      return absl::Status(bound.code(), absl::StrCat("expert store region ", region, ": ", bound.message()));
  }

  // Copy on the pinned threads (first touch). w1/w3 slices are contiguous
  // rows of the source; a w2 slice is a column range, copied row by row.
  // Every stored row is hashed as it is written (expert_content.h): the
  // slices' sums of row hashes.
  char* base = static_cast<char*>(mapping);
  std::unique_ptr<std::atomic<uint64_t>[]> hashes(new std::atomic<uint64_t>[slices.size()]);
  for (size_t i = 0; i < slices.size(); ++i) hashes[i].store(0);
  std::vector<CopyTask> tasks;
  for (size_t i = 0; i < slices.size() && !options.fill; ++i) {
    const ExpertSlice& s = slices[i];
    const ExpertWeights& w = model.layers[static_cast<size_t>(s.layer)].experts[static_cast<size_t>(s.expert)];
    const int64_t row = hidden * element;  // a w1/w3 row
    AddCopy(tasks, base + table[i].w1_offset, static_cast<const char*>(w.w1.data) + s.intermediate_begin * row,
            s.size(), row, row, row, i, WeightRole::kExpertW1);
    AddCopy(tasks, base + table[i].w3_offset, static_cast<const char*>(w.w3.data) + s.intermediate_begin * row,
            s.size(), row, row, row, i, WeightRole::kExpertW3);
    AddCopy(tasks, base + table[i].w2_offset, static_cast<const char*>(w.w2.data) + s.intermediate_begin * element,
            hidden, s.size() * element, intermediate * element, s.size() * element, i, WeightRole::kExpertW2);
  }
  if (options.fill) {
    // The same slicing, generated in place: w1/w3 rows [b, e) are elements
    // [b*D, e*D) of the tensor; w2 row r's columns [b, e) are elements
    // [r*I + b, r*I + e). Tasks of about kCopyChunkBytes, as for copies.
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
      for (int64_t r = 0; r < hidden; r += w2_rows) fills.push_back({i, WeightRole::kExpertW2, r, std::min(hidden, r + w2_rows)});
    }
    auto run = [&](const FillTask& f) -> uint64_t {
      const ExpertSlice& s = slices[f.slice];
      uint64_t sum = 0;  // each stored row hashed right after it is generated
      if (f.role == WeightRole::kExpertW2) {
        char* out = base + table[f.slice].w2_offset;
        const int64_t row_bytes = s.size() * element;
        for (int64_t r = f.row_begin; r < f.row_end; ++r) {
          options.fill(s.layer, s.expert, f.role, r * intermediate + s.intermediate_begin,
                       r * intermediate + s.intermediate_end, out + r * row_bytes);
          sum += HashExpertRow(out + r * row_bytes, static_cast<size_t>(row_bytes), StoredRowSeed(s, f.role, r));
        }
        return sum;
      }
      char* out = base + (f.role == WeightRole::kExpertW1 ? table[f.slice].w1_offset : table[f.slice].w3_offset);
      options.fill(s.layer, s.expert, f.role, (s.intermediate_begin + f.row_begin) * hidden,
                   (s.intermediate_begin + f.row_end) * hidden, out + f.row_begin * hidden * element);
      for (int64_t r = f.row_begin; r < f.row_end; ++r) {
        sum += HashExpertRow(out + r * hidden * element, static_cast<size_t>(hidden * element),
                             StoredRowSeed(s, f.role, r));
      }
      return sum;
    };
    auto fill_task = [&](int64_t t, int) {
      const FillTask& f = fills[static_cast<size_t>(t)];
      hashes[f.slice].fetch_add(run(f), std::memory_order_relaxed);
    };
    if (options.pool != nullptr) {
      options.pool->ParallelFor(static_cast<int64_t>(fills.size()), fill_task);
    } else {
      for (size_t t = 0; t < fills.size(); ++t) fill_task(static_cast<int64_t>(t), 0);
    }
  } else {
    auto copy_task = [&](int64_t t, int) {
      const CopyTask& task = tasks[static_cast<size_t>(t)];
      hashes[task.slice].fetch_add(RunCopy(task, slices[task.slice]), std::memory_order_relaxed);
    };
    if (options.pool != nullptr) {
      options.pool->ParallelFor(static_cast<int64_t>(tasks.size()), copy_task);
    } else {
      for (size_t t = 0; t < tasks.size(); ++t) copy_task(static_cast<int64_t>(t), 0);
    }
  }
  store->slice_hashes_.resize(slices.size());
  for (size_t i = 0; i < slices.size(); ++i) store->slice_hashes_[i] = hashes[i].load();
  store->content_hash_ = CombineExpertContentHashes(slices, store->slice_hashes_);

  // Table and header, the magic last: a reader that sees it sees the rest.
  std::memcpy(base + sizeof(ExpertStoreHeader), table.data(), table.size() * sizeof(ExpertStoreEntry));
  ExpertStoreHeader header;
  header.version = kExpertStoreVersion;
  header.dtype = static_cast<uint32_t>(dtype);
  header.region_bytes = region_bytes;
  header.table_offset = sizeof(ExpertStoreHeader);
  header.data_offset = data_offset;
  header.slice_count = slices.size();
  header.config_hash = fingerprint.config_hash;
  header.tensors_hash = fingerprint.tensors_hash;
  header.hidden_size = hidden;
  header.intermediate_size = intermediate;
  header.num_layers = static_cast<int32_t>(config.num_hidden_layers);
  header.num_experts = static_cast<int32_t>(config.num_local_experts);
  header.division = static_cast<uint32_t>(options.division);
  header.worker_index = options.worker_index;
  header.num_workers = options.num_workers;
  std::memcpy(base, &header, sizeof(header));
  __atomic_store_n(reinterpret_cast<uint64_t*>(base), kExpertStoreMagic, __ATOMIC_RELEASE);

  // Immutable from now on: a stray write faults here instead of silently
  // corrupting what the coordinator copies to the GPU.
  if (mprotect(mapping, region_bytes, PROT_READ) != 0) {
    const int error = errno;
    return absl::ErrnoToStatus(error, absl::StrCat("mprotect of expert store region ", region));
  }
  // The same validation readers run: writer and readers index alike.
  TANDEM_ASSIGN_OR_RETURN(store->index_, IndexExpertStoreRegion(mapping, region_bytes, region));

  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  LOG_INFO("expert store ", region, ": ", ExpertDivisionName(options.division), " worker ", options.worker_index, "/",
           options.num_workers, ", ", slices.size(), " slices, ", FormatBytes(region_bytes),
           options.numa_node >= 0 ? absl::StrCat(" on NUMA node ", options.numa_node) : std::string(" unbound"),
           options.fill ? ", generated in place by " : ", filled by ",
           options.pool != nullptr ? options.pool->num_threads() : 1, " thread(s) in ",
           absl::StrFormat("%.2f s (%.2f GB/s)", seconds, static_cast<double>(region_bytes) / 1e9 / seconds),
           ", content hash ", ContentHashString(store->content_hash_));
  return store;
}

absl::StatusOr<ExpertStoreView> ExpertStore::OpenReadOnly(const std::string& region_name) {
  return ExpertStoreView::Open(region_name);
}

}  // namespace tandem
