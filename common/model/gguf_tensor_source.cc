#include "common/model/gguf_tensor_source.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/parallel_status.h"
#include "common/base/progress.h"
#include "common/base/status_macros.h"
#include "common/base/thread_pool.h"
#include "common/model/gguf_names.h"
#include "common/model/tensor_names.h"
#include "common/quant/block_order.h"
#include "common/quant/quantize.h"

namespace tandem {
namespace {

std::string DimsString(const std::vector<int64_t>& dims) { return absl::StrCat("{", absl::StrJoin(dims, ", "), "}"); }

// Where one Hugging Face tensor lives in the checkpoint.
struct Located {
  const GgufTensorInfo* info = nullptr;
  const GgufMappedFile* file = nullptr;  // the file of a split set holding it
  const uint8_t* data = nullptr;         // the first byte of this HF tensor
  int64_t bytes = 0;
};

// The HF tensor `w`: its own GGUF tensor, or expert w.expert of a stacked
// one, checked against the dims the config implies.
absl::StatusOr<Located> Locate(const GgufCheckpoint& checkpoint, const ModelConfig& c, const WeightSpec& w,
                               bool* per_expert) {
  std::vector<int64_t> dims = GgufDims(w);  // ggml order
  std::string name = GgufTensorName(c.architecture, w.role, w.layer);
  bool stacked = IsExpertRole(w.role);
  if (stacked && !checkpoint.Get(name).ok()) {
    const std::string single = GgufPerExpertTensorName(w.role, w.layer, w.expert);
    if (checkpoint.Get(single).ok()) {
      name = single;
      stacked = false;
      *per_expert = true;
    }
  }
  if (stacked) dims.push_back(c.num_local_experts);
  absl::StatusOr<GgufTensor> t = checkpoint.Get(name);
  if (!t.ok()) {
    return absl::NotFoundError(absl::StrCat(checkpoint.Describe(), ": tensor ", name, " not found (it holds ", w.name,
                                            " of the ", std::string(GgufArchitecture(c.architecture)),
                                            " architecture)"));
  }
  if (t->info->dims != dims) {
    return absl::InvalidArgumentError(absl::StrCat(checkpoint.Describe(), ": tensor ", name, " has dims ",
                                                   DimsString(t->info->dims), ", the model's hyperparameters imply ",
                                                   DimsString(dims), " (", w.name, " ", ShapeString(w.shape), ")"));
  }
  Located loc{t->info, t->file, t->data.data(), static_cast<int64_t>(t->data.size())};
  if (stacked) {
    loc.bytes /= c.num_local_experts;
    loc.data += loc.bytes * w.expert;
  }
  return loc;
}

// Decodes `rows` rows of `row_length` values of ggml `type` (row r at
// src + r * row_bytes, in the order `src_row(r)` gives) into `out` as `to`.
absl::Status DecodeRows(GgmlType type, const uint8_t* src, int64_t rows, int64_t row_length, bool permute,
                        int64_t head_dim, DType to, void* out, ThreadPool* pool) {
  const int64_t row_bytes = static_cast<int64_t>(*GgmlRowBytes(type, row_length));
  constexpr int64_t kRowsPerTask = 64;
  return ParallelTasks(pool, (rows + kRowsPerTask - 1) / kRowsPerTask, [&](int64_t t) -> absl::Status {
    std::vector<float> row(static_cast<size_t>(row_length));
    for (int64_t r = t * kRowsPerTask; r < std::min(rows, (t + 1) * kRowsPerTask); ++r) {
      const int64_t from = permute ? GgufRowOfHfRow(r, head_dim) : r;
      TANDEM_RETURN_IF_ERROR(
          DequantizeRow(type, {src + from * row_bytes, static_cast<size_t>(row_bytes)}, absl::MakeSpan(row)));
      if (to == DType::kF32) {
        std::copy(row.begin(), row.end(), static_cast<float*>(out) + r * row_length);
      } else {
        uint16_t* dst = static_cast<uint16_t*>(out) + r * row_length;
        for (int64_t i = 0; i < row_length; ++i) dst[i] = F32ToBf16(row[static_cast<size_t>(i)]);
      }
    }
    return absl::OkStatus();
  });
}

// Puts `bytes` of Q4_K/Q6_K blocks at `data` (whole rows of `row_bytes`)
// into group-major order, in tasks of whole rows on `pool`.
absl::Status ReorderRows(GgmlType type, uint8_t* data, int64_t bytes, int64_t row_bytes, ThreadPool* pool) {
  const int64_t rows_per_task = std::max<int64_t>(1, (int64_t{1} << 20) / row_bytes);
  const int64_t rows = bytes / row_bytes;
  return ParallelTasks(pool, (rows + rows_per_task - 1) / rows_per_task, [&](int64_t t) -> absl::Status {
    const int64_t first = t * rows_per_task, last = std::min(rows, first + rows_per_task);
    return ToGroupMajorOrder(type,
                             absl::MakeSpan(data + first * row_bytes, static_cast<size_t>((last - first) * row_bytes)));
  });
}

}  // namespace

std::string_view QuantizedWeightsName(QuantizedWeights mode) {
  switch (mode) {
    case QuantizedWeights::kKeep: return "kept quantized";
    case QuantizedWeights::kKeepExperts: return "experts kept quantized, the rest dequantized to BF16 at load";
    case QuantizedWeights::kKeepDense: return "dense matrices kept quantized, the experts dequantized to BF16 at load";
    case QuantizedWeights::kDequantizeToBf16: return "dequantized to BF16 at load";
    case QuantizedWeights::kDequantizeToF32: return "dequantized to F32 at load";
  }
  return "?";
}

bool ExpertsKeptQuantized(QuantizedWeights mode) {
  return mode == QuantizedWeights::kKeep || mode == QuantizedWeights::kKeepExperts;
}

QuantizedWeights QuantizedWeightsFor(bool experts_quantized, bool dense_quantized) {
  if (experts_quantized) return dense_quantized ? QuantizedWeights::kKeep : QuantizedWeights::kKeepExperts;
  return dense_quantized ? QuantizedWeights::kKeepDense : QuantizedWeights::kDequantizeToBf16;
}

absl::StatusOr<DType> DTypeFromGgml(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: return DType::kF32;
    case GgmlType::kF16: return DType::kF16;
    case GgmlType::kBF16: return DType::kBF16;
    case GgmlType::kQ8_0: return DType::kQ8_0;
    case GgmlType::kQ4_0: return DType::kQ4_0;
    case GgmlType::kQ4_1: return DType::kQ4_1;
    case GgmlType::kQ5_0: return DType::kQ5_0;
    case GgmlType::kQ4_K: return DType::kQ4_K;
    case GgmlType::kQ5_K: return DType::kQ5_K;
    case GgmlType::kQ6_K: return DType::kQ6_K;
    case GgmlType::kQ5_1: return DType::kQ5_1;
    case GgmlType::kQ3_K: return DType::kQ3_K;
    case GgmlType::kQ2_K: return DType::kQ2_K;
    case GgmlType::kIQ4_NL: return DType::kIQ4_NL;
    case GgmlType::kIQ4_XS: return DType::kIQ4_XS;
    default: break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(GgmlTypeName(type), ", which tandem does not run (it runs ", SupportedDequantizeTypes(), ")"));
}

GgmlType GgmlFromDType(DType dtype) {
  switch (dtype) {
    case DType::kF32: return GgmlType::kF32;
    case DType::kF16: return GgmlType::kF16;
    case DType::kBF16: return GgmlType::kBF16;
    case DType::kQ8_0: return GgmlType::kQ8_0;
    case DType::kQ4_0: return GgmlType::kQ4_0;
    case DType::kQ4_1: return GgmlType::kQ4_1;
    case DType::kQ5_0: return GgmlType::kQ5_0;
    case DType::kQ4_K: return GgmlType::kQ4_K;
    case DType::kQ5_K: return GgmlType::kQ5_K;
    case DType::kQ6_K: return GgmlType::kQ6_K;
    case DType::kQ5_1: return GgmlType::kQ5_1;
    case DType::kQ3_K: return GgmlType::kQ3_K;
    case DType::kQ2_K: return GgmlType::kQ2_K;
    case DType::kIQ4_NL: return GgmlType::kIQ4_NL;
    case DType::kIQ4_XS: return GgmlType::kIQ4_XS;
  }
  return GgmlType::kF32;
}

absl::StatusOr<std::unique_ptr<GgufTensorSource>> GgufTensorSource::Create(std::unique_ptr<GgufCheckpoint> checkpoint,
                                                                           const ModelConfig& config,
                                                                           const GgufSourceOptions& options) {
  auto source = std::unique_ptr<GgufTensorSource>(new GgufTensorSource());
  source->checkpoint_ = std::move(checkpoint);
  TANDEM_RETURN_IF_ERROR(source->Bind(config, options));
  return source;
}

uint8_t* GgufTensorSource::Own(size_t bytes) {
  if (uint8_t* out = arena_.Allocate(bytes); out != nullptr) return out;
  buffers_.push_back(std::make_unique_for_overwrite<uint8_t[]>(std::max<size_t>(bytes, 1)));
  return buffers_.back().get();
}

namespace {

// Whether a quantized matrix of `role` is dequantized at load.
bool Dequantized(QuantizedWeights mode, WeightRole role) {
  switch (mode) {
    case QuantizedWeights::kKeep: return false;
    case QuantizedWeights::kKeepExperts: return !IsExpertRole(role);
    case QuantizedWeights::kKeepDense: return IsExpertRole(role);
    case QuantizedWeights::kDequantizeToBf16:
    case QuantizedWeights::kDequantizeToF32: return true;
  }
  return true;
}

// Dequantizes all of tensor `t` (rows of dims[0] values, in ggml's order)
// into f32.
absl::StatusOr<std::vector<float>> DequantizeTensor(const GgufTensor& t) {
  const int64_t row_length = t.info->dims[0];
  int64_t rows = 1;
  for (size_t i = 1; i < t.info->dims.size(); ++i) rows *= t.info->dims[i];
  TANDEM_ASSIGN_OR_RETURN(const size_t row_bytes, GgmlRowBytes(t.info->type, row_length));
  std::vector<float> out(static_cast<size_t>(rows * row_length));
  for (int64_t r = 0; r < rows; ++r) {
    TANDEM_RETURN_IF_ERROR(DequantizeRow(t.info->type, {t.data.data() + r * row_bytes, row_bytes},
                                         absl::MakeSpan(out.data() + r * row_length, static_cast<size_t>(row_length))));
  }
  return out;
}

}  // namespace

// kv_b_proj [H (nope + v), R] put back together from a newer converter's
// attn_k_b (each head's key rows transposed: {nope, R, H} or {nope, H R})
// and attn_v_b ({R, v, H} or {R, H v}), in BF16 (F32 when both are F32).
absl::StatusOr<TensorView> GgufTensorSource::JoinSplitKvB(const ModelConfig& c, const WeightSpec& w) {
  const std::string k_name = GgufTensorName(WeightRole::kKBProj, w.layer);
  const std::string v_name = GgufTensorName(WeightRole::kVBProj, w.layer);
  TANDEM_ASSIGN_OR_RETURN(const GgufTensor k_b, checkpoint_->Get(k_name));
  TANDEM_ASSIGN_OR_RETURN(const GgufTensor v_b, checkpoint_->Get(v_name));
  const int64_t heads = c.num_attention_heads, rank = c.kv_lora_rank, nope = c.qk_nope_head_dim, v = c.v_head_dim;
  auto elements = [](const GgufTensor& t) {
    int64_t n = 1;
    for (int64_t d : t.info->dims) n *= d;
    return n;
  };
  if (k_b.info->dims[0] != nope || elements(k_b) != heads * rank * nope) {
    return absl::InvalidArgumentError(absl::StrCat(checkpoint_->Describe(), ": tensor ", k_name, " has dims ",
                                                   DimsString(k_b.info->dims), ", the model's hyperparameters imply {",
                                                   nope, ", ", rank, ", ", heads, "}"));
  }
  if (v_b.info->dims[0] != rank || elements(v_b) != heads * v * rank) {
    return absl::InvalidArgumentError(absl::StrCat(checkpoint_->Describe(), ": tensor ", v_name, " has dims ",
                                                   DimsString(v_b.info->dims), ", the model's hyperparameters imply {",
                                                   rank, ", ", v, ", ", heads, "}"));
  }
  TANDEM_ASSIGN_OR_RETURN(const std::vector<float> k, DequantizeTensor(k_b));
  TANDEM_ASSIGN_OR_RETURN(const std::vector<float> vv, DequantizeTensor(v_b));
  const bool f32 = k_b.info->type == GgmlType::kF32 && v_b.info->type == GgmlType::kF32;
  const DType dtype = f32 ? DType::kF32 : DType::kBF16;
  const size_t bytes = static_cast<size_t>(heads * (nope + v) * rank) * DTypeSize(dtype);
  uint8_t* out = Own(bytes);
  auto put = [&](int64_t row, int64_t col, float value) {
    const size_t at = static_cast<size_t>(row * rank + col);
    if (f32) {
      reinterpret_cast<float*>(out)[at] = value;
    } else {
      reinterpret_cast<uint16_t*>(out)[at] = F32ToBf16(value);
    }
  };
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t r = 0; r < rank; ++r)
      for (int64_t i = 0; i < nope; ++i) put(h * (nope + v) + i, r, k[static_cast<size_t>((h * rank + r) * nope + i)]);
    for (int64_t j = 0; j < v; ++j)
      for (int64_t r = 0; r < rank; ++r)
        put(h * (nope + v) + nope + j, r, vv[static_cast<size_t>((h * v + j) * rank + r)]);
  }
  gguf_names_[w.name] = absl::StrCat(k_name, " + ", v_name);
  return TensorView{w.name, dtype, w.shape, out, bytes};
}

absl::Status GgufTensorSource::Bind(const ModelConfig& c, const GgufSourceOptions& options) {
  std::unique_ptr<ThreadPool> pool;
  if (options.num_threads > 1 && (options.quantized != QuantizedWeights::kKeep || options.copy_to_memory)) {
    pool = std::make_unique<ThreadPool>(ThreadPoolOptions{.num_threads = options.num_threads, .name = "gguf-load"});
  }
  const DType fallback = options.quantized == QuantizedWeights::kDequantizeToF32 ? DType::kF32 : DType::kBF16;
  // In the file's bytes: each tensor counts when it is bound (mapped,
  // copied or dequantized); tensors the model does not use never count.
  int64_t file_bytes = 0;
  for (const GgufTensor& t : checkpoint_->tensors()) file_bytes += static_cast<int64_t>(t.data.size());
  ProgressReporter progress(absl::StrCat("reading ", checkpoint_->Describe()), file_bytes);
  for (const WeightSpec& w : ExpectedWeights(c)) {
    if (w.role == WeightRole::kKvBProj && !checkpoint_->Get(GgufTensorName(w.role, w.layer)).ok() &&
        checkpoint_->Get(GgufTensorName(WeightRole::kKBProj, w.layer)).ok()) {
      TANDEM_ASSIGN_OR_RETURN(views_[w.name], JoinSplitKvB(c, w));
      continue;
    }
    TANDEM_ASSIGN_OR_RETURN(const Located loc, Locate(*checkpoint_, c, w, &per_expert_layout_));
    absl::StatusOr<DType> stored = DTypeFromGgml(loc.info->type);
    if (!stored.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(checkpoint_->Describe(), ": tensor ", loc.info->name, " is ", stored.status().message()));
    }
    gguf_names_[w.name] = loc.info->name;
    if (w.shape.size() == 2) stored_dtypes_[w.name] = *stored;
    const bool permute = GgufPermutesRows(c.architecture, w.role);
    const int64_t rows = w.shape.size() == 2 ? w.shape[0] : 1;
    const int64_t row_length = w.shape.back();
    TensorView view{w.name, *stored, w.shape, loc.data, static_cast<size_t>(loc.bytes)};
    uint8_t* owned = nullptr;  // this source's own copy of the stored blocks (permuted or copied)
    if (w.shape.size() == 1 || w.role == WeightRole::kSharedExpertGate) {
      // A vector (or the shared expert's one-row gate), read as one row in
      // f32; a permuted bias is permuted element by element.
      float* out = reinterpret_cast<float*>(Own(static_cast<size_t>(row_length) * sizeof(float)));
      std::vector<float> row(static_cast<size_t>(row_length));
      TANDEM_RETURN_IF_ERROR(
          DequantizeRow(loc.info->type, {loc.data, static_cast<size_t>(loc.bytes)}, absl::MakeSpan(row)));
      for (int64_t i = 0; i < row_length; ++i)
        out[i] = row[static_cast<size_t>(permute ? GgufRowOfHfRow(i, c.head_dim) : i)];
      view = TensorView{w.name, DType::kF32, w.shape, out, static_cast<size_t>(row_length) * sizeof(float)};
    } else if (IsQuantized(*stored) && Dequantized(options.quantized, w.role)) {
      const size_t bytes = static_cast<size_t>(rows * row_length) * DTypeSize(fallback);
      view = TensorView{w.name, fallback, w.shape, nullptr, 0};
      if (!IsExpertRole(w.role) || options.experts.Includes(w.layer, w.expert)) {
        uint8_t* out = Own(bytes);
        TANDEM_RETURN_IF_ERROR(
            DecodeRows(loc.info->type, loc.data, rows, row_length, permute, c.head_dim, fallback, out, pool.get()));
        view.data = out;
        view.size_bytes = bytes;
        ++dequantized_tensors_;
        dequantized_bytes_ += static_cast<int64_t>(bytes);
      }
    } else if (permute) {
      const int64_t row_bytes = DTypeRowBytes(*stored, row_length);
      uint8_t* out = Own(static_cast<size_t>(loc.bytes));
      owned = out;
      for (int64_t r = 0; r < rows; ++r) {
        std::memcpy(out + r * row_bytes, loc.data + GgufRowOfHfRow(r, c.head_dim) * row_bytes,
                    static_cast<size_t>(row_bytes));
      }
      view.data = out;
    }
    if (options.copy_to_memory && view.data == loc.data && loc.bytes > 0 &&
        (!IsExpertRole(w.role) || options.experts.Includes(w.layer, w.expert))) {
      if (copied_bytes_ + loc.bytes <= options.copy_budget_bytes) {
        uint8_t* out = Own(static_cast<size_t>(loc.bytes));
        if (absl::Status read = loc.file->ReadInto({loc.data, static_cast<size_t>(loc.bytes)}, out, pool.get());
            !read.ok()) {
          return absl::Status(read.code(), absl::StrCat("tensor ", loc.info->name, ": ", read.message()));
        }
        view.data = out;
        owned = out;
        copied_bytes_ += loc.bytes;
      } else {
        left_mapped_bytes_ += loc.bytes;
      }
    }
    // The token embedding is read a row at a time by other code (the CPU
    // backend's lookup), not by the GEMV: it keeps ggml's order.
    if (owned != nullptr && options.block_order == BlockOrder::kGroupMajor && HasGroupMajorOrder(view.dtype) &&
        w.role != WeightRole::kEmbedTokens) {
      const auto start = std::chrono::steady_clock::now();
      if (absl::Status reorder =
              ReorderRows(loc.info->type, owned, loc.bytes, DTypeRowBytes(view.dtype, row_length), pool.get());
          !reorder.ok()) {
        return absl::Status(reorder.code(), absl::StrCat("tensor ", loc.info->name, ": ", reorder.message()));
      }
      view.order = BlockOrder::kGroupMajor;
      ++reordered_tensors_;
      reordered_bytes_ += loc.bytes;
      reorder_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    views_[w.name] = std::move(view);
    progress.Add(loc.bytes);
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorView> GgufTensorSource::Get(const std::string& name) const {
  auto it = views_.find(name);
  if (it == views_.end()) {
    return absl::NotFoundError(absl::StrCat(Describe(), ": no tensor ", name, " (the GGUF maps only the tensors the ",
                                            "model's config implies)"));
  }
  return it->second;
}

absl::StatusOr<DType> GgufTensorSource::StoredDType(const std::string& name) const {
  if (auto it = stored_dtypes_.find(name); it != stored_dtypes_.end()) return it->second;
  return TensorSource::StoredDType(name);
}

std::vector<std::string> GgufTensorSource::Names() const {
  std::vector<std::string> names;
  names.reserve(views_.size());
  for (const auto& [name, view] : views_) names.push_back(name);
  return names;
}

std::string GgufTensorSource::GgufNameOf(const std::string& hf_name) const {
  auto it = gguf_names_.find(hf_name);
  return it == gguf_names_.end() ? std::string() : it->second;
}

std::string GgufTensorSource::StoredTypesSummary() const {
  std::map<std::string, std::pair<int64_t, uint64_t>> by_type;  // name -> (tensors, bytes)
  for (const GgufTensor& t : checkpoint_->tensors()) {
    auto& [count, bytes] = by_type[std::string(GgmlTypeName(t.info->type))];
    ++count;
    bytes += t.info->size_bytes;
  }
  std::vector<std::string> parts;
  for (const auto& [type, stats] : by_type) {
    const double bytes = static_cast<double>(stats.second);
    parts.push_back(
        absl::StrCat(type, ": ", stats.first, " tensors, ",
                     bytes >= 1e9 ? absl::StrFormat("%.2f GB", bytes / 1e9) : absl::StrFormat("%.2f MB", bytes / 1e6)));
  }
  return absl::StrJoin(parts, "; ");
}

}  // namespace tandem
