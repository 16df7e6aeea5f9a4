// Synthetic models: complete Hugging Face-layout models with random weights
// from a fixed seed, for tests, the quick start and benchmarks (nothing can be
// downloaded here). Every tensor element is a pure function of (seed, tensor
// name, index), so a tensor can be generated alone, in parallel, on disk or in
// memory, and always comes out the same.
//
// Weight scales keep activations finite over many layers and routing
// non-trivial: embeddings share a common direction and router rows lean on it
// by a per-expert amount, so some experts are more popular than others (as in
// real models, Fiddler App. C) while every expert is still chosen sometimes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "common/model_config.h"
#include "common/safetensors.h"
#include "common/tensor_names.h"

namespace tandem {

struct SyntheticModelSpec {
  // "tiny" (Mixtral-shaped, tests), "tiny-phimoe" (PhiMoE-shaped, tests),
  // "demo" (quick start), "mixtral-8x7b", "phi-3.5-moe" (full width).
  std::string preset = "tiny";
  int64_t num_layers = 0;  // 0: the preset's default
  uint64_t seed = 0;
  DType dtype = DType::kBF16;
};

std::vector<std::string> SyntheticPresets();
absl::StatusOr<ModelConfig> SyntheticConfig(const SyntheticModelSpec& spec);
// Vocabulary size of the SentencePiece model trained for this preset.
int64_t SyntheticTokenizerVocab(const SyntheticModelSpec& spec);

// Writes num_elements(spec.shape) values of `dtype` into `out`.
void FillSyntheticTensor(const ModelConfig& config, const WeightSpec& weight, uint64_t seed, DType dtype, void* out);

struct WriteSyntheticOptions {
  int num_shards = 1;          // 1: model.safetensors; N: N shards + index
  bool with_tokenizer = true;  // trains tokenizer.model on /usr/share/common-licenses
  int num_threads = 1;         // for generating weights
};

// Writes config.json, the safetensors and (optionally) tokenizer.model into
// `dir` (created if absent; existing model files are overwritten).
absl::Status WriteSyntheticModel(const SyntheticModelSpec& spec, const std::filesystem::path& dir,
                                 const WriteSyntheticOptions& options);

// The same weights generated into memory, no files (full-size models on a
// host with the RAM for them). Owns the buffers; immutable after Create.
class SyntheticTensorSource : public TensorSource {
 public:
  static absl::StatusOr<std::unique_ptr<SyntheticTensorSource>> Create(const SyntheticModelSpec& spec,
                                                                       int num_threads = 1);
  absl::StatusOr<TensorView> Get(const std::string& name) const override;
  std::vector<std::string> Names() const override;
  std::string Describe() const override { return description_; }
  const ModelConfig& config() const { return config_; }

 private:
  ModelConfig config_;
  std::string description_;
  std::map<std::string, TensorView> views_;
  std::vector<std::unique_ptr<uint8_t[]>> buffers_;
};

}  // namespace tandem
