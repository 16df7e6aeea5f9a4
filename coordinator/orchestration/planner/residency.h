// Which experts hold a GPU slot. The planner reads one layer of it
// (ExpertState per expert); cache policies read all of it and return
// decisions; whoever owns the slots (the GPU expert pool, the simulator)
// applies those decisions to a ResidencyTable and copies the bytes.
//
// A migration takes its slot when it starts (the slot is being written) and
// the expert becomes resident when the copy completes. Times are absolute
// µs on the owner's clock; LayerStates() turns them into the µs-from-now
// ETAs the planner takes.
//
// Pure data; no I/O, no threads, not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/expert_key.h"

namespace tandem {

enum class Residency : uint8_t {
  kAbsent,     // weights only in host memory
  kResident,   // in a GPU slot, ready
  kMigrating,  // being copied into a GPU slot; ready at its ETA
};

// One expert as the planner sees it.
struct ExpertState {
  Residency residency = Residency::kAbsent;
  double migration_eta_us = 0;  // kMigrating: µs from the plan's start until ready (>= 0)
};

class ResidencyTable {
 public:
  // InvalidArgument naming the parameter when a count is < 1 (num_slots < 0).
  static absl::StatusOr<ResidencyTable> Create(int num_layers, int num_experts, int num_slots);

  int num_layers() const { return num_layers_; }
  int num_experts() const { return num_experts_; }
  int num_slots() const { return num_slots_; }
  int used_slots() const { return used_slots_; }  // resident + migrating
  int free_slots() const { return num_slots_ - used_slots_; }
  int UsedInLayer(int layer) const { return used_in_layer_[static_cast<size_t>(layer)]; }

  bool Contains(ExpertKey key) const;  // a valid (layer, expert)
  Residency residency(ExpertKey key) const { return residency_[Index(key)]; }
  double ready_at_us(ExpertKey key) const { return ready_at_us_[Index(key)]; }

  // One layer as the planner takes it at time `now_us`: migrations whose
  // copy ends by then count as resident (the owner may not have called
  // CompleteMigration yet), the others carry their remaining time.
  void LayerStates(int layer, double now_us, std::vector<ExpertState>* states) const;

  // Initial placement: resident at once, no copy. ResourceExhausted when no
  // slot is free; FailedPrecondition when it already holds a slot.
  absl::Status Place(ExpertKey key);
  // Starts a copy ending at `ready_at_us`, first evicting `evict` (which
  // must be resident) when given. ResourceExhausted when no slot would be
  // free; FailedPrecondition when `key` already holds a slot.
  absl::Status BeginMigration(ExpertKey key, double ready_at_us, std::optional<ExpertKey> evict = std::nullopt);
  // Keeps an expert the planner copied for one use (staging, not a slot)
  // resident: the bytes are already on the GPU, so it costs no copy.
  absl::Status Admit(ExpertKey key, std::optional<ExpertKey> evict = std::nullopt);
  // kMigrating → kResident. FailedPrecondition when it is not migrating.
  absl::Status CompleteMigration(ExpertKey key);
  // Completes every migration ready by `now_us`; returns how many.
  int CompleteMigrationsBy(double now_us);
  // kResident → kAbsent. FailedPrecondition when it is not resident (a
  // migrating expert cannot be evicted: its copy is in flight).
  absl::Status Evict(ExpertKey key);

  // Every expert holding a slot, in (layer, expert) order.
  std::vector<ExpertKey> Occupants() const;

 private:
  ResidencyTable(int num_layers, int num_experts, int num_slots);
  size_t Index(ExpertKey key) const {
    return static_cast<size_t>(key.layer) * static_cast<size_t>(num_experts_) + static_cast<size_t>(key.expert);
  }
  absl::Status CheckKey(ExpertKey key, const char* what) const;

  int num_layers_ = 0;
  int num_experts_ = 0;
  int num_slots_ = 0;
  int used_slots_ = 0;
  std::vector<Residency> residency_;  // [L * E]
  std::vector<double> ready_at_us_;   // [L * E], kMigrating only
  std::vector<int> used_in_layer_;    // [L]
};

}  // namespace tandem
