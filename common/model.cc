#include "common/model.h"

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace tandem {

absl::StatusOr<const Tokenizer*> Model::RequireTokenizer() const {
  if (tokenizer == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model ", origin, " has no tokenizer.model: send token ids instead of text"));
  }
  return tokenizer.get();
}

absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(dir.string(), ": model directory not found"));
  }
  auto model = std::make_unique<Model>();
  model->origin = dir.string();
  TANDEM_ASSIGN_OR_RETURN(model->config, LoadModelConfig(dir / "config.json"));
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsCheckpoint> checkpoint, SafetensorsCheckpoint::Open(dir));
  TANDEM_ASSIGN_OR_RETURN(model->weights, LoadModelWeights(model->config, std::move(checkpoint)));
  if (std::filesystem::exists(dir / "tokenizer.model", ec)) {
    TANDEM_ASSIGN_OR_RETURN(model->tokenizer, Tokenizer::Load(dir / "tokenizer.model"));
  } else {
    LOG_WARNING(dir.string(), " has no tokenizer.model: only token-id requests will be served");
  }
  return model;
}

absl::StatusOr<std::unique_ptr<Model>> LoadSyntheticModel(const SyntheticModelSpec& spec, int num_threads) {
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<SyntheticTensorSource> source, SyntheticTensorSource::Create(spec, num_threads));
  auto model = std::make_unique<Model>();
  model->config = source->config();
  model->origin = source->Describe();
  TANDEM_ASSIGN_OR_RETURN(model->weights, LoadModelWeights(model->config, std::move(source)));
  return model;
}

}  // namespace tandem
