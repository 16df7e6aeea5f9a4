// GPU expert-cache policies, step by step: the residency table, LRU order
// and set conflicts (the collaborative paper), DAOP's sequence swaps at,
// below and above the 1.05 threshold, in-flight migrations, and the
// adaptive policy's cost-model decisions.
#include "coordinator/orchestration/planner/cache_policy.h"

#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "coordinator/orchestration/planner/placement.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

using Kind = CacheDecision::Kind;

CacheDecision Migrate(int layer, int expert) { return {Kind::kMigrate, {layer, expert}, std::nullopt}; }
CacheDecision Migrate(int layer, int expert, int evict_layer, int evict_expert) {
  return {Kind::kMigrate, {layer, expert}, ExpertKey{evict_layer, evict_expert}};
}
CacheDecision Admit(int layer, int expert, int evict_layer, int evict_expert) {
  return {Kind::kAdmit, {layer, expert}, ExpertKey{evict_layer, evict_expert}};
}

ResidencyTable Table(int layers, int experts, int slots, const std::vector<ExpertKey>& placed) {
  absl::StatusOr<ResidencyTable> table = ResidencyTable::Create(layers, experts, slots);
  EXPECT_OK(table);
  EXPECT_OK(ApplyPlacement(placed, &*table));
  return *table;
}

std::vector<CacheDecision> Route(CachePolicy& policy, const ResidencyTable& table, int layer,
                                 const std::vector<int32_t>& rows, Phase phase = Phase::kDecode,
                                 double copy_backlog_us = 0) {
  CacheStep step;
  step.layer = layer;
  step.phase = phase;
  step.rows = rows;
  step.residency = &table;
  step.copy_backlog_us = copy_backlog_us;
  std::vector<CacheDecision> decisions;
  policy.OnRouting(step, &decisions);
  return decisions;
}

// ---------------------------------------------------------------- residency table

TEST(ResidencyTableTest, SlotsMigrationsAndEvictions) {
  absl::StatusOr<ResidencyTable> table = ResidencyTable::Create(2, 4, 2);
  ASSERT_OK(table);
  ASSERT_OK(table->Place({0, 1}));
  EXPECT_EQ(table->free_slots(), 1);
  ASSERT_OK(table->BeginMigration({1, 2}, /*ready_at_us=*/500));
  EXPECT_EQ(table->residency({1, 2}), Residency::kMigrating);
  EXPECT_EQ(table->free_slots(), 0);
  // Full: a third needs an eviction, and a copy in flight cannot be evicted.
  absl::Status s = table->BeginMigration({0, 3}, 900);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  s = table->BeginMigration({0, 3}, 900, ExpertKey{1, 2});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  ASSERT_OK(table->BeginMigration({0, 3}, 900, ExpertKey{0, 1}));
  EXPECT_EQ(table->residency({0, 1}), Residency::kAbsent);
  // The planner's view at t = 600: the first copy has landed, the second has 300 us left.
  std::vector<ExpertState> states;
  table->LayerStates(1, 600, &states);
  EXPECT_EQ(states[2].residency, Residency::kResident);
  table->LayerStates(0, 600, &states);
  EXPECT_EQ(states[3].residency, Residency::kMigrating);
  EXPECT_DOUBLE_EQ(states[3].migration_eta_us, 300);
  EXPECT_EQ(table->CompleteMigrationsBy(600), 1);
  EXPECT_EQ(table->residency({1, 2}), Residency::kResident);
  EXPECT_FALSE(table->CompleteMigration({1, 2}).ok());
  EXPECT_FALSE(table->Place({5, 0}).ok());
  EXPECT_FALSE(ResidencyTable::Create(0, 4, 1).ok());
}

TEST(ApplyCacheDecisionsTest, CopiesQueueOnOneEngine) {
  ResidencyTable table = Table(1, 4, 3, {{0, 0}});
  double free_at = 0;
  const std::vector<CacheDecision> decisions = {Migrate(0, 1), Migrate(0, 2)};
  ASSERT_OK(ApplyCacheDecisions(decisions, /*now_us=*/50, /*migrate_us=*/100, &free_at, &table));
  EXPECT_DOUBLE_EQ(table.ready_at_us({0, 1}), 150);
  EXPECT_DOUBLE_EQ(table.ready_at_us({0, 2}), 250);
  EXPECT_DOUBLE_EQ(free_at, 250);
  const std::vector<CacheDecision> admit = {Admit(0, 3, 0, 0)};
  ASSERT_OK(ApplyCacheDecisions(admit, 60, 100, &free_at, &table));
  EXPECT_EQ(table.residency({0, 3}), Residency::kResident);
  EXPECT_EQ(table.residency({0, 0}), Residency::kAbsent);
  EXPECT_DOUBLE_EQ(free_at, 250);  // admissions copy nothing
}

// ---------------------------------------------------------------- static

TEST(StaticCachePolicyTest, NeverMoves) {
  ResidencyTable table = Table(2, 8, 4, {{0, 0}, {0, 1}, {1, 0}, {1, 1}});
  StaticCachePolicy policy;
  EXPECT_TRUE(Route(policy, table, 0, {0, 0, 5, 5, 0, 0, 0, 0}, Phase::kPrefill).empty());
  EXPECT_TRUE(Route(policy, table, 1, {1, 0, 0, 0, 0, 0, 0, 1}).empty());
}

// ---------------------------------------------------------------- lru

class LruTest : public ::testing::Test {
 protected:
  // 4 layers x 8 experts; N = 2 indexes x M = 2 ways (the first-layers placement).
  void SetUp() override {
    absl::StatusOr<std::vector<ExpertKey>> placed =
        PlaceExperts({PlacementPolicy::kFirstLayers, /*num_slots=*/4, /*ways=*/2}, 4, 8, nullptr);
    ASSERT_OK(placed);
    table_ = std::make_unique<ResidencyTable>(Table(4, 8, 4, *placed));
    absl::StatusOr<std::unique_ptr<LruCachePolicy>> lru = LruCachePolicy::Create({2, 2}, 4, 8);
    ASSERT_OK(lru);
    lru_ = std::move(*lru);
    ASSERT_OK(lru_->Reset(*table_));
  }
  // Routes and applies at once (copies land immediately: step tests).
  std::vector<CacheDecision> Step(int layer, const std::vector<int32_t>& rows) {
    std::vector<CacheDecision> decisions = Route(*lru_, *table_, layer, rows);
    double free_at = 0;
    EXPECT_OK(ApplyCacheDecisions(decisions, 0, 0, &free_at, table_.get()));
    table_->CompleteMigrationsBy(0);
    return decisions;
  }
  std::unique_ptr<ResidencyTable> table_;
  std::unique_ptr<LruCachePolicy> lru_;
};

TEST_F(LruTest, MissPostFetchesAndEvictsTheLeastRecentlyUsedWay) {
  // Layer 0 holds experts 0 and 1. Token 1 uses 0 (hit) and 2 (miss): 2 is
  // post-fetched into the way of 1, unused since placement.
  EXPECT_EQ(Step(0, {1, 0, 1, 0, 0, 0, 0, 0}), (std::vector<CacheDecision>{Migrate(0, 2, 0, 1)}));
  // Token 2 uses 3 and 5: both miss. Both ways are free to evict: 5 (bigger batch,
  // served first) takes 0's way, then 3 takes 2's (both were last used by
  // token 1; ties go to the lower id).
  EXPECT_EQ(Step(0, {0, 0, 0, 1, 0, 2, 0, 0}), (std::vector<CacheDecision>{Migrate(0, 5, 0, 0), Migrate(0, 3, 0, 2)}));
  // Token 3 uses 5 (hit) and 0 (miss): the LRU way not in use is 3.
  EXPECT_EQ(Step(0, {1, 0, 0, 0, 0, 1, 0, 0}), (std::vector<CacheDecision>{Migrate(0, 0, 0, 3)}));
  EXPECT_GT(lru_->last_use({0, 0}), lru_->last_use({0, 2}));
}

TEST_F(LruTest, SetConflictWhenEveryWayIsInUse) {
  // Layer 1 holds 0 and 1; a token uses 0, 1 and (top-3 here) 4: no way is
  // free to evict, so 4 just runs on the CPU and nothing is fetched.
  EXPECT_TRUE(Step(1, {1, 1, 0, 0, 1, 0, 0, 0}).empty());
  // Other layers' sets are untouched by layer 1's traffic.
  EXPECT_EQ(table_->UsedInLayer(0), 2);
}

TEST_F(LruTest, LayersBeyondTheIndexesAreNotCached) {
  EXPECT_TRUE(Step(2, {1, 0, 0, 0, 0, 0, 0, 1}).empty());
  EXPECT_TRUE(Step(3, {0, 9, 0, 0, 0, 0, 0, 0}).empty());
}

TEST_F(LruTest, InFlightCopiesAreNotFetchedTwiceNorEvicted) {
  // Miss on 2: post-fetch, but the copy takes a while.
  std::vector<CacheDecision> d = Route(*lru_, *table_, 0, {0, 0, 1, 0, 0, 0, 0, 0});
  ASSERT_EQ(d, (std::vector<CacheDecision>{Migrate(0, 2, 0, 0)}));
  double free_at = 0;
  ASSERT_OK(ApplyCacheDecisions(d, 0, 1000, &free_at, table_.get()));
  // Next token uses 2 again (still in flight): no second fetch. Then a miss
  // on 6 must evict 1 (resident), not 2 (in flight).
  EXPECT_TRUE(Route(*lru_, *table_, 0, {0, 0, 1, 0, 0, 0, 0, 0}).empty());
  EXPECT_EQ(Route(*lru_, *table_, 0, {0, 0, 0, 0, 0, 0, 1, 0}), (std::vector<CacheDecision>{Migrate(0, 6, 0, 1)}));
}

TEST_F(LruTest, AdmitsWhatThePlannerCopied) {
  // The planner copied expert 7 of layer 0 for this step (migrate-then-gpu):
  // keeping it is a free post-fetch into the LRU way.
  std::vector<int32_t> rows = {0, 0, 0, 0, 0, 0, 0, 40};
  CacheStep step;
  step.layer = 0;
  step.rows = rows;
  step.residency = table_.get();
  LayerPlan plan;
  plan.experts.assign(8, {});
  plan.experts[7].placement = ExpertPlacement::kMigrateThenGpu;
  std::vector<CacheDecision> decisions;
  lru_->OnExecuted(step, plan, &decisions);
  EXPECT_EQ(decisions, (std::vector<CacheDecision>{Admit(0, 7, 0, 0)}));
}

TEST(LruCachePolicyTest, FreeWaysFillBeforeEvicting) {
  ResidencyTable table = Table(2, 8, 4, {{0, 0}});
  absl::StatusOr<std::unique_ptr<LruCachePolicy>> lru = LruCachePolicy::Create({2, 2}, 2, 8);
  ASSERT_OK(lru);
  EXPECT_EQ(Route(**lru, table, 0, {0, 0, 3, 0, 0, 1, 0, 0}),
            (std::vector<CacheDecision>{Migrate(0, 2), Migrate(0, 5, 0, 0)}));
}

TEST(LruCachePolicyTest, RejectsBadGeometry) {
  absl::StatusOr<std::unique_ptr<LruCachePolicy>> lru = LruCachePolicy::Create({2, 9}, 4, 8);
  ASSERT_FALSE(lru.ok());
  EXPECT_TRUE(absl::StrContains(lru.status().message(), "num_ways")) << lru.status();
  lru = LruCachePolicy::Create({5, 2}, 4, 8);
  ASSERT_FALSE(lru.ok());
  EXPECT_TRUE(absl::StrContains(lru.status().message(), "num_indexes")) << lru.status();
}

// ---------------------------------------------------------------- sequence (DAOP)

TEST(SequenceCachePolicyTest, ThresholdIsExact) {
  EXPECT_TRUE(SequenceCachePolicy::AtLeastRatio(105, 100, 1.05));   // at
  EXPECT_FALSE(SequenceCachePolicy::AtLeastRatio(104, 100, 1.05));  // below
  EXPECT_TRUE(SequenceCachePolicy::AtLeastRatio(106, 100, 1.05));   // above
  EXPECT_TRUE(SequenceCachePolicy::AtLeastRatio(21, 20, 1.05));
  EXPECT_FALSE(SequenceCachePolicy::AtLeastRatio(20, 20, 1.05));
  EXPECT_TRUE(SequenceCachePolicy::AtLeastRatio(1, 0, 1.05));
}

struct SwapCase {
  int32_t hot;
  int32_t cold;
  bool swaps;
};

class SequenceSwapTest : public ::testing::TestWithParam<SwapCase> {};

TEST_P(SequenceSwapTest, SwapsWhenHotReachesThresholdTimesCold) {
  // Layer 0: experts 0-3 on the GPU, 4-7 on the CPU. Prefill counts: GPU
  // expert 3 is the coldest (`cold` tokens), CPU expert 6 the hottest.
  const SwapCase& c = GetParam();
  ResidencyTable table = Table(1, 8, 4, {{0, 0}, {0, 1}, {0, 2}, {0, 3}});
  absl::StatusOr<std::unique_ptr<SequenceCachePolicy>> policy = SequenceCachePolicy::Create({});
  ASSERT_OK(policy);
  const std::vector<int32_t> rows = {1000, 1000, 1000, c.cold, 0, 0, c.hot, 0};
  const std::vector<CacheDecision> decisions = Route(**policy, table, 0, rows, Phase::kPrefill);
  if (c.swaps) {
    EXPECT_EQ(decisions, (std::vector<CacheDecision>{Migrate(0, 6, 0, 3)}));
  } else {
    EXPECT_TRUE(decisions.empty());
  }
  // Decode never migrates, whatever the counts.
  EXPECT_TRUE(Route(**policy, table, 0, rows, Phase::kDecode).empty());
}

INSTANTIATE_TEST_SUITE_P(AtBelowAbove, SequenceSwapTest,
                         ::testing::Values(SwapCase{105, 100, true}, SwapCase{104, 100, false},
                                           SwapCase{106, 100, true}, SwapCase{100, 100, false}, SwapCase{1, 0, true},
                                           SwapCase{0, 0, false}));

TEST(SequenceCachePolicyTest, PairsHottestWithColdestUpToHalfTheExperts) {
  // 8 experts: SwapNum = 4. GPU holds 0-4 (5 experts, counts 1..5), CPU
  // experts 5-7 are hot (50, 40, 3). Pairs: (5:50, 0:1) swap, (6:40, 1:2)
  // swap, (7:3, 2:3) 3 < 3.15: no.
  ResidencyTable table = Table(1, 8, 5, {{0, 0}, {0, 1}, {0, 2}, {0, 3}, {0, 4}});
  absl::StatusOr<std::unique_ptr<SequenceCachePolicy>> policy = SequenceCachePolicy::Create({});
  ASSERT_OK(policy);
  EXPECT_EQ(Route(**policy, table, 0, {1, 2, 3, 4, 5, 50, 40, 3}, Phase::kPrefill),
            (std::vector<CacheDecision>{Migrate(0, 5, 0, 0), Migrate(0, 6, 0, 1)}));
  // 16 experts, 9 hot CPU experts, 7 idle GPU experts: only SwapNum = 8 pairs.
  std::vector<ExpertKey> gpu;
  for (int e = 0; e < 7; ++e) gpu.push_back({0, e});
  ResidencyTable wide = Table(1, 16, 7, gpu);
  std::vector<int32_t> rows(16, 0);
  for (int e = 7; e < 16; ++e) rows[static_cast<size_t>(e)] = 10 + e;
  const std::vector<CacheDecision> d = Route(**policy, wide, 0, rows, Phase::kPrefill);
  EXPECT_EQ(d.size(), 7u);  // min(9 hot, 7 cold, 8)
  EXPECT_EQ(d.front(), Migrate(0, 15, 0, 0));
}

TEST(SequenceCachePolicyTest, InactiveCpuExpertsAreNeverHotAndCopiesInFlightStay) {
  ResidencyTable table = Table(1, 8, 3, {{0, 0}, {0, 1}});
  ASSERT_OK(table.BeginMigration({0, 2}, 1e9));
  absl::StatusOr<std::unique_ptr<SequenceCachePolicy>> policy = SequenceCachePolicy::Create({});
  ASSERT_OK(policy);
  // Expert 2 (in flight, 0 tokens) is not swapped out; expert 0 (5 tokens)
  // is colder than hot 7 (9 tokens) by more than 1.05.
  EXPECT_EQ(Route(**policy, table, 0, {5, 20, 0, 0, 0, 0, 0, 9}, Phase::kPrefill),
            (std::vector<CacheDecision>{Migrate(0, 7, 0, 0)}));
  EXPECT_FALSE(SequenceCachePolicy::Create({0.9, 0.5}).ok());
  EXPECT_FALSE(SequenceCachePolicy::Create({1.05, 0}).ok());
}

// ---------------------------------------------------------------- adaptive

// The collaborative paper's Mixtral numbers: CPU 7.34 ms per row, GPU
// 0.25 ms, migration 28.02 ms.
CostModel PaperCost() {
  CostModelParams p;
  p.expert_bytes = 352321536;
  p.activation_row_bytes = 16384;
  p.transports = {{"local", TransferCost{0, 0}}};
  p.cpu_workers = {{RooflineCurve{7340, 0, 7340}, 0}};
  p.gpu = RooflineCurve{250, 0, 0};
  p.migrate = TransferCost{0, 28020.0 / 352321536};
  p.dma = TransferCost{0, 0};
  absl::StatusOr<CostModel> cost = CostModel::Create(p);
  EXPECT_OK(cost);
  return *cost;
}

class AdaptiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    AdaptiveOptions options;
    options.num_experts_per_token = 2;
    absl::StatusOr<std::unique_ptr<AdaptiveCachePolicy>> policy = AdaptiveCachePolicy::Create(options, &cost_, 2, 8);
    ASSERT_OK(policy);
    policy_ = std::move(*policy);
  }
  CostModel cost_ = PaperCost();
  std::unique_ptr<AdaptiveCachePolicy> policy_;
};

TEST_F(AdaptiveTest, PrefillFrequenciesDriveASwapWorthItsCost) {
  // Both slots hold layer-0 experts 0 and 1. The prompt (100 tokens, top-2)
  // routes 60 tokens to expert 3, 2 to expert 0 and none to expert 1.
  ResidencyTable table = Table(2, 8, 2, {{0, 0}, {0, 1}});
  ASSERT_OK(policy_->Reset(table));
  policy_->OnSequenceStart({/*expected_decode_steps=*/64, /*decode_rows_per_step=*/1});
  const std::vector<int32_t> prompt = {2, 0, 40, 60, 30, 30, 20, 18};
  // Expert 3 saves 0.6 x (7340 - 250) us per token over 64 tokens = 272 ms,
  // far more than a 28 ms copy plus expert 1's nothing: 3 replaces 1 (the
  // coldest; 0 is in use by the prompt). Only one copy may be queued ahead,
  // so expert 2 (0.4 x 7090 x 64 = 181 ms) waits for the next step, where it
  // replaces 0 (2%: 9 ms).
  const std::vector<CacheDecision> d = Route(*policy_, table, 0, prompt, Phase::kPrefill);
  EXPECT_DOUBLE_EQ(policy_->frequency({0, 3}), 0.6);
  EXPECT_EQ(d, (std::vector<CacheDecision>{Migrate(0, 3, 0, 1)}));
  EXPECT_NEAR(policy_->ExpectedSavingUs({0, 3}), 64 * 0.6 * (7340 - 250), 1e-6);
  double free_at = 0;
  ASSERT_OK(ApplyCacheDecisions(d, 0, cost_.MigrateUs(), &free_at, &table));
  table.CompleteMigrationsBy(free_at);
  EXPECT_EQ(Route(*policy_, table, 0, std::vector<int32_t>(8, 0), Phase::kDecode),
            (std::vector<CacheDecision>{Migrate(0, 2, 0, 0)}));
}

TEST_F(AdaptiveTest, NoMigrationWhenTheSequenceIsAboutToEnd) {
  ResidencyTable table = Table(2, 8, 2, {{0, 0}, {0, 1}});
  ASSERT_OK(policy_->Reset(table));
  // Two decode tokens left: 2 x 0.6 x 7.09 ms = 8.5 ms < 28 ms.
  policy_->OnSequenceStart({2, 1});
  EXPECT_TRUE(Route(*policy_, table, 0, {2, 0, 40, 60, 30, 30, 20, 18}, Phase::kPrefill).empty());
}

TEST_F(AdaptiveTest, FreeSlotsFillWithoutEvictionAndBacklogHoldsCopies) {
  ResidencyTable table = Table(2, 8, 4, {});
  ASSERT_OK(policy_->Reset(table));
  policy_->OnSequenceStart({64, 1});
  const std::vector<int32_t> prompt = {0, 0, 0, 100, 0, 0, 0, 100};
  // The copy engine is busy for a whole migration already: nothing starts.
  EXPECT_TRUE(Route(*policy_, table, 0, prompt, Phase::kPrefill, /*copy_backlog_us=*/cost_.MigrateUs()).empty());
  // Idle engine: one copy (the hottest; ties to the lower id), into a free slot.
  policy_->OnSequenceStart({64, 1});
  EXPECT_EQ(Route(*policy_, table, 0, prompt, Phase::kPrefill), (std::vector<CacheDecision>{Migrate(0, 3)}));
}

TEST_F(AdaptiveTest, DecodeFrequenciesFollowAnEwma) {
  ResidencyTable table = Table(2, 8, 0, {});
  ASSERT_OK(policy_->Reset(table));
  policy_->OnSequenceStart({});
  EXPECT_DOUBLE_EQ(policy_->frequency({1, 5}), 0.25);  // prior: K / E
  Route(*policy_, table, 1, {0, 0, 0, 0, 0, 1, 1, 0}, Phase::kDecode);
  EXPECT_DOUBLE_EQ(policy_->frequency({1, 5}), 0.875 * 0.25 + 0.125 * 1.0);
  EXPECT_DOUBLE_EQ(policy_->frequency({1, 0}), 0.875 * 0.25);
  // No slots at all: never a decision.
  EXPECT_TRUE(Route(*policy_, table, 1, {0, 0, 0, 0, 0, 1, 1, 0}, Phase::kDecode).empty());
}

TEST_F(AdaptiveTest, AdmitsPlannerCopiesWhenWorthMoreThanTheVictim) {
  ResidencyTable table = Table(2, 8, 1, {{0, 4}});
  ASSERT_OK(policy_->Reset(table));
  policy_->OnSequenceStart({64, 1});
  // Layer 0's prompt leaves expert 4 cold (0 tokens); layer 1's makes 6 hot.
  Route(*policy_, table, 0, {50, 50, 0, 0, 0, 50, 50, 0}, Phase::kPrefill, 1e12);  // backlog: no copy now
  const std::vector<int32_t> rows = {0, 0, 0, 0, 0, 10, 40, 30};                   // 40 tokens
  Route(*policy_, table, 1, rows, Phase::kPrefill, 1e12);
  CacheStep step;
  step.layer = 1;
  step.phase = Phase::kPrefill;
  step.rows = rows;
  step.residency = &table;
  LayerPlan plan;
  plan.experts.assign(8, {});
  plan.experts[6].placement = ExpertPlacement::kMigrateThenGpu;
  std::vector<CacheDecision> decisions;
  policy_->OnExecuted(step, plan, &decisions);
  EXPECT_EQ(decisions, (std::vector<CacheDecision>{Admit(1, 6, 0, 4)}));
}

TEST_F(AdaptiveTest, PrefillNeverEvictsALayerItHasNotReached) {
  // The only resident expert is in layer 1; layer 0's prefill wants a slot.
  // Layer 1 is about to run with ~all its experts busy: evicting from it
  // would cost a copy in this very step.
  ResidencyTable table = Table(2, 8, 1, {{1, 4}});
  ASSERT_OK(policy_->Reset(table));
  policy_->OnSequenceStart({64, 1});
  const std::vector<int32_t> rows = {0, 0, 0, 0, 0, 10, 40, 30};
  EXPECT_TRUE(Route(*policy_, table, 0, rows, Phase::kPrefill).empty());
  // In decode the same expert is fair game (its expected use is in its frequency).
  EXPECT_EQ(Route(*policy_, table, 0, {0, 0, 0, 0, 0, 0, 1, 1}, Phase::kDecode),
            (std::vector<CacheDecision>{Migrate(0, 6, 1, 4)}));
}

TEST(CachePolicyFactoryTest, NamesAndOptions) {
  for (CachePolicyKind kind :
       {CachePolicyKind::kStatic, CachePolicyKind::kLru, CachePolicyKind::kSequence, CachePolicyKind::kAdaptive}) {
    absl::StatusOr<CachePolicyKind> parsed = ParseCachePolicyKind(CachePolicyKindName(kind));
    ASSERT_OK(parsed);
    EXPECT_EQ(*parsed, kind);
  }
  EXPECT_FALSE(ParseCachePolicyKind("fifo").ok());
  const CostModel cost = PaperCost();
  CachePolicyOptions options;
  options.kind = CachePolicyKind::kLru;
  options.lru = {14, 4};
  absl::StatusOr<std::unique_ptr<CachePolicy>> policy = MakeCachePolicy(options, 32, 8, nullptr);
  ASSERT_OK(policy);
  EXPECT_EQ((*policy)->name(), "lru");
  options.kind = CachePolicyKind::kAdaptive;
  policy = MakeCachePolicy(options, 32, 8, nullptr);
  ASSERT_FALSE(policy.ok());
  EXPECT_TRUE(absl::StrContains(policy.status().message(), "cost")) << policy.status();
  policy = MakeCachePolicy(options, 32, 8, &cost);
  ASSERT_OK(policy);
  EXPECT_EQ((*policy)->name(), "adaptive");
}

}  // namespace
}  // namespace tandem
