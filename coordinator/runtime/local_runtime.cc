#include "coordinator/runtime/local_runtime.h"

#include <unistd.h>

#include "absl/strings/str_format.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/kernels/kernel_calibration.h"
#include "common/kernels/linear.h"
#include "common/model/model_fingerprint.h"
#include "coordinator/orchestration/planner/profile_io.h"
#include "gpu_worker/cuda/cuda_expert_pool.h"
#include "gpu_worker/host_expert_pool.h"
#include "gpu_worker/pinned_regions.h"

namespace tandem {
namespace {

// What the kernel plan is measured on: the first two experts' gate, up and
// down (the shapes that dominate), or, when the experts live in worker
// processes, the first two layers' attention projections.
std::vector<std::vector<LinearWeight>> KernelPlanGroups(const ModelWeights& weights) {
  std::vector<std::vector<LinearWeight>> groups;
  for (const LayerWeights& layer : weights.layers) {
    for (const ExpertWeights& expert : layer.experts) {
      if (groups.size() == 2) break;
      if (expert.w1.data != nullptr && expert.w2.data != nullptr && expert.w3.data != nullptr)
        groups.push_back({expert.w1, expert.w3, expert.w2});
    }
  }
  if (!groups.empty()) return groups;
  for (size_t l = 0; l < weights.layers.size() && l < 2; ++l) {
    const LayerWeights& layer = weights.layers[l];
    groups.push_back({layer.q_proj, layer.k_proj, layer.v_proj, layer.o_proj});
  }
  return groups;
}

// The expert pool `o` asks for, over `experts` ([layer][expert] views into the
// model's weights).
absl::StatusOr<std::unique_ptr<ExpertPool>> CreateExpertPool(const LocalOrchestratorOptions& o,
                                                             const ModelConfig& config,
                                                             std::vector<std::vector<ExpertWeights>> experts,
                                                             ThreadPool* threads, std::unique_ptr<ExpertFfn>* ffn) {
  ExpertPoolOptions pool_options;
  pool_options.num_slots = o.gpu_slots;
  pool_options.memory_bytes = o.gpu_memory_bytes;
  pool_options.num_staging_buffers = o.staging_buffers;
  if (o.gpu_slots < 0 && o.gpu_memory_bytes <= 0) {
    pool_options.num_slots = static_cast<int>(config.num_moe_layers() * config.num_local_experts / 4);
  }
  // Where migrations copy from: the workers' stores, or the model's weights
  // where they lie (mapped files, the synthetic model's buffers).
  ExpertSources sources = o.worker_experts != nullptr ? o.worker_experts->sources() : WholeExperts(experts);
  if (o.pool == ExpertPoolKind::kCuda) {
    CudaExpertPoolOptions cuda;
    cuda.pool = pool_options;
    cuda.device = o.cuda_device;
    // Page-locked in place: no second host copy.
    cuda.host_regions = o.worker_experts != nullptr
                            ? o.worker_experts->regions()
                            : ExpertHostRegions(sources, static_cast<size_t>(sysconf(_SC_PAGESIZE)));
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<CudaExpertPool> pool,
                            CudaExpertPool::Create(config, std::move(sources), cuda));
    return std::unique_ptr<ExpertPool>(std::move(pool));
  }
  // Host slots are this machine's memory: more than it has is a mistake
  // (--gpu_slots), refused before the buffers are allocated. Sized as the
  // pool will size them: the experts' stored types, blocks included.
  if (pool_options.num_slots > 0) {
    TANDEM_ASSIGN_OR_RETURN(const ExpertLayouts layouts, SlotPool::CheckExpertSources(config, sources));
    const double per_expert = static_cast<double>(MaxBufferBytes(layouts));
    const double needed = per_expert * (pool_options.num_slots + std::max(0, pool_options.num_staging_buffers));
    const double memory = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
    if (memory > 0 && needed > memory) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--gpu_slots %d: %d host slots + %d staging buffers of %.1f MB each need %.1f GiB, more than this "
          "machine's %.1f GiB of memory",
          pool_options.num_slots, pool_options.num_slots, pool_options.num_staging_buffers, per_expert / 1e6,
          needed / (1 << 30), memory / (1 << 30)));
    }
  }
  // The CPU executor's own kernel, so pool and CPU give the same bits.
  *ffn = std::make_unique<ExpertFfn>(threads);
  ExpertFfn* kernel_ffn = ffn->get();
  ExpertKernel kernel = [kernel_ffn](const ExpertWeights& weights, const float* input, int64_t rows, float* output) {
    return kernel_ffn->Run(weights, input, rows, output);
  };
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<HostExpertPool> pool,
                          HostExpertPool::Create(config, std::move(sources), std::move(kernel), pool_options));
  return std::unique_ptr<ExpertPool>(std::move(pool));
}

// The expert pool and the orchestrator around `cpu` (see local_runtime.h).
absl::Status BuildOrchestrator(const LocalOrchestratorOptions& o, const PrecalcOptions& precalc, const Model& model,
                               ThreadPool* threads, bool measure_kernel_plan, ExpertExecutor* cpu, bool external_cpu,
                               std::unique_ptr<ExpertFfn>* ffn, std::unique_ptr<ExpertPool>* pool,
                               std::optional<CalibrationResult>* calibration,
                               std::unique_ptr<Orchestrator>* orchestrator) {
  const ModelConfig& config = model.config;
  std::vector<std::vector<ExpertWeights>> experts;
  for (const LayerWeights& layer : model.weights->layers) experts.push_back(layer.experts);
  TANDEM_ASSIGN_OR_RETURN(*pool, CreateExpertPool(o, config, std::move(experts), threads, ffn));

  CostModelParams params;
  if (o.cost) {
    params = *o.cost;
    // A given model's migrate is per expert as the pool stores it (bytes x
    // rate): experts kept quantized copy their blocks, fewer bytes.
    if (params.expert_bytes != (*pool)->expert_bytes()) {
      LOG_INFO("orchestrator: the given cost model's expert_bytes ", params.expert_bytes, " -> the pool's ",
               (*pool)->expert_bytes(), " (experts ", PoolExpertTypes(**pool), ")");
      params.expert_bytes = (*pool)->expert_bytes();
    }
  } else {
    CalibrationSetup setup;
    setup.config = &config;
    TANDEM_ASSIGN_OR_RETURN(setup.fingerprint, FingerprintModel(config, *model.weights->source));
    setup.cpu = cpu;
    setup.num_cpu_workers = o.num_cpu_workers;
    setup.division = o.division;
    setup.cpu_transport = o.cpu_transport;
    setup.pool = pool->get();
    if (measure_kernel_plan) {
      setup.kernel_plan_groups = KernelPlanGroups(*model.weights);
      setup.kernel_pool = threads;
    }
    setup.config_description = absl::StrCat("threads=", threads->num_threads(),
                                            " executor=", external_cpu ? "external " + o.cpu_transport : "local",
                                            " staging=", o.staging_buffers);
    TANDEM_ASSIGN_OR_RETURN(CalibrationResult result, LoadOrCalibrate(o.calibration_profile, setup, o.calibration));
    params = result.profile.cost;
    *calibration = std::move(result);
  }
  TANDEM_ASSIGN_OR_RETURN(CostModel cost, CostModel::Create(params));

  OrchestratorOptions options;
  options.planner.policy = o.execution;
  options.planner.division = o.division;
  options.planner.num_cpu_workers = o.num_cpu_workers;
  options.cache.kind = o.cache;
  options.cache.lru.num_ways = o.lru_ways;
  if (o.lru_ways > 0) {
    options.cache.lru.num_indexes =
        LayersCoveringMoeLayers(static_cast<int>(config.num_hidden_layers), config.dense_layers,
                                std::min(static_cast<int>(config.num_moe_layers()), (*pool)->num_slots() / o.lru_ways));
  }
  options.placement.policy = o.placement;
  options.placement.balance_layers = o.balance_layers;
  if (!o.usage_profile.empty()) {
    TANDEM_ASSIGN_OR_RETURN(options.usage, LoadExpertUsage(o.usage_profile));
  }
  options.refine_online = o.refine_online;
  options.overlap_cpu = o.overlap_cpu;
  options.precalc = precalc;
  TANDEM_ASSIGN_OR_RETURN(*orchestrator, Orchestrator::Create(config, cpu, pool->get(), std::move(cost), options));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ExpertPoolKind> ParseExpertPoolKind(const std::string& name, const std::string& flag) {
  if (name == "host") return ExpertPoolKind::kHost;
  if (name == "cuda") return ExpertPoolKind::kCuda;
  return absl::InvalidArgumentError(absl::StrCat(flag, ": unknown expert pool \"", name, "\" (host | cuda)"));
}

absl::StatusOr<BackendKind> ParseBackendKind(const std::string& name, const std::string& flag) {
  if (name == "cpu") return BackendKind::kCpu;
  if (name == "cuda") return BackendKind::kCuda;
  return absl::InvalidArgumentError(absl::StrCat(flag, ": unknown compute backend \"", name, "\" (cpu | cuda)"));
}

absl::Status CheckKvCacheOptions(const ModelConfig& config, int64_t kv_cache_tokens, int64_t kv_block_size) {
  if (kv_block_size < 1 || kv_block_size > kMaxKvBlockSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_block_size ", kv_block_size, ": must be in [1, ", kMaxKvBlockSize, "] positions"));
  }
  if (kv_cache_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--kv_cache_tokens ", kv_cache_tokens, ": must be >= 1"));
  }
  if (kv_cache_tokens == 0) return absl::OkStatus();
  // K and V (MLA: the latent and rope key), f32, every layer, per position; whole blocks.
  const int64_t row_floats = config.cache_key_dim() + config.cache_value_dim();
  const int64_t per_token = 4 * config.num_hidden_layers * row_floats;
  const int64_t blocks = kv_cache_tokens / kv_block_size + (kv_cache_tokens % kv_block_size != 0);
  const long pages = sysconf(_SC_PHYS_PAGES), page_bytes = sysconf(_SC_PAGESIZE);
  const double memory = pages > 0 && page_bytes > 0 ? static_cast<double>(pages) * static_cast<double>(page_bytes) : 0;
  const double needed =
      static_cast<double>(blocks) * static_cast<double>(kv_block_size) * static_cast<double>(per_token);
  if (memory > 0 && needed > memory) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--kv_cache_tokens %d: a KV cache of %d tokens (%d layers x %d f32 values of K and V: %d bytes per token) "
        "takes %.1f GiB, more than this machine's %.1f GiB of memory",
        kv_cache_tokens, blocks * kv_block_size, config.num_hidden_layers, row_floats, per_token, needed / (1 << 30),
        memory / (1 << 30)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LocalRuntime>> LocalRuntime::Create(std::unique_ptr<Model> model,
                                                                   const LocalRuntimeOptions& options) {
  return Create(std::shared_ptr<const Model>(std::move(model)), options);
}

absl::StatusOr<std::unique_ptr<LocalRuntime>> LocalRuntime::Create(std::shared_ptr<const Model> model,
                                                                   const LocalRuntimeOptions& options) {
  if (model == nullptr) return absl::InvalidArgumentError("model: LocalRuntime::Create needs a model");
  auto rt = std::unique_ptr<LocalRuntime>(new LocalRuntime());
  rt->model_ = std::move(model);
  const ModelConfig& config = rt->model_->config;
  if (options.backend == BackendKind::kCpu) {
    TANDEM_RETURN_IF_ERROR(CheckKvCacheOptions(config, options.kv_cache_tokens, options.kv_block_size));
  }
  const int threads = options.num_threads > 0 ? options.num_threads : AvailableCores();
  TANDEM_ASSIGN_OR_RETURN(rt->pool_, ThreadPool::Create(ThreadPoolOptions{.num_threads = threads, .name = "compute"}));
  CudaBackend* cuda_backend = nullptr;
  if (options.backend == BackendKind::kCuda) {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> cuda,
                            CudaBackend::Create(rt->model_->weights.get(), options.cuda));
    cuda_backend = cuda.get();
    rt->backend_ = std::move(cuda);
    rt->backend_name_ = absl::StrFormat("CUDA backend (device %d, %.1f MB dense weights on the GPU)",
                                        options.cuda.device, cuda_backend->stats().weight_bytes / 1e6);
  } else {
    rt->backend_ = std::make_unique<CpuBackend>(rt->model_->weights.get(), rt->pool_.get());
    rt->backend_name_ = "CPU backend";
  }

  ExpertExecutor* experts = options.expert_executor;
  if (experts == nullptr) {
    std::vector<std::vector<ExpertFfnWeights>> local;
    for (const LayerWeights& layer : rt->model_->weights->layers) local.push_back(layer.experts);
    rt->experts_ = std::make_unique<LocalExpertExecutor>(std::move(local), rt->pool_.get());
    experts = rt->experts_.get();
  }

  if (options.measure_kernel_plan && !(options.orchestrator.enabled && !options.orchestrator.cost)) {
    // No calibration will run: measure here (nothing caches it).
    TANDEM_ASSIGN_OR_RETURN(KernelCalibration measured,
                            MeasureKernelPlan(KernelPlanGroups(*rt->model_->weights), rt->pool_.get()));
    LOG_INFO("kernel plan measured in ", absl::StrFormat("%.2f s", measured.seconds), ": ", measured.plan.Spec());
    SetProcessKernelPlan(std::move(measured.plan));
  }
  if (options.orchestrator.enabled) {
    TANDEM_RETURN_IF_ERROR(BuildOrchestrator(options.orchestrator, options.precalc, *rt->model_, rt->pool_.get(),
                                             options.measure_kernel_plan, experts, options.expert_executor != nullptr,
                                             &rt->pool_ffn_, &rt->expert_pool_, &rt->calibration_, &rt->orchestrator_));
    experts = rt->orchestrator_.get();
  }
  TANDEM_RETURN_IF_ERROR(ValidatePrecalcOptions(options.precalc));
  EngineOptions engine_options = options.engine;
  if (rt->orchestrator_) {
    engine_options.observers.push_back(rt->orchestrator_.get());
    engine_options.layer_hook = rt->orchestrator_->layer_hook();
  } else if (options.precalc.policy == PrecalcPolicy::kDaop) {
    // No pool: every expert is a CPU expert, computed by `experts` itself.
    TANDEM_ASSIGN_OR_RETURN(rt->precalc_, DaopPrecalc::Create(config, experts, experts, nullptr, options.precalc));
    experts = rt->precalc_.get();
    engine_options.layer_hook = rt->precalc_.get();
    LOG_WARNING("precalc daop from layer ", rt->precalc_->stats().start_layer,
                " without the orchestrator: LOSSY (daop pre-calculation changes the outputs); every expert is a CPU "
                "expert, so this is pure approximation with no speed benefit");
  }
  if (!options.record_trace.empty() || !options.record_usage.empty()) {
    RoutingRecorderOptions recorder;
    recorder.trace_path = options.record_trace;
    recorder.usage_path = options.record_usage;
    recorder.model_name = rt->model_->origin;
    TANDEM_ASSIGN_OR_RETURN(rt->recorder_, RoutingRecorder::Create(config, recorder));
    engine_options.observers.push_back(rt->recorder_.get());
  }

  const int64_t tokens = options.kv_cache_tokens > 0 ? options.kv_cache_tokens : config.max_position_embeddings;
  KvCacheOptions kv{.num_layers = config.num_hidden_layers,
                    .kv_dim = config.cache_key_dim(),
                    .value_dim = config.cache_value_dim(),
                    .block_size = options.kv_block_size,
                    .max_blocks = (tokens + options.kv_block_size - 1) / options.kv_block_size};
  if (cuda_backend != nullptr) {
    TANDEM_ASSIGN_OR_RETURN(rt->kv_pool_, cuda_backend->CreateKvPool(kv));
  } else {
    TANDEM_ASSIGN_OR_RETURN(rt->kv_pool_, KvBlockPool::Create(kv));
  }
  rt->engine_ = std::make_unique<Engine>(config, rt->backend_.get(), experts, std::move(engine_options));
  rt->generator_ = std::make_unique<Generator>(rt->model_.get(), rt->engine_.get(), rt->kv_pool_.get());
  LOG_INFO("model ", rt->model_->origin, ": ", config.architecture_name, ", ", config.num_hidden_layers, " layers, ",
           config.num_local_experts, " experts (", config.num_experts_per_tok, " per token), ",
           absl::StrFormat("%.1f MB weights (%.1f MB experts)", rt->model_->weights->total_bytes / 1e6,
                           rt->model_->weights->expert_bytes / 1e6),
           "; ", rt->backend_name_, ", ", threads, " threads; ",
           options.expert_executor == nullptr ? "all experts on the in-process CPU executor"
                                              : "experts on an external executor",
           rt->orchestrator_ ? absl::StrCat(", orchestrated with the ", rt->expert_pool_->kind()) : std::string());
  LOG_INFO("kernels: ", KernelStartupSummary(rt->model_->weights->layers.empty()
                                                 ? DType::kBF16
                                                 : rt->model_->weights->layers.front().q_proj.dtype));
  return rt;
}

PrecalcStats LocalRuntime::precalc_stats() const {
  if (orchestrator_) return orchestrator_->stats().precalc;
  if (precalc_) return precalc_->stats();
  return PrecalcStats{};
}

absl::Status LocalRuntime::FinishRecording() { return recorder_ ? recorder_->Finish() : absl::OkStatus(); }

absl::StatusOr<std::unique_ptr<LocalRuntime>> LocalRuntime::Open(const std::filesystem::path& model_dir,
                                                                 const LocalRuntimeOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, LoadModel(model_dir));
  return Create(std::move(model), options);
}

absl::StatusOr<std::unique_ptr<LocalRuntime>> LocalRuntime::Open(const ModelSource& source,
                                                                 const LocalRuntimeOptions& options) {
  ModelLoadOptions load;
  load.num_threads = options.num_threads > 0 ? options.num_threads : AvailableCores();
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, LoadModelFrom(source, load));
  return Create(std::move(model), options);
}

}  // namespace tandem
