// The engine's one hook that may change a forward pass: after a layer's
// router, before its experts, it may rewrite the routing (and compute ahead).
// Used by lossy policies only (DAOP pre-calculation, coordinator/precalc.h);
// unset, the engine is exact. Borrowed (EngineOptions::layer_hook), called on
// the engine thread inside Engine::Forward, after the observers' OnRouting
// (which see the router's own choice); it must not call back into the engine.
//
// Legend: T rows, D hidden, E experts, K num_experts_per_token.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "coordinator/engine/compute_backend.h"
#include "coordinator/engine/forward_observer.h"

namespace tandem {

// One layer's state after its router; valid only during the call.
struct RoutedLayer {
  int layer = 0;
  int64_t rows = 0;                      // T
  const float* hidden = nullptr;         // [T, D] residual stream after attention (the router's input)
  const float* moe_input = nullptr;      // [T, D] post-attention norm of hidden
  const float* router_logits = nullptr;  // [T, E]
  int32_t* experts = nullptr;            // [T, K] the router's choice; may be rewritten
  float* weights = nullptr;              // [T, K] likewise
};

class LayerHook {
 public:
  virtual ~LayerHook() = default;
  // An error fails the step (no sequence changes).
  virtual absl::Status OnLayerRouted(const ForwardStep& step, ComputeBackend* backend, const RoutedLayer& routed) = 0;
};

}  // namespace tandem
