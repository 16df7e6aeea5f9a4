#include "coordinator/serving/http/prometheus_metrics.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace tandem {
namespace {

// One metric family: HELP and TYPE once, then its samples.
class Family {
 public:
  Family(std::string* out, std::string name, absl::string_view type, absl::string_view help)
      : out_(out), name_(std::move(name)) {
    absl::StrAppend(out_, "# HELP ", name_, " ", help, "\n# TYPE ", name_, " ", type, "\n");
  }
  void Sample(double value, absl::string_view labels = "") {
    absl::StrAppend(out_, name_, labels.empty() ? "" : absl::StrCat("{", labels, "}"), " ", Number(value), "\n");
  }

 private:
  static std::string Number(double v) {
    if (v == static_cast<double>(static_cast<int64_t>(v)) && std::abs(v) < 1e15) {
      return absl::StrCat(static_cast<int64_t>(v));
    }
    return absl::StrCat(v);
  }
  std::string* out_;
  std::string name_;
};

std::string Label(absl::string_view name, absl::string_view value) {
  return absl::StrCat(name, "=\"", absl::StrReplaceAll(value, {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}}), "\"");
}

void AppendHttp(std::string* out, const HttpMetrics& http) {
  Family ready(out, "tandem_ready", "gauge", "1 when the model is loaded and every CPU worker is healthy");
  ready.Sample(http.ready ? 1 : 0);
  Family responses(out, "tandem_http_responses_total", "counter", "HTTP responses by path and status code");
  for (const auto& [key, count] : http.responses) {
    responses.Sample(static_cast<double>(count),
                     absl::StrCat(Label("path", key.first), ",", Label("code", absl::StrCat(key.second))));
  }
  const HttpTransportStats& t = http.transport;
  Family open(out, "tandem_http_open_connections", "gauge", "HTTP connections open now");
  open.Sample(static_cast<double>(t.open_connections));
  Family handling(out, "tandem_http_requests_in_handlers", "gauge", "HTTP requests being handled now");
  handling.Sample(static_cast<double>(t.requests_in_handlers));
  Family queued(out, "tandem_http_requests_queued", "gauge", "HTTP requests waiting for a handler thread");
  queued.Sample(static_cast<double>(t.requests_queued));
  Family memory(out, "tandem_http_request_memory_bytes", "gauge",
                "bytes held by HTTP requests in flight: bodies and parsed JSON");
  memory.Sample(static_cast<double>(t.memory_in_use_bytes));
  Family limit(out, "tandem_http_request_memory_limit_bytes", "gauge",
               "the most HTTP requests in flight may hold (--http_max_request_memory_mb)");
  limit.Sample(static_cast<double>(t.memory_limit_bytes));
  Family closed(out, "tandem_http_connections_closed_total", "counter",
                "HTTP connections the server closed, by reason");
  closed.Sample(static_cast<double>(t.header_timeouts), Label("reason", "header_timeout"));
  closed.Sample(static_cast<double>(t.body_timeouts), Label("reason", "body_timeout"));
  closed.Sample(static_cast<double>(t.idle_evictions), Label("reason", "idle_at_cap"));
  Family refused(out, "tandem_http_overload_refusals_total", "counter",
                 "HTTP requests answered 503 because the queue or the request memory was full");
  refused.Sample(static_cast<double>(t.overload_refusals));
  Family gone(out, "tandem_http_clients_gone_total", "counter",
              "HTTP clients that closed their connection while their request was handled");
  gone.Sample(static_cast<double>(t.clients_gone));
}

void AppendScheduler(std::string* out, const SchedulerStats& s) {
  Family uptime(out, "tandem_uptime_seconds", "gauge", "seconds since the scheduler started");
  uptime.Sample(s.uptime_s);
  Family requests(out, "tandem_requests_total", "counter", "finished requests by outcome");
  requests.Sample(static_cast<double>(s.requests_succeeded), Label("outcome", "succeeded"));
  requests.Sample(static_cast<double>(s.requests_failed), Label("outcome", "failed"));
  requests.Sample(static_cast<double>(s.requests_cancelled), Label("outcome", "cancelled"));
  requests.Sample(static_cast<double>(s.requests_rejected), Label("outcome", "rejected"));
  Family received(out, "tandem_requests_received_total", "counter", "requests submitted to the scheduler");
  received.Sample(static_cast<double>(s.requests_total));
  Family active(out, "tandem_requests_active", "gauge", "requests decoding now");
  active.Sample(static_cast<double>(s.requests_active));
  Family waiting(out, "tandem_queue_depth", "gauge", "requests waiting for admission");
  waiting.Sample(static_cast<double>(s.requests_waiting));
  Family sequences(out, "tandem_active_sequences", "gauge", "sequences in the batch (a beam search counts each beam)");
  sequences.Sample(static_cast<double>(s.active_sequences));
  Family prompt(out, "tandem_prompt_tokens_total", "counter", "prompt tokens prefilled");
  prompt.Sample(static_cast<double>(s.prompt_tokens));
  Family generated(out, "tandem_generated_tokens_total", "counter", "tokens generated");
  generated.Sample(static_cast<double>(s.generated_tokens));
  Family steps(out, "tandem_steps_total", "counter", "forward steps run");
  steps.Sample(static_cast<double>(s.steps));
  Family tps(out, "tandem_tokens_per_second", "gauge", "generated tokens per second over the recent window");
  tps.Sample(s.tokens_per_s);
  Family step_ms(out, "tandem_step_latency_ms", "gauge", "mean forward step time over the recent window");
  step_ms.Sample(s.mean_step_ms);
  Family rows(out, "tandem_batch_rows", "gauge", "mean rows per forward step over the recent window");
  rows.Sample(s.mean_batch_rows);
  Family kv_used(out, "tandem_kv_blocks_in_use", "gauge", "KV cache blocks held by sequences");
  kv_used.Sample(static_cast<double>(s.kv_blocks_in_use));
  Family kv_cached(out, "tandem_kv_blocks_cached", "gauge",
                   "KV cache blocks of cached prompt prefixes that no sequence holds (reusable memory)");
  kv_cached.Sample(static_cast<double>(s.kv_blocks_cached));
  Family cache_hits(out, "tandem_prompt_cache_hit_tokens_total", "counter",
                    "prompt tokens read from the prompt cache instead of prefilled");
  cache_hits.Sample(static_cast<double>(s.prompt_cache_hit_tokens));
  Family cache_evictions(out, "tandem_prompt_cache_evictions_total", "counter",
                         "cached prompt blocks reused for new sequences' memory");
  cache_evictions.Sample(static_cast<double>(s.prompt_cache_evictions));
  Family kv_total(out, "tandem_kv_blocks_total", "gauge", "KV cache blocks in the pool");
  kv_total.Sample(static_cast<double>(s.kv_blocks_total));
  Family kv_usage(out, "tandem_kv_cache_usage_ratio", "gauge", "fraction of the KV cache in use");
  kv_usage.Sample(
      s.kv_blocks_total > 0 ? static_cast<double>(s.kv_blocks_in_use) / static_cast<double>(s.kv_blocks_total) : 0.0);
  Family layer(out, "tandem_layer_time_ms", "gauge", "mean time per step in each layer's parts over the recent window");
  for (size_t i = 0; i < s.mean_layers.size(); ++i) {
    const std::string l = Label("layer", absl::StrCat(i));
    layer.Sample(s.mean_layers[i].attention_us / 1000.0, absl::StrCat(l, ",", Label("part", "attention")));
    layer.Sample(s.mean_layers[i].router_us / 1000.0, absl::StrCat(l, ",", Label("part", "router")));
    layer.Sample(s.mean_layers[i].experts_us / 1000.0, absl::StrCat(l, ",", Label("part", "experts")));
  }
}

void AppendWorkers(std::string* out, const std::vector<WorkerHealthInfo>& workers) {
  Family healthy(out, "tandem_worker_healthy", "gauge", "1 when the CPU worker answers, 0 when it is down");
  for (const WorkerHealthInfo& w : workers) healthy.Sample(w.healthy ? 1 : 0, Label("worker", w.address));
}

// Every numeric field of the orchestrator's totals and layers, and its time sums.
void AppendOrchestrator(std::string* out, const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("orchestrator") || !j["orchestrator"].is_object()) return;
  const nlohmann::json& o = j["orchestrator"];
  if (o.contains("hit_rate") && o["hit_rate"].is_number()) {
    Family(out, "tandem_orchestrator_hit_rate", "gauge", "expert runs that found their expert resident on the GPU")
        .Sample(o["hit_rate"].get<double>());
  }
  for (const char* key : {"num_slots", "placed", "steps", "layer_plans"}) {
    if (o.contains(key) && o[key].is_number()) {
      Family(out, absl::StrCat("tandem_orchestrator_", key), "gauge", absl::StrCat("orchestrator ", key))
          .Sample(o[key].get<double>());
    }
  }
  if (o.contains("layers") && o["layers"].is_array() && !o["layers"].empty() && o["layers"][0].is_object()) {
    for (const auto& [key, first] : o["layers"][0].items()) {
      if (!first.is_number()) continue;
      Family family(out, absl::StrCat("tandem_orchestrator_layer_", key, "_total"), "counter",
                    absl::StrCat("orchestrator per-layer ", key, " (expert runs, GPU hits, CPU runs, migrations)"));
      for (size_t i = 0; i < o["layers"].size(); ++i) {
        const nlohmann::json& v = o["layers"][i];
        if (v.is_object() && v.contains(key) && v[key].is_number()) {
          family.Sample(v[key].get<double>(), Label("layer", absl::StrCat(i)));
        }
      }
    }
  }
  if (o.contains("time_us") && o["time_us"].is_object()) {
    Family time(out, "tandem_orchestrator_time_us_total", "counter", "orchestrator time sums by part, microseconds");
    for (const auto& [key, v] : o["time_us"].items()) {
      if (v.is_number()) time.Sample(v.get<double>(), Label("part", key));
    }
  }
}

}  // namespace

std::string PrometheusText(const SchedulerStats& stats, const std::vector<WorkerHealthInfo>& workers,
                           const std::string& orchestrator_json, const HttpMetrics& http) {
  std::string out;
  AppendHttp(&out, http);
  AppendScheduler(&out, stats);
  AppendWorkers(&out, workers);
  if (!orchestrator_json.empty()) AppendOrchestrator(&out, orchestrator_json);
  return out;
}

std::string PrometheusLoadingText(const HttpMetrics& http) {
  std::string out;
  AppendHttp(&out, http);
  return out;
}

}  // namespace tandem
