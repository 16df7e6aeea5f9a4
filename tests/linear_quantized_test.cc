// The quantized linear kernels (common/kernels/linear_quantized.h) against a
// float64 reference of the dequantized weights, for every block type, every
// quantized kernel this CPU runs, odd row counts and one and two threads.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/thread_pool.h"
#include "common/kernels/kernel_calibration.h"
#include "common/kernels/kernel_plan.h"
#include "common/kernels/linear.h"
#include "common/model/gguf_tensor_source.h"
#include "common/quant/block_order.h"
#include "common/quant/quantize.h"
#include "common/quant/synthetic_blocks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

constexpr auto& kQuantized = kQuantizedDTypes;

std::vector<float> Random(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) x = dist(rng);
  return v;
}

// W [N, K] quantized to `dtype` from random values (random block bytes with
// small finite scales for a type tandem only reads: every level, sub-block
// scale and min occurs), and its exact f32 values.
struct QuantizedMatrix {
  QuantizedMatrix(DType dtype, int64_t n, int64_t k, uint32_t seed) {
    const GgmlType type = GgmlFromDType(dtype);
    const int64_t row_bytes = DTypeRowBytes(dtype, k);
    blocks.resize(static_cast<size_t>(n * row_bytes));
    values.resize(static_cast<size_t>(n * k));
    const std::vector<float> source = Random(n * k, seed);
    for (int64_t j = 0; j < n; ++j) {
      absl::Span<uint8_t> row(blocks.data() + j * row_bytes, static_cast<size_t>(row_bytes));
      if (CanQuantize(type)) {
        EXPECT_OK(QuantizeRow(type, absl::MakeConstSpan(source.data() + j * k, static_cast<size_t>(k)), row));
      } else {
        EXPECT_OK(SyntheticBlocks(type, seed * 7919 + static_cast<uint32_t>(j), row));
      }
      EXPECT_OK(DequantizeRow(type, row, absl::MakeSpan(values.data() + j * k, static_cast<size_t>(k))));
    }
    weight = LinearWeight{blocks.data(), dtype, n, k};
  }
  std::vector<uint8_t> blocks;
  std::vector<float> values;
  LinearWeight weight;
};

struct Case {
  DType dtype;
  int64_t n, k, m;
  int threads;
};

std::string CaseName(const Case& c) {
  return absl::StrCat(std::string(DTypeName(c.dtype)), "_N", c.n, "_K", c.k, "_M", c.m, "_t", c.threads);
}

class QuantizedLinearTest : public ::testing::TestWithParam<Case> {};

// The error bound of one output against the float64 product with the
// dequantized W. Every kernel: f32 accumulation, (K + 4) 2^-24 sum |x W|.
// A kernel that rounds x to int8 blocks (int8_dot, linear_int8_dot.h) adds
// the rounding: x_i moves by at most d/2 with d = max|x| of its 32-value
// block / 127 (times 1 + 2^-10 for the f32 reciprocal it multiplies by),
// and its f32 sums also carry the type's offsets (Q8_0's +128 levels, a
// K-quant's mins, Q6_K's -32), each at most 2 max|W| of the block. The
// bf16 prefill kernel (avx512_bf16_q_dot) rounds x and W to bf16 instead:
// each product moves by at most (2 2^-9 + 2^-18) |x W|.
enum class Rounding { kNone, kInt8, kBf16 };
Rounding RoundingOf(const LinearKernel& kernel) {
  if (!kernel.rounds_activations) return Rounding::kNone;
  return kernel.path == KernelPath::kBf16Dot ? Rounding::kBf16 : Rounding::kInt8;
}

// x_block: the values that share one int8 scale (LinearKernel::x_block;
// the offsets' bound stays per 32 W values).
double Bound(const float* x, const float* w, int64_t k, double bias, Rounding rounding, int64_t x_block = 32) {
  const bool int8 = rounding == Rounding::kInt8;
  double magnitude = std::abs(bias), moved = 0, products = 0;
  for (int64_t b = 0; b < k; b += 32) {
    double max_x = 0, max_w = 0;
    const int64_t xb = b / x_block * x_block;
    for (int64_t i = xb; i < std::min(k, xb + x_block); ++i) max_x = std::max(max_x, std::abs(static_cast<double>(x[i])));
    for (int64_t i = b; i < b + 32; ++i) max_w = std::max(max_w, std::abs(static_cast<double>(w[i])));
    const double step = max_x / 127 * 0.5 * (1 + std::ldexp(1.0, -10));
    for (int64_t i = b; i < b + 32; ++i) {
      const double abs_w = std::abs(static_cast<double>(w[i]));
      magnitude += std::abs(static_cast<double>(x[i])) * (int8 ? abs_w + 2 * max_w : abs_w);
      moved += abs_w * step;
      products += abs_w * std::abs(static_cast<double>(x[i]));
    }
  }
  double bound = (k + 4) * std::ldexp(1.0, -24) * magnitude + 1e-30;
  if (rounding == Rounding::kInt8) bound += moved;
  if (rounding == Rounding::kBf16) bound += (std::ldexp(1.0, -8) + std::ldexp(1.0, -18)) * products;
  return bound;
}

// Every quantized kernel of the table this CPU runs gives y within its
// bound of the float64 product with the dequantized W.
TEST_P(QuantizedLinearTest, EveryKernelMatchesTheDequantizedReference) {
  const Case& c = GetParam();
  const QuantizedMatrix w(c.dtype, c.n, c.k, 11);
  const std::vector<float> x = Random(c.m * c.k, 5), bias = Random(c.n, 6);
  ThreadPool pool(ThreadPoolOptions{.num_threads = c.threads, .name = "q-linear-test"});
  int kernels = 0;
  for (const LinearKernel& kernel : AllLinearKernels()) {
    if (kernel.dtype != c.dtype || kernel.isa > ActiveIsa()) continue;
    ++kernels;
    LinearOptions options;
    options.kernel = &kernel;
    std::vector<float> y(static_cast<size_t>(c.m * c.n));
    ASSERT_OK(Linear(x.data(), c.m, w.weight, bias.data(), y.data(), &pool, options));
    for (int64_t r = 0; r < c.m; ++r) {
      for (int64_t j = 0; j < c.n; ++j) {
        double exact = bias[j];
        for (int64_t i = 0; i < c.k; ++i) exact += static_cast<double>(x[r * c.k + i]) * w.values[j * c.k + i];
        const double bound = Bound(&x[r * c.k], &w.values[j * c.k], c.k, bias[j], RoundingOf(kernel), kernel.x_block);
        ASSERT_LE(std::abs(y[r * c.n + j] - exact), bound)
            << kernel.name << " row " << r << " feature " << j << " got " << y[r * c.n + j] << " exact " << exact;
      }
    }
  }
  EXPECT_GE(kernels, 3) << "a stream, a packed and an int8_dot kernel for " << DTypeName(c.dtype);
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (DType dtype : kQuantized) {
    const int64_t block = DTypeBlockSize(dtype);
    for (int64_t m : {1, 3, 9, 37})
      for (int threads : {1, 2}) cases.push_back({dtype, 45, 2 * block, m, threads});
    cases.push_back({dtype, 67, 4 * block, 16, 2});
    // Decode row counts on an odd shape, one and two threads: a tail of W
    // rows (tile and fused passes), every x-row count of a fused pass and
    // one past it, and for the 32-value types a row that ends in half a
    // 64-value VNNI step.
    for (int64_t m = 1; m <= 9; ++m)
      for (int threads : {1, 2}) cases.push_back({dtype, 13, 3 * block, m, threads});
    // One x row at 9 blocks and at the first K past the bound where two x
    // rows stop reading split streams (6400, kInt8OneRowMaxK in
    // common/kernels/linear_isa.h); 7 W rows leave uneven split-stream parts.
    for (int64_t k : {9 * block, (6400 / block + 1) * block}) cases.push_back({dtype, 7, k, 1, 2});
    // The AMX GEMM's passes over x (linear_amx_gemm.cc): at K = 4608 a
    // pass takes two 16-row blocks, so 37 rows make two, the second part
    // filled; its tasks are 32 W rows, 64 of them two tasks.
    cases.push_back({dtype, 64, 4608, 37, 1});
    // Longer rows of the 32-value types: 34 blocks, and 65 (a half unit
    // after 32 whole ones).
    if (block == 32) {
      for (int64_t m : {1, 4}) {
        cases.push_back({dtype, 9, 34 * block, m, 2});
        cases.push_back({dtype, 9, 65 * block, m, 1});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Types, QuantizedLinearTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return CaseName(info.param); });

// The built-in plan runs int8_dot at decode and on small batches and, where
// the CPU has fast bf16 dot products, the bf16 GEMM on dequantized rows from
// 32 rows (every type); float weights take bf16_dot from 12. Below
// avx512_bf16, or where bf16 dot products are slow, quantized weights keep
// int8_dot at prefill (faster there than q_packed's f32 FMAs at every row
// count) while float weights get packed.
// The exact plan keeps x in f32 (stream, then packed), and so does a layer
// that asks for f32 activations.
// Where bf16 dot products are slow, the built-in plan at avx512_bf16 never
// takes them: int8_dot for quantized weights at every row count, packed from
// 32 rows for float weights.
TEST(QuantizedLinear, SlowBf16DotPlanTakesInt8DotAndPacked) {
  const KernelPlan slow = KernelPlan::BuiltIn(IsaLevel::kAvx512Bf16, Bf16DotSpeed::kSlow);
  for (int64_t m : {1, 16, 31, 32, 512}) {
    for (DType dtype : {DType::kQ8_0, DType::kQ4_K, DType::kQ6_K})
      EXPECT_EQ(slow.PathFor(m, dtype), KernelPath::kInt8Dot);
    EXPECT_EQ(slow.PathFor(m, DType::kBF16), m >= 32 ? KernelPath::kPacked : KernelPath::kInt8Dot) << m;
  }
  EXPECT_NE(slow.source().find("slow bf16"), std::string::npos) << slow.source();
  // A fast CPU's plan at the same level takes the bf16 GEMMs.
  const KernelPlan fast = KernelPlan::BuiltIn(IsaLevel::kAvx512Bf16, Bf16DotSpeed::kFast);
  EXPECT_EQ(fast.PathFor(32, DType::kQ8_0), KernelPath::kBf16Dot);
  EXPECT_EQ(fast.PathFor(12, DType::kBF16), KernelPath::kBf16Dot);
  // With AMX tiles, whatever the vector bf16 speed: the tiles from 4 rows
  // on bf16 weights, from 12 on quantized ones; f32 and f16 weights as
  // where bf16 dot products are slow.
  for (Bf16DotSpeed speed : {Bf16DotSpeed::kSlow, Bf16DotSpeed::kFast}) {
    const KernelPlan amx = KernelPlan::BuiltIn(IsaLevel::kAmx, speed);
    for (DType dtype : {DType::kQ8_0, DType::kQ4_K, DType::kIQ4_XS}) {
      EXPECT_EQ(amx.PathFor(11, dtype), KernelPath::kInt8Dot);
      EXPECT_EQ(amx.PathFor(12, dtype), KernelPath::kBf16Dot);
      EXPECT_EQ(amx.PathFor(512, dtype), KernelPath::kBf16Dot);
    }
    EXPECT_EQ(amx.PathFor(3, DType::kBF16), KernelPath::kInt8Dot);
    EXPECT_EQ(amx.PathFor(4, DType::kBF16), KernelPath::kBf16Dot);
    for (DType dtype : {DType::kF16, DType::kF32}) {
      EXPECT_EQ(amx.PathFor(31, dtype), KernelPath::kInt8Dot);
      EXPECT_EQ(amx.PathFor(32, dtype), KernelPath::kPacked);
    }
    EXPECT_EQ(amx.Spec(), "1:int8_dot,32:packed;BF16=1:int8_dot,4:bf16_dot;quantized=1:int8_dot,12:bf16_dot");
  }
}

TEST(QuantizedLinear, PlanRunsInt8DotAtDecodeAndExactPlanKeepsF32) {
  const KernelPlan built_in = BuiltInKernelPlan();
  const LinearOptions options{.plan = &built_in};
  const bool amx = ActiveIsa() >= IsaLevel::kAmx;
  const bool bf16_dot = amx || (ActiveIsa() >= IsaLevel::kAvx512Bf16 && MeasuredBf16DotSpeed() == Bf16DotSpeed::kFast);
  // AMX tiles take bf16 weights from 4 rows, quantized ones from 12.
  const int64_t quantized_from = amx ? 12 : 32, float_from = amx ? 4 : 12;
  EXPECT_EQ(ChooseLinearKernel(1, DType::kQ4_K, options).path, KernelPath::kInt8Dot);
  for (int64_t m : {4, 11, 12, 15, 16, 31, 32, 127, 128, 512}) {
    // At plain avx512 (no VNNI) packed's zmm FMAs win again from 128 rows.
    const KernelPath quantized = bf16_dot && m >= quantized_from                ? KernelPath::kBf16Dot
                                 : ActiveIsa() == IsaLevel::kAvx512 && m >= 128 ? KernelPath::kPacked
                                                                                : KernelPath::kInt8Dot;
    EXPECT_EQ(ChooseLinearKernel(m, DType::kQ8_0, options).path, quantized) << m;
    EXPECT_EQ(ChooseLinearKernel(m, DType::kQ4_K, options).path, quantized) << m;
    EXPECT_EQ(ChooseLinearKernel(m, DType::kQ6_K, options).path, quantized) << m;
    // Slow bf16 dot products: float weights stream up to 31 rows.
    const bool slow_bf16 = ActiveIsa() >= IsaLevel::kAvx512Bf16 && !bf16_dot;
    // Without bf16 GEMMs, and for f16 weights: the stream below 12 rows
    // (below 32 where the plan is the slow-bf16 one, as with AMX), packed on.
    const int64_t packed_from = slow_bf16 || amx ? 32 : 12;
    const KernelPath float_path = m < packed_from ? KernelPath::kStream : KernelPath::kPacked;
    EXPECT_EQ(ChooseLinearKernel(m, DType::kBF16, options).path,
              bf16_dot ? (m >= float_from ? KernelPath::kBf16Dot : KernelPath::kStream) : float_path)
        << m;
    EXPECT_EQ(ChooseLinearKernel(m, DType::kF16, options).path, float_path) << m;
  }
  EXPECT_EQ(ChooseLinearKernel(1, DType::kBF16, options).path, KernelPath::kStream);  // int8_dot: quantized only
  const KernelPlan exact = KernelPlan::Exact(ActiveIsa());
  for (int64_t m : {1, 8, 512}) {
    EXPECT_FALSE(ChooseLinearKernel(m, DType::kQ6_K, LinearOptions{.plan = &exact}).rounds_activations) << m;
    EXPECT_FALSE(ChooseLinearKernel(m, DType::kQ6_K, LinearOptions{.plan = &built_in, .f32_activations = true})
                     .rounds_activations)
        << m;
  }
}

// Timed on Q8_0 weights, a measured plan's steps serve Q8_0 alone; float
// weights and the other quantized types keep the built-in steps (their
// crossovers differ: docs/BENCHMARKS.md, "Prefill GEMM").
TEST(QuantizedLinear, MeasuredPlanServesTheTypesTimed) {
  const QuantizedMatrix a(DType::kQ8_0, 64, 256, 1), b(DType::kQ8_0, 256, 64, 2);
  const std::vector<std::vector<LinearWeight>> groups = {{a.weight, b.weight}};
  ThreadPool pool(ThreadPoolOptions{.num_threads = 2, .name = "calib-test"});
  KernelCalibrationOptions options;
  options.rows = {1, 8, 40};
  options.reps = 1;
  ASSERT_OK_AND_ASSIGN(const KernelCalibration measured, MeasureKernelPlan(groups, &pool, options));
  auto spec = [](const std::vector<KernelPlanStep>& steps) { return KernelPlan::Create(steps, "t")->Spec(); };
  const KernelPlan built_in = BuiltInKernelPlan();
  // Float weights and the types not timed keep the built-in steps.
  for (DType dtype : {DType::kBF16, DType::kQ4_K, DType::kQ6_K})
    EXPECT_EQ(spec(measured.plan.StepsFor(dtype)), spec(built_in.StepsFor(dtype))) << DTypeName(dtype);
  EXPECT_THAT(measured.plan.source(), ::testing::HasSubstr("for Q8_0 weights"));
  // Each of Q8_0's steps takes a path that was timed at some count.
  for (const KernelPlanStep& step : measured.plan.StepsFor(DType::kQ8_0)) {
    const bool timed = std::any_of(measured.timings.begin(), measured.timings.end(),
                                   [&](const KernelTiming& t) { return t.path == step.path; });
    EXPECT_TRUE(timed) << KernelPathName(step.path) << " in " << measured.plan.Spec();
  }
  // The timings name Q8_0's kernels (e.g. int8_dot's, never a float stream).
  for (const KernelTiming& t : measured.timings) {
    const KernelPlan only = *KernelPlan::Create({{1, t.path}}, "t");
    EXPECT_EQ(t.kernel, ChooseLinearKernel(t.rows, DType::kQ8_0, LinearOptions{.plan = &only}).name);
  }
}

// Each int8_dot kernel's result for every row of a call of `rows` rows
// (one thread) against the same row alone (two threads), bit for bit.
void ExpectRowResultsIndependentOfRowCountAndThreads(DType dtype, int64_t rows, int64_t n, int64_t k) {
  const QuantizedMatrix w(dtype, n, k, 11);
  const std::vector<float> x = Random(rows * k, 7), bias = Random(n, 8);
  for (const LinearKernel& kernel : AllLinearKernels()) {
    if (kernel.dtype != dtype || kernel.path != KernelPath::kInt8Dot || kernel.isa > ActiveIsa()) continue;
    const LinearOptions options{.kernel = &kernel};
    ThreadPool one_thread(ThreadPoolOptions{.num_threads = 1, .name = "q-linear-test"});
    std::vector<float> all(static_cast<size_t>(rows * n));
    ASSERT_OK(Linear(x.data(), rows, w.weight, bias.data(), all.data(), &one_thread, options));
    ThreadPool two_threads(ThreadPoolOptions{.num_threads = 2, .name = "q-linear-test"});
    for (int64_t r : {int64_t{0}, int64_t{7}, int64_t{8}, rows - 1}) {
      std::vector<float> one(static_cast<size_t>(n));
      ASSERT_OK(Linear(&x[r * k], 1, w.weight, bias.data(), one.data(), &two_threads, options));
      for (int64_t j = 0; j < n; ++j)
        ASSERT_EQ(one[j], all[r * n + j]) << kernel.name << " " << DTypeName(dtype) << " row " << r << " feature " << j;
    }
  }
}

// The int8_dot kernels compute each output from its x row and W row alone:
// a row's result is bit for bit the same in a call of 1 row and of 11 or 10
// (the fused kernels' passes of 8 x rows and 3 or 2, the tile's register
// tiles of 4), with 1 or 2 threads; 13 W rows leave short parts of the
// split streams and the lane groups of the 32-value types (4 (W row, x
// row) pairs a group). K of 3 and 9 blocks and the first K past 6400
// (kInt8OneRowMaxK, common/kernels/linear_isa.h), where two x rows and
// Q5_K's one change how their W rows are read at AVX-512 VNNI.
TEST(QuantizedLinear, Int8DotRowResultIndependentOfRowCountAndThreads) {
  for (DType dtype : kQuantized) {
    const int64_t block = DTypeBlockSize(dtype);
    for (const int64_t k : {3 * block, 9 * block, (6400 / block + 1) * block}) {
      SCOPED_TRACE(absl::StrCat(std::string(DTypeName(dtype)), " K = ", k));
      ExpectRowResultsIndependentOfRowCountAndThreads(dtype, 11, 13, k);
      ExpectRowResultsIndependentOfRowCountAndThreads(dtype, 10, 13, k);
    }
  }
}

// Q4_K and Q6_K blocks in group-major order (block_order.h) give every
// kernel the very bits of the same blocks in ggml's order: the VNNI GEMV
// reads the same levels into the same lanes, and the other kernels decode
// the same values (fails when a decoder misplaces one value or group).
TEST(QuantizedLinear, GroupMajorBlocksGiveTheSameBitsOnEveryKernel) {
  for (DType dtype : {DType::kQ4_K, DType::kQ6_K}) {
    for (const int64_t k : {int64_t{256}, int64_t{3 * 256}}) {
      constexpr int64_t kN = 13;
      const QuantizedMatrix w(dtype, kN, k, 17);
      std::vector<uint8_t> group_major = w.blocks;
      ASSERT_OK(ToGroupMajorOrder(GgmlFromDType(dtype), absl::MakeSpan(group_major)));
      ASSERT_NE(group_major, w.blocks);
      LinearWeight reordered = w.weight;
      reordered.data = group_major.data();
      reordered.order = BlockOrder::kGroupMajor;
      for (const int64_t m : {1, 3, 8, 9, 37, 130}) {
        const std::vector<float> x = Random(m * k, 19), bias = Random(kN, 20);
        for (int threads : {1, 2}) {
          ThreadPool pool(ThreadPoolOptions{.num_threads = threads, .name = "q-linear-test"});
          for (const LinearKernel& kernel : AllLinearKernels()) {
            if (kernel.dtype != dtype || kernel.isa > ActiveIsa()) continue;
            const LinearOptions options{.kernel = &kernel};
            std::vector<float> want(static_cast<size_t>(m * kN)), got(want.size());
            ASSERT_OK(Linear(x.data(), m, w.weight, bias.data(), want.data(), &pool, options));
            ASSERT_OK(Linear(x.data(), m, reordered, bias.data(), got.data(), &pool, options));
            // The AVX2 fused GEMV leaves group-major blocks to its tile path,
            // other arithmetic: there, the float64 reference's bound.
            const bool same_route = !(kernel.isa == IsaLevel::kAvx2 && kernel.path == KernelPath::kInt8Dot);
            for (int64_t r = 0; r < m; ++r) {
              for (int64_t j = 0; j < kN; ++j) {
                const size_t i = static_cast<size_t>(r * kN + j);
                if (same_route) {
                  ASSERT_EQ(got[i], want[i]) << kernel.name << " " << DTypeName(dtype) << " K " << k << " m " << m
                                             << " threads " << threads << " row " << r << " feature " << j;
                  continue;
                }
                double exact = bias[j];
                for (int64_t v = 0; v < k; ++v) exact += static_cast<double>(x[r * k + v]) * w.values[j * k + v];
                ASSERT_LE(std::abs(got[i] - exact),
                          Bound(&x[r * k], &w.values[j * k], k, bias[j], RoundingOf(kernel), kernel.x_block))
                    << kernel.name << " " << DTypeName(dtype) << " m " << m << " row " << r << " feature " << j;
              }
            }
          }
        }
      }
    }
  }
}

// LinearShared (attention's q, k and v in one dispatch) gives each W what a
// Linear of its own gives, bit for bit: every feature is still computed by
// one task of the same kernel over all of K, whatever the split. Mixed types
// as in a Q4_K_M file (q, k Q4_K; v Q6_K), and bf16 with K = 1024, whose
// rows 4 KB apart take the padded copy of x; decode and prefill row counts.
TEST(QuantizedLinear, SharedDispatchMatchesOneLinearPerWeight) {
  struct Set {
    DType q, k, v;
    int64_t cols;
  };
  ThreadPool pool(ThreadPoolOptions{.num_threads = 2, .name = "q-linear-test"});
  for (const Set& set :
       {Set{DType::kQ4_K, DType::kQ4_K, DType::kQ6_K, 512}, Set{DType::kBF16, DType::kBF16, DType::kBF16, 1024}}) {
    const QuantizedMatrix q(set.q, 40, set.cols, 21), k(set.k, 9, set.cols, 22), v(set.v, 12, set.cols, 23);
    const QuantizedMatrix* weights[] = {&q, &k, &v};
    const std::vector<float> bias = Random(40, 32);
    for (int64_t m : {int64_t{1}, int64_t{3}, int64_t{13}, int64_t{40}}) {
      const std::vector<float> x = Random(m * set.cols, 31);
      std::vector<std::vector<float>> shared, alone;
      std::vector<LinearProduct> products;
      for (const QuantizedMatrix* w : weights) {
        shared.emplace_back(static_cast<size_t>(m * w->weight.n));
        alone.emplace_back(static_cast<size_t>(m * w->weight.n));
      }
      for (size_t i = 0; i < 3; ++i)
        products.push_back({.w = &weights[i]->weight, .bias = i == 1 ? bias.data() : nullptr, .y = shared[i].data()});
      ASSERT_OK(LinearShared(x.data(), m, products, &pool));
      for (size_t i = 0; i < 3; ++i) {
        ASSERT_OK(Linear(x.data(), m, weights[i]->weight, products[i].bias, alone[i].data(), &pool));
        for (size_t j = 0; j < alone[i].size(); ++j)
          ASSERT_EQ(shared[i][j], alone[i][j])
              << DTypeName(weights[i]->weight.dtype) << " weight " << i << " M " << m << " element " << j;
      }
    }
  }
}

TEST(QuantizedLinear, SharedDispatchRefusesWhatCannotShareOneX) {
  const QuantizedMatrix a(DType::kQ8_0, 4, 64, 1), b(DType::kQ8_0, 4, 96, 2);
  std::vector<float> x(96), y(4), z(4);
  const LinearProduct mixed[] = {{.w = &a.weight, .y = y.data()}, {.w = &b.weight, .y = z.data()}};
  absl::Status status = LinearShared(x.data(), 1, mixed, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("weight 1 has K = 96"));
  status = LinearShared(x.data(), 1, {}, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("0 weights"));
  const LinearProduct many[] = {{.w = &a.weight, .y = y.data()},
                                {.w = &a.weight, .y = y.data()},
                                {.w = &a.weight, .y = y.data()},
                                {.w = &a.weight, .y = y.data()},
                                {.w = &a.weight, .y = y.data()}};
  status = LinearShared(x.data(), 1, many, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("5 weights"));
  const LinearProduct null_weight[] = {{.w = nullptr, .y = y.data()}};
  status = LinearShared(x.data(), 1, null_weight, nullptr);
  EXPECT_THAT(std::string(status.message()), HasSubstr("weight 0 is null"));
}

TEST(QuantizedLinear, RowsThatAreNotWholeBlocksAreRefused) {
  std::vector<uint8_t> blocks(1024);
  const LinearWeight w{blocks.data(), DType::kQ4_K, 2, 100};
  std::vector<float> x(100), y(2);
  const absl::Status status = Linear(x.data(), 1, w, nullptr, y.data(), nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("256-value blocks"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("Q4_K"));
}

}  // namespace
}  // namespace tandem
