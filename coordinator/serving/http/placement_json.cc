#include "coordinator/serving/http/placement_json.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

// The CPU workers that hold (layer, expert): every worker under split (each
// its slice), the one ShardWorker names under shard, none in-process.
Json CpuWorkers(const ServingOptions& serving, int layer, int expert) {
  Json workers = Json::array();
  if (serving.num_cpu_workers < 1) return workers;
  if (serving.division == ExpertDivision::kShard) {
    workers.push_back(ShardWorker(layer, expert, serving.num_cpu_workers));
    return workers;
  }
  for (int w = 0; w < serving.num_cpu_workers; ++w) workers.push_back(w);
  return workers;
}

int64_t Int(const Json& j, const char* field) { return j.contains(field) ? j[field].get<int64_t>() : 0; }

// One layer's counts from the orchestrator's "layers" entry.
void AddOrchestratorLayer(const Json& l, Json* out) {
  const int64_t runs = Int(l, "expert_runs"), hits = Int(l, "gpu_hits");
  (*out)["expert_us"] = l.value("expert_us", 0.0);
  (*out)["expert_runs"] = runs;
  (*out)["gpu_hits"] = hits;
  (*out)["hit_rate"] = runs > 0 ? static_cast<double>(hits) / static_cast<double>(runs) : 0.0;
  (*out)["migrations"] = Int(l, "planner_migrations") + Int(l, "cache_migrations");
  (*out)["evictions"] = Int(l, "evictions");
  (*out)["cpu_runs"] = Int(l, "cpu_runs");
}

// The orchestrator's JSON, checked to have what the page reads.
absl::StatusOr<Json> ParseOrchestrator(const std::string& text, int layers, int experts) {
  Json root = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) return absl::InvalidArgumentError("orchestrator stats: not JSON");
  if (root.contains("orchestrator")) root = root["orchestrator"];  // the server wraps it beside precalc
  if (!root.contains("layers") || !root["layers"].is_array() || root["layers"].size() != static_cast<size_t>(layers)) {
    return absl::InvalidArgumentError(absl::StrCat("orchestrator stats: expected ", layers, " layers"));
  }
  const Json& cells = root["experts"];
  for (const char* field : {"residency", "gpu_runs", "cpu_runs"}) {
    if (!cells.contains(field) || cells[field].size() != static_cast<size_t>(layers)) {
      return absl::InvalidArgumentError(
          absl::StrCat("orchestrator stats: experts.", field, " is not [", layers, "][", experts, "]"));
    }
    for (const Json& row : cells[field]) {
      if (!row.is_array() || row.size() != static_cast<size_t>(experts)) {
        return absl::InvalidArgumentError(
            absl::StrCat("orchestrator stats: experts.", field, " is not [", layers, "][", experts, "]"));
      }
    }
  }
  return root;
}

const char* Where(int residency) {
  switch (residency) {
    case 1: return "gpu";
    case 2: return "migrating";
    default: return "cpu";
  }
}

}  // namespace

absl::StatusOr<Json> PlacementJson(const ModelConfig& config, const SchedulerStats& stats,
                                   const ServingOptions& serving, const std::string& orchestrator_json) {
  const int layers = static_cast<int>(config.num_hidden_layers), experts = static_cast<int>(config.num_local_experts);
  Json orchestrator;
  if (!orchestrator_json.empty()) {
    absl::StatusOr<Json> parsed = ParseOrchestrator(orchestrator_json, layers, experts);
    if (!parsed.ok()) return parsed.status();
    orchestrator = std::move(*parsed);
  }
  const bool orchestrated = orchestrator.is_object();
  Json out = {{"object", "tandem.placement"},
              {"num_layers", layers},
              {"num_experts", experts},
              {"experts_per_token", config.num_experts_per_tok},
              {"cpu_workers", serving.num_cpu_workers},
              {"division", serving.num_cpu_workers > 0 ? ExpertDivisionName(serving.division) : "in-process"},
              {"orchestrated", orchestrated}};
  if (orchestrated) {
    out["execution_policy"] = orchestrator.value("execution_policy", "");
    out["cache_policy"] = orchestrator.value("cache_policy", "");
    out["pool_kind"] = orchestrator.value("pool_kind", "");
    out["num_slots"] = Int(orchestrator, "num_slots");
    out["used_slots"] = orchestrator.contains("pool") ? Int(orchestrator["pool"], "used_slots") : 0;
    out["hit_rate"] = orchestrator.value("hit_rate", 0.0);
    const Json& total = orchestrator["total"];
    out["migrations"] = Int(total, "planner_migrations") + Int(total, "cache_migrations");
  }
  out["steps"] = stats.steps;
  out["prompt_tokens"] = stats.prompt_tokens;
  out["generated_tokens"] = stats.generated_tokens;
  out["tokens_per_s"] = stats.tokens_per_s;
  out["requests_active"] = stats.requests_active;
  out["uptime_s"] = stats.uptime_s;

  Json per_layer = Json::array();
  Json cells = Json::array();
  for (int l = 0; l < layers; ++l) {
    Json layer = {{"layer", l}};
    const bool timed = static_cast<size_t>(l) < stats.mean_layers.size();
    layer["expert_us_per_step"] = timed ? stats.mean_layers[static_cast<size_t>(l)].experts_us : 0.0;
    layer["attention_us_per_step"] = timed ? stats.mean_layers[static_cast<size_t>(l)].attention_us : 0.0;
    if (orchestrated) AddOrchestratorLayer(orchestrator["layers"][static_cast<size_t>(l)], &layer);
    per_layer.push_back(std::move(layer));

    Json row = Json::array();
    for (int e = 0; e < experts; ++e) {
      Json cell = {{"where", orchestrated ? Where(orchestrator["experts"]["residency"][l][e].get<int>()) : "cpu"},
                   {"cpu_workers", CpuWorkers(serving, l, e)}};
      if (orchestrated) {
        cell["gpu_runs"] = orchestrator["experts"]["gpu_runs"][l][e];
        cell["cpu_runs"] = orchestrator["experts"]["cpu_runs"][l][e];
      }
      row.push_back(std::move(cell));
    }
    cells.push_back(std::move(row));
  }
  out["layers"] = std::move(per_layer);
  out["experts"] = std::move(cells);
  return out;
}

}  // namespace tandem
