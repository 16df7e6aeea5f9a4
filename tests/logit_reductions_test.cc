// The vocabulary-row passes against plain double loops, at every length
// from 1 to past two vectors (the tails) and at a real vocabulary's size:
// max and its first index (ties, NaN skipped), the finite check (NaN and
// Inf in the vector body and in the tail), log-sum-exp, the exp weights,
// counts, sums and indices at a threshold, the top k, and the inverse-CDF
// search.
#include "common/kernels/logit_reductions.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace tandem {
namespace {

std::vector<float> RandomLogits(size_t n, uint32_t seed, float scale = 4.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

std::vector<size_t> Lengths() {
  std::vector<size_t> lengths;
  for (size_t n = 1; n <= 40; ++n) lengths.push_back(n);
  lengths.push_back(32000);
  lengths.push_back(32064);  // Phi-3.5-MoE's vocabulary
  lengths.push_back(32003);
  return lengths;
}

TEST(LogitReductionsTest, MaxAndFirstArgmaxMatchAPlainScan) {
  for (size_t n : Lengths()) {
    std::vector<float> v = RandomLogits(n, static_cast<uint32_t>(n));
    size_t best = 0;
    for (size_t i = 1; i < n; ++i)
      if (v[i] > v[best]) best = i;
    EXPECT_EQ(MaxValue(v), v[best]) << n;
    EXPECT_EQ(FirstArgmax(v), static_cast<int32_t>(best)) << n;
    // A tie later in the row (body or tail) keeps the first index.
    v.push_back(v[best]);
    EXPECT_EQ(FirstArgmax(v), static_cast<int32_t>(best)) << n;
    // A tie earlier moves it.
    if (best > 0) {
      v[best / 2] = v[best];
      EXPECT_EQ(FirstArgmax(v), static_cast<int32_t>(best / 2)) << n;
    }
  }
}

TEST(LogitReductionsTest, MaxSkipsNaN) {
  for (size_t n : {3u, 17u, 100u}) {
    std::vector<float> v(n, -1.0f);
    for (size_t i = 0; i < n; i += 3) v[i] = std::numeric_limits<float>::quiet_NaN();
    v[n - 2] = 2.5f;
    EXPECT_EQ(MaxValue(v), 2.5f) << n;
    EXPECT_EQ(FirstArgmax(v), static_cast<int32_t>(n - 2)) << n;
  }
}

TEST(LogitReductionsTest, AllFiniteFindsNaNAndInfAnywhere) {
  for (size_t n : Lengths()) {
    std::vector<float> v = RandomLogits(n, 7);
    EXPECT_TRUE(AllFinite(v)) << n;
    for (size_t at : {size_t{0}, n / 2, n - 1}) {
      for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity()}) {
        std::vector<float> w = v;
        w[at] = bad;
        EXPECT_FALSE(AllFinite(w)) << n << " at " << at << " " << bad;
      }
    }
  }
  const std::vector<float> extremes = {std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                                       std::numeric_limits<float>::denorm_min(), 0.0f, -0.0f};
  EXPECT_TRUE(AllFinite(extremes));
}

TEST(LogitReductionsTest, LogSumExpAndWeightsMatchDoubleReference) {
  for (size_t n : Lengths()) {
    for (float scale : {0.5f, 4.0f, 40.0f}) {
      const std::vector<float> v = RandomLogits(n, static_cast<uint32_t>(3 * n + 1), scale);
      const float max = MaxValue(v);
      double sum = 0.0;
      for (float x : v) sum += std::exp(static_cast<double>(x) - max);
      EXPECT_NEAR(LogSumExp(v), max + std::log(sum), 1e-5 * (1.0 + std::fabs(max))) << n << " scale " << scale;
      for (float temperature : {1.0f, 0.7f, 2.0f}) {
        std::vector<float> w(n);
        const double total = ExpWeights(v, max, 1.0f / temperature, w.data());
        double reference_total = 0.0;
        for (size_t i = 0; i < n; ++i) {
          const double exponent = (static_cast<double>(v[i]) - max) / temperature;
          const double reference = std::exp(exponent);
          reference_total += reference;
          // The f32 exponent's rounding (|x| ulps of it), the polynomial's
          // ulp; weights under e^-87.3 come out as ~1.2e-38, not 0.
          EXPECT_NEAR(w[i], reference, 3e-7 * (1 + std::fabs(exponent)) * reference + 2e-38) << n << " at " << i;
        }
        EXPECT_NEAR(total, reference_total, 1e-6 * reference_total) << n;
      }
    }
  }
}

TEST(LogitReductionsTest, CountsSumsAndIndicesAtOrAboveAThreshold) {
  for (size_t n : Lengths()) {
    const std::vector<float> keys = RandomLogits(n, 11, 1.0f);
    std::vector<float> weights = RandomLogits(n, 12, 1.0f);
    for (float& w : weights) w = std::fabs(w);
    for (float threshold : {-10.0f, -0.5f, 0.0f, 1.0f, 10.0f}) {
      size_t count = 0;
      double sum = 0.0;
      std::vector<int32_t> indices;
      for (size_t i = 0; i < n; ++i) {
        if (keys[i] < threshold) continue;
        ++count;
        sum += weights[i];
        indices.push_back(static_cast<int32_t>(i));
      }
      const CountAndSum got = CountAndSumAtLeast(keys, threshold, weights.data());
      EXPECT_EQ(got.count, count) << n << " " << threshold;
      EXPECT_NEAR(got.sum, sum, 1e-9 * (1.0 + sum)) << n << " " << threshold;
      EXPECT_EQ(CountAtLeast(keys, threshold), count) << n << " " << threshold;
      std::vector<int32_t> got_indices = {42};  // cleared first
      IndicesAtLeast(keys, threshold, got_indices);
      EXPECT_EQ(got_indices, indices) << n << " " << threshold;
    }
  }
}

TEST(LogitReductionsTest, TopIndicesMatchAFullSort) {
  for (size_t n : Lengths()) {
    for (float scale : {0.001f, 1.0f, 1000.0f}) {
      std::vector<float> v = RandomLogits(n, static_cast<uint32_t>(n + 77), scale);
      // Ties: a run of equal values, some of them among the largest.
      for (size_t i = 0; i < n; i += 5) v[i] = v[0];
      std::vector<int32_t> order(n);
      for (size_t i = 0; i < n; ++i) order[i] = static_cast<int32_t>(i);
      std::sort(order.begin(), order.end(),
                [&](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
      for (size_t k : {size_t{0}, size_t{1}, size_t{5}, size_t{20}, n, n + 3}) {
        std::vector<int32_t> got = {-1};  // cleared first
        TopIndices(v, k, got);
        const std::vector<int32_t> expected(order.begin(), order.begin() + static_cast<ptrdiff_t>(std::min(k, n)));
        EXPECT_EQ(got, expected) << n << " scale " << scale << " k " << k;
      }
    }
  }
}

TEST(LogitReductionsTest, FirstCumulativeAboveIsTheInverseCdf) {
  for (size_t n : Lengths()) {
    std::vector<float> w = RandomLogits(n, 5, 1.0f);
    for (float& x : w) x = std::fabs(x);
    if (n > 3) w[1] = 0.0f;  // a zero weight is never chosen
    double total = 0.0;
    for (float x : w) total += x;
    std::mt19937 rng(9);
    std::uniform_real_distribution<double> uniform(0.0, total);
    for (int trial = 0; trial < 20; ++trial) {
      const double target = uniform(rng);
      double cumulative = 0.0;
      size_t expected = n;
      for (size_t i = 0; i < n && expected == n; ++i)
        if ((cumulative += w[i]) > target && w[i] > 0.0f) expected = i;
      const size_t got = FirstCumulativeAbove(w, target);
      // Block sums round differently from the element-wise walk: at most a
      // neighbour when the target sits on a boundary.
      EXPECT_LE(std::fabs(static_cast<double>(got) - static_cast<double>(expected)), 1.0) << n;
      EXPECT_GT(w[got], 0.0f) << n;
    }
    // Past the total (rounding): the last positive weight.
    size_t last = n - 1;
    while (w[last] == 0.0f) --last;
    EXPECT_EQ(FirstCumulativeAbove(w, total * 2), last) << n;
    EXPECT_EQ(FirstCumulativeAbove(w, 0.0), w[0] > 0.0f ? 0u : 2u) << n;
  }
  const std::vector<float> zeros(70, 0.0f);
  EXPECT_EQ(FirstCumulativeAbove(zeros, 0.0), zeros.size());
}

}  // namespace
}  // namespace tandem
