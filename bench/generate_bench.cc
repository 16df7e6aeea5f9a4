// Prefill and decode of whole models on the CPU, one sequence, against the
// machine's own limits measured in the same run. Prints JSON lines:
//   machine   triad and read-only bandwidth, the peak of every instruction
//             the kernels use (AVX2 FMA, AVX-512 FMA, AVX512-BF16 dot)
//   generate  per model: prefill (best, and the runtime's first: cold
//             scratch) and decode tokens/s; the weight bytes a
//             decode token reads, and the bandwidth floor (those bytes at
//             the read-only bandwidth) next to the measured step; the
//             best decode also against the read-only bandwidth probed
//             right before and after its own rep (the host's swings)
//   decode_breakdown  where a decode step's time goes: embedding,
//             attention (of which its four projections), router, experts,
//             combine, lm_head, the rest (sampling, bookkeeping), and of all
//             that, the engine thread waiting for pool threads
//   prefill   the prompt's expert and projection GEMMs in GFLOP/s and as a
//             fraction of the peak of the instruction their kernel uses
//   ttft      per --ttft_prompts length: time to first token, the same
//             GEMM figures, and the process's peak RSS growth (prefill
//             attention must stay memory-flat: no [L, L] buffers)
// Every line is stamped with the CPU, its ISA level, the kernel plan and the
// load average (bench/json_lines.h).
//
//   tandem-generate-bench --presets tiny,demo,mixtral-8x7b:2 --prompt_tokens 128 --decode_tokens 32
//   tandem-generate-bench --presets mixtral-8x7b:2 --prompt_tokens 512 --ttft_prompts 512,1024,2048,4096
//   tandem-generate-bench --model_dir models/demo --kernel_plan exact
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/json_lines.h"
#include "common/base/flags_usage.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/kernels/attention_block.h"
#include "common/kernels/compute_peak.h"
#include "common/kernels/linear.h"
#include "common/model/gguf_tensor_source.h"
#include "common/platform/hardware_probe.h"
#include "common/programs/kernel_flags.h"
#include "coordinator/engine/cpu_backend.h"
#include "coordinator/runtime/local_runtime.h"

ABSL_FLAG(std::string, presets, "tiny,demo,mixtral-8x7b:2",
          "synthetic models generated in memory, preset[:layers], comma-separated");
ABSL_FLAG(std::string, model_dir, "", "benchmark this model folder (or GGUF file) instead of presets");
ABSL_FLAG(std::string, gguf_weights, "quantized",
          "with a GGUF --model_dir: every matrix kept in its blocks (quantized), only the experts' (experts), "
          "only the dense ones' (dense), or all dequantized to BF16 at load (bf16)");
ABSL_FLAG(std::string, load_weights, "copy",
          "with --model_dir (GGUF or safetensors): copy the weights into anonymous 2 MiB pages (as "
          "tandem-generate and tandem-server do) or map (read them from the files' mappings)");
ABSL_FLAG(int32_t, prompt_tokens, 128, "prefill length of the generate run");
ABSL_FLAG(int32_t, decode_tokens, 32, "decode steps timed");
ABSL_FLAG(int32_t, reps, 3, "repetitions; the best is reported");
ABSL_FLAG(int64_t, mla_expanded_min_rows, tandem::CpuBackend::kExpandedLatentMinRows,
          "latent attention (DeepSeek): slices of at least this many new rows attend in the expanded form, the "
          "rest absorbed (a huge value: always absorbed)");
ABSL_FLAG(int32_t, threads, 0, "compute threads; 0 = all available cores");
ABSL_FLAG(std::string, ttft_prompts, "",
          "prompt lengths whose time to first token is measured (one prefill each, best of --reps), e.g. "
          "512,1024,2048,4096; empty: none");

namespace tandem {
namespace {

using nlohmann::json;

double Ms(double us) { return us / 1000.0; }

// Weight bytes one decode token reads: every dense matrix plus, per layer,
// the K experts it is routed to (the embedding reads one row: ignored;
// a dense layer's MLP is a dense matrix).
double DecodeBytesPerToken(const ModelWeights& w) {
  const auto& c = w.config;
  const double per_expert = static_cast<double>(w.expert_bytes) / (c.num_moe_layers() * c.num_local_experts);
  const double dense = static_cast<double>(w.total_bytes - w.expert_bytes - w.embed_tokens.size_bytes);
  return dense + static_cast<double>(c.num_moe_layers() * c.num_experts_per_tok) * per_expert;
}

double PeakRssMb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

struct Machine {
  double triad_gb_s = 0, read_gb_s = 0;
  std::map<PeakInstruction, double> peak_gflops;
};

// Sums of the engine's per-part timings over several forwards.
struct PartSums {
  int64_t steps = 0, routed_rows = 0;
  double embed_us = 0, attention_us = 0, projection_us = 0, router_us = 0, experts_us = 0, combine_us = 0,
         shared_expert_us = 0, dense_mlp_us = 0, logits_us = 0, engine_us = 0, wall_us = 0, wait_us = 0;
  void Add(const ForwardTiming& t) {
    ++steps;
    routed_rows += t.routed_rows;
    embed_us += t.embed_us;
    attention_us += t.attention_us;
    router_us += t.router_us;
    experts_us += t.experts_us;
    combine_us += t.combine_us;
    shared_expert_us += t.shared_expert_us;
    dense_mlp_us += t.dense_mlp_us;
    logits_us += t.logits_us;
    engine_us += t.total_us;
  }
};

// GEMM figures of one prefill: the experts' (2 x 3 x D x I flops per routed
// row the engine ran; the last layer runs only the prompt's last token) and
// the attention projections', against the peak of the instruction the
// kernel at that row count uses for the weights' dtype (a Q4_K_M file's
// experts run int8 or bf16 dot products, not its bf16 kernels).
struct GemmDTypes {
  DType experts, projections;
};
void AddGemmFigures(const ModelConfig& c, int64_t prompt_tokens, const PartSums& parts, double projection_flops,
                    const GemmDTypes& dtypes, const Machine& machine, json* line) {
  const double experts_us = parts.experts_us, projection_us = parts.projection_us;
  const double expert_flops = 2.0 * 3.0 * static_cast<double>(c.hidden_size) *
                              static_cast<double>(c.intermediate_size) * static_cast<double>(parts.routed_rows);
  const int64_t rows_per_expert = std::max<int64_t>(1, prompt_tokens * c.num_experts_per_tok / c.num_local_experts);
  const LinearKernel& expert_kernel = ChooseLinearKernel(rows_per_expert, dtypes.experts, LinearOptions{});
  const LinearKernel& projection_kernel = ChooseLinearKernel(prompt_tokens, dtypes.projections, LinearOptions{});
  const double expert_gflops = expert_flops / (experts_us * 1e3);
  const double projection_gflops = projection_flops / (projection_us * 1e3);
  (*line)["experts_ms"] = Ms(experts_us);
  (*line)["expert_gemm_gflops"] = expert_gflops;
  (*line)["expert_kernel"] = expert_kernel.name;
  (*line)["mean_rows_per_expert"] = rows_per_expert;
  (*line)["projections_ms"] = Ms(projection_us);
  (*line)["projection_gemm_gflops"] = projection_gflops;
  (*line)["projection_kernel"] = projection_kernel.name;
  for (auto [kernel, gflops, key] : {std::tuple{&expert_kernel, expert_gflops, "expert"},
                                     std::tuple{&projection_kernel, projection_gflops, "projection"}}) {
    const PeakInstruction instruction = PeakInstructionOf(*kernel);
    auto peak = machine.peak_gflops.find(instruction);
    if (peak == machine.peak_gflops.end()) continue;
    (*line)[std::string(key) + "_peak_instruction"] = PeakInstructionName(instruction);
    (*line)[std::string(key) + "_peak_ratio"] = gflops / peak->second;
  }
}

GenerationRequest Request(const ModelConfig& c, int prompt_tokens, int max_tokens) {
  GenerationRequest request;
  for (int i = 0; i < prompt_tokens; ++i)
    request.prompt_ids.push_back(static_cast<int32_t>(3 + (i * 7919) % (c.vocab_size - 3)));
  request.max_tokens = max_tokens;
  request.ignore_eos = true;
  return request;
}

// One generate run timed part by part: the first token's forward is the
// prefill, every later one a decode step.
struct TimedRun {
  GenerationResult result;
  PartSums prefill, decode;
  double prefill_projection_flops = 0;
};

absl::StatusOr<TimedRun> TimedGenerate(LocalRuntime& rt, const GenerationRequest& request) {
  auto* cpu = dynamic_cast<CpuBackend*>(&rt.backend());
  TimedRun run;
  rt.pool().ResetStats();
  double projection_us = cpu ? cpu->projection_us() : 0, projection_flops = cpu ? cpu->projection_flops() : 0;
  double wait_us = 0;
  auto last = std::chrono::steady_clock::now();
  int64_t tokens = 0;
  // Every forward since the last token (a long prompt's chunks all count
  // toward its first token).
  ForwardTiming seen = rt.engine().total_timing();
  auto on_token = [&](const GeneratedToken&) {
    const auto now = std::chrono::steady_clock::now();
    PartSums& sums = tokens++ == 0 ? run.prefill : run.decode;
    ForwardTiming since = rt.engine().total_timing();
    since.Add(seen, -1.0);
    seen = rt.engine().total_timing();
    sums.Add(since);
    sums.wall_us += std::chrono::duration<double, std::micro>(now - last).count();
    const double pool_wait = rt.pool().stats().caller_wait_us;
    sums.wait_us += pool_wait - wait_us;
    wait_us = pool_wait;
    if (cpu != nullptr) {
      sums.projection_us += cpu->projection_us() - projection_us;
      if (tokens == 1) run.prefill_projection_flops = cpu->projection_flops() - projection_flops;
      projection_us = cpu->projection_us();
      projection_flops = cpu->projection_flops();
    }
    last = now;
  };
  TANDEM_ASSIGN_OR_RETURN(run.result, rt.generator().Generate(request, on_token));
  return run;
}

// The read-only bandwidth now, on the engine's own threads (a shorter
// probe than the start-up one: 3 reps).
absl::StatusOr<double> ReadBandwidthNow(ThreadPool& pool) {
  TANDEM_ASSIGN_OR_RETURN(const MemoryBandwidth bw, MeasureMemoryBandwidth(&pool, {.reps = 3}));
  return bw.read_gb_s;
}

absl::Status BenchModel(std::unique_ptr<Model> model, const std::string& name, const Machine& machine) {
  LocalRuntimeOptions options;
  options.num_threads = absl::GetFlag(FLAGS_threads);
  const int prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  const int decode_tokens = absl::GetFlag(FLAGS_decode_tokens);
  const std::vector<int> ttft_prompts = ParsePositiveList<int>(absl::GetFlag(FLAGS_ttft_prompts));
  int64_t max_prompt = prompt_tokens;
  for (int p : ttft_prompts) max_prompt = std::max<int64_t>(max_prompt, p);
  options.kv_cache_tokens = max_prompt + decode_tokens + 16;
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<LocalRuntime> runtime, LocalRuntime::Create(std::move(model), options));
  LocalRuntime& rt = *runtime;
  if (auto* cpu = dynamic_cast<CpuBackend*>(&rt.backend()))
    cpu->set_expanded_latent_min_rows(absl::GetFlag(FLAGS_mla_expanded_min_rows));
  const ModelConfig& c = rt.model().config;
  if (max_prompt + decode_tokens > c.max_position_embeddings)
    return absl::InvalidArgumentError("prompt plus decode tokens exceed the model's context");
  const LayerWeights& first_layer = rt.model().weights->layers.front();
  const DType dtype = first_layer.q_proj.dtype;
  const GemmDTypes gemm_dtypes{first_layer.experts.empty() ? dtype : first_layer.experts.front().w1.dtype, dtype};
  SetBenchStamp("kernels", absl::StrCat(std::string(DTypeName(dtype)), " weights: ", DescribeKernelChoice(dtype), "; ",
                                        DescribeAttentionKernels()));

  // The first token comes from prefill; decode_tokens steps follow.
  const GenerationRequest request = Request(c, prompt_tokens, decode_tokens + 1);
  // Each breakdown comes from the rep its headline figure comes from: the
  // fastest prefill's parts, the fastest decode's steps (not one rep's of
  // both, which put a slow rep's prefill parts beside the best prefill rate).
  TimedRun best, best_prefill_run;
  double best_prefill = 0, best_decode = 0;
  // The first rep's prefill is the runtime's first forward: its scratch
  // arrays are grown (and their pages faulted in) during it, as a server's
  // first request grows them.
  double first_prefill = 0;
  // The read-only bandwidth right before and after every rep: on a shared
  // host it swings 2x within minutes, so the start-up probe alone can put a
  // decode at 60% or 130% of "the machine". The best decode is set against
  // the mean of its own two probes.
  TANDEM_ASSIGN_OR_RETURN(double probe_before, ReadBandwidthNow(rt.pool()));
  double best_decode_probe = 0;
  for (int rep = 0; rep < std::max(absl::GetFlag(FLAGS_reps), 1); ++rep) {
    TANDEM_ASSIGN_OR_RETURN(TimedRun run, TimedGenerate(rt, request));
    if (rep == 0) first_prefill = run.result.timing.prefill_tokens_per_s;
    TANDEM_ASSIGN_OR_RETURN(const double probe_after, ReadBandwidthNow(rt.pool()));
    if (run.result.timing.prefill_tokens_per_s > best_prefill) {
      best_prefill = run.result.timing.prefill_tokens_per_s;
      best_prefill_run.prefill = run.prefill;
      best_prefill_run.prefill_projection_flops = run.prefill_projection_flops;
    }
    if (run.result.timing.decode_tokens_per_s > best_decode) {
      best_decode = run.result.timing.decode_tokens_per_s;
      best_decode_probe = (probe_before + probe_after) / 2;
      best = std::move(run);
    }
    probe_before = probe_after;
  }
  const double bytes = DecodeBytesPerToken(*rt.model().weights);
  const double decode_gb_s = bytes * best_decode / 1e9;
  const double floor_ms = machine.read_gb_s > 0 ? bytes / (machine.read_gb_s * 1e9) * 1e3 : 0;
  EmitJsonLine({{"bench", "generate"},
                {"model", name},
                {"architecture", c.architecture_name},
                {"layers", c.num_hidden_layers},
                {"hidden_size", c.hidden_size},
                {"weight_bytes", rt.model().weights->total_bytes},
                {"threads", rt.pool().num_threads()},
                {"prompt_tokens", prompt_tokens},
                {"decode_tokens", decode_tokens},
                {"prefill_tokens_per_s", best_prefill},
                {"first_prefill_tokens_per_s", first_prefill},
                {"decode_tokens_per_s", best_decode},
                {"decode_weight_bytes_per_token", bytes},
                {"decode_weight_gb_s", decode_gb_s},
                {"decode_fraction_of_read_bandwidth", machine.read_gb_s > 0 ? decode_gb_s / machine.read_gb_s : 0.0},
                {"decode_fraction_of_triad", machine.triad_gb_s > 0 ? decode_gb_s / machine.triad_gb_s : 0.0},
                {"read_only_gb_s_around_decode", best_decode_probe},
                {"decode_fraction_of_read_bandwidth_around_decode",
                 best_decode_probe > 0 ? decode_gb_s / best_decode_probe : 0.0},
                {"floor_ms_per_token", floor_ms},
                {"step_over_floor", floor_ms > 0 && best_decode > 0 ? (1e3 / best_decode) / floor_ms : 0.0}});

  const PartSums& d = best.decode;
  if (d.steps > 0) {
    const double n = static_cast<double>(d.steps);
    const double parts = d.embed_us + d.attention_us + d.router_us + d.experts_us + d.combine_us + d.shared_expert_us +
                         d.dense_mlp_us + d.logits_us;
    EmitJsonLine({{"bench", "decode_breakdown"},
                  {"model", name},
                  {"steps", d.steps},
                  {"step_ms", Ms(d.wall_us / n)},
                  {"floor_ms", floor_ms},
                  {"embed_ms", Ms(d.embed_us / n)},
                  {"attention_ms", Ms(d.attention_us / n)},
                  {"attention_projections_ms", Ms(d.projection_us / n)},
                  {"router_ms", Ms(d.router_us / n)},
                  {"experts_ms", Ms(d.experts_us / n)},
                  {"combine_ms", Ms(d.combine_us / n)},
                  {"shared_expert_ms", Ms(d.shared_expert_us / n)},
                  {"dense_mlp_ms", Ms(d.dense_mlp_us / n)},
                  {"lm_head_ms", Ms(d.logits_us / n)},
                  {"other_ms", Ms((d.wall_us - parts) / n)},
                  {"thread_wait_ms", Ms(d.wait_us / n)},
                  {"note",
                   "parts are wall time on the engine thread; attention_projections_ms is part of "
                   "attention_ms; thread_wait_ms (the engine thread waiting for pool threads at the end "
                   "of parallel loops) is spread over all parts; other = sampling and bookkeeping"}});
  }
  const PartSums& p = best_prefill_run.prefill;
  if (p.steps > 0) {
    json line = {{"bench", "prefill"},
                 {"model", name},
                 {"prompt_tokens", prompt_tokens},
                 {"prefill_ms", Ms(p.wall_us)},
                 {"attention_ms", Ms(p.attention_us)},
                 {"router_ms", Ms(p.router_us)},
                 {"combine_ms", Ms(p.combine_us)},
                 {"shared_expert_ms", Ms(p.shared_expert_us)},
                 {"dense_mlp_ms", Ms(p.dense_mlp_us)},
                 {"lm_head_ms", Ms(p.logits_us)},
                 {"thread_wait_ms", Ms(p.wait_us)}};
    AddGemmFigures(c, prompt_tokens, p, best_prefill_run.prefill_projection_flops, gemm_dtypes, machine, &line);
    EmitJsonLine(line);
  }

  for (int length : ttft_prompts) {
    const GenerationRequest ttft_request = Request(c, length, 1);
    const double rss_before = PeakRssMb();
    TimedRun fastest;
    double best_ttft = 0;
    for (int rep = 0; rep < std::max(absl::GetFlag(FLAGS_reps), 1); ++rep) {
      TANDEM_ASSIGN_OR_RETURN(TimedRun run, TimedGenerate(rt, ttft_request));
      if (best_ttft == 0 || run.result.timing.time_to_first_token_ms < best_ttft) {
        best_ttft = run.result.timing.time_to_first_token_ms;
        fastest = std::move(run);
      }
    }
    const PartSums& t = fastest.prefill;
    json line = {{"bench", "ttft"},
                 {"model", name},
                 {"prompt_tokens", length},
                 {"ttft_ms", best_ttft},
                 {"prefill_tokens_per_s", length / (best_ttft / 1e3)},
                 {"attention_ms", Ms(t.attention_us)},
                 {"attention_core_ms", Ms(t.attention_us - t.projection_us)},
                 {"thread_wait_ms", Ms(t.wait_us)},
                 {"peak_rss_growth_mb", PeakRssMb() - rss_before}};
    AddGemmFigures(c, length, t, fastest.prefill_projection_flops, gemm_dtypes, machine, &line);
    EmitJsonLine(line);
  }
  return absl::OkStatus();
}

absl::StatusOr<Machine> MeasureMachine(int threads) {
  ThreadPool pool({.num_threads = threads, .name = "probe"});
  Machine machine;
  TANDEM_ASSIGN_OR_RETURN(const MemoryBandwidth bw, MeasureMemoryBandwidth(&pool));
  machine.triad_gb_s = bw.triad_gb_s;
  machine.read_gb_s = bw.read_gb_s;
  json peaks = json::object();
  for (PeakInstruction instruction : {PeakInstruction::kAvx2Fma, PeakInstruction::kAvx512Fma, PeakInstruction::kBf16Dot,
                                      PeakInstruction::kVnniDot, PeakInstruction::kAmxBf16}) {
    if (PeakInstructionIsa(instruction) > ActiveIsa()) continue;
    TANDEM_ASSIGN_OR_RETURN(const ComputePeak peak, MeasureComputePeak(instruction, &pool));
    machine.peak_gflops[instruction] = peak.gflops;
    peaks[PeakInstructionName(instruction)] = peak.gflops;
  }
  EmitJsonLine({{"bench", "machine"},
                {"threads", threads},
                {"triad_gb_s", bw.triad_gb_s},
                {"triad_with_write_allocate_gb_s", bw.triad_with_write_allocate_gb_s},
                {"read_only_gb_s", bw.read_gb_s},
                {"read_one_stream_gb_s", bw.read_one_stream_gb_s},
                {"read_four_streams_gb_s", bw.read_four_streams_gb_s},
                {"peak_gflops", peaks}});
  return machine;
}

absl::Status Main() {
  TANDEM_ASSIGN_OR_RETURN(const KernelFlags kernel, ApplyKernelFlags());
  const int threads = absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads) : AvailableCores();
  SetBenchStamp("kernel_plan", ProcessKernelPlan().Spec());
  TANDEM_ASSIGN_OR_RETURN(const Machine machine, MeasureMachine(threads));
  int failures = 0;
  auto report = [&](const absl::Status& s, const std::string& name) {
    if (!s.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), std::string(s.message()).c_str());
      ++failures;
    }
  };
  if (!absl::GetFlag(FLAGS_model_dir).empty()) {
    const std::string weights = absl::GetFlag(FLAGS_gguf_weights);
    if (weights != "quantized" && weights != "experts" && weights != "dense" && weights != "bf16") {
      return absl::InvalidArgumentError(
          absl::StrCat("--gguf_weights \"", weights, "\": expected quantized, experts, dense or bf16"));
    }
    const std::string load_weights = absl::GetFlag(FLAGS_load_weights);
    TANDEM_ASSIGN_OR_RETURN(const bool copy, CopyWeightsFromFlag(load_weights));
    ModelLoadOptions load{.num_threads = threads, .copy_weights_to_memory = copy};
    SetBenchStamp("load_weights", load_weights);
    load.block_order = kernel.block_order;
    SetBenchStamp("block_order", BlockOrderName(load.block_order));
    load.quantized = QuantizedWeightsFor(weights == "quantized" || weights == "experts",
                                         weights == "quantized" || weights == "dense");
    SetBenchStamp("gguf_weights", weights);
    auto model = LoadModel(absl::GetFlag(FLAGS_model_dir), load);
    if (!model.ok()) return model.status();
    return BenchModel(std::move(*model), absl::GetFlag(FLAGS_model_dir), machine);
  }
  for (absl::string_view item : absl::StrSplit(absl::GetFlag(FLAGS_presets), ',', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(item, ':');
    SyntheticModelSpec spec{.preset = parts[0]};
    if (parts.size() > 1 && !absl::SimpleAtoi(parts[1], &spec.num_layers)) {
      report(absl::InvalidArgumentError("--presets: layers must be an integer"), std::string(item));
      continue;
    }
    auto model = LoadSyntheticModel(spec, threads);
    if (!model.ok()) {
      report(model.status(), std::string(item));
      continue;
    }
    report(BenchModel(std::move(*model), std::string(item), machine), std::string(item));
  }
  return failures ? absl::InternalError(absl::StrCat(failures, " model(s) failed")) : absl::OkStatus();
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::SetProgramUsage("Prefill and decode throughput of whole models on the CPU, one sequence.");
  tandem::ParseProgramFlags(argc, argv);
  const absl::Status status = tandem::Main();
  if (!status.ok()) {
    LOG_ERROR("tandem-generate-bench: ", status.ToString());
    return 1;
  }
  return 0;
}
