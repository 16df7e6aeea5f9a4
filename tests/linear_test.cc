// Linear() against a naive float64 loop over the same stored weights, for
// every dtype, both kernel paths, odd shapes, with and without bias, on one
// and two threads.
//
// Legend: M rows, K input features, N output features.
#include "common/kernels/linear.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
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
double Tolerance(int64_t k, double magnitude) { return (k + 2) * std::ldexp(1.0, -24) * magnitude + 1e-30; }

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

class LinearTest : public ::testing::TestWithParam<Case> {};

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
    for (int64_t i = 0; i < m * c.n; ++i) {
      ASSERT_NEAR(y[i], ref[i], Tolerance(c.k, magnitude[i]))
          << CaseName(c) << " " << label << " path=" << LinearPathName(ChooseLinearPath(m, options))
          << " M=" << m << " row " << i / c.n << " feature " << i % c.n;
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

TEST_P(LinearTest, DefaultPathsMatchNaive) {
  // Small row counts take the stream kernel, the rest the prefill kernel.
  ExpectMatchesNaive(GetParam(), RowCounts(), LinearOptions{}, "default");
}

TEST_P(LinearTest, StreamKernelMatchesNaiveAtAllRows) {
  LinearOptions options;
  options.prefill_min_rows = std::numeric_limits<int64_t>::max();
  ExpectMatchesNaive(GetParam(), RowCounts(), options, "stream-only");
}

TEST_P(LinearTest, PackedKernelMatchesNaiveAtAllRows) {
  LinearOptions options;
  options.prefill_min_rows = 1;
  options.prefill_kernel = PrefillKernel::kAvx2Packed;
  ExpectMatchesNaive(GetParam(), RowCounts(), options, "packed-only");
}

TEST_P(LinearTest, OneDnnMatchesNaiveAtAllRows) {
  LinearOptions options;
  options.prefill_min_rows = 1;
  options.prefill_kernel = PrefillKernel::kOneDnn;
  ExpectMatchesNaive(GetParam(), RowCounts(), options, "onednn-only");
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  // Odd shapes (tails in N and K), one that spans several tasks and oneDNN
  // tiles (N = 300 > 256), a K below one vector, and K = 1024 whose 4 KB rows
  // make Linear read x through a padded copy (ActivationRowStride).
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{13, 72},   {1, 8}, {37, 129},
                                                           {300, 520}, {9, 3}, {20, 1024}};
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16})
    for (const auto& [n, k] : shapes)
      for (bool bias : {false, true})
        for (int threads : {1, 2}) cases.push_back({dtype, n, k, bias, threads});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const Case& c = info.param;
                           return absl::StrCat(std::string(DTypeName(c.dtype)), "_N", c.n, "_K", c.k,
                                               c.bias ? "_bias" : "", "_t", c.threads);
                         });

TEST(LinearErrors, RejectsBadArguments) {
  const StoredWeight w(DType::kBF16, 4, 8, 1);
  std::vector<float> x(16), y(16);
  EXPECT_EQ(Linear(nullptr, 2, w.view, nullptr, y.data(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Linear(x.data(), 2, w.view, nullptr, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Linear(x.data(), -1, w.view, nullptr, y.data(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  LinearWeight no_data = w.view;
  no_data.data = nullptr;
  EXPECT_EQ(Linear(x.data(), 2, no_data, nullptr, y.data(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  LinearWeight empty = w.view;
  empty.n = 0;
  EXPECT_EQ(Linear(x.data(), 2, empty, nullptr, y.data(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  // Zero rows is a valid no-op, even without buffers.
  EXPECT_OK(Linear(nullptr, 0, w.view, nullptr, nullptr, nullptr));
}

TEST(LinearSliceTest, WritesOnlyItsFeatures) {
  // A slice writes y[:, n_begin:n_end) of a wider row stride and nothing else,
  // on every path: the expert FFN relies on this to fill [R, I] by tasks.
  const StoredWeight w(DType::kBF16, 40, 72, 3);
  const std::vector<float> x = RandomVector(20 * 72, 9);
  for (auto [m, kernel] :
       {std::pair{3, PrefillKernel::kAvx2Packed}, std::pair{20, PrefillKernel::kAvx2Packed},
        std::pair{20, PrefillKernel::kOneDnn}}) {
    const int64_t ldy = 50;
    std::vector<float> y(static_cast<size_t>(m * ldy), -7.0f);
    LinearOptions options;
    options.prefill_kernel = kernel;
    const LinearSliceArgs args{
        .x = x.data(), .ldx = 72, .m = m, .n_begin = 10, .n_end = 27, .y = y.data(), .ldy = ldy};
    ASSERT_OK(LinearSlice(w.view, args, options));
    std::vector<double> ref, magnitude;
    NaiveLinear(x.data(), m, w.view, nullptr, ref, magnitude);
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t j = 0; j < ldy; ++j) {
        const float v = y[r * ldy + j];
        if (j >= 10 && j < 27) {
          EXPECT_NEAR(v, ref[r * 40 + j], Tolerance(72, magnitude[r * 40 + j])) << "M=" << m;
        } else {
          EXPECT_EQ(v, -7.0f) << "M=" << m << " row " << r << " column " << j << " written";
        }
      }
    }
  }
}

TEST(LinearTaskFeaturesTest, SplitsWorkForAllThreads) {
  const LinearWeight w{reinterpret_cast<const void*>(1), DType::kBF16, 14336, 4096};
  for (int64_t m : {1, 8, 16, 512}) {
    const int64_t features = LinearTaskFeatures(m, w, 2, LinearOptions{});
    EXPECT_GE(features, 1);
    EXPECT_GE((w.n + features - 1) / features, 8) << "M=" << m;  // >= 4 tasks per thread
  }
  const LinearWeight tiny{reinterpret_cast<const void*>(1), DType::kF32, 3, 5};
  EXPECT_EQ(LinearTaskFeatures(1, tiny, 2, LinearOptions{}), 3);
}

}  // namespace
}  // namespace tandem
