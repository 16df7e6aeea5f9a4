// Initial placement: which experts fill the GPU slots before the first
// token. Pure functions of the model's shape, the slot count and, for
// `popularity`, a usage profile (how many tokens each expert took on
// calibration prompts; profile_io.h reads and writes it, and tandem can
// record one from prompts).
//
//   popularity   — Fiddler §3.4: the most-used experts of the whole model
//                  fill the slots. With balance_layers, DAOP §IV-A instead:
//                  every layer gets floor(slots / L) of its own most-used
//                  experts and the remainder goes to the most-used of the
//                  rest.
//   first-layers — the collaborative paper's N-index × M-way cache: layers
//                  0..N-1 (N = slots / M) get M experts each (their most
//                  used when a profile is given, else experts 0..M-1); later
//                  layers get none.
//   uniform      — every layer gets slots / L experts (the first slots % L
//                  layers one more), spread over expert ids by rotation so
//                  that no id is favoured.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/orchestration/planner/residency.h"

namespace tandem {

// Tokens routed to each expert on calibration data: [L * E], row-major by layer.
struct ExpertUsage {
  int num_layers = 0;
  int num_experts = 0;
  std::vector<double> tokens;

  double At(int layer, int expert) const {
    return tokens[static_cast<size_t>(layer) * static_cast<size_t>(num_experts) + static_cast<size_t>(expert)];
  }
  // InvalidArgument naming the field (shape, negative or non-finite counts).
  absl::Status Validate() const;
};

enum class PlacementPolicy { kPopularity, kFirstLayers, kUniform };
// "popularity" | "first-layers" | "uniform"
absl::StatusOr<PlacementPolicy> ParsePlacementPolicy(const std::string& name);
std::string PlacementPolicyName(PlacementPolicy policy);

struct PlacementOptions {
  PlacementPolicy policy = PlacementPolicy::kPopularity;
  int num_slots = 0;
  int ways = 0;                 // first-layers: M, experts cached per covered layer
  bool balance_layers = false;  // popularity: DAOP's per-layer share first
  // Layers with no experts (a model's dense MLP layers): never placed, and
  // not counted where slots are shared among layers.
  std::vector<int64_t> dense_layers;
};

// The experts to place, in (layer, expert) order; at most num_slots (fewer
// when the model has fewer experts, or first-layers runs out of layers);
// first-layers takes the first MoE layers, skipping options.dense_layers.
// InvalidArgument naming the parameter: counts < 1, num_slots < 0, ways
// outside [1, num_experts] for first-layers, popularity without `usage`, or
// a usage profile of another shape. Ties go to the lower layer, then the
// lower expert id, so the result is deterministic.
absl::StatusOr<std::vector<ExpertKey>> PlaceExperts(const PlacementOptions& options, int num_layers, int num_experts,
                                                    const ExpertUsage* usage);

// How many leading layers of `num_layers` hold `moe_layers` MoE layers, the
// sorted `dense_layers` skipped: the LRU's index count that covers what
// first-layers placement fills (moe_layers when no layer is dense).
int LayersCoveringMoeLayers(int num_layers, std::span<const int64_t> dense_layers, int moe_layers);

// Places `experts` into an empty table (ResidencyTable::Place each).
absl::Status ApplyPlacement(const std::vector<ExpertKey>& experts, ResidencyTable* table);

}  // namespace tandem
