// Routing traces on disk (`tandem-routing-trace/1`, JSON lines), as the
// engine's recorder (routing_recorder.h) writes them and tandem-sim
// (coordinator/planner/simulator.h) replays them:
//
//   {"format": "tandem-routing-trace/1", "model": "…", "num_layers": L,
//    "num_experts": E, "num_experts_per_token": K}
//   {"step": 0, "sequence": 0, "phase": "prefill", "start": 0, "tokens": 20,
//    "rows": [[…E…], …L…]}
//   {"step": 1, "sequence": 0, "phase": "decode", "start": 20, "tokens": 1, "rows": […]}
//
// One line per sequence per step: rows[l][e] is how many of that sequence's
// tokens layer l routed to expert e. Reading merges the lines of one step
// (a batch) into one TraceStep — rows and tokens summed, prefill when any
// line is — and numbers trace sequences so that a new one begins at every
// step holding a sequence that starts at position 0 ("start": 0), which is
// when the engine tells the cache policies a sequence starts.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/orchestration/planner/synthetic_trace.h"

namespace tandem {

inline constexpr const char* kRoutingTraceFormat = "tandem-routing-trace/1";

// The first line ("dense_layers" only when the model has some).
std::string RoutingTraceHeaderLine(const std::string& model, int num_layers, int num_experts, int num_experts_per_token,
                                   std::span<const int64_t> dense_layers = {});

// One sequence's part of one step. rows: [L * E].
struct RoutingTraceLine {
  int64_t step = 0;
  int64_t sequence = 0;
  Phase phase = Phase::kDecode;
  int64_t start_position = 0;
  int64_t tokens = 0;
  std::span<const int32_t> rows;
};
std::string RoutingTraceStepLine(const RoutingTraceLine& line, int num_layers, int num_experts);

// InvalidArgument naming the file, the line number and the field.
absl::StatusOr<RoutingTrace> ParseRoutingTrace(const std::string& text, const std::string& file_name);
// NotFound when the file cannot be read.
absl::StatusOr<RoutingTrace> LoadRoutingTrace(const std::string& path);
// Writes every TraceStep as one line (its own sequence, "start" 0 on the
// first step of each sequence), so Load gives the same trace back.
absl::Status SaveRoutingTrace(const RoutingTrace& trace, const std::string& model, const std::string& path);

}  // namespace tandem
