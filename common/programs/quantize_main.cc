// tandem-quantize: a Hugging Face folder (bf16/f16/f32 safetensors) to a
// GGUF file llama.cpp loads too (common/model/gguf_quantize.h).
//   tandem-quantize --model models/Mixtral-8x7B-v0.1 --type q4_k_m --out mixtral-q4_k_m.gguf
// Progress goes to stderr about once a second; the last line has the time
// taken and the peak resident memory.
#include <chrono>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/flags_usage.h"
#include "common/base/thread_pool.h"
#include "common/model/gguf_quantize.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model folder (config.json, *.safetensors, tokenizer.model)");
ABSL_FLAG(std::string, type, "q8_0", "q8_0 | q4_0 | q4_k_m | q5_k_m | q6_k | f16 | bf16 | f32");
ABSL_FLAG(std::string, out, "", "the .gguf file to write");
ABSL_FLAG(int32_t, threads, 0, "quantization threads; 0 = all available cores");
ABSL_FLAG(int32_t, chunk_mb, 64, "f32 rows converted at a time, in MB (bounds memory)");

int main(int argc, char** argv) {
  tandem::SetProgramUsage(
      "Write a GGUF file (llama.cpp's layout) from a Hugging Face model folder.\n"
      "  tandem-quantize --model DIR --type q4_k_m --out FILE.gguf");
  tandem::ParseProgramFlags(argc, argv);
  if (absl::GetFlag(FLAGS_model).empty() || absl::GetFlag(FLAGS_out).empty()) {
    std::fprintf(stderr, "tandem-quantize: --model DIR and --out FILE.gguf are required\n");
    return 1;
  }
  absl::StatusOr<tandem::GgufFileType> type = tandem::ParseGgufFileType(absl::GetFlag(FLAGS_type));
  if (!type.ok() || absl::GetFlag(FLAGS_chunk_mb) < 1) {
    std::fprintf(stderr, "tandem-quantize: %s\n",
                 type.ok() ? "--chunk_mb must be >= 1" : std::string(type.status().message()).c_str());
    return 1;
  }
  const int threads = absl::GetFlag(FLAGS_threads);
  auto last = std::chrono::steady_clock::now();
  tandem::QuantizeOptions options{
      .model_dir = absl::GetFlag(FLAGS_model),
      .file_type = *type,
      .out = absl::GetFlag(FLAGS_out),
      .num_threads = threads > 0 ? threads : tandem::AvailableCores(),
      .chunk_bytes = int64_t{absl::GetFlag(FLAGS_chunk_mb)} << 20,
      .progress =
          [&](const tandem::QuantizeProgress& p) {
            const auto now = std::chrono::steady_clock::now();
            if (now - last < std::chrono::seconds(1)) return;
            last = now;
            std::fprintf(stderr, "tandem-quantize: %s  %s\n", tandem::FormatQuantizeProgress(p).c_str(),
                         p.tensor.c_str());
          },
  };
  absl::StatusOr<tandem::QuantizeResult> result = tandem::QuantizeModel(options);
  if (!result.ok()) {
    std::fprintf(stderr, "tandem-quantize: %s\n", std::string(result.status().message()).c_str());
    return 1;
  }
  std::vector<std::string> types;
  for (const auto& [name, count] : result->tensors_by_type) types.push_back(absl::StrCat(name, " ", count));
  std::fprintf(stderr,
               "tandem-quantize: wrote %s: %lld tensors (%s), %.3f GB in %.1f s (%.2f GB/s), peak RSS %.1f MB\n",
               absl::GetFlag(FLAGS_out).c_str(), static_cast<long long>(result->tensors),
               absl::StrJoin(types, ", ").c_str(), static_cast<double>(result->bytes_written) / 1e9, result->seconds,
               static_cast<double>(result->bytes_written) / 1e9 / std::max(result->seconds, 1e-9),
               static_cast<double>(result->peak_rss_bytes) / 1e6);
  return 0;
}
