#include "coordinator/orchestration/worker_connect.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/status_macros.h"
#include "common/base/thread_pool.h"
#include "common/model/expert_content.h"
#include "common/model/model_fingerprint.h"

namespace tandem {

std::function<absl::StatusOr<std::vector<uint64_t>>(std::span<const ExpertSlice>)> ExpectedExpertContent(
    const Model& model, const std::optional<SyntheticModelSpec>& synthetic, int num_threads,
    const std::string& gguf_path) {
  bool has_bytes = true;
  for (const LayerWeights& layer : model.weights->layers) {
    for (const ExpertWeights& e : layer.experts) {
      has_bytes = has_bytes && e.w1.data != nullptr && e.w2.data != nullptr && e.w3.data != nullptr;
    }
  }
  const int threads = std::max(1, num_threads);
  if (has_bytes) {
    const ModelWeights* weights = model.weights.get();
    return [weights, threads](std::span<const ExpertSlice> slices) {
      ThreadPool pool(ThreadPoolOptions{.num_threads = threads, .name = "hash"});
      return HashExpertSlices(*weights, slices, &pool);
    };
  }
  if (!gguf_path.empty()) {
    return [gguf_path, threads](std::span<const ExpertSlice> slices) -> absl::StatusOr<std::vector<uint64_t>> {
      // Views of every block (kKeep: nothing dequantized at load), released
      // once hashed.
      ModelLoadOptions load{.num_threads = threads, .tokenizer = false, .quantized = QuantizedWeights::kKeep};
      TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Model> blocks, LoadModel(gguf_path, load));
      ThreadPool pool(ThreadPoolOptions{.num_threads = threads, .name = "hash"});
      return HashDequantizedExpertSlices(*blocks->weights, slices, DType::kBF16, &pool);
    };
  }
  if (synthetic) {
    const SyntheticModelSpec spec = *synthetic;
    return [spec, threads](std::span<const ExpertSlice> slices) {
      ThreadPool pool(ThreadPoolOptions{.num_threads = threads, .name = "hash"});
      return HashSyntheticExpertSlices(spec, slices, &pool);
    };
  }
  return nullptr;
}

std::function<std::string(std::span<const ExpertSlice>)> ExpectedExpertDTypes(const Model& model) {
  const ModelWeights* weights = model.weights.get();
  return [weights](std::span<const ExpertSlice> slices) {
    std::vector<ExpertWeights> experts;
    for (const ExpertSlice& s : slices) {
      if (s.layer < 0 || static_cast<size_t>(s.layer) >= weights->layers.size()) continue;
      const std::vector<ExpertWeights>& layer = weights->layers[static_cast<size_t>(s.layer)].experts;
      if (s.expert >= 0 && static_cast<size_t>(s.expert) < layer.size()) {
        experts.push_back(layer[static_cast<size_t>(s.expert)]);
      }
    }
    return ExpertDTypesText(experts);
  };
}

absl::StatusOr<std::unique_ptr<RemoteExpertExecutor>> ConnectExpertWorkers(const Model& model,
                                                                           const WorkerConnectSettings& settings) {
  absl::StatusOr<WorkerTransport> transport = ParseWorkerTransport(settings.transport);
  if (!transport.ok()) return absl::InvalidArgumentError(absl::StrCat("--transport: ", transport.status().message()));
  if (settings.call_timeout <= absl::ZeroDuration() || settings.connect_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--worker_timeout_ms and --connect_timeout_ms must be > 0");
  }
  RemoteExpertExecutorOptions options;
  for (absl::string_view address : absl::StrSplit(settings.addresses, ',', absl::SkipWhitespace())) {
    options.addresses.emplace_back(address);
  }
  if (options.addresses.empty()) return absl::InvalidArgumentError("--workers: no worker address given");
  options.transports = {*transport};
  options.call_timeout = settings.call_timeout;
  options.connect_timeout = settings.connect_timeout;
  options.expected_content = ExpectedExpertContent(model, settings.synthetic, settings.num_threads, settings.gguf_path);
  options.expected_dtypes = ExpectedExpertDTypes(model);
  options.split_block = ExpertSplitBlockOf(*model.weights);
  absl::StatusOr<ModelFingerprint> fingerprint = FingerprintModel(model.config, *model.weights->source);
  if (!fingerprint.ok()) return fingerprint.status();
  return RemoteExpertExecutor::Connect(model.config, *fingerprint, options);
}

}  // namespace tandem
