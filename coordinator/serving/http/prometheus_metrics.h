// The server's figures in the Prometheus text exposition format (version
// 0.0.4): the scheduler's requests by outcome, tokens, queue depth, KV
// cache use, step latency and per-layer time; the CPU workers' health; the
// orchestrator's per-layer placement counters, hit rates and migrations;
// and the HTTP front end's own responses by path and status. Pure: figures
// in, text out.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/generation/scheduler.h"
#include "coordinator/serving/http/http_transport.h"
#include "coordinator/serving/serving.h"

namespace tandem {

struct HttpMetrics {
  bool ready = false;  // the model is loaded and serving
  // (path, HTTP status) -> responses
  std::map<std::pair<std::string, int>, int64_t> responses;
  HttpTransportStats transport;  // connections, request memory, refusals
};

// `orchestrator_json` is ServingOptions::orchestrator_json's text (or
// empty); its numeric fields become tandem_orchestrator_* series.
std::string PrometheusText(const SchedulerStats& stats, const std::vector<WorkerHealthInfo>& workers,
                           const std::string& orchestrator_json, const HttpMetrics& http);

// Before the model is loaded: the HTTP series and tandem_ready 0.
std::string PrometheusLoadingText(const HttpMetrics& http);

}  // namespace tandem
