// Expert pre-calculation (DAOP, DATE 2025, §IV-C): a LOSSY decode-time
// policy, off by default. At layer i of a decode step, layer (i+1)'s router
// is applied to the hidden state layer i's router saw, predicting layer
// (i+1)'s experts per token; predicted experts that are not resident in the
// pool ("CPU experts") are computed now, on the CPU, from layer i's
// moe_input (an approximation of layer i+1's). Graceful degradation: a token
// whose predicted experts are all CPU experts swaps its lowest-scored one
// for the best-scored resident expert, if any. At layer i+1 the predicted
// set is used: resident experts run on the true moe_input, CPU experts give
// their pre-computed outputs.
//
// Choices (docs/orchestrator.md "Pre-calculation (lossy)"):
//  - The prediction is ComputeBackend::Router(i+1) on layer i's residual
//    stream after attention (the tensor layer i's router normed): layer
//    (i+1)'s own norm and gate on the state layer i's gate saw. With RMSNorm
//    this differs from gating layer i's normed moe_input only by the norms'
//    per-channel weights, and needs no new backend call.
//  - Weights: layer (i+1)'s own router logits (computed anyway) with every
//    expert outside the used set masked, through the model's router
//    (Mixtral: softmax over the used set's logits; PhiMoE: its sparsemixer
//    over the used set). A token whose used set equals its true set keeps
//    the true routing untouched, so a correct prediction with no
//    pre-computed expert changes nothing, bit for bit.
//  - Only all-decode steps predict; a step with any prefill row is exact.
//  - Without a residency view (no pool) every expert is a CPU expert: every
//    predicted expert is pre-computed and nothing degrades — pure
//    approximation, no speed benefit on a CPU-only box.
//
// Owns its scratch and the pre-computed outputs of the next layer; borrows
// the CPU executor, the inner executor and the residency table (all must
// outlive it). Engine thread only, except stats() (any thread).
//
// Legend: T rows, D hidden, E experts, K num_experts_per_token, L layers.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/base/expert_executor.h"
#include "common/base/scratch_memory.h"
#include "common/model/model_config.h"
#include "coordinator/engine/layer_hook.h"
#include "coordinator/orchestration/planner/residency.h"

namespace tandem {

enum class PrecalcPolicy { kOff, kDaop };

std::string PrecalcPolicyName(PrecalcPolicy policy);
// "off" | "daop"; InvalidArgument naming `flag` otherwise.
absl::StatusOr<PrecalcPolicy> ParsePrecalcPolicy(std::string_view name, std::string_view flag = "precalc");

struct PrecalcOptions {
  PrecalcPolicy policy = PrecalcPolicy::kOff;
  // First layer whose experts are predicted (from the layer before it). DAOP
  // starts at block 4; clamped to L-1. Must be >= 1.
  int start_layer = 4;
};

// InvalidArgument naming the field for a bad start layer.
absl::Status ValidatePrecalcOptions(const PrecalcOptions& options);

struct PrecalcStats {
  std::string policy = "off";
  int start_layer = 0;              // effective (clamped)
  int64_t predicted_steps = 0;      // decode steps that predicted
  int64_t predictions = 0;          // (token, layer) predictions
  int64_t correct = 0;              // predicted set == true set (before degradation)
  int64_t used_true_routing = 0;    // used set == true set (after degradation)
  int64_t precomputed_rows = 0;     // (token, expert) pairs pre-computed on the CPU
  int64_t precomputed_experts = 0;  // (layer, expert) CPU runs ahead of time
  int64_t degradations = 0;         // CPU expert swapped for a resident one
  int64_t no_alternative = 0;       // all CPU, no resident expert to swap in
  double precompute_us = 0;         // CPU time spent pre-computing

  double accuracy() const { return predictions > 0 ? static_cast<double>(correct) / predictions : 0.0; }
  // A JSON object; carries "lossy": "daop pre-calculation" unless off.
  std::string ToJson() const;
};

class DaopPrecalc final : public LayerHook, public ExpertExecutor {
 public:
  // `cpu` computes the pre-calculated experts. `inner` computes everything
  // else when this is used as the engine's executor (null when the
  // orchestrator calls Serve itself). `residency`: null means no pool.
  static absl::StatusOr<std::unique_ptr<DaopPrecalc>> Create(const ModelConfig& config, ExpertExecutor* cpu,
                                                             ExpertExecutor* inner, const ResidencyTable* residency,
                                                             const PrecalcOptions& options);

  // LayerHook: checks and applies the prediction for `layer`, then predicts
  // and pre-computes `layer + 1`.
  absl::Status OnLayerRouted(const ForwardStep& step, ComputeBackend* backend, const RoutedLayer& routed) override;

  // ExpertExecutor: Serve, then `inner` for the rest.
  absl::Status RunExperts(int layer, std::span<const ExpertWork> work) override;

  // Writes the pre-computed outputs of `layer`'s experts into their work
  // entries and appends the other entries to `rest`. Internal if the work
  // does not match what was pre-computed (the engine did not use the routing).
  absl::Status Serve(int layer, std::span<const ExpertWork> work, std::vector<ExpertWork>* rest);

  PrecalcStats stats() const ABSL_LOCKS_EXCLUDED(stats_mutex_);  // any thread
  void ResetStats() ABSL_LOCKS_EXCLUDED(stats_mutex_);

 private:
  DaopPrecalc(const ModelConfig& config, ExpertExecutor* cpu, ExpertExecutor* inner, const ResidencyTable* residency,
              int start_layer);
  bool Resident(int layer, int expert) const;
  absl::Status Predict(ComputeBackend* backend, const RoutedLayer& routed, PrecalcStats* delta);
  void ApplyPrediction(const RoutedLayer& routed, PrecalcStats* delta);

  const ModelConfig& config_;
  ExpertExecutor* cpu_;
  ExpertExecutor* inner_;
  const ResidencyTable* residency_;
  const int start_layer_;

  // One layer's prediction: experts [T, K] (raw, and after degradation),
  // and the pre-computed outputs grouped by expert in row order: expert e's
  // rows are [offsets[e], offsets[e+1]).
  struct Prediction {
    int layer = -1;  // -1: none
    int64_t rows = 0;
    std::vector<int32_t> raw_experts, used_experts;
    std::vector<int64_t> offsets;  // [E + 1]
    ScratchArray<float> outputs;   // [Σ rows, D]
  };
  // current_: the layer being run (served by Serve); next_: the one after.
  Prediction current_, next_;
  // Scratch.
  ScratchArray<float> normed_, logits_, gathered_in_, route_weights_;
  std::vector<float> masked_logits_;  // [E]
  std::vector<ExpertWork> work_;
  std::vector<ExpertWork> rest_;

  mutable absl::Mutex stats_mutex_;
  // The constructor sets policy and start_layer before the object is shared.
  PrecalcStats stats_ ABSL_GUARDED_BY(stats_mutex_);
};

}  // namespace tandem
