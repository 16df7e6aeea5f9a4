// tandem-perplexity: perplexity of a model over a text, and the mean
// per-token KL divergence of its next-token distributions from a reference
// model's (e.g. a quantized GGUF against the bf16 folder it was made from).
//   tandem-perplexity --model DIR|FILE.gguf --text heldout.txt --context 128
//   tandem-perplexity --model q4_k_m.gguf --reference_model DIR --text heldout.txt --context 128
// Prints one JSON line on stdout and a readable line on stderr. The model
// takes every flag tandem-generate's does (--threads, --gguf_experts,
// --kernel_plan, --record_trace, --record_usage, ...); the reference is
// loaded as a plain in-process model on the same threads.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/base/flags_usage.h"
#include "common/base/status_macros.h"
#include "coordinator/runtime/local_runtime.h"
#include "coordinator/runtime/perplexity.h"
#include "coordinator/runtime/runtime_flags.h"

ABSL_FLAG(std::string, text, "", "UTF-8 text file to score (encoded with the model's tokenizer)");
ABSL_FLAG(std::string, reference_model, "",
          "optional: a folder or .gguf with the same vocabulary; reports the mean KL(reference || model)");
ABSL_FLAG(int64_t, context, 512, "tokens per window (each window is a fresh sequence)");
ABSL_FLAG(int64_t, stride, 0,
          "window start advance, in [1, --context]; 0 = --context / 2 (--context: disjoint windows)");
ABSL_FLAG(bool, add_bos, true, "prepend the BOS token to the text");
// --model, --threads and the rest are runtime_flags.cc's.

namespace {

// A text file this program will hold in memory at once.
constexpr uintmax_t kMaxTextBytes = 64ull << 20;

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "tandem-perplexity: %s\n", std::string(status.message()).c_str());
  return 1;
}

absl::StatusOr<std::string> ReadText(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("--text: give the text file to score");
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::NotFoundError(absl::StrCat("--text ", path, ": no such file (or not a regular file)"));
  }
  const uintmax_t bytes = std::filesystem::file_size(path, ec);
  if (ec || bytes > kMaxTextBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--text ", path, ": ", ec ? ec.message() : absl::StrCat(bytes, " bytes, more than ", kMaxTextBytes)));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--text ", path, ": cannot open"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat("--text ", path, ": cannot read"));
  return buffer.str();
}

// The text's ids under the model's tokenizer; a reference with a tokenizer
// must agree (KL compares distributions over the same ids).
absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text, const tandem::Model& model,
                                            const tandem::Model* reference) {
  TANDEM_ASSIGN_OR_RETURN(const tandem::Tokenizer* tokenizer, model.RequireTokenizer());
  const bool add_bos = absl::GetFlag(FLAGS_add_bos);
  TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer->Encode(text, add_bos));
  if (reference != nullptr && reference->tokenizer != nullptr) {
    TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> ref_ids, reference->tokenizer->Encode(text, add_bos));
    if (ref_ids != ids) {
      return absl::InvalidArgumentError(absl::StrCat("--reference_model ", reference->origin,
                                                     ": its tokenizer encodes --text differently from the model's (",
                                                     ref_ids.size(), " vs ", ids.size(), " tokens)"));
    }
  }
  return ids;
}

// The reference: an in-process model on the model's threads.
absl::StatusOr<std::unique_ptr<tandem::LocalRuntime>> OpenReference(const std::string& path, int num_threads) {
  tandem::ModelSource source;
  source.model_dir = path;
  tandem::LocalRuntimeOptions options;
  options.num_threads = num_threads;
  auto runtime = tandem::LocalRuntime::Open(source, options);
  if (!runtime.ok()) {
    return absl::Status(runtime.status().code(),
                        absl::StrCat("--reference_model ", path, ": ", runtime.status().message()));
  }
  return runtime;
}

void Print(const tandem::PerplexityResult& r, const tandem::PerplexityOptions& options, const tandem::Model& model,
           const std::string& reference) {
  nlohmann::json out = {{"model", model.origin},
                        {"text", absl::GetFlag(FLAGS_text)},
                        {"tokens", r.tokens},
                        {"scored", r.scored},
                        {"windows", r.windows},
                        {"context", options.context},
                        {"stride", tandem::EffectiveStride(options)},
                        {"mean_nll", r.mean_nll},
                        {"perplexity", r.perplexity},
                        {"seconds", r.seconds},
                        {"summary", model.summary}};
  if (r.has_reference) {
    out["reference_model"] = reference;
    out["mean_kl"] = r.mean_kl;
    out["max_kl"] = r.max_kl;
    out["top1_agreement"] = r.top1_agreement;
  }
  std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
  std::fprintf(stderr, "%s: perplexity %.4f (mean NLL %.5f nats) over %lld tokens in %lld windows of %lld",
               model.origin.c_str(), r.perplexity, r.mean_nll, static_cast<long long>(r.scored),
               static_cast<long long>(r.windows), static_cast<long long>(options.context));
  if (r.has_reference) {
    std::fprintf(stderr, "; KL from %s: mean %.6f, max %.4f nats; top-1 agreement %.2f%%", reference.c_str(), r.mean_kl,
                 r.max_kl, 100.0 * r.top1_agreement);
  }
  std::fprintf(stderr, " (%.1f s)\n", r.seconds);
}

// --help: the model and the text first, then the runtime's groups.
std::vector<tandem::FlagGroup> PerplexityFlagGroups() {
  std::vector<tandem::FlagGroup> groups = {
      {"Model", tandem::RuntimeModelFlags()},
      {"Text and windows", {"text", "reference_model", "context", "stride", "add_bos"}},
  };
  for (tandem::FlagGroup& group : tandem::RuntimeFlagGroups()) groups.push_back(std::move(group));
  return groups;
}

}  // namespace

int main(int argc, char** argv) {
  tandem::SetProgramUsage(
      "Perplexity of a model over a text, and the mean per-token KL divergence from a reference model.\n"
      "  tandem-perplexity --model DIR|FILE.gguf --text FILE [--context 512 --stride 256]\n"
      "  tandem-perplexity --model q4_k_m.gguf --reference_model BF16_DIR --text FILE --context 128",
      PerplexityFlagGroups());
  tandem::ParseProgramFlags(argc, argv);
  // Flag errors before any loading.
  if (auto source = tandem::ModelSourceFromFlags(); !source.ok()) return Fail(source.status());
  auto text = ReadText(absl::GetFlag(FLAGS_text));
  if (!text.ok()) return Fail(text.status());
  const tandem::PerplexityOptions options{.context = absl::GetFlag(FLAGS_context),
                                          .stride = absl::GetFlag(FLAGS_stride)};

  auto opened = tandem::OpenRuntimeFromFlags({});
  if (!opened.ok()) return Fail(opened.status());
  tandem::LocalRuntime& runtime = *opened->runtime;
  if (absl::Status ok = tandem::CheckPerplexityOptions(options, runtime.model().config); !ok.ok()) return Fail(ok);
  const std::string reference_path = absl::GetFlag(FLAGS_reference_model);
  std::unique_ptr<tandem::LocalRuntime> reference;
  if (!reference_path.empty()) {
    auto ref = OpenReference(reference_path, runtime.pool().num_threads());
    if (!ref.ok()) return Fail(ref.status());
    reference = std::move(*ref);
  }
  auto ids = Encode(*text, runtime.model(), reference ? &reference->model() : nullptr);
  if (!ids.ok()) return Fail(ids.status());
  auto result = tandem::MeasurePerplexity(runtime, reference.get(), *ids, options);
  if (!result.ok()) return Fail(result.status());
  if (absl::Status recorded = runtime.FinishRecording(); !recorded.ok()) return Fail(recorded);
  Print(*result, options, runtime.model(), reference_path);
  return 0;
}
