// A model ready to run: config, weights and (when the source has one) the
// tokenizer. Loaded from a Hugging Face folder, a GGUF file (or the first
// file of a split set), or generated in memory.
// Immutable after load; any thread may read it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat/model_defaults.h"
#include "common/model/gguf_tensor_source.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "common/model/synthetic_model.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem {

struct Model {
  ModelConfig config;
  std::unique_ptr<ModelWeights> weights;
  // SentencePiece or BPE (model_tokenizer.h); null when the source has none.
  std::unique_ptr<Tokenizer> tokenizer;
  std::string origin;  // the folder or file, or "synthetic:PRESET:LAYERS seed N"
  // Why there is no tokenizer, for RequireTokenizer ("" : the default reason).
  std::string no_tokenizer_reason;
  // The Jinja chat template the source carries (GGUF tokenizer.chat_template,
  // or tokenizer_config.json's); "" when none.
  std::string chat_template;
  // A folder's generation_config.json and tokenizer_config.json (and their
  // companions): its own stop ids, sampling defaults and special tokens. A
  // GGUF's chat template, special tokens and add_bos/add_eos
  // (gguf_chat_defaults.h). Empty for synthetic models.
  ModelDefaults defaults;
  // One line for logs and model info: origin, architecture, sizes, stored
  // weight types and any fallback taken at load.
  std::string summary;

  // The ids that end generation: config.json's eos_token_id and every id
  // generation_config.json (or the tokenizer's eos_token) names, without
  // duplicates, in that order.
  std::vector<int32_t> EosIds() const;

  // A text request needs a tokenizer; token-id requests never do.
  absl::StatusOr<const Tokenizer*> RequireTokenizer() const;
};

// Where a program's model comes from: a folder (--model DIR) or a synthetic
// model generated in memory (--synthetic PRESET[:layers] --synthetic_seed N). Every
// program taking a model (tandem-server, tandem-generate, tandem-cpu-worker)
// parses its flags with ParseModelSource, so they accept and reject the same.
struct ModelSource {
  std::string model_dir;                        // --model (a folder or a .gguf); empty for synthetic
  std::optional<SyntheticModelSpec> synthetic;  // --synthetic; nullopt for a folder
  // The folder, or SyntheticModelName(*synthetic): what Model::origin will be.
  std::string Describe() const;
};

// From the values of --model, --synthetic and --synthetic_seed. InvalidArgument naming
// the flag: neither or both of --model and --synthetic, a --synthetic that is
// not PRESET or PRESET:layers with layers >= 1, an unknown preset.
absl::StatusOr<ModelSource> ParseModelSource(const std::string& model_flag, const std::string& synthetic_flag,
                                             uint64_t seed_flag);

struct ModelLoadOptions {
  int num_threads = 1;  // synthetic: generation threads
  // Synthetic: which experts to generate. A folder ignores it: its tensors
  // are mapped, and expert pages never read take no memory anyway.
  SyntheticExperts experts;
  // Synthetic: false leaves out the embeddings, attention and lm_head
  // matrices (SyntheticSourceOptions::dense_matrices).
  bool dense_matrices = true;
  // Synthetic: train the tokenizer WriteSyntheticModel would write, in
  // memory (0.2-0.5 s on the license corpus); false: no tokenizer.
  bool tokenizer = true;
  // GGUF: what to do with quantized matrices (gguf_tensor_source.h). The
  // default dequantizes them to BF16 at load (only `experts`' experts),
  // which every consumer runs; kKeepExperts keeps the experts' blocks for
  // the quantized CPU kernels (runtime_flags.cc picks it for in-process
  // CPU experts). Logged and named in Model::summary.
  QuantizedWeights quantized = QuantizedWeights::kDequantizeToBf16;
  // GGUF and safetensors: copy the weights this process uses out of the
  // files into anonymous 2 MiB pages (GgufSourceOptions::copy_to_memory,
  // SafetensorsCheckpoint::CopyToMemory), up to what /proc/meminfo says is
  // available less 1 GiB; logged with how much was copied. The in-process
  // runtimes ask for it (--load_weights copy).
  bool copy_weights_to_memory = false;
  // GGUF with copy_weights_to_memory: the order of the Q4_K/Q6_K blocks in
  // the copies (GgufSourceOptions::block_order); the runtimes pass
  // PreferredBlockOrder() (linear.h): group-major on AVX512-VNNI CPUs.
  BlockOrder block_order = BlockOrder::kGgml;
};

// LoadModel or LoadSyntheticModel, as `source` says.
absl::StatusOr<std::unique_ptr<Model>> LoadModelFrom(const ModelSource& source, const ModelLoadOptions& options);

// A folder: reads <dir>/config.json, the safetensors (sharded or not) and,
// if present, the tokenizer (<dir>/tokenizer.model, else tokenizer.json:
// model_tokenizer.h). A file ending in .gguf (or the first file of a split
// set, NAME-00001-of-0000N.gguf): config, weights, tokenizer and chat
// template from the GGUF (LoadGgufModel).
absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::filesystem::path& path,
                                                 const ModelLoadOptions& options = {});
// A GGUF file or split set; errors name the file and the key or tensor.
absl::StatusOr<std::unique_ptr<Model>> LoadGgufModel(const std::filesystem::path& path,
                                                     const ModelLoadOptions& options = {});
// Whether `path` names a GGUF file (by its .gguf extension).
bool IsGgufPath(const std::filesystem::path& path);

// The value of a --load_weights flag: "copy" -> true
// (ModelLoadOptions::copy_weights_to_memory), "map" -> false, anything else
// InvalidArgument naming the flag and the value.
absl::StatusOr<bool> CopyWeightsFromFlag(std::string_view value);
// Only the config of what LoadModel(path) would load: <dir>/config.json, or
// the GGUF's metadata (its header is parsed, no weights are touched).
absl::StatusOr<ModelConfig> LoadModelConfigAt(const std::filesystem::path& path);
// The weights of WriteSyntheticModel(spec), generated in memory, no tokenizer.
absl::StatusOr<std::unique_ptr<Model>> LoadSyntheticModel(const SyntheticModelSpec& spec, int num_threads = 1);
// The same with options.tokenizer's tokenizer and only options.experts'
// experts; logs the time taken and the bytes generated.
absl::StatusOr<std::unique_ptr<Model>> LoadSyntheticModel(const SyntheticModelSpec& spec,
                                                          const ModelLoadOptions& options);

}  // namespace tandem
