#include "coordinator/runtime/runtime_flags.h"

#include <malloc.h>

#include <filesystem>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/base/log.h"
#include "common/base/progress.h"
#include "common/base/status_macros.h"
#include "common/base/thread_pool.h"
#include "common/kernels/linear.h"
#include "common/model/model.h"
#include "common/programs/kernel_flags.h"
#include "coordinator/orchestration/worker_connect.h"
#include "gpu_worker/cuda/cuda_device.h"

ABSL_FLAG(std::string, model, "",
          "model directory (config.json, *.safetensors, tokenizer.model) or GGUF file (the first of a split set)");
ABSL_FLAG(std::string, synthetic, "",
          "instead of --model: a synthetic model generated in memory (weights as tandem-make-model writes them, "
          "tokenizer trained in memory), PRESET[:layers], e.g. tiny:2 or mixtral-8x7b");
ABSL_FLAG(uint64_t, synthetic_seed, 0, "seed of the --synthetic weights (as tandem-make-model --seed)");
ABSL_FLAG(std::string, gguf_experts, "auto",
          "GGUF files: keep the experts as their quantized blocks (quantized: 2-4x less memory and fewer bytes "
          "per token) in this process, in the CPU workers (which need the same --gguf_experts) and in the expert "
          "pool's slots (--execution_policy: fewer bytes per migration, more experts per --gpu_memory_mb), "
          "computed by the quantized CPU kernels or the CUDA pool's (docs/gpu.md); or dequantize them to BF16 "
          "at load (bf16); auto (the default) = quantized unless --expert_pool cuda. --gguf_dense does the same "
          "for the other matrices");
ABSL_FLAG(std::string, gguf_dense, "auto",
          "GGUF files: the dense matrices (embedding, attention projections, lm_head) kept as their quantized "
          "blocks, run by the quantized CPU kernels (quantized), or dequantized to BF16 at load (bf16); "
          "auto = quantized with --backend cpu, bf16 with --backend cuda (its dense code is float only)");
ABSL_FLAG(std::string, load_weights, "copy",
          "copy (the weights this process computes with, read from the GGUF or safetensors files into anonymous "
          "2 MiB pages while they fit in available memory less 1 GiB: faster decode) | map (read them from the "
          "files' mappings, 4 KiB page-cache pages)");
ABSL_FLAG(int32_t, threads, 0, "compute threads; 0 = all available cores");
ABSL_FLAG(absl::Duration, progress_interval, absl::Seconds(2),
          "how often a long load (generating, reading, dequantizing weights) logs its progress, e.g. 2s, 500ms");
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

// --threads at most this many per core this process may run on.
constexpr int kMaxThreadsPerCore = 4;

// The model (for the coordinator's own layers) and the workers computing its
// experts, checked against it at connect.
absl::StatusOr<std::pair<std::unique_ptr<Model>, std::unique_ptr<RemoteExpertExecutor>>> ConnectWorkers(
    const ModelSource& source, const ModelLoadOptions& load) {
  auto model = LoadModelFrom(source, load);
  if (!model.ok()) return model.status();
  WorkerConnectSettings settings;
  settings.addresses = absl::GetFlag(FLAGS_workers);
  settings.transport = absl::GetFlag(FLAGS_transport);
  settings.call_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_worker_timeout_ms));
  settings.connect_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_connect_timeout_ms));
  settings.synthetic = source.synthetic;
  // A GGUF whose experts were not loaded here (dequantized on the workers):
  // their hashes come from the file's blocks.
  if (!source.synthetic && IsGgufPath(source.model_dir) && !ExpertsKeptQuantized(load.quantized)) {
    settings.gguf_path = source.model_dir;
  }
  settings.num_threads = load.num_threads;
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
  // Bounded so no count can size an allocation beyond reason (or overflow
  // the MB-to-bytes shift); the pool checks its memory against the machine.
  auto in_range = [](const char* flag, int64_t value, int64_t low, int64_t high) -> absl::Status {
    if (value < low || value > high) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", value, ": must be in [", low, ", ", high, "]"));
    }
    return absl::OkStatus();
  };
  TANDEM_RETURN_IF_ERROR(in_range("gpu_memory_mb", absl::GetFlag(FLAGS_gpu_memory_mb), 0, int64_t{1} << 24));
  TANDEM_RETURN_IF_ERROR(in_range("gpu_slots", absl::GetFlag(FLAGS_gpu_slots), -1, kMaxExpertsPerModel));
  TANDEM_RETURN_IF_ERROR(in_range("staging_buffers", absl::GetFlag(FLAGS_staging_buffers), 0, 64));
  TANDEM_RETURN_IF_ERROR(in_range("lru_ways", absl::GetFlag(FLAGS_lru_ways), 0, kMaxExpertsPerModel));
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
    return absl::InvalidArgumentError(absl::StrCat("--precalc_start_layer: must be >= 1, got ", o->start_layer));
  }
  return absl::OkStatus();
}

// --gguf_experts: quantized experts wherever experts are computed: this
// process's executor or the CPU workers (whose stores then hold the blocks:
// they must be started with the same --gguf_experts, which Connect checks),
// and the orchestrator's expert pool, whose slots hold the blocks too (the
// host pool computes them with the CPU's quantized kernels, the CUDA pool
// with its own; a type either cannot compute is refused when the pool is
// created, naming it). `auto` keeps them quantized except with the CUDA
// pool, whose quantized kernels have not yet run on a GPU (docs/gpu.md).
// --gguf_dense: the dense matrices likewise; the CUDA backend computes
// only float weights, so `auto` dequantizes them for it.
absl::StatusOr<QuantizedWeights> GgufWeightsFromFlags(const LocalRuntimeOptions& options) {
  const std::string experts = absl::GetFlag(FLAGS_gguf_experts), dense = absl::GetFlag(FLAGS_gguf_dense);
  for (const auto& [flag, mode] : {std::pair{"--gguf_experts", experts}, std::pair{"--gguf_dense", dense}}) {
    if (mode != "auto" && mode != "quantized" && mode != "bf16") {
      return absl::InvalidArgumentError(absl::StrCat(flag, " \"", mode, "\": expected auto, quantized or bf16"));
    }
  }
  const bool cuda_pool = options.orchestrator.enabled && options.orchestrator.pool == ExpertPoolKind::kCuda;
  const bool cuda_dense = options.backend == BackendKind::kCuda;
  if (dense == "quantized" && cuda_dense) {
    return absl::InvalidArgumentError(
        "--gguf_dense quantized: --backend cuda computes only float dense weights; use --gguf_dense bf16 (or auto)");
  }
  const bool experts_quantized = experts == "quantized" || (experts == "auto" && !cuda_pool);
  const bool dense_quantized = dense == "quantized" || (dense == "auto" && !cuda_dense);
  return QuantizedWeightsFor(experts_quantized, dense_quantized);
}

}  // namespace

std::vector<std::string> RuntimeModelFlags() {
  return {"model", "synthetic", "synthetic_seed", "gguf_experts", "gguf_dense", "load_weights"};
}

std::vector<FlagGroup> RuntimeFlagGroups() {
  return {
      {"Threads", {"threads"}},
      {"CPU worker processes", {"workers", "transport", "worker_timeout_ms", "connect_timeout_ms"}},
      {"GPU and expert placement",
       {"backend", "cuda_device", "cuda_graphs", "expert_pool", "execution_policy", "cache_policy", "placement",
        "gpu_slots", "gpu_memory_mb", "staging_buffers", "lru_ways", "usage_profile", "calibration_profile", "precalc",
        "precalc_start_layer"}},
      {"CPU kernels", {"max_isa", "kernel_plan", "block_order"}},
      {"Recording and progress", {"record_trace", "record_usage", "progress_interval"}},
  };
}

absl::StatusOr<ModelSource> ModelSourceFromFlags() {
  return ParseModelSource(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_synthetic),
                          absl::GetFlag(FLAGS_synthetic_seed));
}

absl::StatusOr<RuntimeFromFlags> OpenRuntimeFromFlags(LocalRuntimeOptions options) {
  TANDEM_ASSIGN_OR_RETURN(const ModelSource source, ModelSourceFromFlags());
  if (absl::GetFlag(FLAGS_progress_interval) < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--progress_interval: must be >= 0");
  }
  SetProgressLogInterval(absl::GetFlag(FLAGS_progress_interval));
  TANDEM_ASSIGN_OR_RETURN(const KernelFlags kernel, ApplyKernelFlags());
  if (kernel.measure_kernel_plan) options.measure_kernel_plan = true;
  options.num_threads = absl::GetFlag(FLAGS_threads);
  if (options.num_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--threads: must be >= 0, got ", options.num_threads));
  }
  // A compute pool larger than the cores only contends with itself (and
  // 100000 threads cannot even be started); some oversubscription is allowed
  // for small test machines.
  const int max_threads = kMaxThreadsPerCore * AvailableCores();
  if (options.num_threads > max_threads) {
    return absl::InvalidArgumentError(absl::StrCat("--threads ", options.num_threads, ": this process may run on ",
                                                   AvailableCores(), " cores; give at most ", max_threads,
                                                   " (0 = one per core)"));
  }
  TANDEM_ASSIGN_OR_RETURN(options.backend, ParseBackendKind(absl::GetFlag(FLAGS_backend), "--backend"));
  if (absl::GetFlag(FLAGS_cuda_device) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cuda_device: must be >= 0, got ", absl::GetFlag(FLAGS_cuda_device)));
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
  // The KV cache flags against the model's config before any weight is
  // loaded or generated (a folder whose config does not load fails in the
  // loader below, with its own message).
  const absl::StatusOr<ModelConfig> config =
      source.synthetic ? SyntheticConfig(*source.synthetic)
                       : LoadModelConfig(std::filesystem::path(source.model_dir) / "config.json");
  if (config.ok() && options.backend == BackendKind::kCpu) {
    TANDEM_RETURN_IF_ERROR(CheckKvCacheOptions(*config, options.kv_cache_tokens, options.kv_block_size));
  }
  ModelLoadOptions load;
  load.num_threads = options.num_threads > 0 ? options.num_threads : AvailableCores();
  TANDEM_ASSIGN_OR_RETURN(load.quantized, GgufWeightsFromFlags(options));
  TANDEM_ASSIGN_OR_RETURN(load.copy_weights_to_memory, CopyWeightsFromFlag(absl::GetFlag(FLAGS_load_weights)));
  load.block_order = kernel.block_order;
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
    // Read-only unless the CUDA pool must page-lock the stores and its GPU
    // cannot lock read-only mappings (worker_expert_sources.h says why).
    // Unknown (no device): read-only; the pool then fails saying why.
    const bool writable = options.orchestrator.pool == ExpertPoolKind::kCuda &&
                          !HostRegisterReadOnlySupported(options.orchestrator.cuda_device).value_or(true);
    TANDEM_ASSIGN_OR_RETURN(out.worker_experts, WorkerExpertSources::Open(connected->first->config,
                                                                          out.remote->weights_regions(), writable));
    options.orchestrator.worker_experts = out.worker_experts.get();
    LOG_INFO("expert pool: migrations copy from the ", out.remote->num_workers(), " workers' expert stores (",
             absl::StrFormat("%.1f MB", out.worker_experts->mapped_bytes() / 1e6), " mapped ",
             writable ? "read-write, so that the GPU can page-lock them" : "read-only",
             "), not from a copy in this process");
  }
  TANDEM_ASSIGN_OR_RETURN(out.runtime, LocalRuntime::Create(std::move(connected->first), options));
  return out;
}

}  // namespace tandem
