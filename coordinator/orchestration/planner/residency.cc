#include "coordinator/orchestration/planner/residency.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {

absl::StatusOr<ResidencyTable> ResidencyTable::Create(int num_layers, int num_experts, int num_slots) {
  if (num_layers < 1) return absl::InvalidArgumentError(absl::StrCat("num_layers must be >= 1, got ", num_layers));
  if (num_experts < 1) return absl::InvalidArgumentError(absl::StrCat("num_experts must be >= 1, got ", num_experts));
  if (num_slots < 0) return absl::InvalidArgumentError(absl::StrCat("num_slots must be >= 0, got ", num_slots));
  return ResidencyTable(num_layers, num_experts, num_slots);
}

ResidencyTable::ResidencyTable(int num_layers, int num_experts, int num_slots)
    : num_layers_(num_layers),
      num_experts_(num_experts),
      num_slots_(num_slots),
      residency_(static_cast<size_t>(num_layers) * static_cast<size_t>(num_experts), Residency::kAbsent),
      ready_at_us_(residency_.size(), 0.0),
      used_in_layer_(static_cast<size_t>(num_layers), 0) {}

bool ResidencyTable::Contains(ExpertKey key) const {
  return key.layer >= 0 && key.layer < num_layers_ && key.expert >= 0 && key.expert < num_experts_;
}

absl::Status ResidencyTable::CheckKey(ExpertKey key, const char* what) const {
  if (Contains(key)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " (layer ", key.layer, ", expert ", key.expert, ") is outside ",
                                                 num_layers_, " layers x ", num_experts_, " experts"));
}

void ResidencyTable::LayerStates(int layer, double now_us, std::vector<ExpertState>* states) const {
  states->resize(static_cast<size_t>(num_experts_));
  for (int e = 0; e < num_experts_; ++e) {
    const size_t i = Index({layer, e});
    ExpertState& state = (*states)[static_cast<size_t>(e)];
    state.residency = residency_[i];
    state.migration_eta_us = 0;
    if (state.residency == Residency::kMigrating) {
      if (ready_at_us_[i] <= now_us) {
        state.residency = Residency::kResident;
      } else {
        state.migration_eta_us = ready_at_us_[i] - now_us;
      }
    }
  }
}

absl::Status ResidencyTable::Place(ExpertKey key) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key, "placed expert"));
  if (residency(key) != Residency::kAbsent) {
    return absl::FailedPreconditionError(
        absl::StrCat("expert (", key.layer, ", ", key.expert, ") already holds a slot"));
  }
  if (free_slots() < 1)
    return absl::ResourceExhaustedError(absl::StrCat("all ", num_slots_, " GPU expert slots are taken"));
  residency_[Index(key)] = Residency::kResident;
  ++used_slots_;
  ++used_in_layer_[static_cast<size_t>(key.layer)];
  return absl::OkStatus();
}

absl::Status ResidencyTable::BeginMigration(ExpertKey key, double ready_at_us, std::optional<ExpertKey> evict) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key, "migrated expert"));
  if (residency(key) != Residency::kAbsent) {
    return absl::FailedPreconditionError(
        absl::StrCat("expert (", key.layer, ", ", key.expert, ") already holds a slot"));
  }
  if (evict) {
    TANDEM_RETURN_IF_ERROR(Evict(*evict));
  }
  TANDEM_RETURN_IF_ERROR(Place(key));
  residency_[Index(key)] = Residency::kMigrating;
  ready_at_us_[Index(key)] = ready_at_us;
  return absl::OkStatus();
}

absl::Status ResidencyTable::Admit(ExpertKey key, std::optional<ExpertKey> evict) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key, "admitted expert"));
  if (residency(key) != Residency::kAbsent) {
    return absl::FailedPreconditionError(
        absl::StrCat("expert (", key.layer, ", ", key.expert, ") already holds a slot"));
  }
  if (evict) {
    TANDEM_RETURN_IF_ERROR(Evict(*evict));
  }
  return Place(key);
}

absl::Status ResidencyTable::CompleteMigration(ExpertKey key) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key, "completed expert"));
  if (residency(key) != Residency::kMigrating) {
    return absl::FailedPreconditionError(absl::StrCat("expert (", key.layer, ", ", key.expert, ") is not migrating"));
  }
  residency_[Index(key)] = Residency::kResident;
  return absl::OkStatus();
}

int ResidencyTable::CompleteMigrationsBy(double now_us) {
  int completed = 0;
  for (size_t i = 0; i < residency_.size(); ++i) {
    if (residency_[i] == Residency::kMigrating && ready_at_us_[i] <= now_us) {
      residency_[i] = Residency::kResident;
      ++completed;
    }
  }
  return completed;
}

absl::Status ResidencyTable::Evict(ExpertKey key) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key, "evicted expert"));
  if (residency(key) != Residency::kResident) {
    return absl::FailedPreconditionError(
        absl::StrCat("expert (", key.layer, ", ", key.expert, ") is not resident",
                     residency(key) == Residency::kMigrating ? " (its copy is in flight)" : ""));
  }
  residency_[Index(key)] = Residency::kAbsent;
  --used_slots_;
  --used_in_layer_[static_cast<size_t>(key.layer)];
  return absl::OkStatus();
}

std::vector<ExpertKey> ResidencyTable::Occupants() const {
  std::vector<ExpertKey> out;
  for (int l = 0; l < num_layers_; ++l) {
    for (int e = 0; e < num_experts_; ++e) {
      if (residency({l, e}) != Residency::kAbsent) out.push_back({l, e});
    }
  }
  return out;
}

}  // namespace tandem
