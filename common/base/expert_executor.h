// The seam between the engine and whoever computes expert FFNs: the
// in-process CPU executor now, CPU worker processes and the GPU expert pool
// later. It lives in common/ so the coordinator never includes cpu_worker/.
//
// Legend: D hidden size, R rows routed to one expert.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"

namespace tandem {

// One expert's share of one layer: its rows, gathered contiguously.
struct ExpertWork {
  int expert = 0;
  int64_t num_rows = 0;
  const float* input = nullptr;  // [R, D] f32, post-attention-norm activations
  float* output = nullptr;       // [R, D] f32, FFN_e(input), written by the executor
};

class ExpertExecutor {
 public:
  virtual ~ExpertExecutor() = default;
  // Computes FFN_e for every entry of `work` in layer `layer`. Entries name
  // distinct experts. Called by the engine thread only.
  virtual absl::Status RunExperts(int layer, std::span<const ExpertWork> work) = 0;
};

}  // namespace tandem
