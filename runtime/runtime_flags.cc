#include "runtime/runtime_flags.h"

#include <malloc.h>

#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/log.h"
#include "common/model/model.h"
#include "common/base/status_macros.h"
#include "common/base/thread_pool.h"
#include "runtime/kernel_flags.h"
#include "coordinator/worker_connect.h"

ABSL_FLAG(std::string, model, "", "model directory (config.json, *.safetensors, tokenizer.model)");
ABSL_FLAG(std::string, synthetic, "",
          "instead of --model: a synthetic model generated in memory (weights as tandem-make-model writes them, "
          "tokenizer trained in memory), PRESET[:layers], e.g. tiny:2 or mixtral-8x7b");
ABSL_FLAG(uint64_t, synthetic_seed, 0, "seed of the --synthetic weights (as tandem-make-model --seed)");
ABSL_FLAG(int32_t, threads, 0, "compute threads; 0 = all available cores");
ABSL_FLAG(std::string, backend, "cpu",
          "device of the dense part (embedding, attention, router, lm_head) and the KV cache: cpu | cuda "
          "(cuda: cuBLAS + tandem's kernels on --cuda_device; not yet the default: awaiting its first GPU run)");
ABSL_FLAG(int32_t, cuda_device, 0, "CUDA device of --backend cuda and --expert_pool cuda");
ABSL_FLAG(bool, cuda_graphs, false, "with --backend cuda: replay decode attention from captured CUDA graphs");
ABSL_FLAG(std::string, workers, "",
          "comma-separated CPU worker addresses in worker-index order (e.g. unix:/run/tandem/w0.sock,...); "
          "empty = compute experts in this process");
ABSL_FLAG(std::string, transport, "shm",
          "with --workers: shm (arena + doorbell) | shm-grpc (arena + gRPC descriptors) | inline (tensors in gRPC)");
ABSL_FLAG(int32_t, worker_timeout_ms, 5000, "with --workers: deadline of one layer's expert round trip");
ABSL_FLAG(int32_t, connect_timeout_ms, 10000, "with --workers: how long to wait for every worker at start-up");
ABSL_FLAG(std::string, execution_policy, "",
          "orchestrate the experts over the expert pool (--expert_pool) with this execution policy: "
          "threshold | makespan | gpu-only | cpu-only; empty = no orchestrator (every expert on the CPU executor)");
ABSL_FLAG(std::string, expert_pool, "host",
          "with --execution_policy: where pool slots live, host (no GPU: this process's memory and CPU) | "
          "cuda (GPU memory on --cuda_device, migrations from the page-locked weights)");
ABSL_FLAG(std::string, cache_policy, "static", "with --execution_policy: static | lru | sequence | adaptive");
ABSL_FLAG(std::string, placement, "uniform",
          "with --execution_policy: initial placement, uniform | first-layers | popularity | popularity-balanced "
          "(popularity needs --usage_profile)");
ABSL_FLAG(int32_t, gpu_slots, -1, "with --execution_policy: expert slots in the pool; -1 = from --gpu_memory_mb");
ABSL_FLAG(int64_t, gpu_memory_mb, 0,
          "with --execution_policy: pool memory (slots + staging buffers) when --gpu_slots is -1; "
          "neither = a quarter of the model's experts");
ABSL_FLAG(int32_t, staging_buffers, 2, "with --execution_policy: copies one layer plan may start");
ABSL_FLAG(int32_t, lru_ways, 0, "with --cache_policy lru: experts cached per layer; 0 = slots / layers");
ABSL_FLAG(std::string, usage_profile, "", "with --execution_policy: expert usage file for popularity placement");
ABSL_FLAG(std::string, calibration_profile, "",
          "with --execution_policy: calibration cache file (reused when machine, model and config match)");
ABSL_FLAG(std::string, precalc, "off",
          "expert pre-calculation: off (exact) | daop (LOSSY: one-layer-ahead prediction, CPU experts pre-computed "
          "from the previous layer's input; decode only)");
ABSL_FLAG(int32_t, precalc_start_layer, 4, "with --precalc daop: first layer predicted (>= 1; clamped to layers - 1)");
ABSL_FLAG(std::string, record_trace, "", "write the routing trace (tandem-sim --trace) to this file");
ABSL_FLAG(std::string, record_usage, "", "write the expert usage profile (--usage_profile) to this file");

namespace tandem {
namespace {

// The model (for the coordinator's own layers) and the workers computing its
// experts, checked against it at connect.
absl::StatusOr<std::pair<std::unique_ptr<Model>, std::unique_ptr<RemoteExpertExecutor>>>
ConnectWorkers(const ModelSource& source, const ModelLoadOptions& load) {
  auto model = LoadModelFrom(source, load);
  if (!model.ok()) return model.status();
  WorkerConnectSettings settings;
  settings.addresses = absl::GetFlag(FLAGS_workers);
  settings.transport = absl::GetFlag(FLAGS_transport);
  settings.call_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_worker_timeout_ms));
  settings.connect_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_connect_timeout_ms));
  auto remote = ConnectExpertWorkers(**model, settings);
  if (!remote.ok()) return remote.status();
  return std::make_pair(std::move(*model), std::move(*remote));
}

// --execution_policy and the flags that go with it.
absl::Status OrchestratorFlags(LocalOrchestratorOptions* o) {
  const std::string execution = absl::GetFlag(FLAGS_execution_policy);
  if (execution.empty()) {
    const bool other = absl::GetFlag(FLAGS_cache_policy) != "static" || absl::GetFlag(FLAGS_placement) != "uniform" ||
                       absl::GetFlag(FLAGS_gpu_slots) != -1 || absl::GetFlag(FLAGS_gpu_memory_mb) != 0 ||
                       absl::GetFlag(FLAGS_lru_ways) != 0 || !absl::GetFlag(FLAGS_usage_profile).empty() ||
                       !absl::GetFlag(FLAGS_calibration_profile).empty() || absl::GetFlag(FLAGS_expert_pool) != "host";
    if (other) {
      return absl::InvalidArgumentError(
          "--expert_pool, --cache_policy, --placement, --gpu_slots, --gpu_memory_mb, --lru_ways, --usage_profile "
          "and --calibration_profile need --execution_policy");
    }
    return absl::OkStatus();
  }
  o->enabled = true;
  TANDEM_ASSIGN_OR_RETURN(o->pool, ParseExpertPoolKind(absl::GetFlag(FLAGS_expert_pool), "--expert_pool"));
  o->cuda_device = absl::GetFlag(FLAGS_cuda_device);
  auto policy = ParseExecutionPolicy(execution);
  if (!policy.ok()) return absl::InvalidArgumentError(absl::StrCat("--execution_policy: ", policy.status().message()));
  o->execution = *policy;
  auto cache = ParseCachePolicyKind(absl::GetFlag(FLAGS_cache_policy));
  if (!cache.ok()) return absl::InvalidArgumentError(absl::StrCat("--cache_policy: ", cache.status().message()));
  o->cache = *cache;
  std::string placement = absl::GetFlag(FLAGS_placement);
  o->balance_layers = placement == "popularity-balanced";
  if (o->balance_layers) placement = "popularity";
  auto parsed = ParsePlacementPolicy(placement);
  if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat("--placement: ", parsed.status().message()));
  o->placement = *parsed;
  if (o->placement == PlacementPolicy::kPopularity && absl::GetFlag(FLAGS_usage_profile).empty()) {
    return absl::InvalidArgumentError("--placement popularity needs --usage_profile (record one with --record_usage)");
  }
  if (absl::GetFlag(FLAGS_gpu_memory_mb) < 0) return absl::InvalidArgumentError("--gpu_memory_mb must be >= 0");
  if (absl::GetFlag(FLAGS_staging_buffers) < 0) return absl::InvalidArgumentError("--staging_buffers must be >= 0");
  if (absl::GetFlag(FLAGS_lru_ways) < 0) return absl::InvalidArgumentError("--lru_ways must be >= 0");
  o->gpu_slots = absl::GetFlag(FLAGS_gpu_slots);
  o->gpu_memory_bytes = absl::GetFlag(FLAGS_gpu_memory_mb) << 20;
  o->staging_buffers = absl::GetFlag(FLAGS_staging_buffers);
  o->lru_ways = absl::GetFlag(FLAGS_lru_ways);
  o->usage_profile = absl::GetFlag(FLAGS_usage_profile);
  o->calibration_profile = absl::GetFlag(FLAGS_calibration_profile);
  return absl::OkStatus();
}

// --precalc and --precalc_start_layer.
absl::Status PrecalcFlags(PrecalcOptions* o) {
  TANDEM_ASSIGN_OR_RETURN(o->policy, ParsePrecalcPolicy(absl::GetFlag(FLAGS_precalc), "--precalc"));
  o->start_layer = absl::GetFlag(FLAGS_precalc_start_layer);
  if (o->start_layer < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--precalc_start_layer: must be >= 1, got ", o->start_layer));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelSource> ModelSourceFromFlags() {
  return ParseModelSource(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_synthetic), absl::GetFlag(FLAGS_synthetic_seed));
}

absl::StatusOr<RuntimeFromFlags> OpenRuntimeFromFlags(LocalRuntimeOptions options) {
  TANDEM_ASSIGN_OR_RETURN(const ModelSource source, ModelSourceFromFlags());
  TANDEM_RETURN_IF_ERROR(ApplyKernelFlags(&options));
  options.num_threads = absl::GetFlag(FLAGS_threads);
  if (options.num_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--threads: must be >= 0, got ", options.num_threads));
  }
  TANDEM_ASSIGN_OR_RETURN(options.backend, ParseBackendKind(absl::GetFlag(FLAGS_backend), "--backend"));
  if (absl::GetFlag(FLAGS_cuda_device) < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--cuda_device: must be >= 0, got ", absl::GetFlag(FLAGS_cuda_device)));
  }
  options.cuda.device = absl::GetFlag(FLAGS_cuda_device);
  options.cuda.decode_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  if (options.cuda.decode_graphs && options.backend != BackendKind::kCuda) {
    return absl::InvalidArgumentError("--cuda_graphs needs --backend cuda");
  }
  TANDEM_RETURN_IF_ERROR(OrchestratorFlags(&options.orchestrator));
  TANDEM_RETURN_IF_ERROR(PrecalcFlags(&options.precalc));
  options.record_trace = absl::GetFlag(FLAGS_record_trace);
  options.record_usage = absl::GetFlag(FLAGS_record_usage);
  ModelLoadOptions load;
  load.num_threads = options.num_threads > 0 ? options.num_threads : AvailableCores();
  RuntimeFromFlags out;
  if (absl::GetFlag(FLAGS_workers).empty()) {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, LoadModelFrom(source, load));
    TANDEM_ASSIGN_OR_RETURN(out.runtime, LocalRuntime::Create(std::move(model), options));
    return out;
  }
  // The workers hold and compute the experts, so a synthetic model leaves
  // them out here (a full Mixtral-8x7B: ~3 of ~93 GB generated here, not the
  // experts a second time); the orchestrator's pool copies them from the
  // workers' stores. A folder is mapped: expert pages this process never
  // reads take no memory either way.
  load.experts.mode = SyntheticExperts::Mode::kNone;
  // Inline (gRPC) layers allocate MB-sized message buffers per call: keep
  // them in the heap instead of a fresh mmap (page faults) each time.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  auto connected = ConnectWorkers(source, load);
  if (!connected.ok()) return connected.status();
  out.remote = std::move(connected->second);
  options.expert_executor = out.remote.get();
  // The orchestrator's CPU side is the workers: their count and division,
  // and a thread of its own so the pool computes meanwhile.
  options.orchestrator.num_cpu_workers = out.remote->num_workers();
  options.orchestrator.division = out.remote->division();
  options.orchestrator.cpu_transport = absl::GetFlag(FLAGS_transport);
  options.orchestrator.overlap_cpu = true;
  if (options.orchestrator.enabled) {
    TANDEM_ASSIGN_OR_RETURN(out.worker_experts,
                            WorkerExpertSources::Open(connected->first->config, out.remote->weights_regions()));
    options.orchestrator.worker_experts = out.worker_experts.get();
    LOG_INFO("expert pool: migrations copy from the ", out.remote->num_workers(), " workers' expert stores (",
             absl::StrFormat("%.1f MB", out.worker_experts->mapped_bytes() / 1e6),
             " mapped read-only), not from a copy in this process");
  }
  TANDEM_ASSIGN_OR_RETURN(out.runtime, LocalRuntime::Create(std::move(connected->first), options));
  return out;
}

}  // namespace tandem
