#include "common/model/expert_partition.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/tensor_names.h"

namespace tandem {
namespace {

absl::Status CheckWorkers(int worker_index, int num_workers) {
  if (num_workers < 1) return absl::InvalidArgumentError(absl::StrCat("num_workers must be >= 1, got ", num_workers));
  if (worker_index < 0 || worker_index >= num_workers)
    return absl::InvalidArgumentError(
        absl::StrCat("worker_index ", worker_index, " out of range [0, ", num_workers, ")"));
  return absl::OkStatus();
}

}  // namespace

ExpertSplitBlock ExpertSplitBlockOf(const ModelWeights& weights) {
  ExpertSplitBlock block;
  for (size_t l = 0; l < weights.layers.size(); ++l) {
    const std::vector<ExpertWeights>& experts = weights.layers[l].experts;
    for (size_t e = 0; e < experts.size(); ++e) {
      const DType dtype = experts[e].w2.dtype;
      if (DTypeBlockSize(dtype) <= block.values) continue;
      block.values = DTypeBlockSize(dtype);
      block.dtype = dtype;
      block.tensor = WeightName(weights.config, WeightRole::kExpertW2, static_cast<int>(l), static_cast<int>(e));
    }
  }
  return block;
}

absl::StatusOr<std::vector<ExpertSlice>> PartitionExperts(const ModelConfig& config, ExpertDivision division,
                                                          int worker_index, int num_workers,
                                                          const ExpertSplitBlock& block) {
  TANDEM_RETURN_IF_ERROR(CheckWorkers(worker_index, num_workers));
  if (config.num_hidden_layers < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("config num_hidden_layers must be >= 1, got ", config.num_hidden_layers));
  if (config.num_local_experts < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("config num_local_experts must be >= 1, got ", config.num_local_experts));
  if (config.intermediate_size < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("config intermediate_size must be >= 1, got ", config.intermediate_size));

  const int layers = static_cast<int>(config.num_hidden_layers);
  const int experts = static_cast<int>(config.num_local_experts);
  std::vector<ExpertSlice> slices;
  if (division == ExpertDivision::kSplit) {
    absl::StatusOr<std::vector<IntermediateRange>> ranges =
        SplitIntermediate(config.intermediate_size, num_workers, block.values);
    if (!ranges.ok() && block.values > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("split of ", block.tensor, " (", std::string(DTypeName(block.dtype)), ", ", block.values,
                       "-value blocks) between ", num_workers, " workers: ", ranges.status().message(),
                       "; a slice of a quantized matrix must be whole blocks (use fewer workers, --division shard or "
                       "--gguf_experts bf16)"));
    }
    if (!ranges.ok()) return ranges.status();
    const IntermediateRange mine = (*ranges)[static_cast<size_t>(worker_index)];
    slices.reserve(static_cast<size_t>(layers) * static_cast<size_t>(experts));
    for (int layer = 0; layer < layers; ++layer)
      for (int expert = 0; expert < experts && config.moe_layer(layer); ++expert)
        slices.push_back(ExpertSlice{layer, expert, mine.begin, mine.end});
    return slices;
  }
  // A dense layer has no experts to hold.
  for (int layer = 0; layer < layers; ++layer)
    for (int expert = 0; expert < experts && config.moe_layer(layer); ++expert)
      if (ShardWorker(layer, expert, num_workers) == worker_index)
        slices.push_back(ExpertSlice{layer, expert, 0, config.intermediate_size});
  return slices;
}

}  // namespace tandem
