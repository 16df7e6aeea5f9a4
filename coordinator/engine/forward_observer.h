// What the engine tells interested parties about each forward pass (a
// "step"): which sequences it runs and whether each is a prefill or a
// decode, then, per layer, the router's choice for every row. The expert
// orchestrator uses it for its cache policies (phase, new sequences); the
// routing recorder writes it to a trace. Observers are optional
// (EngineOptions::observers) and borrowed; they are called on the engine
// thread, inside Engine::Forward, and must not call back into the engine.
//
// Legend: T rows in the step, K num_experts_per_token.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"

namespace tandem {

// One sequence's part of a step.
struct StepSequence {
  // Stable for the sequence's life: the engine gives a new id to every
  // sequence that starts at position 0 (and to a KV it has not seen, e.g. a
  // forked beam).
  int64_t id = 0;
  int64_t start_position = 0;
  int64_t num_tokens = 0;
  int64_t row_offset = 0;     // its first row in the step
  bool prefill = false;       // a prompt chunk (more than one token, or position 0); else one decode token
  bool new_sequence = false;  // its first step: position 0, or past a cached prompt prefix (a forked beam is not new)
};

struct ForwardStep {
  int64_t index = 0;  // steps since the engine was made
  int64_t rows = 0;   // T
  std::span<const StepSequence> sequences;
  bool prefill = false;       // some sequence in it is a prefill
  bool new_sequence = false;  // some sequence in it is new
};

class ForwardObserver {
 public:
  virtual ~ForwardObserver() = default;
  // Before the first layer.
  virtual void OnStepBegin(const ForwardStep& step) {}
  // After the router of `layer`, before its experts: experts[t * K + j] is
  // row t's j-th expert. In the last layer `step` has only the rows whose
  // logits are asked for (a prefill's last token), its sequences' row_offset
  // and num_tokens counting those.
  virtual void OnRouting(const ForwardStep& step, int layer, std::span<const int32_t> experts,
                         int num_experts_per_token) {}
  // After the step, with its status (a failed step changed no sequence).
  virtual void OnStepEnd(const ForwardStep& step, const absl::Status& status) {}
};

}  // namespace tandem
