// A model ready to run: config, weights and (when the folder has one) the
// tokenizer. Loaded from a Hugging Face folder or generated in memory.
// Immutable after load; any thread may read it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "common/model/synthetic_model.h"
#include "common/model/tokenizer.h"

namespace tandem {

struct Model {
  ModelConfig config;
  std::unique_ptr<ModelWeights> weights;
  std::unique_ptr<Tokenizer> tokenizer;  // null when the folder has no tokenizer.model
  std::string origin;                    // the folder, or "synthetic:PRESET:LAYERS seed N"

  // A text request needs a tokenizer; token-id requests never do.
  absl::StatusOr<const Tokenizer*> RequireTokenizer() const;
};

// Where a program's model comes from: a folder (--model DIR) or a synthetic
// model generated in memory (--synthetic PRESET[:layers] --synthetic_seed N). Every
// program taking a model (tandem-server, tandem-generate, tandem-cpu-worker)
// parses its flags with ParseModelSource, so they accept and reject the same.
struct ModelSource {
  std::string model_dir;                        // --model; empty for synthetic
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
};

// LoadModel or LoadSyntheticModel, as `source` says.
absl::StatusOr<std::unique_ptr<Model>> LoadModelFrom(const ModelSource& source, const ModelLoadOptions& options);

// Reads <dir>/config.json, the safetensors (sharded or not) and, if present,
// <dir>/tokenizer.model.
absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::filesystem::path& dir);
// The weights of WriteSyntheticModel(spec), generated in memory, no tokenizer.
absl::StatusOr<std::unique_ptr<Model>> LoadSyntheticModel(const SyntheticModelSpec& spec, int num_threads = 1);
// The same with options.tokenizer's tokenizer and only options.experts'
// experts; logs the time taken and the bytes generated.
absl::StatusOr<std::unique_ptr<Model>> LoadSyntheticModel(const SyntheticModelSpec& spec,
                                                          const ModelLoadOptions& options);

}  // namespace tandem
