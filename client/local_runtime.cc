#include "client/local_runtime.h"

#include "absl/strings/str_format.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<LocalRuntime>> LocalRuntime::Create(std::unique_ptr<Model> model,
                                                                   const LocalRuntimeOptions& options) {
  auto rt = std::unique_ptr<LocalRuntime>(new LocalRuntime());
  rt->model_ = std::move(model);
  const ModelConfig& config = rt->model_->config;
  const int threads = options.num_threads > 0 ? options.num_threads : AvailableCores();
  rt->pool_ = std::make_unique<ThreadPool>(ThreadPoolOptions{.num_threads = threads, .name = "compute"});
  rt->backend_ = std::make_unique<CpuBackend>(rt->model_->weights.get(), rt->pool_.get());

  ExpertExecutor* experts = options.expert_executor;
  if (experts == nullptr) {
    std::vector<std::vector<ExpertFfnWeights>> local;
    for (const LayerWeights& layer : rt->model_->weights->layers) local.push_back(layer.experts);
    rt->experts_ = std::make_unique<LocalExpertExecutor>(std::move(local), rt->pool_.get());
    experts = rt->experts_.get();
  }

  const int64_t tokens = options.kv_cache_tokens > 0 ? options.kv_cache_tokens : config.max_position_embeddings;
  KvCacheOptions kv{.num_layers = config.num_hidden_layers,
                    .kv_dim = config.kv_dim(),
                    .block_size = options.kv_block_size,
                    .max_blocks = (tokens + options.kv_block_size - 1) / options.kv_block_size};
  TANDEM_ASSIGN_OR_RETURN(rt->kv_pool_, KvBlockPool::Create(kv));
  rt->engine_ = std::make_unique<Engine>(config, rt->backend_.get(), experts, options.engine);
  rt->generator_ = std::make_unique<Generator>(rt->model_.get(), rt->engine_.get(), rt->kv_pool_.get());
  LOG_INFO("model ", rt->model_->origin, ": ", config.architecture_name, ", ", config.num_hidden_layers, " layers, ",
           config.num_local_experts, " experts (", config.num_experts_per_tok, " per token), ",
           absl::StrFormat("%.1f MB weights (%.1f MB experts)", rt->model_->weights->total_bytes / 1e6,
                           rt->model_->weights->expert_bytes / 1e6),
           "; CPU backend, ", threads, " threads; ",
           options.expert_executor == nullptr ? "all experts on the in-process CPU executor" : "experts on an external executor");
  return rt;
}

absl::StatusOr<std::unique_ptr<LocalRuntime>> LocalRuntime::Open(const std::filesystem::path& model_dir,
                                                                 const LocalRuntimeOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, LoadModel(model_dir));
  return Create(std::move(model), options);
}

}  // namespace tandem
