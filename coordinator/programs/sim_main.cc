// tandem-sim (skeleton): replays a routing trace through combinations of
// policies under a hardware profile and prints one JSON line per
// combination: TTFT, per-token latency, hit rate, migrations, CPU/GPU/copy
// busy time. The trace is synthetic (coordinator/planner/synthetic_trace.h,
// matching the papers' published routing statistics), or one the engine
// recorded (--trace, from tandem-generate --record_trace; with --usage the
// popularity placement uses a recorded usage profile instead of a synthetic
// calibration trace).
//
// Presets, each the paper's own combination (DAOP's lossy pre-calculation
// is not modelled; its exact part is):
//   fiddler — threshold execution, static cache, popularity placement
//   collab  — hit → GPU, miss → CPU (cpu-only execution), lru cache,
//             first-layers placement (--lru_ways ways per covered layer)
//   daop    — cpu-only execution, sequence cache, per-layer popularity
//   offload — gpu-only execution, lru cache over every layer
//   ours    — makespan execution, adaptive cache, per-layer popularity
//   llamacpp — cpu-only execution, static cache, whole first layers on the
//             GPU (llama.cpp's -ngl: first-layers with every expert a way)
// or "execution/cache/placement" triples, e.g. makespan/lru/first-layers.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/json_lines.h"
#include "common/base/flags_usage.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "coordinator/orchestration/planner/profile_io.h"
#include "coordinator/orchestration/planner/routing_trace_io.h"
#include "coordinator/orchestration/planner/simulator.h"
#include "coordinator/orchestration/planner/synthetic_trace.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, profile, "bench/profiles/collab-rtx4090-tr7960x-mixtral.json", "hardware profile");
ABSL_FLAG(std::string, presets, "fiddler,collab,daop,offload,ours", "policy combinations (see the file comment)");
ABSL_FLAG(int, workers, 1, "CPU workers the profile's whole CPU is divided into");
ABSL_FLAG(std::string, division, "split", "split or shard");
ABSL_FLAG(int, slots, 0, "GPU expert slots; 0: the profile's");
ABSL_FLAG(int, lru_ways, 4, "collab/offload: ways per cached layer (the paper's (N, M) = (slots / M, M))");
ABSL_FLAG(double, non_expert_us, 0, "non-expert time per layer (attention, norms, router), the same for every policy");
ABSL_FLAG(int, leading_dense_layers, 0,
          "the model's first N layers are dense (DeepSeek-V3: 3, GLM-4.5: 3): no routing, no expert slots");
ABSL_FLAG(int, prompt, 128, "prompt tokens per sequence");
ABSL_FLAG(int, decode, 128, "decode steps per sequence");
ABSL_FLAG(int, beams, 1, "rows per decode step (beam width or batch)");
ABSL_FLAG(int, sequences, 4, "sequences, one after another");
ABSL_FLAG(std::string, trace, "", "recorded routing trace (tandem-routing-trace/1); empty = synthetic");
ABSL_FLAG(std::string, usage, "", "expert usage profile for popularity placement; empty = from a synthetic trace");
ABSL_FLAG(std::string, scenario, "", "scenario name copied into every result line (bench/run_scenarios.sh)");
ABSL_FLAG(bool, per_layer, false,
          "also print each preset's plan per layer (kind \"layer\": slots, GPU runs, CPU runs, copies, time)");
ABSL_FLAG(uint64_t, seed, 2, "routing seed of the measured trace (the calibration trace uses seed + 1000)");

namespace tandem {
namespace {

using Json = nlohmann::json;

absl::StatusOr<SimOptions> Preset(const std::string& name, const RoutingTrace& trace, int slots, int workers,
                                  ExpertDivision division) {
  std::string spec = name;
  if (name == "fiddler") spec = "threshold/static/popularity";
  if (name == "collab") spec = "cpu-only/lru/first-layers";
  if (name == "daop") spec = "cpu-only/sequence/popularity-balanced";
  if (name == "offload") spec = "gpu-only/lru-all/uniform";
  if (name == "ours") spec = "makespan/adaptive/popularity-balanced";
  if (name == "llamacpp") spec = "cpu-only/static/first-layers-whole";
  const std::vector<std::string> parts = absl::StrSplit(spec, '/');
  if (parts.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("preset \"", name, "\" is neither a preset nor execution/cache/placement"));
  }
  SimOptions o;
  TANDEM_ASSIGN_OR_RETURN(o.planner.policy, ParseExecutionPolicy(parts[0]));
  o.planner.division = division;
  o.planner.num_cpu_workers = workers;
  const int L = trace.num_layers, E = trace.num_experts;
  std::string placement = parts[2];
  // first-layers-whole: every expert of a covered layer is a way (llama.cpp
  // offloads whole layers).
  const bool whole_layers = placement == "first-layers-whole";
  if (whole_layers) placement = "first-layers";
  const int ways = whole_layers ? E : std::min(absl::GetFlag(FLAGS_lru_ways), E);
  std::string cache = parts[1];
  const bool lru_all = cache == "lru-all";
  if (lru_all) cache = "lru";
  TANDEM_ASSIGN_OR_RETURN(o.cache.kind, ParseCachePolicyKind(cache));
  // A dense layer (the trace's dense_layers) holds no expert: the slots
  // are shared among the MoE layers.
  const int moe_layers = std::max(1, L - static_cast<int>(trace.dense_layers.size()));
  if (lru_all) {
    o.cache.lru = {L, std::max(1, std::min(E, slots / moe_layers))};
  } else {
    o.cache.lru = {LayersCoveringMoeLayers(L, trace.dense_layers, std::min(moe_layers, slots / std::max(1, ways))),
                   ways};
  }
  o.cache.adaptive.division = division;
  o.cache.adaptive.num_experts_per_token = trace.num_experts_per_token;
  o.placement.balance_layers = placement == "popularity-balanced";
  if (o.placement.balance_layers) placement = "popularity";
  TANDEM_ASSIGN_OR_RETURN(o.placement.policy, ParsePlacementPolicy(placement));
  o.placement.num_slots = slots;
  o.placement.ways = o.cache.kind == CachePolicyKind::kLru ? o.cache.lru.num_ways : ways;
  o.non_expert_us_per_layer = absl::GetFlag(FLAGS_non_expert_us);
  return o;
}

// A synthetic trace routes every layer; a model whose first layers are
// dense (DeepSeek-V3, GLM-4.5) routes none there: their rows become zero and
// the trace names them, so no slot or run is spent on them.
void MakeLeadingLayersDense(int count, RoutingTrace& trace) {
  for (int l = 0; l < std::min(count, trace.num_layers - 1); ++l) {
    if (std::find(trace.dense_layers.begin(), trace.dense_layers.end(), l) != trace.dense_layers.end()) continue;
    trace.dense_layers.push_back(l);
    for (TraceStep& step : trace.steps)
      std::fill_n(step.rows.begin() + static_cast<int64_t>(l) * trace.num_experts, trace.num_experts, 0);
  }
  std::sort(trace.dense_layers.begin(), trace.dense_layers.end());
}

int Run() {
  absl::StatusOr<HardwareProfile> profile = LoadHardwareProfile(absl::GetFlag(FLAGS_profile));
  if (!profile.ok()) {
    LOG_ERROR(profile.status().ToString());
    return 1;
  }
  CostModelParams params = profile->cost;
  const int workers = absl::GetFlag(FLAGS_workers);
  absl::StatusOr<CostModel> cost = CostModelForWorkers(params, workers);
  absl::StatusOr<ExpertDivision> division = ParseExpertDivision(absl::GetFlag(FLAGS_division));
  if (!cost.ok() || !division.ok()) {
    LOG_ERROR(cost.ok() ? division.status().ToString() : cost.status().ToString());
    return 1;
  }
  const int slots = absl::GetFlag(FLAGS_slots) > 0 ? absl::GetFlag(FLAGS_slots) : profile->model.gpu_expert_slots;

  SyntheticTraceOptions trace_options;
  trace_options.num_layers = profile->model.num_layers;
  trace_options.num_experts = profile->model.num_experts;
  trace_options.num_experts_per_token = profile->model.num_experts_per_token;
  trace_options.num_sequences = absl::GetFlag(FLAGS_sequences);
  trace_options.prompt_tokens = absl::GetFlag(FLAGS_prompt);
  trace_options.decode_steps = absl::GetFlag(FLAGS_decode);
  trace_options.decode_rows_per_step = absl::GetFlag(FLAGS_beams);
  trace_options.seed = absl::GetFlag(FLAGS_seed);
  const std::string trace_file = absl::GetFlag(FLAGS_trace);
  absl::StatusOr<RoutingTrace> trace =
      trace_file.empty() ? GenerateSyntheticTrace(trace_options) : LoadRoutingTrace(trace_file);
  if (!trace.ok()) {
    LOG_ERROR(trace.status().ToString());
    return 1;
  }
  MakeLeadingLayersDense(absl::GetFlag(FLAGS_leading_dense_layers), *trace);
  ExpertUsage usage;
  if (!absl::GetFlag(FLAGS_usage).empty()) {
    absl::StatusOr<ExpertUsage> loaded = LoadExpertUsage(absl::GetFlag(FLAGS_usage));
    if (!loaded.ok()) {
      LOG_ERROR(loaded.status().ToString());
      return 1;
    }
    usage = *loaded;
  } else {
    SyntheticTraceOptions calibration_options = trace_options;
    calibration_options.num_layers = trace->num_layers;
    calibration_options.num_experts = trace->num_experts;
    calibration_options.num_experts_per_token = trace->num_experts_per_token;
    calibration_options.seed += 1000;
    calibration_options.num_sequences = 8;
    absl::StatusOr<RoutingTrace> calibration = GenerateSyntheticTrace(calibration_options);
    if (!calibration.ok()) {
      LOG_ERROR(calibration.status().ToString());
      return 1;
    }
    usage = TraceUsage(*calibration);
  }
  const TraceStats stats = MeasureTrace(*trace);
  Json trace_line = {{"kind", "trace"},
                     {"profile", profile->name},
                     {"trace", trace_file.empty() ? std::string("synthetic") : trace_file},
                     {"layers", trace->num_layers},
                     {"experts", trace->num_experts},
                     {"steps", trace->steps.size()},
                     {"slots", slots},
                     {"workers", cost->num_cpu_workers()},
                     {"popularity_mean", stats.popularity_mean},
                     {"popularity_sd", stats.popularity_sd},
                     {"token_reuse", stats.token_reuse},
                     {"layer_same_id", stats.layer_same_id},
                     {"prefill_decode_cosine", stats.prefill_decode_cosine}};
  if (trace_file.empty()) {  // what the synthetic trace was made of
    trace_line["prompt"] = trace_options.prompt_tokens;
    trace_line["decode"] = trace_options.decode_steps;
    trace_line["beams"] = trace_options.decode_rows_per_step;
    trace_line["sequences"] = trace_options.num_sequences;
  }
  EmitJsonLine(trace_line);

  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_presets), ',', absl::SkipEmpty())) {
    absl::StatusOr<SimOptions> options = Preset(std::string(name), *trace, slots, cost->num_cpu_workers(), *division);
    if (!options.ok()) {
      LOG_ERROR(options.status().ToString());
      return 1;
    }
    options->usage = &usage;
    absl::StatusOr<SimResult> r = Simulate(*trace, *cost, *options);
    if (!r.ok()) {
      LOG_ERROR(std::string(name), ": ", r.status().ToString());
      return 1;
    }
    // Generated tokens (one per decode step per sequence; beams are
    // alternatives of one output) over the whole run, prefill included.
    int64_t generated = 0;
    for (const TraceStep& step : trace->steps) generated += step.phase == Phase::kDecode ? 1 : 0;
    EmitJsonLine({{"kind", "result"},
                  {"scenario", absl::GetFlag(FLAGS_scenario)},
                  {"profile", profile->name},
                  {"slots", slots},
                  {"lru_ways", absl::GetFlag(FLAGS_lru_ways)},
                  {"prompt", trace_options.prompt_tokens},
                  {"decode", trace_options.decode_steps},
                  {"beams", trace_options.decode_rows_per_step},
                  {"sequences", trace_options.num_sequences},
                  {"preset", std::string(name)},
                  {"execution", ExecutionPolicyName(options->planner.policy)},
                  {"cache", CachePolicyKindName(options->cache.kind)},
                  {"placement", PlacementPolicyName(options->placement.policy)},
                  {"ttft_ms", r->ttft_us / 1000},
                  {"decode_ms_per_step", r->decode_step_us / 1000},
                  {"decode_steps_per_s", r->decode_tokens_per_s},
                  {"total_s", r->total_us / 1e6},
                  {"e2e_tokens_per_s", r->total_us > 0 ? 1e6 * static_cast<double>(generated) / r->total_us : 0},
                  {"migrations", r->planner_migrations + r->cache_migrations},
                  {"hit_rate", r->hit_rate()},
                  {"inflight_waits", r->inflight_waits},
                  {"planner_migrations", r->planner_migrations},
                  {"cache_migrations", r->cache_migrations},
                  {"cache_admissions", r->cache_admissions},
                  {"cpu_runs", r->cpu_runs},
                  {"cpu_busy_s", r->cpu_busy_us / 1e6},
                  {"gpu_busy_s", r->gpu_busy_us / 1e6},
                  {"copy_busy_s", r->copy_busy_us / 1e6}});
    if (!absl::GetFlag(FLAGS_per_layer)) continue;
    for (size_t l = 0; l < r->layers.size(); ++l) {
      const SimLayerResult& layer = r->layers[l];
      const bool dense = std::find(trace->dense_layers.begin(), trace->dense_layers.end(), static_cast<int64_t>(l)) !=
                         trace->dense_layers.end();
      EmitJsonLine({{"kind", "layer"},
                    {"preset", std::string(name)},
                    {"layer", l},
                    {"dense", dense},
                    {"slots", layer.slots},
                    {"expert_runs", layer.expert_runs},
                    {"gpu_runs", layer.gpu_hits},
                    {"migrations", layer.migrations},
                    {"cpu_runs", layer.cpu_runs},
                    {"ms", layer.makespan_us / 1000}});
    }
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::SetProgramUsage(
      "tandem-sim: replays a routing trace through combinations of policies under a hardware profile.");
  tandem::ParseProgramFlags(argc, argv);
  return tandem::Run();
}
