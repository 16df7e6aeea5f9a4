// GET /v1/tandem/placement: where every expert is and how the experts are
// doing, per layer, for the web page's heatmap and time plots (and any
// dashboard). Built from what the server already keeps: the scheduler's
// window of steps (per-layer expert time), the orchestrator's stats
// (residency of every expert, hits, migrations, runs per expert) and where
// the CPU experts run (in-process, or the workers and their division).
// Pure: data in, JSON out.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "coordinator/generation/scheduler.h"
#include "coordinator/serving/serving.h"

namespace tandem {

// `orchestrator_json` is ServingOptions::orchestrator_json's text, or ""
// when the server runs no orchestrator (then every expert is "cpu" and the
// counts are absent). InvalidArgument when that text is not the JSON the
// orchestrator writes.
//
// {"object": "tandem.placement", "num_layers": L, "num_experts": E,
//  "experts_per_token": K, "cpu_workers": N (0: in this process),
//  "division": "split" | "shard" | "in-process", "orchestrated": bool,
//  "execution_policy", "cache_policy", "pool_kind", "num_slots", "used_slots",
//  "steps", "prompt_tokens", "generated_tokens", "tokens_per_s",
//  "requests_active", "uptime_s", "hit_rate", "migrations",
//  "layers": [{"layer", "expert_us_per_step", "attention_us_per_step",
//              "expert_us", "expert_runs", "gpu_hits", "hit_rate",
//              "migrations", "evictions", "cpu_runs"}, ...],
//  "experts": [[{"where": "gpu" | "migrating" | "cpu", "cpu_workers": [w...],
//                "gpu_runs", "cpu_runs"}, ... E], ... L]}
absl::StatusOr<nlohmann::ordered_json> PlacementJson(const ModelConfig& config, const SchedulerStats& stats,
                                                     const ServingOptions& serving,
                                                     const std::string& orchestrator_json);

}  // namespace tandem
