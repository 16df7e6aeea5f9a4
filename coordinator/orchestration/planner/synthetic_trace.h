// Routing traces — rows per expert, per layer, per step — and a synthetic
// generator whose traces match the statistics the papers publish for
// Mixtral-8x7B routing, so policies can be compared without the model:
//   - expert popularity relative to the model's top expert: mean 0.71,
//     sd 0.08 (Fiddler App. C, ShareGPT);
//   - consecutive-token reuse: an expert a token uses was used by the
//     previous token in the same layer 30-50% of the time (collaborative
//     paper §I, Fig. 2; uniform routing would give K/E = 25%);
//   - consecutive-layer same id: ~44% (collaborative paper §II-B);
//   - prefill/decode similarity: ~90% mean cosine between the two phases'
//     per-layer activation frequencies (DAOP Table II, Eq. 1), and dominant
//     experts that differ between sequences (DAOP §III ①).
// MeasureTrace computes those statistics from any trace (recorded or
// synthetic), so the generator is checked against them (tests) and recorded
// traces can be compared with the papers'.
//
// Pure: the trace lives in memory (file I/O belongs with the engine's
// recorder). Deterministic for a seed.
//
// Legend: L layers, E experts per layer, K experts per token.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/orchestration/planner/cache_policy.h"
#include "coordinator/orchestration/planner/placement.h"

namespace tandem {

struct TraceStep {
  Phase phase = Phase::kDecode;
  int sequence = 0;           // which sequence (request) the step belongs to
  int tokens = 0;             // tokens processed: the prompt, or rows per decode step (batch × beams)
  std::vector<int32_t> rows;  // [L * E] rows routed to each expert
};

struct RoutingTrace {
  int num_layers = 0;
  int num_experts = 0;
  int num_experts_per_token = 0;
  // The model's dense MLP layers: no routing (their rows stay zero), no
  // experts to place. Sorted, unique.
  std::vector<int64_t> dense_layers;
  std::vector<TraceStep> steps;

  std::span<const int32_t> LayerRows(size_t step, int layer) const {
    return std::span<const int32_t>(steps[step].rows)
        .subspan(static_cast<size_t>(layer) * static_cast<size_t>(num_experts), static_cast<size_t>(num_experts));
  }
};

struct SyntheticTraceOptions {
  int num_layers = 32;
  int num_experts = 8;
  int num_experts_per_token = 2;
  int num_sequences = 1;
  int prompt_tokens = 128;
  int decode_steps = 128;
  int decode_rows_per_step = 1;   // beams (Fiddler scenario c) or batched sequences
  double popularity_mean = 0.71;  // Fiddler App. C, relative to the top expert
  double popularity_sd = 0.08;
  double token_reuse = 0.40;    // collaborative paper: 30-50% (per expert)
  double layer_same_id = 0.44;  // collaborative paper: ~44%
  // σ of log-normal per-sequence (and per-phase) perturbations of the
  // popularity: dominant experts vary by sequence (DAOP §III ①), and
  // decode drifts from prefill (Table II: ~90% cosine).
  double sequence_skew = 0.35;
  double phase_drift = 0.8;
  // The model's own popularity comes from model_seed, the sequences from
  // seed: a calibration trace (for `popularity` placement) and the measured
  // one share the model and differ in their prompts.
  uint64_t model_seed = 1;
  uint64_t seed = 1;

  absl::Status Validate() const;  // InvalidArgument naming the field
};

absl::StatusOr<RoutingTrace> GenerateSyntheticTrace(const SyntheticTraceOptions& options);

struct TraceStats {
  double popularity_mean = 0;  // tokens per expert / the top expert's, over the whole trace
  double popularity_sd = 0;
  double token_reuse = 0;            // decode steps with one row: P(expert at t was used at t-1), same layer
  double layer_same_id = 0;          // decode steps with one row: P(expert at layer l was used at l-1)
  double prefill_decode_cosine = 0;  // DAOP Eq. 1, averaged over sequences
};

TraceStats MeasureTrace(const RoutingTrace& trace);

// Tokens per expert over the whole trace: a usage profile for `popularity`
// placement (calibrate on one trace, run on another).
ExpertUsage TraceUsage(const RoutingTrace& trace);

}  // namespace tandem
