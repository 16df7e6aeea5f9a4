#include "common/model/gguf_quantize.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/parallel_status.h"
#include "common/base/status_macros.h"
#include "common/base/thread_pool.h"
#include "common/gguf/gguf_writer.h"
#include "common/model/gguf_model_config.h"
#include "common/model/gguf_names.h"
#include "common/model/gguf_tokenizer.h"
#include "common/model/safetensors.h"
#include "common/quant/quantize.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

struct FileTypeInfo {
  GgufFileType type;
  std::string_view name;
  GgmlType default_type;
};

constexpr FileTypeInfo kFileTypes[] = {
    {GgufFileType::kF32, "f32", GgmlType::kF32},        {GgufFileType::kF16, "f16", GgmlType::kF16},
    {GgufFileType::kBF16, "bf16", GgmlType::kBF16},     {GgufFileType::kQ8_0, "q8_0", GgmlType::kQ8_0},
    {GgufFileType::kQ4_0, "q4_0", GgmlType::kQ4_0},     {GgufFileType::kQ4_K_M, "q4_k_m", GgmlType::kQ4_K},
    {GgufFileType::kQ5_K_M, "q5_k_m", GgmlType::kQ5_K}, {GgufFileType::kQ6_K, "q6_k", GgmlType::kQ6_K},
};

const FileTypeInfo& Info(GgufFileType type) {
  for (const FileTypeInfo& info : kFileTypes) {
    if (info.type == type) return info;
  }
  return kFileTypes[0];
}

bool IsQuantizedFileType(GgufFileType type) {
  return type != GgufFileType::kF32 && type != GgufFileType::kF16 && type != GgufFileType::kBF16;
}

// llama.cpp's use_more_bits: the first and last eighth of the layers, and
// every third layer in between, get the bigger type.
bool UseMoreBits(int layer, int layers) {
  return layer < layers / 8 || layer >= 7 * layers / 8 || (layer - layers / 8) % 3 == 2;
}

// Neither the converter nor llama-quantize quantizes these: vectors, norms,
// the router, and anything that is not a weight.
bool KeptF32(const GgufTensorSpec& t) {
  return t.dims.size() < 2 || absl::EndsWith(t.name, "_norm.weight") ||
         absl::StrContains(t.name, "ffn_gate_inp.weight") || !absl::EndsWith(t.name, "weight");
}

// llama-quantize's choice for one tensor (llama_tensor_get_type_impl and
// tensor_type_fallback, for the file types tandem writes), in file order.
class TypeMix {
 public:
  TypeMix(const ModelConfig& c, GgufFileType file_type)
      : file_type_(file_type),
        default_type_(Info(file_type).default_type),
        layers_(static_cast<int>(c.num_hidden_layers)),
        eight_experts_(c.num_local_experts == 8),
        tied_(c.tie_word_embeddings) {}

  absl::StatusOr<GgmlType> Choose(const GgufTensorSpec& t, int layer) {
    if (KeptF32(t)) return GgmlType::kF32;
    if (!IsQuantizedFileType(file_type_)) return default_type_;
    const bool k_mix = file_type_ == GgufFileType::kQ4_K_M || file_type_ == GgufFileType::kQ5_K_M;
    GgmlType type = default_type_;
    const std::string& n = t.name;
    if (n == "output.weight" || (tied_ && n == "token_embd.weight")) {
      if (t.dims[0] % GgmlBlockSize(default_type_) != 0) {
        type = GgmlType::kQ8_0;
      } else if (default_type_ != GgmlType::kQ8_0) {
        type = GgmlType::kQ6_K;
      }
    } else if (absl::StrContains(n, "attn_v.weight")) {
      if (k_mix && UseMoreBits(attention_v_seen_, layers_)) type = GgmlType::kQ6_K;
      if (eight_experts_) type = GgmlType::kQ8_0;
      ++attention_v_seen_;
    } else if (absl::StrContains(n, "attn_k.weight")) {
      if (eight_experts_) type = GgmlType::kQ8_0;
    } else if (absl::StrContains(n, "ffn_down")) {
      if (k_mix && UseMoreBits(layer, layers_)) type = GgmlType::kQ6_K;
    } else if (absl::StrContains(n, "attn_output.weight")) {
      if (eight_experts_ && file_type_ == GgufFileType::kQ4_K_M) type = GgmlType::kQ5_K;
    }
    return Fallback(t, type);
  }

 private:
  static absl::StatusOr<GgmlType> Fallback(const GgufTensorSpec& t, GgmlType type) {
    const int64_t row = t.dims[0];
    if (row % GgmlBlockSize(type) == 0) return type;
    GgmlType fallback;
    switch (type) {
      case GgmlType::kQ4_K: fallback = GgmlType::kQ5_0; break;
      case GgmlType::kQ5_K: fallback = GgmlType::kQ5_1; break;
      case GgmlType::kQ6_K: fallback = GgmlType::kQ8_0; break;
      default:
        return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, ": rows of ", row, " values are not whole ",
                                                       GgmlTypeName(type), " blocks of ", GgmlBlockSize(type),
                                                       ", and llama.cpp defines no fallback for ", GgmlTypeName(type)));
    }
    if (row % GgmlBlockSize(fallback) != 0) return GgmlType::kF16;
    if (!CanQuantize(fallback)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, ": rows of ", row, " values are not whole ",
                                                     GgmlTypeName(type), " blocks; llama.cpp falls back to ",
                                                     GgmlTypeName(fallback), ", which tandem does not write"));
    }
    return fallback;
  }

  GgufFileType file_type_;
  GgmlType default_type_;
  int layers_;
  bool eight_experts_;
  bool tied_;
  int attention_v_seen_ = 0;
};

struct PlanEntry {
  int layer;
  GgufTensorPlan plan;
};

// Copies `n` values of a float `dtype` to f32.
void ToF32(const void* src, DType dtype, int64_t n, float* dst) {
  switch (dtype) {
    case DType::kF32: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToF32(static_cast<const uint16_t*>(src)[i]);
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = F16ToF32(static_cast<const uint16_t*>(src)[i]);
      return;
    default:
      for (int64_t i = 0; i < n; ++i) dst[i] = LoadAsF32(src, dtype, static_cast<size_t>(i));
      return;
  }
}

// Drops the pages of a mapped input tensor from this process (they stay in
// the page cache): a 93 GB model is read once, and RSS stays one tensor.
void ReleasePages(const TensorView& view) {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(view.data) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(view.data) + view.size_bytes) / page * page;
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

int64_t PeakRssBytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

absl::StatusOr<std::string> ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path.string(), ": cannot open"));
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// Streams one planned tensor into the writer.
class TensorWriter {
 public:
  TensorWriter(const QuantizeOptions& options, const ModelConfig& config, const SafetensorsCheckpoint& checkpoint,
               GgufWriter& writer, ThreadPool* pool)
      : options_(options), config_(config), checkpoint_(checkpoint), writer_(writer), pool_(pool) {}

  absl::Status Write(const GgufTensorPlan& plan) {
    TANDEM_RETURN_IF_ERROR(BindSources(plan));
    const GgufTensorSpec& spec = plan.spec;
    const int64_t row_length = spec.dims[0];
    int64_t rows = 1;
    for (size_t i = 1; i < spec.dims.size(); ++i) rows *= spec.dims[i];
    const int64_t rows_per_source = rows / static_cast<int64_t>(std::max<size_t>(sources_.size(), 1));
    const int64_t out_row_bytes = static_cast<int64_t>(*GgmlRowBytes(spec.type, row_length));
    const int64_t chunk_rows =
        std::clamp<int64_t>(options_.chunk_bytes / (row_length * static_cast<int64_t>(sizeof(float))), 1, rows);
    // Reused across tensors, never zeroed: every byte is written before it is read.
    float* values = Grow(values_, values_size_, static_cast<size_t>(chunk_rows * row_length));
    uint8_t* out = Grow(out_, out_size_, static_cast<size_t>(chunk_rows * out_row_bytes));
    for (int64_t first = 0; first < rows; first += chunk_rows) {
      const int64_t n = std::min(chunk_rows, rows - first);
      TANDEM_RETURN_IF_ERROR(ParallelTasks(pool_, n, [&](int64_t i) -> absl::Status {
        float* row = values + i * row_length;
        FillRow(plan, first + i, rows_per_source, row_length, row);
        absl::Status s = QuantizeRow(spec.type, {row, static_cast<size_t>(row_length)},
                                     {out + i * out_row_bytes, static_cast<size_t>(out_row_bytes)});
        if (s.ok()) return s;
        return absl::InvalidArgumentError(absl::StrCat(options_.model_dir.string(), ": tensor ",
                                                       SourceName(plan, first + i, rows_per_source), " (GGUF ",
                                                       spec.name, " row ", first + i, "): ", s.message()));
      }));
      TANDEM_RETURN_IF_ERROR(writer_.Write(spec.name, {out, static_cast<size_t>(n * out_row_bytes)}));
      // Sources whose last row is written are done.
      for (size_t s = 0; s < sources_.size(); ++s) {
        if (static_cast<int64_t>(s + 1) * rows_per_source <= first + n) ReleasePages(sources_[s]);
      }
      if (options_.progress) {
        options_.progress({writer_.bytes_written(), writer_.total_bytes(), Seconds(), spec.name});
      }
    }
    return absl::OkStatus();
  }

  double Seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

 private:
  template <typename T>
  static T* Grow(std::unique_ptr<T[]>& buffer, size_t& size, size_t wanted) {
    if (size < wanted) {
      buffer = std::make_unique_for_overwrite<T[]>(wanted);
      size = wanted;
    }
    return buffer.get();
  }

  absl::Status BindSources(const GgufTensorPlan& plan) {
    sources_.clear();
    for (const std::string& name : plan.hf_names) {
      TANDEM_ASSIGN_OR_RETURN(TensorView view, checkpoint_.Get(name));
      sources_.push_back(std::move(view));
    }
    if (plan.config_tensor >= 0)
      config_values_ = GgufConfigTensors(config_)[static_cast<size_t>(plan.config_tensor)].second;
    return absl::OkStatus();
  }

  std::string SourceName(const GgufTensorPlan& plan, int64_t row, int64_t rows_per_source) const {
    if (sources_.empty()) return plan.spec.name;
    return sources_[static_cast<size_t>(row / rows_per_source)].name;
  }

  // GGUF row `row` as f32: row (row % rows_per_source) of source
  // row / rows_per_source, put back in HF order when the rows are permuted.
  void FillRow(const GgufTensorPlan& plan, int64_t row, int64_t rows_per_source, int64_t row_length, float* out) const {
    if (plan.config_tensor >= 0) {
      std::copy(config_values_.begin(), config_values_.end(), out);
      return;
    }
    const TensorView& src = sources_[static_cast<size_t>(row / rows_per_source)];
    int64_t local = row % rows_per_source;
    if (plan.spec.dims.size() == 1 && plan.permute_rows) {  // a permuted bias: element by element
      for (int64_t i = 0; i < row_length; ++i) {
        out[i] = LoadAsF32(src.data, src.dtype, static_cast<size_t>(HfRowOfGgufRow(i, config_.head_dim)));
      }
      return;
    }
    if (plan.permute_rows) local = HfRowOfGgufRow(local, config_.head_dim);
    const size_t element = DTypeSize(src.dtype);
    ToF32(static_cast<const uint8_t*>(src.data) + static_cast<size_t>(local * row_length) * element, src.dtype,
          row_length, out);
  }

  const QuantizeOptions& options_;
  const ModelConfig& config_;
  const SafetensorsCheckpoint& checkpoint_;
  GgufWriter& writer_;
  ThreadPool* pool_;
  std::vector<TensorView> sources_;
  std::vector<float> config_values_;
  std::unique_ptr<float[]> values_;  // [chunk rows, row length] f32
  size_t values_size_ = 0;
  std::unique_ptr<uint8_t[]> out_;  // the same rows encoded
  size_t out_size_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// The HF tensors a plan reads must have the shapes the config implies.
absl::Status CheckSources(const SafetensorsCheckpoint& checkpoint, const ModelConfig& config) {
  for (const WeightSpec& w : ExpectedWeights(config)) {
    TANDEM_ASSIGN_OR_RETURN(TensorView view, checkpoint.Get(w.name));
    if (view.shape != w.shape) {
      return absl::InvalidArgumentError(absl::StrCat(checkpoint.Describe(), ": tensor ", w.name, " has shape ",
                                                     ShapeString(view.shape), ", config.json implies ",
                                                     ShapeString(w.shape)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GgufFileType> ParseGgufFileType(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(std::string(name));
  for (const FileTypeInfo& info : kFileTypes) {
    if (info.name == lower) return info.type;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--type \"", std::string(name), "\": expected q8_0, q4_0, q4_k_m, q5_k_m, q6_k, f16, bf16 or f32"));
}

std::string_view GgufFileTypeName(GgufFileType type) { return Info(type).name; }

absl::StatusOr<std::vector<GgufTensorPlan>> PlanGgufTensors(const ModelConfig& c, GgufFileType file_type) {
  std::vector<PlanEntry> entries;
  for (const WeightSpec& w : ExpectedWeights(c)) {
    if (IsExpertRole(w.role) && w.expert != 0) continue;  // stacked with expert 0
    GgufTensorPlan plan;
    plan.spec.name = GgufTensorName(c.architecture, w.role, w.layer);
    plan.spec.dims = GgufDims(w);
    plan.permute_rows = GgufPermutesRows(c.architecture, w.role);
    if (IsExpertRole(w.role)) {
      plan.spec.dims.push_back(c.num_local_experts);
      for (int e = 0; e < c.num_local_experts; ++e) plan.hf_names.push_back(WeightName(c, w.role, w.layer, e));
    } else {
      plan.hf_names.push_back(w.name);
    }
    entries.push_back({w.layer, std::move(plan)});
  }
  const auto config_tensors = GgufConfigTensors(c);
  for (size_t i = 0; i < config_tensors.size(); ++i) {
    GgufTensorPlan plan;
    plan.spec.name = config_tensors[i].first;
    plan.spec.dims = {static_cast<int64_t>(config_tensors[i].second.size())};
    plan.config_tensor = static_cast<int>(i);
    entries.push_back({-1, std::move(plan)});
  }
  // llama-quantize's order (its weight_name_comparer): by layer, model-level first, then by name.
  std::stable_sort(entries.begin(), entries.end(), [](const PlanEntry& a, const PlanEntry& b) {
    if (a.layer != b.layer) return a.layer < b.layer;
    return a.plan.spec.name < b.plan.spec.name;
  });
  TypeMix mix(c, file_type);
  std::vector<GgufTensorPlan> plans;
  for (PlanEntry& e : entries) {
    TANDEM_ASSIGN_OR_RETURN(e.plan.spec.type, mix.Choose(e.plan.spec, e.layer));
    plans.push_back(std::move(e.plan));
  }
  return plans;
}

std::string FormatQuantizeProgress(const QuantizeProgress& p) {
  const double done = static_cast<double>(p.bytes_written) / 1e9, total = static_cast<double>(p.total_bytes) / 1e9;
  const double rate = p.seconds > 0 ? done / p.seconds : 0;
  const double eta = rate > 0 ? (total - done) / rate : 0;
  return absl::StrFormat("%.2f / %.2f GB (%.0f%%), %.2f GB/s, ETA %.0f s", done, total,
                         total > 0 ? 100.0 * done / total : 100.0, rate, eta);
}

absl::StatusOr<QuantizeResult> QuantizeModel(const QuantizeOptions& options) {
  const fs::path& dir = options.model_dir;
  TANDEM_ASSIGN_OR_RETURN(const ModelConfig config, LoadModelConfig(dir / "config.json"));
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsCheckpoint> checkpoint, SafetensorsCheckpoint::Open(dir));
  TANDEM_RETURN_IF_ERROR(CheckSources(*checkpoint, config));
  absl::StatusOr<std::vector<GgufTensorPlan>> plans = PlanGgufTensors(config, options.file_type);
  if (!plans.ok()) return absl::InvalidArgumentError(absl::StrCat(dir.string(), ": ", plans.status().message()));

  GgufMetadata metadata(options.out.string());
  const std::string name = fs::absolute(dir).lexically_normal().filename().string();
  TANDEM_RETURN_IF_ERROR(AddModelConfigToGguf(config, name.empty() ? "model" : name, &metadata));
  metadata.Set(kGgufFileTypeKey, static_cast<uint32_t>(options.file_type));
  std::error_code ec;
  if (fs::exists(dir / "tokenizer.model", ec)) {
    TANDEM_ASSIGN_OR_RETURN(const std::string proto, ReadFile(dir / "tokenizer.model"));
    TANDEM_RETURN_IF_ERROR(AddSentencePieceVocabToGguf(proto, config, (dir / "tokenizer.model").string(), &metadata));
  }
  TANDEM_RETURN_IF_ERROR(AddHfTokenizerConfigToGguf(dir, &metadata));
  metadata.Set(kGgufQuantizationVersionKey, kGgufQuantizationVersion);

  std::vector<GgufTensorSpec> specs;
  for (const GgufTensorPlan& p : *plans) specs.push_back(p.spec);
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<GgufWriter> writer, GgufWriter::Create(options.out, metadata, specs));
  std::unique_ptr<ThreadPool> pool;
  if (options.num_threads > 1) {
    pool = std::make_unique<ThreadPool>(ThreadPoolOptions{.num_threads = options.num_threads, .name = "quantize"});
  }
  TensorWriter tensors(options, config, *checkpoint, *writer, pool.get());
  std::map<std::string, int64_t> by_type;
  for (const GgufTensorPlan& p : *plans) {
    TANDEM_RETURN_IF_ERROR(tensors.Write(p));
    ++by_type[std::string(GgmlTypeName(p.spec.type))];
  }
  TANDEM_RETURN_IF_ERROR(writer->Finish());
  QuantizeResult result;
  result.bytes_written = writer->total_bytes();
  result.tensors = static_cast<int64_t>(plans->size());
  result.seconds = tensors.Seconds();
  result.peak_rss_bytes = PeakRssBytes();
  result.tensors_by_type.assign(by_type.begin(), by_type.end());
  return result;
}

}  // namespace tandem
