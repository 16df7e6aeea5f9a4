// Records what the router did, as the engine runs (a ForwardObserver):
//   - a routing trace (routing_trace_io.h): per step, per sequence, per
//     layer, the rows routed to each expert — what tandem-sim replays;
//   - an expert usage profile (coordinator/planner/profile_io.h): tokens
//     per expert per layer over everything recorded — the input of the
//     `popularity` placement.
// Trace lines are written (and flushed) at the end of every successful
// step, so a killed process leaves a readable trace; the usage profile is
// written by Finish (or the destructor).
//
// Owns its output file. Engine thread only (the observer calls, Finish);
// usage() and steps_recorded() from the same thread.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "coordinator/engine/forward_observer.h"
#include "coordinator/orchestration/planner/placement.h"

namespace tandem {

struct RoutingRecorderOptions {
  std::string trace_path;  // empty: no trace
  std::string usage_path;  // empty: no usage file (usage() still counts)
  std::string model_name;  // written into both files
};

class RoutingRecorder final : public ForwardObserver {
 public:
  // Opens (truncates) the trace file and writes its header. InvalidArgument
  // naming the path when it cannot be opened.
  static absl::StatusOr<std::unique_ptr<RoutingRecorder>> Create(const ModelConfig& config,
                                                                 const RoutingRecorderOptions& options);
  ~RoutingRecorder() override;  // Finish, logging a failure

  void OnStepBegin(const ForwardStep& step) override;
  void OnRouting(const ForwardStep& step, int layer, std::span<const int32_t> experts,
                 int num_experts_per_token) override;
  void OnStepEnd(const ForwardStep& step, const absl::Status& status) override;

  // Flushes the trace and writes the usage profile. Returns the first error
  // any write met (a failed write does not stop inference). Idempotent.
  absl::Status Finish();

  const ExpertUsage& usage() const { return usage_; }
  int64_t steps_recorded() const { return steps_recorded_; }

 private:
  RoutingRecorder(const ModelConfig& config, const RoutingRecorderOptions& options);

  RoutingRecorderOptions options_;
  int num_layers_ = 0;
  int num_experts_ = 0;
  std::ofstream trace_;
  ExpertUsage usage_;
  std::vector<std::vector<int32_t>> rows_;  // [sequence in step][L * E] this step
  int64_t steps_recorded_ = 0;
  absl::Status status_;
  bool finished_ = false;
};

}  // namespace tandem
