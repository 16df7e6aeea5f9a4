// Linear() against a naive float64 loop over the same stored weights, for
// every dtype, every kernel of the dispatch table this CPU can run (the
// others skip, naming the flags it lacks), odd shapes, with and without
// bias, on one and two threads; the kernel plan and the ISA cap.
//
// Legend: M rows, K input features, N output features.
#include "common/kernels/linear.h"

#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kernels/kernel_calibration.h"
#include "common/kernels/kernel_plan.h"
#include "gtest/gtest.h"
#include "tests/kernel_cases_testlib.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

// A weight matrix [N, K] stored in `dtype`, values uniform in [-1, 1].
struct StoredWeight {
  StoredWeight(DType dtype, int64_t n, int64_t k, uint32_t seed) : bytes(n * k * DTypeSize(dtype)) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (int64_t i = 0; i < n * k; ++i) {
      const float v = dist(rng);
      StoreAsDType(bytes.data(), dtype, static_cast<size_t>(i), v);
    }
    view = {bytes.data(), dtype, n, k};
  }
  std::vector<uint8_t> bytes;
  LinearWeight view;
};

std::vector<float> RandomVector(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& e : v) e = dist(rng);
  return v;
}

// The oracle: y = x . W^T + bias in float64 over the stored (already rounded)
// weights, plus the magnitude sum |x| . |W|^T the error bound scales with.
void NaiveLinear(const float* x, int64_t m, const LinearWeight& w, const float* bias, std::vector<double>& y,
                 std::vector<double>& magnitude) {
  y.assign(static_cast<size_t>(m * w.n), 0.0);
  magnitude.assign(static_cast<size_t>(m * w.n), 0.0);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < w.n; ++j) {
      double sum = bias != nullptr ? bias[j] : 0.0, mag = bias != nullptr ? std::fabs(bias[j]) : 0.0;
      for (int64_t kk = 0; kk < w.k; ++kk) {
        const double p = static_cast<double>(x[r * w.k + kk]) * LoadAsF32(w.data, w.dtype, j * w.k + kk);
        sum += p;
        mag += std::fabs(p);
      }
      y[r * w.n + j] = sum;
      magnitude[r * w.n + j] = mag;
    }
  }
}

// f32 accumulation of K products (FMA) plus a bias, in any order, is within
// (K + 1) * 2^-24 * sum |terms| of the exact sum: the rigorous worst case of
// recursive summation, which blocked and lane-split sums only improve on.
// A kernel that changes x first (rounded to bf16: 8 significant bits,
// nearest even; split into bf16 hi + lo: 16) changes each product by at
// most its x_relative_error of itself: that times sum |terms| more (and the
// accumulation bound grows by that factor, hence K + 3).
double Tolerance(int64_t k, double magnitude, const LinearKernel& kernel) {
  const double x_error = kernel.x_relative_error;
  if (x_error == 0.0) return (k + 2) * std::ldexp(1.0, -24) * magnitude + 1e-30;
  return (x_error + (k + 3) * std::ldexp(1.0, -24)) * magnitude + 1e-30;
}

struct Case {
  DType dtype;
  int64_t n, k;
  bool bias;
  int threads;
};

std::string CaseName(const Case& c) {
  return absl::StrCat(std::string(DTypeName(c.dtype)), " N=", c.n, " K=", c.k, c.bias ? " bias" : " no-bias",
                      " threads=", c.threads);
}

std::string CaseTestName(const Case& c) {
  return absl::StrCat(std::string(DTypeName(c.dtype)), "_N", c.n, "_K", c.k, c.bias ? "_bias" : "", "_t", c.threads);
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  // Odd shapes (tails in N and K, K odd for the bf16 pairs), one that spans
  // several tasks and oneDNN tiles (N = 300 > 256), a K below one vector,
  // and K = 1024 whose 4 KB rows make Linear read x through a padded copy
  // (ActivationRowStride).
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{13, 72}, {1, 8}, {37, 129}, {300, 520}, {9, 3}, {20, 1024}};
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16})
    for (const auto& [n, k] : shapes)
      for (bool bias : {false, true})
        for (int threads : {1, 2}) cases.push_back({dtype, n, k, bias, threads});
  return cases;
}

void ExpectMatchesNaive(const Case& c, const std::vector<int64_t>& row_counts, const LinearOptions& options,
                        const std::string& label) {
  const StoredWeight w(c.dtype, c.n, c.k, 17);
  const std::vector<float> bias = RandomVector(c.n, 5);
  ThreadPool pool(ThreadPoolOptions{.num_threads = c.threads, .name = "linear-test"});
  for (int64_t m : row_counts) {
    const std::vector<float> x = RandomVector(m * c.k, 100 + static_cast<uint32_t>(m));
    std::vector<float> y(static_cast<size_t>(m * c.n), std::numeric_limits<float>::quiet_NaN());
    const float* b = c.bias ? bias.data() : nullptr;
    ASSERT_OK(Linear(x.data(), m, w.view, b, y.data(), &pool, options));
    std::vector<double> ref, magnitude;
    NaiveLinear(x.data(), m, w.view, b, ref, magnitude);
    const LinearKernel& kernel = ChooseLinearKernel(m, c.dtype, options);
    for (int64_t i = 0; i < m * c.n; ++i) {
      ASSERT_NEAR(y[i], ref[i], Tolerance(c.k, magnitude[i], kernel))
          << CaseName(c) << " " << label << " kernel=" << kernel.name << " M=" << m << " row " << i / c.n << " feature "
          << i % c.n;
    }
  }
}

std::vector<int64_t> RowCounts() {
  std::vector<int64_t> rows;
  for (int64_t m = 1; m <= 40; ++m) rows.push_back(m);
  rows.push_back(64);
  rows.push_back(97);
  return rows;
}

// Skips the test (naming what is missing) when this process may not run `kernel`.
#define SKIP_UNLESS_RUNNABLE(kernel) \
  if ((kernel).isa > ActiveIsa()) GTEST_SKIP() << (kernel).name << ": " << IsaUnavailableReason((kernel).isa)

void PrintTo(const Case& c, std::ostream* out) { *out << CaseName(c); }

class LinearTest : public ::testing::TestWithParam<Case> {};

TEST_P(LinearTest, DefaultPlanMatchesNaive) {
  // The process's plan: small row counts stream, the rest a GEMM path.
  ExpectMatchesNaive(GetParam(), RowCounts(), LinearOptions{}, "default");
}

TEST_P(LinearTest, F32ActivationsMatchNaiveWithoutRounding) {
  // The router's setting: whatever the plan says, x is never rounded.
  LinearOptions options;
  options.f32_activations = true;
  for (int64_t m : RowCounts()) EXPECT_FALSE(ChooseLinearKernel(m, GetParam().dtype, options).rounds_activations);
  ExpectMatchesNaive(GetParam(), RowCounts(), options, "f32-activations");
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return CaseTestName(info.param); });

// Every kernel of the table against the reference at every row count.
using KernelCase = test::KernelCase<Case>;

void PrintTo(const KernelCase& c, std::ostream* out) { *out << c.kernel->name << " " << CaseName(c.shape); }

class LinearKernelTest : public ::testing::TestWithParam<KernelCase> {};

TEST_P(LinearKernelTest, MatchesNaiveAtAllRows) {
  const KernelCase& c = GetParam();
  SKIP_UNLESS_RUNNABLE(*c.kernel);
  LinearOptions options;
  options.kernel = c.kernel;
  ExpectMatchesNaive(c.shape, RowCounts(), options, std::string(c.kernel->name));
}

// Each output depends only on its x row, its W row and the kernel: the same
// bits at every M, however the rows are batched and the work split. Kernels
// that are not the same at every M still give the same bits at any split.
TEST_P(LinearKernelTest, RowResultIndependentOfBatchAndThreads) {
  const KernelCase& c = GetParam();
  SKIP_UNLESS_RUNNABLE(*c.kernel);
  if (c.shape.threads != 2) GTEST_SKIP() << "compares 1 and 2 threads; run once per shape";
  if (c.kernel->path == KernelPath::kOneDnn) GTEST_SKIP() << "oneDNN picks its own kernels by M";
  const StoredWeight w(c.shape.dtype, c.shape.n, c.shape.k, 23);
  LinearOptions options;
  options.kernel = c.kernel;
  constexpr int64_t kRows = 37;
  const std::vector<float> x = RandomVector(kRows * c.shape.k, 7);
  ThreadPool two(ThreadPoolOptions{.num_threads = 2, .name = "linear-test"});
  const int64_t n = c.shape.n;
  std::vector<float> batched(static_cast<size_t>(kRows * n)), batched_one_thread(batched.size());
  ASSERT_OK(Linear(x.data(), kRows, w.view, nullptr, batched.data(), &two, options));
  ASSERT_OK(Linear(x.data(), kRows, w.view, nullptr, batched_one_thread.data(), nullptr, options));
  EXPECT_EQ(batched, batched_one_thread) << c.kernel->name << ": the split changed a batched result";
  for (int64_t r : {int64_t{0}, int64_t{16}, kRows - 1}) {
    std::vector<float> alone(static_cast<size_t>(n)), alone_two_threads(static_cast<size_t>(n));
    ASSERT_OK(Linear(x.data() + r * c.shape.k, 1, w.view, nullptr, alone.data(), nullptr, options));
    ASSERT_OK(Linear(x.data() + r * c.shape.k, 1, w.view, nullptr, alone_two_threads.data(), &two, options));
    EXPECT_EQ(alone, alone_two_threads) << c.kernel->name << " row " << r << ": the split changed a one-row result";
    if (!c.kernel->same_at_every_m) continue;
    for (int64_t j = 0; j < n; ++j)
      ASSERT_EQ(alone[j], batched[r * n + j]) << c.kernel->name << " row " << r << " feature " << j;
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, LinearKernelTest, ::testing::ValuesIn(test::WithEveryKernel(AllCases())),
                         test::KernelCaseName<Case>(CaseTestName));

// Model-sized K at decode's row counts: rows of x and W a multiple of 4 KB
// apart (K = 4096) share L1 sets, which the kernels' x layouts pad around;
// K = 4128 and 4100 leave tails after the 64- and 32-value steps.
TEST(LinearWideRowsTest, EveryBf16KernelMatchesNaiveAtDecodeRows) {
  for (const LinearKernel& kernel : AllLinearKernels()) {
    if (kernel.dtype != DType::kBF16 || kernel.isa > ActiveIsa()) continue;
    LinearOptions options;
    options.kernel = &kernel;
    for (int64_t k : {4096, 4128, 4100}) {
      ExpectMatchesNaive(Case{DType::kBF16, 6, k, true, 2}, {1, 2, 3, 4, 5, 7, 8, 9, 11, 12, 16}, options,
                         std::string(kernel.name));
    }
  }
}

// Prefill's row counts: the bf16_dot GEMM sweeps x in super-blocks of 512
// rows (32 row blocks) per W tile, so row counts on both sides of one and
// two super-blocks, odd K (its pair tail) and N tails, with bias.
TEST(LinearWideRowsTest, EveryBf16KernelMatchesNaiveAcrossRowSuperBlocks) {
  for (const LinearKernel& kernel : AllLinearKernels()) {
    if (kernel.dtype != DType::kBF16 || kernel.isa > ActiveIsa()) continue;
    LinearOptions options;
    options.kernel = &kernel;
    ExpectMatchesNaive(Case{DType::kBF16, 29, 515, true, 2}, {496, 511, 512, 513, 530, 1024, 1041}, options,
                       std::string(kernel.name));
  }
}

TEST(LinearKernelTable, EveryPathHasABaselineVariantExceptBf16Dot) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (KernelPath path : {KernelPath::kStream, KernelPath::kPacked, KernelPath::kOneDnn}) {
      const LinearKernel* kernel = FindLinearKernel(dtype, path, IsaLevel::kAvx2);
      ASSERT_NE(kernel, nullptr) << DTypeName(dtype) << " " << KernelPathName(path);
      EXPECT_EQ(kernel->isa, IsaLevel::kAvx2);
    }
    EXPECT_EQ(FindLinearKernel(dtype, KernelPath::kBf16Dot, IsaLevel::kAvx512Vnni), nullptr);
  }
  EXPECT_EQ(FindLinearKernel(DType::kF32, KernelPath::kBf16Dot, IsaLevel::kAmx), nullptr);
  const LinearKernel* dot = FindLinearKernel(DType::kBF16, KernelPath::kBf16Dot, IsaLevel::kAvx512Bf16);
  ASSERT_NE(dot, nullptr);
  EXPECT_STREQ(dot->name, "avx512_bf16_dot");
  EXPECT_TRUE(dot->rounds_activations);
  const LinearKernel* tiles = FindLinearKernel(DType::kBF16, KernelPath::kBf16Dot, IsaLevel::kAmx);
  ASSERT_NE(tiles, nullptr);
  EXPECT_STREQ(tiles->name, "amx_bf16_dot");
  EXPECT_STREQ(FindLinearKernel(DType::kQ4_K, KernelPath::kBf16Dot, IsaLevel::kAmx)->name, "amx_q_dot");
  EXPECT_STREQ(FindLinearKernel(DType::kQ4_K, KernelPath::kBf16Dot, IsaLevel::kAvx512Bf16)->name, "avx512_bf16_q_dot");
  EXPECT_STREQ(FindLinearKernel(DType::kF16, KernelPath::kStream, IsaLevel::kAvx512)->name, "avx512_stream");
}

TEST(LinearKernelChoice, FollowsPlanIsaCapAndPrecision) {
  ASSERT_OK_AND_ASSIGN(const KernelPlan plan, KernelPlan::Parse("1:stream,8:bf16_dot,300:onednn", "test"));
  LinearOptions options{.plan = &plan};
  const IsaLevel isa = ActiveIsa();
  EXPECT_EQ(ChooseLinearKernel(7, DType::kBF16, options).path, KernelPath::kStream);
  EXPECT_EQ(ChooseLinearKernel(300, DType::kBF16, options).path, KernelPath::kOneDnn);
  // bf16_dot where the CPU has it, for bf16 weights only; packed otherwise.
  EXPECT_EQ(ChooseLinearKernel(8, DType::kBF16, options).path,
            isa >= IsaLevel::kAvx512Bf16 ? KernelPath::kBf16Dot : KernelPath::kPacked);
  EXPECT_EQ(ChooseLinearKernel(8, DType::kF32, options).path, KernelPath::kPacked);
  options.f32_activations = true;
  EXPECT_EQ(ChooseLinearKernel(8, DType::kBF16, options).path, KernelPath::kPacked);
  // The cap selects the AVX2 variants.
  options.max_isa = IsaLevel::kAvx2;
  EXPECT_STREQ(ChooseLinearKernel(1, DType::kBF16, options).name, "avx2_stream");
  EXPECT_STREQ(ChooseLinearKernel(8, DType::kBF16, options).name, "avx2_packed");
  EXPECT_NE(DescribeKernelChoice(DType::kBF16, options).find("1-7 rows avx2_stream"), std::string::npos)
      << DescribeKernelChoice(DType::kBF16, options);
}

TEST(LinearKernelChoice, ForcedKernelAboveTheCpuFails) {
  const LinearKernel* dot = FindLinearKernel(DType::kBF16, KernelPath::kBf16Dot, IsaLevel::kAmx);
  ASSERT_NE(dot, nullptr);
  if (dot->isa <= ActiveIsa()) GTEST_SKIP() << "this process may run " << dot->name;
  const StoredWeight w(DType::kBF16, 4, 8, 1);
  std::vector<float> x(16), y(8);
  LinearOptions options{.kernel = dot};
  const absl::Status status = Linear(x.data(), 2, w.view, nullptr, y.data(), nullptr, options);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find(dot->name), std::string::npos) << status;
  EXPECT_NE(status.message().find(IsaLevelName(dot->isa)), std::string::npos) << status;
}

TEST(KernelPlanTest, ParsesPrintsAndRejects) {
  ASSERT_OK_AND_ASSIGN(const KernelPlan plan, KernelPlan::Parse("1:stream, 12:packed,16:packed,64:bf16_dot", "t"));
  EXPECT_EQ(plan.Spec(), "1:stream,12:packed,64:bf16_dot");  // equal neighbours merge
  for (DType dtype : {DType::kBF16, DType::kQ4_K}) {  // one list serves both kinds of weights
    EXPECT_EQ(plan.PathFor(1, dtype), KernelPath::kStream);
    EXPECT_EQ(plan.PathFor(11, dtype), KernelPath::kStream);
    EXPECT_EQ(plan.PathFor(63, dtype), KernelPath::kPacked);
    EXPECT_EQ(plan.PathFor(1 << 20, dtype), KernelPath::kBf16Dot);
  }
  EXPECT_EQ(plan.source(), "t");
  for (const char* bad : {"", "2:stream", "1:stream,1:packed", "1:stream,8:fast", "stream", "1:stream,x:packed",
                          "1:stream;", "1:stream;2:int8_dot", "1:stream;quantized=", "1:stream;quantized=4:int8_dot",
                          "1:stream;quantized=1:int8_dot;quantized=1:packed", "1:stream;floats=1:int8_dot",
                          "1:stream;f16=1:packed", "1:stream;q8_0=1:int8_dot;Q8_0=1:packed", "1:stream;q4_K=1:fast"}) {
    const absl::Status status = KernelPlan::Parse(bad, "t").status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find(bad), std::string::npos) << status;
  }
  for (IsaLevel isa : kAllIsaLevels) {
    const KernelPlan built_in = KernelPlan::BuiltIn(isa);
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K})
      EXPECT_EQ(built_in.StepsFor(dtype).front().min_rows, 1);
    EXPECT_EQ(built_in.PathFor(1, DType::kQ4_K), KernelPath::kInt8Dot);
    EXPECT_EQ(ChooseLinearKernel(1, DType::kBF16, LinearOptions{.plan = &built_in}).path, KernelPath::kStream);
    ASSERT_OK_AND_ASSIGN(const KernelPlan round_trip, KernelPlan::Parse(built_in.Spec(), "t"));
    EXPECT_EQ(round_trip.Spec(), built_in.Spec());
  }
}

// Float and quantized weights, and one quantized type and another, may
// take different crossovers: ";quantized=" serves every quantized type,
// ";TYPE=" one of them, and float weights keep the common list.
TEST(KernelPlanTest, QuantizedTypesTakeTheirOwnSteps) {
  ASSERT_OK_AND_ASSIGN(const KernelPlan plan,
                       KernelPlan::Parse("1:stream,12:bf16_dot; q8_0 = 1:int8_dot,32:bf16_dot;quantized=1:int8_dot,"
                                         "48:bf16_dot",
                                         "t"));
  EXPECT_EQ(plan.Spec(), "1:stream,12:bf16_dot;quantized=1:int8_dot,48:bf16_dot;Q8_0=1:int8_dot,32:bf16_dot");
  // bf16 weights may take a list of their own (AMX tiles serve them alone);
  // f32 and f16 keep the common one.
  ASSERT_OK_AND_ASSIGN(const KernelPlan bf16_own,
                       KernelPlan::Parse("1:stream,32:packed;bf16=1:stream,4:bf16_dot", "t"));
  EXPECT_EQ(bf16_own.Spec(), "1:stream,32:packed;BF16=1:stream,4:bf16_dot");
  EXPECT_EQ(bf16_own.PathFor(4, DType::kBF16), KernelPath::kBf16Dot);
  EXPECT_EQ(bf16_own.PathFor(4, DType::kF16), KernelPath::kStream);
  EXPECT_EQ(bf16_own.PathFor(4, DType::kQ4_K), KernelPath::kStream);
  EXPECT_EQ(KernelPlan::Parse("1:stream;bf16=1:packed;BF16=1:stream", "t").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.PathFor(12, DType::kBF16), KernelPath::kBf16Dot);
  EXPECT_EQ(plan.PathFor(12, DType::kF32), KernelPath::kBf16Dot);
  EXPECT_EQ(plan.PathFor(12, DType::kQ4_K), KernelPath::kInt8Dot);
  EXPECT_EQ(plan.PathFor(47, DType::kQ6_K), KernelPath::kInt8Dot);
  EXPECT_EQ(plan.PathFor(48, DType::kQ6_K), KernelPath::kBf16Dot);
  EXPECT_EQ(plan.PathFor(31, DType::kQ8_0), KernelPath::kInt8Dot);
  EXPECT_EQ(plan.PathFor(32, DType::kQ8_0), KernelPath::kBf16Dot);
  EXPECT_EQ(plan.StepsFor(DType::kQ5_0).size(), 2u);
  ASSERT_OK_AND_ASSIGN(const KernelPlan again, KernelPlan::Parse(plan.Spec(), "t"));
  EXPECT_EQ(again.Spec(), plan.Spec());
  // Lists equal to the one they would inherit print as nothing.
  ASSERT_OK_AND_ASSIGN(const KernelPlan same,
                       KernelPlan::Parse("1:stream,8:packed;quantized=1:stream,8:packed;q6_K=1:stream,8:packed", "t"));
  EXPECT_EQ(same.Spec(), "1:stream,8:packed");
  // A list for one type alone.
  ASSERT_OK_AND_ASSIGN(const KernelPlan one, KernelPlan::Parse("1:stream;Q4_K=1:int8_dot", "t"));
  EXPECT_EQ(one.Spec(), "1:stream;Q4_K=1:int8_dot");
  EXPECT_EQ(one.PathFor(1, DType::kQ5_K), KernelPath::kStream);
  EXPECT_EQ(one.PathFor(1, DType::kQ4_K), KernelPath::kInt8Dot);
  // Create refuses an f32 or f16 list (bf16 may have one) and a type given twice.
  EXPECT_FALSE(KernelPlan::Create({{1, KernelPath::kStream}}, "t", {{DType::kF16, {{1, KernelPath::kPacked}}}}).ok());
  EXPECT_FALSE(KernelPlan::Create({{1, KernelPath::kStream}}, "t",
                                  {{DType::kQ8_0, {{1, KernelPath::kPacked}}}, {DType::kQ8_0, {{1, KernelPath::kPacked}}}})
                   .ok());
  // The start-up line describes each type by its own list.
  const LinearOptions options{.plan = &plan};
  EXPECT_EQ(ChooseLinearKernel(20, DType::kQ4_K, options).path, KernelPath::kInt8Dot);
  if (ActiveIsa() >= IsaLevel::kAvx512Bf16) {  // below it bf16_dot is int8_dot for Q4_K: one range
    EXPECT_NE(DescribeKernelChoice(DType::kQ4_K, options).find("1-47 rows"), std::string::npos)
        << DescribeKernelChoice(DType::kQ4_K, options);
    EXPECT_NE(DescribeKernelChoice(DType::kQ8_0, options).find("1-31 rows"), std::string::npos)
        << DescribeKernelChoice(DType::kQ8_0, options);
  }
  EXPECT_NE(DescribeKernelChoice(DType::kBF16, options).find("1-11 rows"), std::string::npos)
      << DescribeKernelChoice(DType::kBF16, options);
}

TEST(KernelCalibrationTest, MeasuresEveryRunnablePathAndMakesAPlan) {
  const StoredWeight a(DType::kBF16, 96, 64, 1), b(DType::kBF16, 64, 96, 2);
  const std::vector<std::vector<LinearWeight>> groups = {{a.view, b.view}};
  ThreadPool pool(ThreadPoolOptions{.num_threads = 2, .name = "calib-test"});
  KernelCalibrationOptions options;
  options.rows = {1, 8, 40};
  options.reps = 1;
  ASSERT_OK_AND_ASSIGN(const KernelCalibration measured, MeasureKernelPlan(groups, &pool, options));
  EXPECT_EQ(measured.plan.StepsFor(DType::kBF16).front().min_rows, 1);
  ASSERT_OK_AND_ASSIGN(const KernelPlan again, KernelPlan::Parse(measured.plan.Spec(), "t"));
  EXPECT_EQ(again.Spec(), measured.plan.Spec());
  // Every path this CPU runs for bf16 was timed at the first count, and
  // every step of the plan is the fastest (or within the margin) there.
  std::set<std::string> at_one;
  for (const KernelTiming& t : measured.timings) {
    if (t.rows == 1) at_one.insert(t.kernel);
    EXPECT_GT(t.median_us, 0) << t.kernel;
  }
  for (KernelPath path : kAllKernelPaths) {
    const LinearKernel* kernel = FindLinearKernel(DType::kBF16, path, ActiveIsa());
    if (kernel != nullptr) {
      EXPECT_EQ(at_one.count(kernel->name), 1u) << kernel->name;
    }
  }
  EXPECT_FALSE(measured.plan.source().empty());
  // Timed on bf16 weights: quantized weights keep the built-in steps.
  const KernelPlan built_in = BuiltInKernelPlan();
  for (DType dtype : {DType::kQ8_0, DType::kQ4_K, DType::kQ6_K}) {
    EXPECT_EQ(KernelPlan::Create(measured.plan.StepsFor(dtype), "t")->Spec(),
              KernelPlan::Create(built_in.StepsFor(dtype), "t")->Spec());
  }
  EXPECT_NE(measured.plan.source().find("for float weights"), std::string::npos) << measured.plan.source();
  options.rows = {4, 2};
  EXPECT_EQ(MeasureKernelPlan(groups, &pool, options).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MeasureKernelPlan({}, &pool).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuFeaturesTest, LevelsNamesAndFlags) {
  for (IsaLevel level : kAllIsaLevels) {
    ASSERT_OK_AND_ASSIGN(const IsaLevel parsed, ParseIsaLevel(IsaLevelName(level)));
    EXPECT_EQ(parsed, level);
  }
  EXPECT_EQ(ParseIsaLevel("sse2").status().code(), absl::StatusCode::kInvalidArgument);
  const CpuFeatures& cpu = HostCpu();
  EXPECT_TRUE(cpu.baseline_ok) << cpu.Description() << ": " << cpu.Flags();
  EXPECT_TRUE(cpu.MissingFor(cpu.level).empty()) << cpu.MissingFor(cpu.level);
  if (cpu.level < IsaLevel::kAmx) {
    EXPECT_FALSE(cpu.MissingFor(kAllIsaLevels[static_cast<int>(cpu.level) + 1]).empty());
  }
  EXPECT_LE(ActiveIsa(), cpu.level);
  EXPECT_NE(cpu.Flags().find("avx2"), std::string::npos);
  std::cout << "[ cpu      ] " << cpu.Description() << "; flags: " << cpu.Flags()
            << "; kernels run at: " << ActiveIsaDescription() << "\n";
}

TEST(LinearErrors, RejectsBadArguments) {
  const StoredWeight w(DType::kBF16, 4, 8, 1);
  std::vector<float> x(16), y(16);
  EXPECT_EQ(Linear(nullptr, 2, w.view, nullptr, y.data(), nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Linear(x.data(), 2, w.view, nullptr, nullptr, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Linear(x.data(), -1, w.view, nullptr, y.data(), nullptr).code(), absl::StatusCode::kInvalidArgument);
  LinearWeight no_data = w.view;
  no_data.data = nullptr;
  EXPECT_EQ(Linear(x.data(), 2, no_data, nullptr, y.data(), nullptr).code(), absl::StatusCode::kInvalidArgument);
  LinearWeight empty = w.view;
  empty.n = 0;
  EXPECT_EQ(Linear(x.data(), 2, empty, nullptr, y.data(), nullptr).code(), absl::StatusCode::kInvalidArgument);
  // Zero rows is a valid no-op, even without buffers.
  EXPECT_OK(Linear(nullptr, 0, w.view, nullptr, nullptr, nullptr));
}

TEST(LinearSliceTest, WritesOnlyItsFeatures) {
  // A slice writes y[:, n_begin:n_end) of a wider row stride and nothing else,
  // on every path: the expert FFN relies on this to fill [R, I] by tasks.
  const StoredWeight w(DType::kBF16, 40, 72, 3);
  const std::vector<float> x = RandomVector(20 * 72, 9);
  for (const LinearKernel& kernel : AllLinearKernels()) {
    if (kernel.dtype != DType::kBF16 || kernel.isa > ActiveIsa()) continue;
    for (int64_t m : {3, 20}) {
      const int64_t ldy = 50;
      std::vector<float> y(static_cast<size_t>(m * ldy), -7.0f);
      PreparedInput prepared;
      ASSERT_OK(prepared.Prepare(kernel, x.data(), 72, m, 72, nullptr));
      const LinearSliceArgs args{.x = x.data(),
                                 .ldx = 72,
                                 .m = m,
                                 .n_begin = 10,
                                 .n_end = 27,
                                 .y = y.data(),
                                 .ldy = ldy,
                                 .prepared = prepared.data()};
      ASSERT_OK(LinearSlice(kernel, w.view, args));
      std::vector<double> ref, magnitude;
      NaiveLinear(x.data(), m, w.view, nullptr, ref, magnitude);
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t j = 0; j < ldy; ++j) {
          const float v = y[r * ldy + j];
          if (j >= 10 && j < 27) {
            EXPECT_NEAR(v, ref[r * 40 + j], Tolerance(72, magnitude[r * 40 + j], kernel))
                << kernel.name << " M=" << m;
          } else {
            EXPECT_EQ(v, -7.0f) << kernel.name << " M=" << m << " row " << r << " column " << j << " written";
          }
        }
      }
    }
  }
}

TEST(LinearTaskFeaturesTest, SplitsWorkForAllThreads) {
  const LinearWeight w{reinterpret_cast<const void*>(1), DType::kBF16, 14336, 4096};
  for (const LinearKernel& kernel : AllLinearKernels()) {
    if (kernel.dtype != DType::kBF16) continue;
    for (int64_t m : {1, 8, 16, 512}) {
      const int64_t features = LinearTaskFeatures(m, w, 2, kernel);
      EXPECT_GE(features, 1);
      EXPECT_GE((w.n + features - 1) / features, 8) << kernel.name << " M=" << m;  // >= 4 tasks per thread
    }
    const LinearWeight tiny{reinterpret_cast<const void*>(1), DType::kBF16, 3, 5};
    EXPECT_EQ(LinearTaskFeatures(1, tiny, 2, kernel), 3) << kernel.name;
  }
}

}  // namespace
}  // namespace tandem
