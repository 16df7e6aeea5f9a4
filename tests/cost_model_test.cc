// The planner's cost model: roofline fits of measured tables, the terms it
// predicts, online EWMA refinement and its prediction-error windows.
#include "coordinator/orchestration/planner/cost_model.h"

#include <cmath>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

CostModelParams SimpleParams(int num_workers = 1) {
  CostModelParams p;
  p.expert_bytes = 1'000'000;
  p.activation_row_bytes = 1000;
  p.transports = {{"shm", TransferCost{10, 0.001}}};
  for (int w = 0; w < num_workers; ++w) p.cpu_workers.push_back({RooflineCurve{1000, 0, 100}, 0});
  p.gpu = RooflineCurve{50, 0, 0.5};
  p.migrate = TransferCost::FromBandwidth(20, 10);  // 10 GB/s: 1 MB in 100 us, +20 fixed
  p.dma = TransferCost{5, 0.0001};
  return p;
}

TEST(RooflineCurveTest, PlateauThenLinear) {
  const RooflineCurve curve{1000, 200, 100};
  EXPECT_EQ(curve.Us(0), 0);
  EXPECT_EQ(curve.Us(1), 1000);
  EXPECT_EQ(curve.Us(8), 1000);
  EXPECT_EQ(curve.Us(9), 1100);
  EXPECT_EQ(curve.Us(100), 10200);
  EXPECT_DOUBLE_EQ(curve.BreakpointRows(), 8);
  EXPECT_TRUE(std::isinf(RooflineCurve{250, 0, 0}.BreakpointRows()));
}

TEST(RooflineCurveTest, ValidateNamesTheField) {
  absl::Status s = RooflineCurve{10, 0, -1}.Validate("cpu_workers[1].compute");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "cpu_workers[1].compute.per_row_us")) << s;
  s = RooflineCurve{0, 0, 0}.Validate("gpu");
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), "gpu")) << s;
}

TEST(FitRooflineTest, RecoversAnExactRoofline) {
  const RooflineCurve truth{1000, 200, 100};
  std::vector<TimingSample> table;
  for (double rows : {512.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0})
    table.push_back({rows, truth.Us(rows)});
  absl::StatusOr<RooflineCurve> fit = FitRoofline(table);
  ASSERT_OK(fit);
  for (double rows : {1.0, 3.0, 8.0, 10.0, 50.0, 300.0, 1000.0}) {
    EXPECT_NEAR(fit->Us(rows), truth.Us(rows), 1e-6 * truth.Us(rows)) << rows;
  }
}

TEST(FitRooflineTest, LinearAndFlatTablesAreSpecialCases) {
  // Fiddler's CPU model: linear through the origin.
  std::vector<TimingSample> linear;
  for (double rows : {1.0, 2.0, 4.0, 8.0}) linear.push_back({rows, 7000 * rows});
  absl::StatusOr<RooflineCurve> fit = FitRoofline(linear);
  ASSERT_OK(fit);
  for (double rows : {1.0, 3.0, 16.0}) EXPECT_NEAR(fit->Us(rows), 7000 * rows, 1e-6 * 7000 * rows);
  // Fiddler's GPU model: constant.
  std::vector<TimingSample> flat{{1, 250}, {8, 250}, {64, 250}};
  fit = FitRoofline(flat);
  ASSERT_OK(fit);
  EXPECT_NEAR(fit->Us(1), 250, 1e-9);
  EXPECT_NEAR(fit->Us(4096), 250, 1e-9);
  EXPECT_NEAR(fit->per_row_us, 0, 1e-9);
}

// The expert-FFN table measured on the development VM (docs/BENCHMARKS.md,
// "Other instruction sets"; bench/results/expert-ffn-2core-epyc.jsonl): one Mixtral expert, 2 cores.
// It is not an ideal roofline (4-8 rows fall between the kernels), so the
// fit is judged by its relative error at every point.
TEST(FitRooflineTest, FitsTheMeasuredEpycTableWithinTolerance) {
  const std::vector<TimingSample> table = {{1, 13700},  {2, 14800},   {4, 22800},    {8, 35600},    {16, 74400},
                                           {32, 97000}, {64, 190000}, {128, 386000}, {256, 779000}, {512, 1260000}};
  absl::StatusOr<RooflineCurve> fit = FitRoofline(table);
  ASSERT_OK(fit);
  double sum = 0, worst = 0;
  for (const TimingSample& p : table) {
    const double error = std::abs(fit->Us(p.rows) - p.us) / p.us;
    sum += error;
    worst = std::max(worst, error);
  }
  EXPECT_LT(sum / table.size(), 0.15) << "plateau " << fit->plateau_us << " base " << fit->base_us << " per_row "
                                      << fit->per_row_us;
  EXPECT_LT(worst, 0.45);
  // The shape: a memory-bound plateau near the 1-row time, then ~2.5-3 ms per row.
  EXPECT_NEAR(fit->plateau_us, 13700, 0.25 * 13700);
  EXPECT_GT(fit->per_row_us, 2000);
  EXPECT_LT(fit->per_row_us, 3200);
  // Non-decreasing everywhere (the makespan planner's proof needs it).
  for (double rows = 1; rows < 2048; rows *= 1.5) EXPECT_LE(fit->Us(rows), fit->Us(rows * 1.5));
}

TEST(FitRooflineTest, NoisyTableStaysClose) {
  const RooflineCurve truth{5000, -2000, 300};
  std::vector<TimingSample> table;
  int i = 0;
  for (double rows = 1; rows <= 1024; rows *= 2, ++i) {
    const double noise = (i % 2 == 0 ? 1.04 : 0.96);  // ±4%, deterministic
    table.push_back({rows, truth.Us(rows) * noise});
    table.push_back({rows, truth.Us(rows) / noise});
  }
  absl::StatusOr<RooflineCurve> fit = FitRoofline(table);
  ASSERT_OK(fit);
  for (double rows = 1; rows <= 1024; rows *= 2)
    EXPECT_NEAR(fit->Us(rows), truth.Us(rows), 0.08 * truth.Us(rows)) << rows;
}

TEST(FitRooflineTest, RejectsBadTablesNamingTheField) {
  std::vector<TimingSample> one{{1, 100}};
  absl::StatusOr<RooflineCurve> fit = FitRoofline(one, "cpu_workers[0].compute.table");
  ASSERT_FALSE(fit.ok());
  EXPECT_EQ(fit.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(fit.status().message(), "cpu_workers[0].compute.table")) << fit.status();
  std::vector<TimingSample> zero_rows{{1, 100}, {0, 100}};
  fit = FitRoofline(zero_rows, "gpu.table");
  ASSERT_FALSE(fit.ok());
  EXPECT_TRUE(absl::StrContains(fit.status().message(), "gpu.table[1]")) << fit.status();
  std::vector<TimingSample> negative_time{{1, 100}, {2, -5}};
  EXPECT_FALSE(FitRoofline(negative_time).ok());
}

TEST(CostModelTest, TermsFollowTheParameters) {
  absl::StatusOr<CostModel> cost = CostModel::Create(SimpleParams(2));
  ASSERT_OK(cost);
  EXPECT_EQ(cost->num_cpu_workers(), 2);
  EXPECT_DOUBLE_EQ(cost->CpuUs(0, 1), 1000);
  EXPECT_DOUBLE_EQ(cost->CpuUs(1, 20), 2000);
  EXPECT_DOUBLE_EQ(cost->GpuUs(100), 50);
  EXPECT_DOUBLE_EQ(cost->GpuUs(1000), 500);
  EXPECT_NEAR(cost->MigrateUs(), 20 + 100, 1e-9);
  EXPECT_DOUBLE_EQ(cost->DmaUs(0), 0);
  EXPECT_DOUBLE_EQ(cost->DmaUs(10000), 5 + 1);
  EXPECT_DOUBLE_EQ(cost->IpcUs(1, 1000), 10 + 1);
  absl::StatusOr<double> t = cost->TransportUs("shm", 1000);
  ASSERT_OK(t);
  EXPECT_DOUBLE_EQ(*t, 11);
  EXPECT_FALSE(cost->TransportUs("carrier-pigeon", 1).ok());
  // One expert alone: split halves it across both workers, shard runs it whole.
  EXPECT_DOUBLE_EQ(cost->CpuExpertUs(20, ExpertDivision::kSplit, 0), 1000);
  EXPECT_DOUBLE_EQ(cost->CpuExpertUs(20, ExpertDivision::kShard, 1), 2000);
}

TEST(CostModelTest, ValidateNamesTheFirstBadField) {
  CostModelParams p = SimpleParams();
  p.cpu_workers[0].transport = 3;
  absl::StatusOr<CostModel> cost = CostModel::Create(p);
  ASSERT_FALSE(cost.ok());
  EXPECT_TRUE(absl::StrContains(cost.status().message(), "cpu_workers[0].transport")) << cost.status();
  p = SimpleParams();
  p.expert_bytes = 0;
  cost = CostModel::Create(p);
  ASSERT_FALSE(cost.ok());
  EXPECT_TRUE(absl::StrContains(cost.status().message(), "expert_bytes")) << cost.status();
  p = SimpleParams();
  p.migrate = TransferCost{0, 0};
  cost = CostModel::Create(p);
  ASSERT_FALSE(cost.ok());
  EXPECT_TRUE(absl::StrContains(cost.status().message(), "migrate")) << cost.status();
  CostModelOptions options;
  options.ewma_alpha = 0;
  cost = CostModel::Create(SimpleParams(), options);
  ASSERT_FALSE(cost.ok());
  EXPECT_TRUE(absl::StrContains(cost.status().message(), "ewma_alpha")) << cost.status();
}

TEST(CostModelTest, DivideCpuIntoWorkers) {
  absl::StatusOr<CostModelParams> two = DivideCpuIntoWorkers(SimpleParams(1), 2);
  ASSERT_OK(two);
  absl::StatusOr<CostModel> whole = CostModel::Create(SimpleParams(1));
  absl::StatusOr<CostModel> divided = CostModel::Create(*two);
  ASSERT_OK(whole);
  ASSERT_OK(divided);
  ASSERT_EQ(divided->num_cpu_workers(), 2);
  for (double rows : {1.0, 5.0, 50.0}) {
    EXPECT_DOUBLE_EQ(divided->CpuUs(1, rows), 2 * whole->CpuUs(0, rows));
    // Split over both halves: the whole CPU's time again.
    EXPECT_DOUBLE_EQ(divided->CpuExpertUs(rows, ExpertDivision::kSplit, 0), whole->CpuUs(0, rows));
  }
  EXPECT_FALSE(DivideCpuIntoWorkers(*two, 2).ok());
  EXPECT_FALSE(DivideCpuIntoWorkers(SimpleParams(1), 0).ok());
}

TEST(CostModelTest, EwmaMovesThePredictionTowardTheMeasurement) {
  CostModelOptions options;
  options.ewma_alpha = 0.25;
  absl::StatusOr<CostModel> cost = CostModel::Create(SimpleParams(), options);
  ASSERT_OK(cost);
  // Linear region (s = 50: 5000 us predicted); the machine is twice as slow.
  const int32_t rows[] = {50};
  for (int i = 1; i <= 10; ++i) {
    cost->ObserveCpu(0, rows, 10000);
    const double expected = 10000 - 5000 * std::pow(0.75, i);
    EXPECT_NEAR(cost->CpuUs(0, 50), expected, 1e-6 * expected) << i;
  }
  // Only the line moved: the plateau is where it was.
  EXPECT_DOUBLE_EQ(cost->params().cpu_workers[0].compute.plateau_us, 1000);
  // Plateau region (s = 2: 1000 us predicted) observed at 1500.
  const int32_t small[] = {2};
  const double slope_before = cost->params().cpu_workers[0].compute.per_row_us;
  cost->ObserveCpu(0, small, 1500);
  EXPECT_DOUBLE_EQ(cost->params().cpu_workers[0].compute.plateau_us, 1000 + 0.25 * 500);
  EXPECT_DOUBLE_EQ(cost->params().cpu_workers[0].compute.per_row_us, slope_before);
}

TEST(CostModelTest, BatchObservationsScaleTheWholeCurve) {
  CostModelOptions options;
  options.ewma_alpha = 0.5;
  absl::StatusOr<CostModel> cost = CostModel::Create(SimpleParams(), options);
  ASSERT_OK(cost);
  const int32_t batch[] = {2, 50, 0};  // 1000 + 5000 predicted
  cost->ObserveCpu(0, batch, 12000);   // twice that
  const double factor = 1 + 0.5 * (12000.0 / 6000 - 1);
  EXPECT_DOUBLE_EQ(cost->params().cpu_workers[0].compute.plateau_us, 1000 * factor);
  EXPECT_DOUBLE_EQ(cost->params().cpu_workers[0].compute.per_row_us, 100 * factor);
}

TEST(CostModelTest, SplitObservationsAreScaledToWholeExperts) {
  CostModelOptions options;
  options.ewma_alpha = 1.0;
  absl::StatusOr<CostModel> cost = CostModel::Create(SimpleParams(2), options);
  ASSERT_OK(cost);
  const int32_t rows[] = {50};  // whole expert: 5000 us; worker 1's half: 2500
  cost->ObserveCpu(1, rows, 2500, /*share=*/0.5);
  EXPECT_NEAR(cost->CpuUs(1, 50), 5000, 1e-9);  // right on: unchanged
  EXPECT_NEAR(cost->Stats().cpu.mape_percent, 0, 1e-9);
  cost->ObserveCpu(1, rows, 3000, 0.5);
  EXPECT_NEAR(cost->CpuUs(1, 50), 6000, 1e-9);
}

TEST(CostModelTest, MigrationDmaIpcAndGpuRefine) {
  CostModelOptions options;
  options.ewma_alpha = 1.0;  // jump straight to the measurement
  absl::StatusOr<CostModel> cost = CostModel::Create(SimpleParams(), options);
  ASSERT_OK(cost);
  cost->ObserveMigration(240);
  EXPECT_NEAR(cost->MigrateUs(), 240, 1e-9);
  cost->ObserveDma(10000, 12);
  EXPECT_NEAR(cost->DmaUs(10000), 12, 1e-9);
  cost->ObserveIpc(0, 1000, 22);
  EXPECT_NEAR(cost->IpcUs(0, 1000), 22, 1e-9);
  const int32_t rows[] = {10, 10};
  cost->ObserveGpu(rows, 200);
  EXPECT_NEAR(cost->GpuUs(10), 100, 1e-9);
}

TEST(CostModelTest, MapeCoversTheLastNObservations) {
  CostModelOptions options;
  options.ewma_alpha = 1e-9;  // keep predictions fixed so the errors are known
  options.error_window = 4;
  absl::StatusOr<CostModel> cost = CostModel::Create(SimpleParams(), options);
  ASSERT_OK(cost);
  EXPECT_EQ(cost->Stats().cpu.window, 0);
  EXPECT_EQ(cost->Stats().cpu.mape_percent, 0);
  const int32_t rows[] = {50};       // predicts 5000
  cost->ObserveCpu(0, rows, 5000);   // 0%
  cost->ObserveCpu(0, rows, 10000);  // 50%
  CostModelStats stats = cost->Stats();
  EXPECT_EQ(stats.cpu.observations, 2);
  EXPECT_EQ(stats.cpu.window, 2);
  EXPECT_NEAR(stats.cpu.mape_percent, 25, 1e-3);
  // Four more at 0% push both out of the 4-wide window.
  for (int i = 0; i < 4; ++i) cost->ObserveCpu(0, rows, 5000);
  stats = cost->Stats();
  EXPECT_EQ(stats.cpu.observations, 6);
  EXPECT_EQ(stats.cpu.window, 4);
  EXPECT_NEAR(stats.cpu.mape_percent, 0, 1e-3);
  // Makespan scoring changes no parameter.
  cost->ObserveMakespan(900, 1000);
  EXPECT_NEAR(cost->Stats().makespan.mape_percent, 10, 1e-9);
  // Unscorable observations are ignored.
  cost->ObserveCpu(0, rows, 0);
  cost->ObserveCpu(7, rows, 100);
  EXPECT_EQ(cost->Stats().cpu.observations, 6);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

TEST(CostModelTest, CostModelForWorkersDividesAWholeCpuProfileOnly) {
  absl::StatusOr<CostModel> one = CostModelForWorkers(SimpleParams(1), 1);
  ASSERT_OK(one);
  EXPECT_EQ(one->num_cpu_workers(), 1);
  absl::StatusOr<CostModel> two = CostModelForWorkers(SimpleParams(1), 2);
  ASSERT_OK(two);
  EXPECT_EQ(two->num_cpu_workers(), 2);
  absl::StatusOr<CostModelParams> listed = DivideCpuIntoWorkers(SimpleParams(1), 2);
  ASSERT_OK(listed);
  EXPECT_OK(CostModelForWorkers(*listed, 2)) << "a profile that lists its workers is used as it is";
  const absl::StatusOr<CostModel> mismatch = CostModelForWorkers(*listed, 3);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mismatch.status().message().find("workers"), std::string::npos) << mismatch.status();
}

}  // namespace
}  // namespace tandem
