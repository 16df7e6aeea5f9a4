// Hugging Face folder -> GGUF, as llama.cpp's converter followed by
// llama-quantize would write it: the same tensor names and ggml dims
// (gguf_names.h), q/k rows permuted for "llama", the converter's metadata
// (gguf_model_config.h, gguf_tokenizer.h), general.file_type and
// general.quantization_version, and llama-quantize's per-tensor type mix:
//
//   never quantized (F32)  1-D tensors, *_norm.weight, ffn_gate_inp (the router),
//                          PhiMoE's rope factors
//   output.weight          Q6_K (Q8_0 for q8_0 files, or when the row length
//                          is not whole blocks of the file's type); token_embd
//                          likewise when the embeddings are tied
//   attn_v                 Q6_K in Q4_K_M/Q5_K_M files for layers where
//                          use_more_bits(i, n): i < n/8, i >= 7n/8, or
//                          (i - n/8) % 3 == 2; Q8_0 for 8-expert models
//   attn_k                 Q8_0 for 8-expert models
//   ffn_down (all experts) Q6_K in Q4_K_M/Q5_K_M files where use_more_bits(layer)
//   attn_output            Q5_K in Q4_K_M files of 8-expert models
//   everything else        the file type's own: q8_0, q4_0, q4_K, q5_K, q6_K
// and llama-quantize's fallback for rows that are not whole 256-blocks:
// q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0, then f16 if still not whole
// blocks. (q5_1 is not a type tandem writes: such a tensor is refused,
// naming it; the legacy types have no fallback in llama.cpp either.)
//
// Tensor order is llama-quantize's (model-level tensors, then each layer,
// by name). The output is streamed tensor by tensor, in chunks of at most
// QuantizeOptions::chunk_bytes of f32 rows, through GgufWriter, so memory
// stays bounded whatever the model's size; pages of the input already
// converted are released.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/gguf/gguf_serializer.h"
#include "common/model/model_config.h"
#include "common/model/tensor_names.h"

namespace tandem {

// llama.cpp's llama_ftype numbers (general.file_type).
enum class GgufFileType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ8_0 = 7,
  kQ4_K_M = 15,
  kQ5_K_M = 17,
  kQ6_K = 18,
  kBF16 = 32,
};

// "f32", "f16", "bf16", "q8_0", "q4_0", "q4_k_m", "q5_k_m", "q6_k" (any case).
absl::StatusOr<GgufFileType> ParseGgufFileType(std::string_view name);
std::string_view GgufFileTypeName(GgufFileType type);

// One tensor of the file to write and where its values come from.
struct GgufTensorPlan {
  GgufTensorSpec spec;                // GGUF name, ggml dims, chosen type
  std::vector<std::string> hf_names;  // rows in order: one tensor, or E experts stacked
  bool permute_rows = false;          // llama q/k: rows (or elements) in llama.cpp's RoPE order
  int config_tensor = -1;             // >= 0: GgufConfigTensors(config)[i] instead of hf_names
};

// Every tensor of the file, in order, with its type. InvalidArgument naming
// the tensor when llama.cpp's fallback ends in a type tandem does not write.
absl::StatusOr<std::vector<GgufTensorPlan>> PlanGgufTensors(const ModelConfig& config, GgufFileType file_type);

struct QuantizeProgress {
  uint64_t bytes_written = 0;
  uint64_t total_bytes = 0;
  double seconds = 0;
  std::string tensor;  // the tensor being written
};

struct QuantizeOptions {
  std::filesystem::path model_dir;  // config.json, *.safetensors, tokenizer.model (optional)
  GgufFileType file_type = GgufFileType::kQ8_0;
  std::filesystem::path out;  // the .gguf to write (written as out.partial, then renamed)
  int num_threads = 1;
  int64_t chunk_bytes = int64_t{64} << 20;  // f32 rows converted at a time
  // Called after each chunk; may be empty.
  std::function<void(const QuantizeProgress&)> progress;
};

struct QuantizeResult {
  uint64_t bytes_written = 0;
  int64_t tensors = 0;
  double seconds = 0;
  int64_t peak_rss_bytes = 0;                                    // the process's, at the end (getrusage)
  std::vector<std::pair<std::string, int64_t>> tensors_by_type;  // "q4_K" -> count
};

// Reads the folder, writes the file. Errors name the file and tensor: a
// missing or misshapen tensor, a non-finite weight (its index), an
// unwritable output.
absl::StatusOr<QuantizeResult> QuantizeModel(const QuantizeOptions& options);

// "12.3 / 46.7 GB (26%), 1.8 GB/s, ETA 14 s" for a progress line.
std::string FormatQuantizeProgress(const QuantizeProgress& progress);

}  // namespace tandem
