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
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/dtype.h"
#include "common/model/expert_partition.h"
#include "common/model/model_config.h"
#include "common/model/safetensors.h"
#include "common/model/tensor_names.h"

namespace tandem {

struct SyntheticModelSpec {
  // "tiny" (Mixtral-shaped, tests), "tiny-phimoe" (PhiMoE-shaped, tests),
  // "demo" (quick start), "small-mixtral" (D = 1024, 8 layers: benchmarks
  // of per-layer overheads), "mixtral-8x7b", "phi-3.5-moe" (full width).
  std::string preset = "tiny";
  int64_t num_layers = 0;  // 0: the preset's default
  // 0: the preset's. Another (e.g. 32000 for a Qwen shape) makes the
  // vocabulary the synthetic tokenizer's size, so that every id the model
  // can pick has a piece (what another engine needs to decode its output).
  int64_t vocab_size = 0;
  uint64_t seed = 0;
  DType dtype = DType::kBF16;
};

std::vector<std::string> SyntheticPresets();
// "PRESET" or "PRESET:LAYERS" (a bench's --preset) as a spec with `seed`;
// InvalidArgument naming `flag` when LAYERS is not a positive integer.
absl::StatusOr<SyntheticModelSpec> ParseSyntheticPreset(std::string_view text, uint64_t seed,
                                                       std::string_view flag = "--preset");
// "synthetic:PRESET:LAYERS seed N" (layers resolved from the preset), the
// model's origin in logs, stats and errors. Empty preset/layers as given
// when the preset is unknown.
std::string SyntheticModelName(const SyntheticModelSpec& spec);
absl::StatusOr<ModelConfig> SyntheticConfig(const SyntheticModelSpec& spec);
// Vocabulary size of the SentencePiece model trained for this preset.
int64_t SyntheticTokenizerVocab(const SyntheticModelSpec& spec);

// Writes num_elements(spec.shape) values of `dtype` into `out`.
void FillSyntheticTensor(const ModelConfig& config, const WeightSpec& weight, uint64_t seed, DType dtype, void* out);
// Writes only elements [begin, end) (row-major index), each with the value
// FillSyntheticTensor gives it; element i goes to out[i - out_first] (0: a
// buffer of the whole tensor; `begin`: a buffer of just this range). Slices
// of a tensor can be generated alone, in parallel, straight where they live.
void FillSyntheticRange(const ModelConfig& config, const WeightSpec& weight, uint64_t seed, DType dtype, void* out,
                        int64_t begin, int64_t end, int64_t out_first = 0);

// The tokenizer.model WriteSyntheticModel writes for `spec`, as bytes (a
// serialized SentencePiece model proto), trained in memory on
// DefaultTokenizerCorpus(): no files. Deterministic (TrainTokenizer).
absl::StatusOr<std::string> SyntheticTokenizerModel(const SyntheticModelSpec& spec);

struct WriteSyntheticOptions {
  int num_shards = 1;          // 1: model.safetensors; N: N shards + index
  bool with_tokenizer = true;  // trains tokenizer.model on /usr/share/common-licenses
  int num_threads = 1;         // for generating weights
};

// Writes config.json, the safetensors and (optionally) tokenizer.model into
// `dir` (created if absent; existing model files are overwritten).
absl::Status WriteSyntheticModel(const SyntheticModelSpec& spec, const std::filesystem::path& dir,
                                 const WriteSyntheticOptions& options);

// Which expert weights an in-memory model generates. A process whose experts
// run elsewhere (a coordinator with CPU worker processes) or that holds a
// part of them (one worker) need not generate the rest: a full Mixtral-8x7B
// is ~90 GB, 96% of it experts.
struct SyntheticExperts {
  enum class Mode {
    kAll,     // every expert (the in-process CPU executor, the host expert pool)
    kNone,    // no expert at all
    kSlices,  // only `slices`: the intermediate rows of w1/w3 and columns of w2 in each slice
  };
  Mode mode = Mode::kAll;
  std::vector<ExpertSlice> slices;  // kSlices: e.g. PartitionExperts(config, division, worker, workers)

  // Whether expert `expert` of `layer` (or a slice of it) is among these.
  bool Includes(int layer, int expert) const;
};

struct SyntheticSourceOptions {
  int num_threads = 1;  // generation threads (work is cut into chunks of a few MB)
  SyntheticExperts experts;
  // false: leave out the embeddings, attention projections and lm_head too
  // (like unselected experts), for a process that computes experts only.
  // Norms, biases and routers are always generated: they are small and
  // LoadModelWeights reads them.
  bool dense_matrices = true;
};

// The same weights generated into memory, no files (full-size models on a
// host with the RAM for them). Owns the buffers; immutable after Create, any
// thread may read.
//
// Expert tensors left out by SyntheticExperts keep their name, dtype and
// shape (fingerprints, parameter counts and LoadModelWeights are unchanged)
// but their views have data == nullptr and size_bytes == 0, so any use is a
// crash rather than silent zeros, and ModelWeights::expert_bytes counts only
// tensors that have bytes (a kSlices tensor counts whole). Every tensor
// buffer is an anonymous private mapping: the pages of a kSlices tensor
// outside its slices are never touched, so they take no memory.
class SyntheticTensorSource : public TensorSource {
 public:
  static absl::StatusOr<std::unique_ptr<SyntheticTensorSource>> Create(const SyntheticModelSpec& spec,
                                                                       const SyntheticSourceOptions& options);
  static absl::StatusOr<std::unique_ptr<SyntheticTensorSource>> Create(const SyntheticModelSpec& spec,
                                                                       int num_threads = 1) {
    return Create(spec, SyntheticSourceOptions{.num_threads = num_threads});
  }
  ~SyntheticTensorSource() override;
  SyntheticTensorSource(const SyntheticTensorSource&) = delete;
  SyntheticTensorSource& operator=(const SyntheticTensorSource&) = delete;

  absl::StatusOr<TensorView> Get(const std::string& name) const override;
  std::vector<std::string> Names() const override;
  std::string Describe() const override { return description_; }
  const ModelConfig& config() const { return config_; }
  // Bytes actually generated (written), and how long generating took.
  int64_t generated_bytes() const { return generated_bytes_; }
  double generate_seconds() const { return generate_seconds_; }

 private:
  SyntheticTensorSource() = default;
  struct Mapping {
    void* data = nullptr;
    size_t bytes = 0;
  };
  ModelConfig config_;
  std::string description_;
  std::map<std::string, TensorView> views_;
  std::vector<Mapping> mappings_;  // munmap'd by the destructor
  int64_t generated_bytes_ = 0;
  double generate_seconds_ = 0;
};

}  // namespace tandem
