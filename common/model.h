// A model ready to run: config, weights and (when the folder has one) the
// tokenizer. Loaded from a Hugging Face folder or generated in memory.
// Immutable after load; any thread may read it.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "common/model_weights.h"
#include "common/synthetic_model.h"
#include "common/tokenizer.h"

namespace tandem {

struct Model {
  ModelConfig config;
  std::unique_ptr<ModelWeights> weights;
  std::unique_ptr<Tokenizer> tokenizer;  // null when the folder has no tokenizer.model
  std::string origin;                    // the folder, or "synthetic:<preset>:seed=<n>"

  // A text request needs a tokenizer; token-id requests never do.
  absl::StatusOr<const Tokenizer*> RequireTokenizer() const;
};

// Reads <dir>/config.json, the safetensors (sharded or not) and, if present,
// <dir>/tokenizer.model.
absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::filesystem::path& dir);
// The weights of WriteSyntheticModel(spec), generated in memory, no tokenizer.
absl::StatusOr<std::unique_ptr<Model>> LoadSyntheticModel(const SyntheticModelSpec& spec, int num_threads = 1);

}  // namespace tandem
