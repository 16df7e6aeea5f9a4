#include "coordinator/orchestration/planner/placement.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

// Experts of `layer` by usage descending, ties by id.
std::vector<int> LayerByUsage(const ExpertUsage& usage, int layer) {
  std::vector<int> experts(static_cast<size_t>(usage.num_experts));
  for (int e = 0; e < usage.num_experts; ++e) experts[static_cast<size_t>(e)] = e;
  std::stable_sort(experts.begin(), experts.end(),
                   [&](int a, int b) { return usage.At(layer, a) > usage.At(layer, b); });
  return experts;
}

void SortKeys(std::vector<ExpertKey>* keys) {
  std::sort(keys->begin(), keys->end(), [](const ExpertKey& a, const ExpertKey& b) {
    return a.layer != b.layer ? a.layer < b.layer : a.expert < b.expert;
  });
}

}  // namespace

absl::Status ExpertUsage::Validate() const {
  if (num_layers < 1)
    return absl::InvalidArgumentError(absl::StrCat("usage num_layers must be >= 1, got ", num_layers));
  if (num_experts < 1)
    return absl::InvalidArgumentError(absl::StrCat("usage num_experts must be >= 1, got ", num_experts));
  if (tokens.size() != static_cast<size_t>(num_layers) * static_cast<size_t>(num_experts)) {
    return absl::InvalidArgumentError(
        absl::StrCat("usage tokens has ", tokens.size(),
                     " entries, expected num_layers x num_experts = ", num_layers * num_experts));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (!(tokens[i] >= 0) || !std::isfinite(tokens[i])) {
      return absl::InvalidArgumentError(absl::StrCat("usage tokens[", i, "] must be finite and >= 0, got ", tokens[i]));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PlacementPolicy> ParsePlacementPolicy(const std::string& name) {
  if (name == "popularity") return PlacementPolicy::kPopularity;
  if (name == "first-layers") return PlacementPolicy::kFirstLayers;
  if (name == "uniform") return PlacementPolicy::kUniform;
  return absl::InvalidArgumentError(
      absl::StrCat("placement policy \"", name, "\" is not one of popularity, first-layers, uniform"));
}

std::string PlacementPolicyName(PlacementPolicy policy) {
  switch (policy) {
    case PlacementPolicy::kPopularity: return "popularity";
    case PlacementPolicy::kFirstLayers: return "first-layers";
    case PlacementPolicy::kUniform: return "uniform";
  }
  return "unknown";
}

absl::StatusOr<std::vector<ExpertKey>> PlaceExperts(const PlacementOptions& options, int num_layers, int num_experts,
                                                    const ExpertUsage* usage) {
  if (num_layers < 1) return absl::InvalidArgumentError(absl::StrCat("num_layers must be >= 1, got ", num_layers));
  if (num_experts < 1) return absl::InvalidArgumentError(absl::StrCat("num_experts must be >= 1, got ", num_experts));
  if (options.num_slots < 0)
    return absl::InvalidArgumentError(absl::StrCat("num_slots must be >= 0, got ", options.num_slots));
  if (usage != nullptr) {
    TANDEM_RETURN_IF_ERROR(usage->Validate());
    if (usage->num_layers != num_layers || usage->num_experts != num_experts) {
      return absl::InvalidArgumentError(absl::StrCat("usage profile is ", usage->num_layers, " layers x ",
                                                     usage->num_experts, " experts but the model has ", num_layers,
                                                     " x ", num_experts));
    }
  }
  std::vector<int> layers;  // the MoE layers: the only ones with experts to place
  for (int l = 0; l < num_layers; ++l) {
    if (!std::binary_search(options.dense_layers.begin(), options.dense_layers.end(), int64_t{l})) layers.push_back(l);
  }
  if (layers.empty()) return absl::InvalidArgumentError("dense_layers: every layer is dense, no expert to place");
  const int moe_layers = static_cast<int>(layers.size());
  const int slots = std::min(options.num_slots, moe_layers * num_experts);
  std::vector<ExpertKey> placed;
  placed.reserve(static_cast<size_t>(slots));

  switch (options.policy) {
    case PlacementPolicy::kPopularity: {
      if (usage == nullptr) {
        return absl::InvalidArgumentError("usage: the popularity placement needs a usage profile (profile_io.h)");
      }
      std::vector<bool> taken(static_cast<size_t>(num_layers) * static_cast<size_t>(num_experts), false);
      if (options.balance_layers) {
        const int per_layer = slots / moe_layers;
        for (int l : layers) {
          const std::vector<int> order = LayerByUsage(*usage, l);
          for (int j = 0; j < per_layer; ++j) {
            const int e = order[static_cast<size_t>(j)];
            placed.push_back({l, e});
            taken[static_cast<size_t>(l * num_experts + e)] = true;
          }
        }
      }
      std::vector<int> order;
      for (int l : layers) {
        for (int e = 0; e < num_experts; ++e) {
          const int i = l * num_experts + e;
          if (!taken[static_cast<size_t>(i)]) order.push_back(i);
        }
      }
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
        return usage->tokens[static_cast<size_t>(a)] > usage->tokens[static_cast<size_t>(b)];
      });
      for (int i : order) {
        if (static_cast<int>(placed.size()) >= slots) break;
        placed.push_back({i / num_experts, i % num_experts});
      }
      break;
    }
    case PlacementPolicy::kFirstLayers: {
      if (options.ways < 1 || options.ways > num_experts) {
        return absl::InvalidArgumentError(
            absl::StrCat("ways must be in [1, num_experts = ", num_experts, "] for first-layers, got ", options.ways));
      }
      const int indexes = std::min(moe_layers, slots / options.ways);
      for (int i = 0; i < indexes; ++i) {
        const int l = layers[static_cast<size_t>(i)];
        if (usage != nullptr) {
          const std::vector<int> order = LayerByUsage(*usage, l);
          for (int j = 0; j < options.ways; ++j) placed.push_back({l, order[static_cast<size_t>(j)]});
        } else {
          for (int j = 0; j < options.ways; ++j) placed.push_back({l, j});
        }
      }
      break;
    }
    case PlacementPolicy::kUniform: {
      const int per_layer = slots / moe_layers;
      const int extra = slots % moe_layers;
      for (int i = 0; i < moe_layers; ++i) {
        const int l = layers[static_cast<size_t>(i)];
        const int count = per_layer + (i < extra ? 1 : 0);
        // Rotate the starting id per layer so that no expert id is favoured
        // across the model (and shard owners get an even share).
        const int start = static_cast<int>((static_cast<int64_t>(l) * std::max(count, 1)) % num_experts);
        for (int j = 0; j < count; ++j) placed.push_back({l, (start + j) % num_experts});
      }
      break;
    }
  }
  SortKeys(&placed);
  return placed;
}

int LayersCoveringMoeLayers(int num_layers, std::span<const int64_t> dense_layers, int moe_layers) {
  int seen = 0, l = 0;
  for (; l < num_layers && seen < moe_layers; ++l) {
    if (!std::binary_search(dense_layers.begin(), dense_layers.end(), int64_t{l})) ++seen;
  }
  return l;
}

absl::Status ApplyPlacement(const std::vector<ExpertKey>& experts, ResidencyTable* table) {
  for (const ExpertKey& key : experts) TANDEM_RETURN_IF_ERROR(table->Place(key));
  return absl::OkStatus();
}

}  // namespace tandem
