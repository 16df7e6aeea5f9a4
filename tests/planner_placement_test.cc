// Initial placement: popularity (Fiddler §3.4, and DAOP's per-layer share),
// first-layers (the collaborative paper's index coverage), uniform.
#include "coordinator/orchestration/planner/placement.h"

#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

ExpertUsage Usage(int layers, int experts) {
  ExpertUsage usage{layers, experts, {}};
  for (int l = 0; l < layers; ++l) {
    for (int e = 0; e < experts; ++e) usage.tokens.push_back(static_cast<double>((l * 7 + e * 13) % 17));
  }
  return usage;
}

int CountInLayer(const std::vector<ExpertKey>& keys, int layer) {
  int n = 0;
  for (const ExpertKey& k : keys) n += k.layer == layer;
  return n;
}

TEST(PlacementTest, PopularityTakesTheMostUsedExpertsOfTheModel) {
  ExpertUsage usage{2, 4, {1, 9, 3, 9, 8, 0, 7, 2}};
  absl::StatusOr<std::vector<ExpertKey>> placed = PlaceExperts({PlacementPolicy::kPopularity, 3}, 2, 4, &usage);
  ASSERT_OK(placed);
  // 9, 9 (layer 0: experts 1 and 3) and 8 (layer 1 expert 0); ties by layer then id.
  EXPECT_EQ(*placed, (std::vector<ExpertKey>{{0, 1}, {0, 3}, {1, 0}}));
}

TEST(PlacementTest, BalancedPopularityGivesEveryLayerItsShareFirst) {
  // DAOP §IV-A: 5 slots over 2 layers: 2 per layer (each layer's most
  // used), then the most used of the rest.
  ExpertUsage usage{2, 4, {1, 9, 3, 9, 8, 0, 7, 2}};
  PlacementOptions options{PlacementPolicy::kPopularity, 5};
  options.balance_layers = true;
  absl::StatusOr<std::vector<ExpertKey>> placed = PlaceExperts(options, 2, 4, &usage);
  ASSERT_OK(placed);
  EXPECT_EQ(*placed, (std::vector<ExpertKey>{{0, 1}, {0, 2}, {0, 3}, {1, 0}, {1, 2}}));
}

TEST(PlacementTest, FiddlerEnvironmentOneFills56Of256) {
  const ExpertUsage usage = Usage(32, 8);
  absl::StatusOr<std::vector<ExpertKey>> placed = PlaceExperts({PlacementPolicy::kPopularity, 56}, 32, 8, &usage);
  ASSERT_OK(placed);
  ASSERT_EQ(placed->size(), 56u);
  double min_placed = 1e9, max_left = -1;
  std::set<int> chosen;
  for (const ExpertKey& k : *placed) {
    min_placed = std::min(min_placed, usage.At(k.layer, k.expert));
    chosen.insert(k.layer * 8 + k.expert);
  }
  for (int i = 0; i < 256; ++i) {
    if (!chosen.count(i)) max_left = std::max(max_left, usage.tokens[static_cast<size_t>(i)]);
  }
  EXPECT_GE(min_placed, max_left);
}

TEST(PlacementTest, FirstLayersCoversNIndexesOfMWays) {
  // The collaborative paper: 56 slots as 4 ways → 14 indexes, layers 0-13.
  absl::StatusOr<std::vector<ExpertKey>> placed = PlaceExperts({PlacementPolicy::kFirstLayers, 56, 4}, 32, 8, nullptr);
  ASSERT_OK(placed);
  ASSERT_EQ(placed->size(), 56u);
  for (int l = 0; l < 32; ++l) EXPECT_EQ(CountInLayer(*placed, l), l < 14 ? 4 : 0) << l;
  EXPECT_EQ(placed->front(), (ExpertKey{0, 0}));
  // With a usage profile each covered layer keeps its most used experts.
  ExpertUsage usage{2, 4, {1, 9, 3, 9, 8, 0, 7, 2}};
  placed = PlaceExperts({PlacementPolicy::kFirstLayers, 3, 2}, 2, 4, &usage);
  ASSERT_OK(placed);
  EXPECT_EQ(*placed, (std::vector<ExpertKey>{{0, 1}, {0, 3}}));  // 3 / 2 = 1 index
}

TEST(PlacementTest, UniformSpreadsOverLayersAndIds) {
  absl::StatusOr<std::vector<ExpertKey>> placed = PlaceExperts({PlacementPolicy::kUniform, 125}, 32, 8, nullptr);
  ASSERT_OK(placed);
  ASSERT_EQ(placed->size(), 125u);
  std::vector<int> per_id(8, 0);
  for (int l = 0; l < 32; ++l) EXPECT_EQ(CountInLayer(*placed, l), l < 29 ? 4 : 3) << l;
  for (const ExpertKey& k : *placed) ++per_id[static_cast<size_t>(k.expert)];
  for (int count : per_id) {
    EXPECT_GE(count, 14);
    EXPECT_LE(count, 18);
  }
  // More slots than experts: everything, once.
  placed = PlaceExperts({PlacementPolicy::kUniform, 1000}, 2, 4, nullptr);
  ASSERT_OK(placed);
  EXPECT_EQ(placed->size(), 8u);
}

// A model's dense MLP layers hold no experts: every policy skips them and
// shares the slots among the MoE layers only.
TEST(PlacementTest, DenseLayersAreNeverPlaced) {
  const std::vector<int64_t> dense = {0, 2, 5};  // of 6 layers: MoE layers 1, 3, 4
  const ExpertUsage usage = Usage(6, 8);
  for (PlacementPolicy policy :
       {PlacementPolicy::kPopularity, PlacementPolicy::kFirstLayers, PlacementPolicy::kUniform}) {
    for (bool balance : {false, true}) {
      PlacementOptions options{policy, 12, 4, balance};
      options.dense_layers = dense;
      absl::StatusOr<std::vector<ExpertKey>> placed = PlaceExperts(options, 6, 8, &usage);
      ASSERT_OK(placed);
      EXPECT_EQ(placed->size(), 12u) << PlacementPolicyName(policy);
      for (int l : {0, 2, 5}) EXPECT_EQ(CountInLayer(*placed, l), 0) << PlacementPolicyName(policy) << " layer " << l;
      if (policy != PlacementPolicy::kPopularity || balance) {
        for (int l : {1, 3, 4}) EXPECT_EQ(CountInLayer(*placed, l), 4) << PlacementPolicyName(policy) << " layer " << l;
      }
    }
  }
  // The LRU covering the first two MoE layers (1 and 3) spans layers 0-3.
  EXPECT_EQ(LayersCoveringMoeLayers(6, dense, 2), 4);
  EXPECT_EQ(LayersCoveringMoeLayers(6, dense, 3), 5);
  EXPECT_EQ(LayersCoveringMoeLayers(6, {}, 3), 3);
  // More slots than the MoE layers' experts: each of them once.
  PlacementOptions all{PlacementPolicy::kUniform, 1000};
  all.dense_layers = dense;
  absl::StatusOr<std::vector<ExpertKey>> placed = PlaceExperts(all, 6, 8, nullptr);
  ASSERT_OK(placed);
  EXPECT_EQ(placed->size(), 24u);
  // Every layer dense: nothing to place, said so.
  all.dense_layers = {0, 1};
  placed = PlaceExperts(all, 2, 8, nullptr);
  ASSERT_FALSE(placed.ok());
  EXPECT_TRUE(absl::StrContains(placed.status().message(), "dense_layers")) << placed.status();
}

TEST(PlacementTest, ErrorsNameTheParameter) {
  absl::StatusOr<std::vector<ExpertKey>> placed = PlaceExperts({PlacementPolicy::kPopularity, 3}, 2, 4, nullptr);
  ASSERT_FALSE(placed.ok());
  EXPECT_TRUE(absl::StrContains(placed.status().message(), "usage")) << placed.status();
  placed = PlaceExperts({PlacementPolicy::kFirstLayers, 3, 0}, 2, 4, nullptr);
  ASSERT_FALSE(placed.ok());
  EXPECT_TRUE(absl::StrContains(placed.status().message(), "ways")) << placed.status();
  placed = PlaceExperts({PlacementPolicy::kUniform, -1}, 2, 4, nullptr);
  ASSERT_FALSE(placed.ok());
  EXPECT_TRUE(absl::StrContains(placed.status().message(), "num_slots")) << placed.status();
  ExpertUsage wrong = Usage(3, 4);
  placed = PlaceExperts({PlacementPolicy::kPopularity, 3}, 2, 4, &wrong);
  ASSERT_FALSE(placed.ok());
  EXPECT_TRUE(absl::StrContains(placed.status().message(), "usage profile")) << placed.status();
  ExpertUsage negative{1, 2, {1, -1}};
  EXPECT_FALSE(negative.Validate().ok());
  for (PlacementPolicy p : {PlacementPolicy::kPopularity, PlacementPolicy::kFirstLayers, PlacementPolicy::kUniform}) {
    absl::StatusOr<PlacementPolicy> parsed = ParsePlacementPolicy(PlacementPolicyName(p));
    ASSERT_OK(parsed);
    EXPECT_EQ(*parsed, p);
  }
  EXPECT_FALSE(ParsePlacementPolicy("random").ok());
}

TEST(PlacementTest, ApplyFillsTheTableAndRefusesOverflow) {
  absl::StatusOr<ResidencyTable> table = ResidencyTable::Create(2, 4, 2);
  ASSERT_OK(table);
  ASSERT_OK(ApplyPlacement({{0, 1}, {1, 2}}, &*table));
  EXPECT_EQ(table->residency({1, 2}), Residency::kResident);
  absl::Status s = ApplyPlacement({{0, 3}}, &*table);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
}

}  // namespace
}  // namespace tandem
