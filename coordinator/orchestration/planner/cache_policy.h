// GPU expert-cache policies: small classes behind one interface, each pure
// and testable step by step. A policy sees the routing of one layer and the
// current residency and answers with decisions — migrations to start (with
// the expert each evicts) and admissions of experts the planner already
// copied for one use — which the owner of the slots (the GPU expert pool,
// the simulator) applies in order. Policies never copy bytes.
//
// One layer step, as the engine and the simulator drive it:
//   1. router → rows per expert
//   2. policy.OnRouting(step)      → decisions, applied (copies queued)
//   3. planner.Plan(...)           → the layer's plan (it sees the new
//                                    copies as in flight, with their ETAs)
//   4. execute; policy.OnExecuted(step, plan) → admissions, applied
//
//   static   — the placement is fixed (Fiddler): no decisions.
//   lru      — the collaborative paper (§III-B): an N-index × M-way
//              set-associative cache; index i holds up to M experts of layer
//              i, layers >= N are not cached. Hits refresh recency; a miss
//              runs on the CPU now (the planner decides that) and its weights
//              are post-fetched asynchronously for later tokens, evicting
//              the least recently used way not in use in this step.
//   sequence — DAOP Alg. 1: during prefill, per layer, pair the hottest
//              CPU experts with the coldest GPU experts (up to half the
//              layer's experts) and swap a pair when hot >= 1.05 × cold;
//              no migration during decode.
//   adaptive — ours: keeps per-sequence activation frequencies (seeded by
//              the prefill, whose pattern matches decode's, DAOP Table II,
//              then an EWMA over decode steps) and migrates an expert when
//              the CPU time the cost model says it would save over the
//              expected remaining steps exceeds the migration's cost (plus
//              what the evicted expert would have saved); victims may
//              come from any layer, but during a prefill only from layers
//              the step has passed (the others are about to run with many
//              rows). Planner copies are admitted for free when worth more
//              than the victim.
//
// Not thread-safe; one instance per residency table.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/expert_division.h"
#include "coordinator/orchestration/planner/cost_model.h"
#include "coordinator/orchestration/planner/planner.h"
#include "coordinator/orchestration/planner/residency.h"

namespace tandem {

enum class Phase : uint8_t { kPrefill, kDecode };

// One layer of one step.
struct CacheStep {
  int layer = 0;
  Phase phase = Phase::kDecode;
  std::span<const int32_t> rows;              // [E] rows routed to each expert of `layer`
  const ResidencyTable* residency = nullptr;  // as of now
  double copy_backlog_us = 0;                 // µs until the copy engine is idle
};

struct CacheDecision {
  enum class Kind : uint8_t {
    kMigrate,  // copy `expert` into a slot (asynchronously)
    kAdmit,    // keep `expert`, which this step's plan copied, in a slot: no copy
  };
  Kind kind = Kind::kMigrate;
  ExpertKey expert;
  std::optional<ExpertKey> evict;  // resident expert whose slot it takes

  friend bool operator==(const CacheDecision&, const CacheDecision&) = default;
};

struct SequenceInfo {
  int64_t expected_decode_steps = 0;  // 0: unknown (the policy's default horizon)
  int decode_rows_per_step = 1;       // rows per decode step: batch size × beams
};

class CachePolicy {
 public:
  virtual ~CachePolicy() = default;
  virtual std::string name() const = 0;
  // Forgets all statistics (after the initial placement, or when the owner
  // changed the table behind the policy's back).
  virtual absl::Status Reset(const ResidencyTable& residency) = 0;
  // A new sequence (or batch of them) starts; per-sequence statistics restart.
  virtual void OnSequenceStart(const SequenceInfo& info) {}
  // After the router, before planning. Appends to `decisions`.
  virtual void OnRouting(const CacheStep& step, std::vector<CacheDecision>* decisions) = 0;
  // After the layer ran as `plan` says. Appends to `decisions`.
  virtual void OnExecuted(const CacheStep& step, const LayerPlan& plan, std::vector<CacheDecision>* decisions) {}
};

// Applies decisions in order to `table`: a migration queues on the copy
// engine — it starts at max(now_us, *copy_engine_free_at_us) and is ready
// `migrate_us` later, which becomes the new *copy_engine_free_at_us — and an
// admission is immediate. Stops at the first decision the table refuses.
absl::Status ApplyCacheDecisions(std::span<const CacheDecision> decisions, double now_us, double migrate_us,
                                 double* copy_engine_free_at_us, ResidencyTable* table);

class StaticCachePolicy final : public CachePolicy {
 public:
  std::string name() const override { return "static"; }
  absl::Status Reset(const ResidencyTable&) override { return absl::OkStatus(); }
  void OnRouting(const CacheStep&, std::vector<CacheDecision>*) override {}
};

struct LruOptions {
  int num_indexes = 0;  // N: layers 0..N-1 are cached
  int num_ways = 0;     // M: experts cached per layer
};

class LruCachePolicy final : public CachePolicy {
 public:
  // InvalidArgument naming the field: num_ways outside [1, num_experts],
  // num_indexes outside [0, num_layers].
  static absl::StatusOr<std::unique_ptr<LruCachePolicy>> Create(const LruOptions& options, int num_layers,
                                                                int num_experts);
  std::string name() const override { return "lru"; }
  absl::Status Reset(const ResidencyTable& residency) override;
  void OnRouting(const CacheStep& step, std::vector<CacheDecision>* decisions) override;
  void OnExecuted(const CacheStep& step, const LayerPlan& plan, std::vector<CacheDecision>* decisions) override;

  // When (layer, expert) was last used, 0 = never (for tests and stats).
  int64_t last_use(ExpertKey key) const { return last_use_[Index(key)]; }

 private:
  LruCachePolicy(const LruOptions& options, int num_layers, int num_experts);
  size_t Index(ExpertKey key) const {
    return static_cast<size_t>(key.layer) * static_cast<size_t>(num_experts_) + static_cast<size_t>(key.expert);
  }
  // Puts `expert` into its set: a free way, else the least recently used
  // resident way not in use this step (lower id on ties). False when the set
  // is full of experts in use or in flight.
  bool Insert(const CacheStep& step, int expert, CacheDecision::Kind kind, std::vector<CacheDecision>* decisions);

  LruOptions options_;
  int num_layers_ = 0;
  int num_experts_ = 0;
  int64_t clock_ = 0;
  std::vector<int64_t> last_use_;  // [L * E]
  // Within one call: slots taken and victims chosen by earlier decisions,
  // which the table does not show until they are applied.
  int pending_new_ = 0;
  int pending_layer_new_ = 0;
  std::vector<int> pending_victims_;
  std::vector<int> misses_;
};

struct SequenceOptions {
  double swap_threshold = 1.05;  // DAOP's SwapInOut: swap when hot >= threshold × cold
  double swap_fraction = 0.5;    // DAOP's SwapNum = 0.5 × experts per layer
};

class SequenceCachePolicy final : public CachePolicy {
 public:
  // InvalidArgument naming the field: swap_threshold < 1 or not finite,
  // swap_fraction outside (0, 1].
  static absl::StatusOr<std::unique_ptr<SequenceCachePolicy>> Create(const SequenceOptions& options);
  std::string name() const override { return "sequence"; }
  absl::Status Reset(const ResidencyTable&) override { return absl::OkStatus(); }
  void OnRouting(const CacheStep& step, std::vector<CacheDecision>* decisions) override;

  // hot >= threshold × cold, exactly (compared in parts per million, so
  // 105 vs 100 at 1.05 is "at" the threshold, not lost to rounding).
  static bool AtLeastRatio(int64_t hot, int64_t cold, double threshold);

 private:
  explicit SequenceCachePolicy(const SequenceOptions& options) : options_(options) {}
  SequenceOptions options_;
  std::vector<int> hot_, cold_;
};

struct AdaptiveOptions {
  ExpertDivision division = ExpertDivision::kSplit;  // how CPU time is counted (CostModel::CpuExpertUs)
  int num_experts_per_token = 2;                     // K: rows per token in the routing
  double ewma_alpha = 0.125;                         // weight of one decode step in the frequencies
  int64_t default_horizon_steps = 64;                // remaining steps when the sequence does not say
  // Start no migration while the copy engine is busy for longer than this;
  // < 0: one migration's time (at most about one copy queued ahead).
  double max_copy_backlog_us = -1;
  // Migrate when saved > gain_ratio × (migration + victim's lost savings).
  double gain_ratio = 1.0;

  absl::Status Validate() const;
};

class AdaptiveCachePolicy final : public CachePolicy {
 public:
  // `cost` is read at every decision (it is refined online) and must outlive
  // the policy. InvalidArgument naming the field for bad options or counts.
  static absl::StatusOr<std::unique_ptr<AdaptiveCachePolicy>> Create(const AdaptiveOptions& options,
                                                                     const CostModel* cost, int num_layers,
                                                                     int num_experts);
  std::string name() const override { return "adaptive"; }
  absl::Status Reset(const ResidencyTable& residency) override;
  void OnSequenceStart(const SequenceInfo& info) override;
  void OnRouting(const CacheStep& step, std::vector<CacheDecision>* decisions) override;
  void OnExecuted(const CacheStep& step, const LayerPlan& plan, std::vector<CacheDecision>* decisions) override;

  // Estimated probability that one token routes to (layer, expert).
  double frequency(ExpertKey key) const { return frequency_[Index(key)]; }
  // µs of CPU time a GPU slot for (layer, expert) is expected to save over
  // the rest of the sequence (the quantity decisions compare).
  double ExpectedSavingUs(ExpertKey key) const;

 private:
  AdaptiveCachePolicy(const AdaptiveOptions& options, const CostModel* cost, int num_layers, int num_experts);
  size_t Index(ExpertKey key) const {
    return static_cast<size_t>(key.layer) * static_cast<size_t>(num_experts_) + static_cast<size_t>(key.expert);
  }
  void Observe(const CacheStep& step);
  // The resident expert (any layer) whose slot is worth least, skipping
  // experts in use in `step` and victims already chosen; nullopt if none.
  std::optional<ExpertKey> CheapestVictim(const CacheStep& step) const;
  void Consider(const CacheStep& step, int expert, CacheDecision::Kind kind, double cost_us,
                std::vector<CacheDecision>* decisions);

  AdaptiveOptions options_;
  const CostModel* cost_ = nullptr;
  int num_layers_ = 0;
  int num_experts_ = 0;
  std::vector<double> frequency_;       // [L * E]
  std::vector<double> prefill_tokens_;  // [L] prompt tokens seen per layer this sequence
  int64_t horizon_steps_ = 0;
  int64_t decode_steps_seen_ = 0;
  int decode_rows_per_step_ = 1;
  // Within one call (see LruCachePolicy).
  int pending_new_ = 0;
  double pending_copy_us_ = 0;
  std::vector<ExpertKey> pending_victims_;
  std::vector<int> candidates_;
};

enum class CachePolicyKind { kStatic, kLru, kSequence, kAdaptive };
// "static" | "lru" | "sequence" | "adaptive"
absl::StatusOr<CachePolicyKind> ParseCachePolicyKind(const std::string& name);
std::string CachePolicyKindName(CachePolicyKind kind);

struct CachePolicyOptions {
  CachePolicyKind kind = CachePolicyKind::kStatic;
  LruOptions lru;
  SequenceOptions sequence;
  AdaptiveOptions adaptive;
};

// `cost` is needed by adaptive only (may be null otherwise).
absl::StatusOr<std::unique_ptr<CachePolicy>> MakeCachePolicy(const CachePolicyOptions& options, int num_layers,
                                                             int num_experts, const CostModel* cost);

}  // namespace tandem
