// ExpertFfn against a naive float64 SwiGLU, and LocalExpertExecutor's
// dispatch, validation and stats.
//
// Legend: R rows, D hidden size, I intermediate size.
#include "cpu_worker/expert_ffn.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/gguf_tensor_source.h"
#include "common/quant/quantize.h"
#include "cpu_worker/local_expert_executor.h"
#include "gtest/gtest.h"
#include "tests/kernel_cases_testlib.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

constexpr double kU = 5.9604644775390625e-8;  // 2^-24, unit roundoff of f32

// A weight matrix [N, K] stored in `dtype`, values uniform in [-scale, scale].
struct StoredWeight {
  StoredWeight(DType dtype, int64_t n, int64_t k, uint32_t seed, float scale)
      : bytes(static_cast<size_t>(n * DTypeRowBytes(dtype, k))) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-scale, scale);
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t j = 0; j < n; ++j) {
      for (float& v : row) v = dist(rng);
      if (IsQuantized(dtype)) {  // ggml blocks, k a whole number of them
        EXPECT_OK(QuantizeRow(
            GgmlFromDType(dtype), row,
            absl::MakeSpan(bytes.data() + j * DTypeRowBytes(dtype, k), static_cast<size_t>(DTypeRowBytes(dtype, k)))));
        continue;
      }
      for (int64_t i = 0; i < k; ++i) StoreAsDType(bytes.data(), dtype, static_cast<size_t>(j * k + i), row[i]);
    }
    view = {bytes.data(), dtype, n, k};
  }
  std::vector<uint8_t> bytes;
  LinearWeight view;
};

// One expert's three matrices; scales chosen so gate values span silu's
// curved region (|g| up to ~4) rather than only its linear part.
struct StoredExpert {
  StoredExpert(DType dtype, int64_t hidden, int64_t intermediate, uint32_t seed)
      : w1(dtype, intermediate, hidden, seed, 4.0f / std::sqrt(static_cast<float>(hidden))),
        w3(dtype, intermediate, hidden, seed + 1, 2.0f / std::sqrt(static_cast<float>(hidden))),
        w2(dtype, hidden, intermediate, seed + 2, 2.0f / std::sqrt(static_cast<float>(intermediate))) {
    weights.w1 = w1.view;
    weights.w3 = w3.view;
    weights.w2 = w2.view;
  }
  StoredWeight w1, w3, w2;
  ExpertFfnWeights weights;
};

std::vector<float> RandomVector(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& e : v) e = dist(rng);
  return v;
}

double W(const LinearWeight& w, int64_t row, int64_t col) { return LoadAsF32(w.data, w.dtype, row * w.k + col); }

// The oracle: y = W2 (silu(W1 x) * (W3 x)) in float64, and for each output a
// bound on what f32 arithmetic may add: each of the three matmuls may err by
// (K + 1) u sum |terms| (see linear_test), the error in h = silu(g) u carries
// through W2, and silu itself (vector exp, one divide) adds ~4 u relative.
// `rounding` is the relative error a kernel adds to each product by rounding
// its input (x for gate and up, h for down) to bf16 first: 2^-8, else 0.
void NaiveExpertFfn(const ExpertFfnWeights& w, const float* x, int64_t rows, std::vector<double>& y,
                    std::vector<double>& tolerance, double rounding = 0.0) {
  const int64_t d = w.w1.k, inter = w.w1.n;
  y.assign(static_cast<size_t>(rows * d), 0.0);
  tolerance.assign(static_cast<size_t>(rows * d), 0.0);
  std::vector<double> h(static_cast<size_t>(inter)), h_error(static_cast<size_t>(inter));
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * d;
    for (int64_t j = 0; j < inter; ++j) {
      double g = 0, u = 0, g_mag = 0, u_mag = 0;
      for (int64_t kk = 0; kk < d; ++kk) {
        g += xr[kk] * W(w.w1, j, kk);
        u += xr[kk] * W(w.w3, j, kk);
        g_mag += std::fabs(xr[kk] * W(w.w1, j, kk));
        u_mag += std::fabs(xr[kk] * W(w.w3, j, kk));
      }
      const double sig = 1.0 / (1.0 + std::exp(-g));
      const double silu = g * sig;
      h[j] = silu * u;
      // |d silu / dg| <= 1.1 everywhere.
      const double g_err = ((d + 1) * kU + rounding) * g_mag, u_err = ((d + 1) * kU + rounding) * u_mag;
      h_error[j] = 1.1 * g_err * std::fabs(u) + std::fabs(silu) * u_err + g_err * u_err + 8 * kU * std::fabs(h[j]);
    }
    for (int64_t i = 0; i < d; ++i) {
      double sum = 0, mag = 0, carried = 0;
      for (int64_t j = 0; j < inter; ++j) {
        sum += W(w.w2, i, j) * h[j];
        mag += std::fabs(W(w.w2, i, j) * h[j]);
        carried += std::fabs(W(w.w2, i, j)) * h_error[j];
      }
      y[r * d + i] = sum;
      tolerance[r * d + i] = 2.0 * (((inter + 1) * kU + rounding) * mag + carried) + 1e-30;
    }
  }
}

struct Case {
  DType dtype;
  int64_t hidden, intermediate;
  int threads;
};

class ExpertFfnTest : public ::testing::TestWithParam<Case> {};

void ExpectFfnMatchesNaive(const Case& c, const LinearOptions& options, const std::string& label) {
  const StoredExpert expert(c.dtype, c.hidden, c.intermediate, 11);
  ThreadPool pool(ThreadPoolOptions{.num_threads = c.threads, .name = "ffn-test"});
  ExpertFfn ffn(&pool, options);
  std::vector<int64_t> row_counts;
  for (int64_t r = 1; r <= 40; ++r) row_counts.push_back(r);
  row_counts.push_back(64);
  // Decreasing sizes after large ones exercise reuse of the scratch buffers.
  row_counts.push_back(3);
  for (int64_t rows : row_counts) {
    const std::vector<float> x = RandomVector(rows * c.hidden, 1000 + static_cast<uint32_t>(rows));
    std::vector<float> y(static_cast<size_t>(rows * c.hidden), std::numeric_limits<float>::quiet_NaN());
    ASSERT_OK(ffn.Run(expert.weights, x.data(), rows, y.data()));
    const LinearKernel& kernel = ChooseLinearKernel(rows, c.dtype, options);
    std::vector<double> ref, tolerance;
    NaiveExpertFfn(expert.weights, x.data(), rows, ref, tolerance, kernel.x_relative_error);
    for (int64_t i = 0; i < rows * c.hidden; ++i) {
      ASSERT_NEAR(y[i], ref[i], tolerance[i])
          << DTypeName(c.dtype) << " D=" << c.hidden << " I=" << c.intermediate << " threads=" << c.threads << " "
          << label << " kernel=" << kernel.name << " R=" << rows << " row " << i / c.hidden << " feature "
          << i % c.hidden;
    }
  }
}

TEST_P(ExpertFfnTest, DefaultPlanMatchesNaive) { ExpectFfnMatchesNaive(GetParam(), LinearOptions{}, "default"); }

// Every kernel of the dispatch table this CPU can run, for all three matrices.
using KernelCase = test::KernelCase<Case>;

class ExpertFfnKernelTest : public ::testing::TestWithParam<KernelCase> {};

TEST_P(ExpertFfnKernelTest, MatchesNaive) {
  const KernelCase& c = GetParam();
  if (c.kernel->isa > ActiveIsa()) GTEST_SKIP() << c.kernel->name << ": " << IsaUnavailableReason(c.kernel->isa);
  LinearOptions options;
  options.kernel = c.kernel;
  ExpectFfnMatchesNaive(c.shape, options, std::string(c.kernel->name));
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  // Odd sizes, and D or I of 1024, where x or the intermediate get padded
  // row strides (ActivationRowStride).
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{72, 13}, {64, 200}, {37, 100}, {1024, 24}, {24, 1024}};
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16})
    for (const auto& [hidden, intermediate] : shapes)
      for (int threads : {1, 2}) cases.push_back({dtype, hidden, intermediate, threads});
  return cases;
}

std::string CaseTestName(const Case& c) {
  return absl::StrCat(std::string(DTypeName(c.dtype)), "_D", c.hidden, "_I", c.intermediate, "_t", c.threads);
}

INSTANTIATE_TEST_SUITE_P(Shapes, ExpertFfnTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return CaseTestName(info.param); });

INSTANTIATE_TEST_SUITE_P(Kernels, ExpertFfnKernelTest, ::testing::ValuesIn(test::WithEveryKernel(AllCases())),
                         test::KernelCaseName<Case>(CaseTestName));

TEST(ExpertFfnErrors, RejectsMismatchedShapesAndNulls) {
  const StoredExpert expert(DType::kBF16, 16, 24, 3);
  ExpertFfn ffn(nullptr);
  std::vector<float> x(32), y(32);
  ExpertFfnWeights bad = expert.weights;
  bad.w2.k = 23;
  absl::Status status = ffn.Run(bad, x.data(), 2, y.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("down_proj"), std::string::npos) << status;
  bad = expert.weights;
  bad.w3.data = nullptr;
  EXPECT_EQ(ffn.Run(bad, x.data(), 2, y.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ffn.Run(expert.weights, nullptr, 2, y.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ffn.Run(expert.weights, x.data(), -1, y.data()).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ExpertFfnErrors, ZeroRowsChangesNothing) {
  const StoredExpert expert(DType::kBF16, 16, 24, 3);
  ExpertFfn ffn(nullptr);
  std::vector<float> y(16, 5.0f);
  EXPECT_OK(ffn.Run(expert.weights, nullptr, 0, y.data()));
  for (float v : y) EXPECT_EQ(v, 5.0f);
}

// ---- Batches: several experts in two passes over the pool ----

// Every call of a batch gives the bits of running it alone: 1 and 2
// threads, row counts from 0 to past the GEMM kernels' thresholds, float
// and block-quantized weights, and two expert widths in one batch (their
// buffers sit side by side in the shared scratch).
TEST(ExpertFfnBatch, EachCallGivesTheBitsOfRunningItAlone) {
  for (DType dtype : {DType::kBF16, DType::kF32, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K}) {
    const int64_t hidden = 256;
    std::vector<std::unique_ptr<StoredExpert>> experts;
    for (uint32_t e = 0; e < 5; ++e)
      experts.push_back(std::make_unique<StoredExpert>(dtype, hidden, e == 3 ? 512 : 768, 40 + 10 * e));
    const int64_t rows[] = {1, 0, 7, 130, 2};
    for (int threads : {1, 2}) {
      ThreadPool pool(ThreadPoolOptions{.num_threads = threads, .name = "batch-test"});
      ExpertFfn batch(&pool), alone(&pool);
      std::vector<std::vector<float>> x, y;
      std::vector<ExpertFfnCall> calls;
      for (size_t e = 0; e < experts.size(); ++e) {
        x.push_back(RandomVector(rows[e] * hidden, 7 + static_cast<uint32_t>(e)));
        y.emplace_back(static_cast<size_t>(rows[e] * hidden), std::numeric_limits<float>::quiet_NaN());
      }
      for (size_t e = 0; e < experts.size(); ++e)
        calls.push_back({.weights = &experts[e]->weights,
                         .x = x[e].data(),
                         .rows = rows[e],
                         .y = y[e].data(),
                         .expert = static_cast<int>(e)});
      for (int rep = 0; rep < 2; ++rep) {  // the second reuses the grown scratch
        ASSERT_OK(batch.Run(calls));
        for (size_t e = 0; e < experts.size(); ++e) {
          std::vector<float> want(y[e].size());
          ASSERT_OK(alone.Run(experts[e]->weights, x[e].data(), rows[e], want.data()));
          ASSERT_EQ(y[e], want) << DTypeName(dtype) << " threads " << threads << " expert " << e << " rows " << rows[e]
                                << " rep " << rep;
        }
      }
    }
  }
}

// One call's output may be another's input: every x is read before any y
// is written.
TEST(ExpertFfnBatch, OutputMayBeAnotherCallsInput) {
  const int64_t hidden = 64;
  const StoredExpert a(DType::kBF16, hidden, 96, 1), b(DType::kBF16, hidden, 96, 2);
  ThreadPool pool(ThreadPoolOptions{.num_threads = 2, .name = "batch-test"});
  ExpertFfn ffn(&pool);
  const std::vector<float> x = RandomVector(3 * hidden, 5);
  std::vector<float> want_a(x.size()), want_b(x.size());
  ASSERT_OK(ffn.Run(a.weights, x.data(), 3, want_a.data()));
  ASSERT_OK(ffn.Run(b.weights, x.data(), 3, want_b.data()));
  std::vector<float> shared = x, out_b(x.size());
  const ExpertFfnCall calls[] = {{.weights = &a.weights, .x = shared.data(), .rows = 3, .y = shared.data()},
                                 {.weights = &b.weights, .x = shared.data(), .rows = 3, .y = out_b.data()}};
  ASSERT_OK(ffn.Run(calls));
  EXPECT_EQ(shared, want_a);
  EXPECT_EQ(out_b, want_b);
}

TEST(ExpertFfnBatch, ABadCallIsNamedAndNothingRuns) {
  const StoredExpert good(DType::kBF16, 16, 24, 3);
  ExpertFfnWeights bad = good.weights;
  bad.w2.k = 23;
  ExpertFfn ffn(nullptr);
  const std::vector<float> x(32, 1.0f);
  std::vector<float> y0(32, 9.0f), y1(32, 9.0f);
  const ExpertFfnCall calls[] = {{.weights = &good.weights, .x = x.data(), .rows = 2, .y = y0.data(), .expert = 4},
                                 {.weights = &bad, .x = x.data(), .rows = 2, .y = y1.data(), .expert = 6}};
  const absl::Status status = ffn.Run(calls);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("expert 6: ExpertFfn: down_proj"), std::string::npos) << status;
  for (float v : y0) EXPECT_EQ(v, 9.0f);
  const ExpertFfnCall no_weights[] = {{.x = x.data(), .rows = 2, .y = y0.data(), .expert = 2}};
  EXPECT_NE(ffn.Run(no_weights).message().find("expert 2: ExpertFfn: no weights"), std::string::npos);
}

// ---- LocalExpertExecutor ----

class LocalExpertExecutorTest : public ::testing::Test {
 protected:
  static constexpr int64_t kHidden = 24;
  static constexpr int64_t kIntermediate = 40;
  static constexpr int kLayers = 2;
  static constexpr int kExperts = 3;

  void SetUp() override {
    std::vector<std::vector<ExpertFfnWeights>> table(kLayers);
    for (int layer = 0; layer < kLayers; ++layer) {
      for (int e = 0; e < kExperts; ++e) {
        stored_.push_back(std::make_unique<StoredExpert>(DType::kBF16, kHidden, kIntermediate,
                                                         static_cast<uint32_t>(100 * layer + 10 * e)));
        table[layer].push_back(stored_.back()->weights);
      }
    }
    pool_ = std::make_unique<ThreadPool>(ThreadPoolOptions{.num_threads = 2, .name = "exec-test"});
    executor_ = std::make_unique<LocalExpertExecutor>(std::move(table), pool_.get());
  }

  const ExpertFfnWeights& Weights(int layer, int expert) { return stored_[layer * kExperts + expert]->weights; }

  std::vector<std::unique_ptr<StoredExpert>> stored_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<LocalExpertExecutor> executor_;
};

TEST_F(LocalExpertExecutorTest, RunsEachExpertLikeExpertFfn) {
  const std::vector<float> x0 = RandomVector(3 * kHidden, 1), x2 = RandomVector(20 * kHidden, 2);
  std::vector<float> y0(3 * kHidden), y2(20 * kHidden);
  const ExpertWork work[] = {{0, 3, x0.data(), y0.data()}, {2, 20, x2.data(), y2.data()}};
  ASSERT_OK(executor_->RunExperts(1, work));

  // Same kernels on the same pool: results are bit-identical.
  ExpertFfn ffn(pool_.get());
  std::vector<float> want0(y0.size()), want2(y2.size());
  ASSERT_OK(ffn.Run(Weights(1, 0), x0.data(), 3, want0.data()));
  ASSERT_OK(ffn.Run(Weights(1, 2), x2.data(), 20, want2.data()));
  EXPECT_EQ(y0, want0);
  EXPECT_EQ(y2, want2);

  // Layer 0 has different weights, so its answer differs.
  std::vector<float> other(y0.size());
  const ExpertWork layer0[] = {{0, 3, x0.data(), other.data()}};
  ASSERT_OK(executor_->RunExperts(0, layer0));
  EXPECT_NE(other, y0);
}

TEST_F(LocalExpertExecutorTest, CollectsStats) {
  const std::vector<float> x = RandomVector(5 * kHidden, 1);
  std::vector<float> y(5 * kHidden);
  const ExpertWork work[] = {{1, 5, x.data(), y.data()}, {2, 0, nullptr, nullptr}};
  ASSERT_OK(executor_->RunExperts(0, work));
  ASSERT_OK(executor_->RunExperts(1, work));
  const ExpertCallStats last = executor_->last_call();
  EXPECT_EQ(last.calls, 1);
  EXPECT_EQ(last.experts, 1);  // the zero-row entry is skipped
  EXPECT_EQ(last.rows, 5);
  EXPECT_GE(last.time_us, 0);
  const ExpertCallStats totals = executor_->stats();
  EXPECT_EQ(totals.calls, 2);
  EXPECT_EQ(totals.experts, 2);
  EXPECT_EQ(totals.rows, 10);
  EXPECT_GE(totals.time_us, last.time_us);
  executor_->ResetStats();
  EXPECT_EQ(executor_->stats().calls, 0);
}

TEST_F(LocalExpertExecutorTest, RejectsBadRequestsNamingLayerAndExpert) {
  const std::vector<float> x = RandomVector(2 * kHidden, 1);
  std::vector<float> y(2 * kHidden, 9.0f);
  auto expect_invalid = [&](int layer, const ExpertWork& entry, const std::string& needle) {
    const absl::Status status = executor_->RunExperts(layer, std::span<const ExpertWork>(&entry, 1));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find(needle), std::string::npos) << status << " lacks \"" << needle << "\"";
  };
  expect_invalid(-1, {0, 2, x.data(), y.data()}, "layer -1");
  expect_invalid(kLayers, {0, 2, x.data(), y.data()}, "layer 2");
  expect_invalid(1, {kExperts, 2, x.data(), y.data()}, "layer 1 expert 3");
  expect_invalid(1, {-1, 2, x.data(), y.data()}, "layer 1 expert -1");
  expect_invalid(0, {1, 2, nullptr, y.data()}, "layer 0 expert 1");
  expect_invalid(0, {1, 2, x.data(), nullptr}, "layer 0 expert 1");
  expect_invalid(0, {2, -4, x.data(), y.data()}, "layer 0 expert 2");

  // A bad entry after a good one: nothing is computed.
  const ExpertWork mixed[] = {{0, 2, x.data(), y.data()}, {7, 2, x.data(), y.data()}};
  EXPECT_EQ(executor_->RunExperts(0, mixed).code(), absl::StatusCode::kInvalidArgument);
  for (float v : y) EXPECT_EQ(v, 9.0f);
  EXPECT_EQ(executor_->stats().calls, 0);
}

TEST(LocalExpertExecutorWeights, BadWeightShapeNamesLayerAndExpert) {
  const StoredExpert good(DType::kF32, 8, 16, 1);
  ExpertFfnWeights bad = good.weights;
  bad.w2.n = 7;
  LocalExpertExecutor executor({{good.weights, bad}}, nullptr);
  const std::vector<float> x(8, 1.0f);
  std::vector<float> y(8);
  const ExpertWork work[] = {{1, 1, x.data(), y.data()}};
  const absl::Status status = executor.RunExperts(0, work);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("layer 0 expert 1"), std::string::npos) << status;
}

}  // namespace
}  // namespace tandem
