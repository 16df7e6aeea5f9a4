#include "common/model/model.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/base/thread_pool.h"
#include "common/model/gguf_chat_defaults.h"
#include "common/model/gguf_model_config.h"
#include "common/model/gguf_names.h"
#include "common/model/gguf_tokenizer.h"
#include "common/model/model_tokenizer.h"
#include "common/model/safetensors.h"
#include "common/model/sentencepiece_tokenizer.h"
#include "common/model/tensor_names.h"
#include "common/platform/hardware_probe.h"
#include "common/platform/huge_page_arena.h"

namespace tandem {

absl::StatusOr<const Tokenizer*> Model::RequireTokenizer() const {
  if (tokenizer == nullptr) {
    if (!no_tokenizer_reason.empty()) return absl::FailedPreconditionError(no_tokenizer_reason);
    return absl::FailedPreconditionError(absl::StrCat(
        "model ", origin, " has no tokenizer (tokenizer.model or tokenizer.json): send token ids instead of text"));
  }
  return tokenizer.get();
}

std::vector<int32_t> Model::EosIds() const {
  std::vector<int32_t> ids = config.eos_token_ids;
  for (int32_t id : defaults.StopTokenIds()) {
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

namespace {

// generation_config.json's (or the tokenizer's) stop ids must be tokens of
// this vocabulary: an id past it would never match, silently.
absl::Status CheckStopIds(const ModelDefaults& defaults, const ModelConfig& config, const std::filesystem::path& dir) {
  for (int32_t id : defaults.StopTokenIds()) {
    if (id < 0 || id >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat((dir / "generation_config.json").string(),
                                                     ": field \"eos_token_id\" lists ", id,
                                                     ", outside the vocabulary [0, ", config.vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

std::string ModelSummary(const Model& model, std::string_view weights) {
  const ModelConfig& c = model.config;
  return absl::StrCat(model.origin, ": ", c.architecture_name, ", ", c.num_hidden_layers, " layers, ",
                      c.num_local_experts, " experts (", c.num_experts_per_tok, " per token), hidden ", c.hidden_size,
                      ", intermediate ", c.intermediate_size, ", vocab ", c.vocab_size, "; weights ",
                      std::string(weights));
}

// The copy's budget: what the kernel says is available, less room for the
// KV cache, activations and the rest.
int64_t CopyBudgetBytes() {
  constexpr int64_t kHeadroomBytes = int64_t{1} << 30;
  return AvailableMemoryBytes() - kHeadroomBytes;
}

// "weights copied into memory: 1.95 GB in 1.2 s, 2 MiB pages advised
// (1.96 GB mapped); 0.00 GB left in the file's mapping (over the budget)".
std::string DescribeCopy(int64_t copied_bytes, int64_t left_mapped_bytes, const HugePageArena& arena,
                         std::chrono::steady_clock::time_point start) {
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::string text = absl::StrFormat(
      "weights copied into memory: %.2f GB in %.1f s, 2 MiB pages advised (%.2f GB mapped)",
      static_cast<double>(copied_bytes) / 1e9, seconds, static_cast<double>(arena.mapped_bytes()) / 1e9);
  if (left_mapped_bytes > 0) {
    absl::StrAppendFormat(
        &text,
        "; %.2f GB left in the file's mapping (over the copy budget: MemAvailable less 1 GiB, none when unknown)",
        static_cast<double>(left_mapped_bytes) / 1e9);
  }
  return text;
}

// The safetensors weights this process computes with (experts only where
// options.experts includes them) copied into huge pages, as GGUF's are.
absl::Status CopyCheckpointToMemory(SafetensorsCheckpoint& checkpoint, const ModelConfig& config,
                                    const ModelLoadOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> names;
  for (const WeightSpec& w : ExpectedWeights(config)) {
    if (!IsExpertRole(w.role) || options.experts.Includes(w.layer, w.expert)) names.push_back(w.name);
  }
  std::unique_ptr<ThreadPool> pool;
  if (options.num_threads > 1) {
    pool = std::make_unique<ThreadPool>(ThreadPoolOptions{.num_threads = options.num_threads, .name = "load-copy"});
  }
  TANDEM_RETURN_IF_ERROR(checkpoint.CopyToMemory(names, CopyBudgetBytes(), pool.get()));
  LOG_INFO(checkpoint.Describe(), ": ",
           DescribeCopy(checkpoint.copied_bytes(), checkpoint.left_mapped_bytes(), checkpoint.arena(), start));
  return absl::OkStatus();
}

}  // namespace

bool IsGgufPath(const std::filesystem::path& path) { return path.extension() == ".gguf"; }

absl::StatusOr<bool> CopyWeightsFromFlag(std::string_view value) {
  // string_view comparisons: an out-of-line std::string::compare(const char*)
  // in a file with flags once let the ASan link of tandem-scenario-bench pull
  // that file (and its clashing flags) in to resolve libprotobuf's reference.
  if (value != "copy" && value != "map") {
    return absl::InvalidArgumentError(
        absl::StrCat("--load_weights \"", std::string(value), "\": expected copy or map"));
  }
  return value == "copy";
}

absl::StatusOr<ModelConfig> LoadModelConfigAt(const std::filesystem::path& path) {
  if (!IsGgufPath(path)) return LoadModelConfig(path / "config.json");
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<GgufCheckpoint> checkpoint, GgufCheckpoint::Open(path));
  return ModelConfigFromGguf(*checkpoint);
}

absl::StatusOr<std::unique_ptr<Model>> LoadGgufModel(const std::filesystem::path& path,
                                                     const ModelLoadOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<GgufCheckpoint> checkpoint, GgufCheckpoint::Open(path));
  auto model = std::make_unique<Model>();
  model->origin = checkpoint->Describe();
  TANDEM_ASSIGN_OR_RETURN(model->config, ModelConfigFromGguf(*checkpoint));
  const GgufMetadata& metadata = checkpoint->metadata();
  TANDEM_ASSIGN_OR_RETURN(model->chat_template, ChatTemplateFromGguf(metadata));
  if (!GgufHasTokenizer(metadata)) {
    model->no_tokenizer_reason =
        absl::StrCat("model ", model->origin, " has no tokenizer.ggml vocabulary: send token ids instead of text");
  } else if (absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = TokenizerFromGguf(metadata, model->origin);
             tokenizer.ok()) {
    model->tokenizer = std::move(*tokenizer);
  } else {
    // A vocabulary tandem cannot tokenize still serves token ids.
    model->no_tokenizer_reason = std::string(tokenizer.status().message());
    LOG_WARNING(model->no_tokenizer_reason);
  }
  // The chat template and its special tokens, as a folder's files give them.
  // Malformed ones fail the load, unless the vocabulary was unreadable
  // already: such a model serves token ids, and needs none of it.
  if (absl::StatusOr<ModelDefaults> defaults = ModelDefaultsFromGguf(metadata, model->origin); defaults.ok()) {
    model->defaults = std::move(*defaults);
  } else if (model->tokenizer != nullptr) {
    return defaults.status();
  } else {
    LOG_WARNING(defaults.status().message(), ": the model's chat template is not used");
  }
  const GgufSourceOptions source_options{.quantized = options.quantized,
                                         .experts = options.experts,
                                         .num_threads = options.num_threads,
                                         .copy_to_memory = options.copy_weights_to_memory,
                                         .copy_budget_bytes = CopyBudgetBytes(),
                                         .block_order = options.block_order};
  const auto load_start = std::chrono::steady_clock::now();
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<GgufTensorSource> source,
                          GgufTensorSource::Create(std::move(checkpoint), model->config, source_options));
  if (options.copy_weights_to_memory) {
    LOG_INFO(model->origin, ": ",
             DescribeCopy(source->copied_bytes(), source->left_mapped_bytes(), source->arena(), load_start));
  }
  if (source->reordered_tensors() > 0) {
    LOG_INFO(model->origin, ": ", source->reordered_tensors(), " Q4_K/Q6_K matrices (",
             absl::StrFormat("%.2f GB", static_cast<double>(source->reordered_bytes()) / 1e9),
             ") put in group-major block order for the AVX512-VNNI GEMV in ",
             absl::StrFormat("%.2f s", source->reorder_seconds()));
  }
  std::string weights = source->StoredTypesSummary();
  if (source->dequantized_tensors() > 0) {
    const std::string fallback = absl::StrFormat(
        "%d quantized tensors dequantized at load (%.2f GB): %s", source->dequantized_tensors(),
        static_cast<double>(source->dequantized_bytes()) / 1e9, std::string(QuantizedWeightsName(options.quantized)));
    LOG_WARNING(model->origin, ": ", fallback);
    absl::StrAppend(&weights, "; ", fallback);
  }
  if (source->per_expert_layout()) absl::StrAppend(&weights, "; one tensor per expert (older layout)");
  TANDEM_ASSIGN_OR_RETURN(model->weights, LoadModelWeights(model->config, std::move(source)));
  model->summary = ModelSummary(*model, weights);
  LOG_INFO(model->summary);
  return model;
}

absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::filesystem::path& dir, const ModelLoadOptions& options) {
  if (IsGgufPath(dir)) return LoadGgufModel(dir, options);
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(dir, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return absl::PermissionDeniedError(absl::StrCat(dir.string(), ": cannot read the model directory: ", ec.message()));
  }
  if (!std::filesystem::exists(status)) {
    return absl::NotFoundError(absl::StrCat(dir.string(), ": no such model directory"));
  }
  if (!std::filesystem::is_directory(status)) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir.string(), " is ", std::filesystem::is_regular_file(status) ? "a file" : "not a directory",
                     ", not a model directory: give the folder holding config.json and the *.safetensors"));
  }
  auto model = std::make_unique<Model>();
  model->origin = dir.string();
  TANDEM_ASSIGN_OR_RETURN(model->config, LoadModelConfig(dir / "config.json"));
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsCheckpoint> checkpoint, SafetensorsCheckpoint::Open(dir));
  if (options.copy_weights_to_memory) {
    TANDEM_RETURN_IF_ERROR(CopyCheckpointToMemory(*checkpoint, model->config, options));
  }
  TANDEM_ASSIGN_OR_RETURN(model->weights, LoadModelWeights(model->config, std::move(checkpoint)));
  TANDEM_ASSIGN_OR_RETURN(model->defaults, LoadModelDefaults(dir));
  TANDEM_ASSIGN_OR_RETURN(model->tokenizer, LoadFolderTokenizer(dir, model->defaults, &model->config));
  if (model->tokenizer == nullptr) {
    LOG_WARNING(dir.string(), " has no tokenizer.model or tokenizer.json: only token-id requests will be served");
  }
  TANDEM_RETURN_IF_ERROR(CheckStopIds(model->defaults, model->config, dir));
  model->chat_template = model->defaults.tokenizer.chat_template.value_or(std::string());
  model->summary = ModelSummary(*model, absl::StrCat(model->config.torch_dtype, " safetensors"));
  return model;
}

absl::StatusOr<std::unique_ptr<Model>> LoadSyntheticModel(const SyntheticModelSpec& spec, int num_threads) {
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<SyntheticTensorSource> source,
                          SyntheticTensorSource::Create(spec, num_threads));
  auto model = std::make_unique<Model>();
  model->config = source->config();
  model->origin = source->Describe();
  TANDEM_ASSIGN_OR_RETURN(model->weights, LoadModelWeights(model->config, std::move(source)));
  return model;
}

absl::StatusOr<std::unique_ptr<Model>> LoadSyntheticModel(const SyntheticModelSpec& spec,
                                                          const ModelLoadOptions& options) {
  SyntheticSourceOptions source_options{
      .num_threads = options.num_threads, .experts = options.experts, .dense_matrices = options.dense_matrices};
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<SyntheticTensorSource> source,
                          SyntheticTensorSource::Create(spec, source_options));
  const char* experts = options.experts.mode == SyntheticExperts::Mode::kAll    ? "all experts"
                        : options.experts.mode == SyntheticExperts::Mode::kNone ? "no experts"
                                                                                : "this worker's expert slices";
  const std::string what = options.dense_matrices ? experts : absl::StrCat(experts, ", no dense matrices");
  const double bytes = static_cast<double>(source->generated_bytes());
  LOG_INFO("generated ", source->Describe(), ": ",
           bytes >= 1e9 ? absl::StrFormat("%.2f GB", bytes / 1e9) : absl::StrFormat("%.1f MB", bytes / 1e6), " (", what,
           ") in ", absl::StrFormat("%.2f s", source->generate_seconds()), " on ", std::max(1, options.num_threads),
           " threads (", absl::StrFormat("%.2f GB/s", bytes / 1e9 / std::max(source->generate_seconds(), 1e-9)), ")");
  auto model = std::make_unique<Model>();
  model->config = source->config();
  model->origin = source->Describe();
  TANDEM_ASSIGN_OR_RETURN(model->weights, LoadModelWeights(model->config, std::move(source)));
  if (options.tokenizer) {
    const absl::Time start = absl::Now();
    TANDEM_ASSIGN_OR_RETURN(std::string proto, SyntheticTokenizerModel(spec));
    TANDEM_ASSIGN_OR_RETURN(model->tokenizer,
                            SentencePieceTokenizer::FromModelProto(proto, absl::StrCat(model->origin, " tokenizer")));
    LOG_INFO("trained the ", model->origin, " tokenizer (", model->tokenizer->vocab_size(), " pieces) in memory in ",
             absl::StrFormat("%.2f s", absl::ToDoubleSeconds(absl::Now() - start)));
  }
  return model;
}

std::string ModelSource::Describe() const { return synthetic ? SyntheticModelName(*synthetic) : model_dir; }

absl::StatusOr<ModelSource> ParseModelSource(const std::string& model_flag, const std::string& synthetic_flag,
                                             uint64_t seed_flag) {
  if (model_flag.empty() == synthetic_flag.empty()) {
    return absl::InvalidArgumentError("give exactly one of --model DIR or --synthetic PRESET[:layers]");
  }
  ModelSource source;
  if (!model_flag.empty()) {
    source.model_dir = model_flag;
    return source;
  }
  SyntheticModelSpec spec;
  std::vector<std::string> parts = absl::StrSplit(synthetic_flag, ':');
  spec.preset = parts[0];
  if (parts.size() > 2 ||
      (parts.size() == 2 && (!absl::SimpleAtoi(parts[1], &spec.num_layers) || spec.num_layers < 1))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--synthetic \"", synthetic_flag, "\": expected PRESET or PRESET:layers with layers >= 1"));
  }
  spec.seed = seed_flag;
  if (absl::Status status = SyntheticConfig(spec).status(); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--synthetic \"", synthetic_flag, "\": ", status.message()));
  }
  source.synthetic = spec;
  return source;
}

absl::StatusOr<std::unique_ptr<Model>> LoadModelFrom(const ModelSource& source, const ModelLoadOptions& options) {
  if (source.synthetic) return LoadSyntheticModel(*source.synthetic, options);
  return LoadModel(source.model_dir, options);
}

}  // namespace tandem
