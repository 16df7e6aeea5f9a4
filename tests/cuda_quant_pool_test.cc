// The CUDA expert pool on block-quantized experts (a GGUF's, kept as
// blocks: --gguf_experts quantized), against float64 references of the
// dequantized weights (the CPU's reference decoders, common/quant):
//
//   - the kernels, per format (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K):
//     LaunchDequantize to f32 gives the reference decoder's values (up to
//     the last bit: the GPU may fuse d·q - m), and the decode GEMV at 1..8
//     rows gives Σ x·w within f32 accumulation error;
//   - the pool: slots hold the blocks as stored (ReadHeld), migrations
//     record their layer's bytes, and RunExperts matches the float64 FFN
//     (normalised MSE; activations rounded to bf16 on the batched path) at
//     row counts on both sides of kQuantGemvMaxRows, with a Q4_K_M-like
//     layer mixing Q4_K and Q6_K.
//
// Without a CUDA device (or without CUDA in the build) every test skips,
// saying why. The host-side logic (slot sizing, byte counts, which types the
// pool refuses) is tested without a GPU in quantized_pool_test.
//
// Legend: D hidden size, I intermediate size, R rows.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/base/dtype.h"
#include "common/model/gguf_tensor_source.h"
#include "common/model/model_config.h"
#include "common/quant/block_order.h"
#include "common/quant/quantize.h"
#include "gpu_worker/cuda/cuda_expert_pool.h"
#include "gtest/gtest.h"
#include "tests/cuda_skip_testlib.h"
#include "tests/status_testlib.h"

#if TANDEM_HAVE_CUDA
#include <cuda_runtime.h>

#include "gpu_worker/cuda/cuda_dtype.h"
#include "gpu_worker/cuda/cuda_quant_kernels.h"
#endif

namespace tandem {
namespace {

// The decode GEMV's row limit (kQuantGemvMaxRows, in a CUDA-only header).
constexpr int64_t kGemvRows = 8;
#if TANDEM_HAVE_CUDA
static_assert(kGemvRows == kQuantGemvMaxRows);
#endif

constexpr DType kFormats[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                              DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

// A random [n, k] matrix quantized by the CPU's reference quantizer, and the
// float64 values its blocks decode to (the reference decoder's).
struct QuantMatrix {
  DType dtype = DType::kQ8_0;
  int64_t n = 0, k = 0;
  std::vector<uint8_t> blocks;  // [n, DTypeRowBytes(dtype, k)]
  std::vector<double> values;   // [n, k]
};

QuantMatrix MakeQuantMatrix(DType dtype, int64_t n, int64_t k, uint32_t seed) {
  QuantMatrix m{dtype, n, k, {}, {}};
  const int64_t row_bytes = DTypeRowBytes(dtype, k);
  m.blocks.resize(static_cast<size_t>(n * row_bytes));
  m.values.resize(static_cast<size_t>(n * k));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> row(static_cast<size_t>(k)), decoded(static_cast<size_t>(k));
  for (int64_t r = 0; r < n; ++r) {
    for (float& v : row) v = normal(rng);
    absl::Span<uint8_t> out(m.blocks.data() + r * row_bytes, static_cast<size_t>(row_bytes));
    EXPECT_OK(QuantizeRow(GgmlFromDType(dtype), row, out));
    EXPECT_OK(DequantizeRow(GgmlFromDType(dtype), out, absl::Span<float>(decoded)));
    for (int64_t c = 0; c < k; ++c) m.values[static_cast<size_t>(r * k + c)] = decoded[static_cast<size_t>(c)];
  }
  return m;
}

std::vector<float> RandomRows(int64_t rows, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows * k));
  for (float& v : x) v = uniform(rng);
  return x;
}

// Σ (got - want)² / Σ want².
double Nmse(const std::vector<float>& got, const std::vector<double>& want) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = got[i] - want[i];
    err += e * e;
    norm += want[i] * want[i];
  }
  return norm > 0 ? err / norm : err;
}

class QuantKernelTest : public ::testing::TestWithParam<DType> {};

// In ggml's order and, for Q4_K and Q6_K, in group-major order (the blocks
// a pool copies from a VNNI worker's store): the same values.
TEST_P(QuantKernelTest, DequantizeGivesTheReferenceDecodersValues) {
  SKIP_WITHOUT_CUDA_DEVICE();
#if TANDEM_HAVE_CUDA
  const DType dtype = GetParam();
  const QuantMatrix m = MakeQuantMatrix(dtype, 24, 512, 1);
  for (BlockOrder order : {BlockOrder::kGgml, BlockOrder::kGroupMajor}) {
    if (order == BlockOrder::kGroupMajor && !HasGroupMajorOrder(dtype)) continue;
    std::vector<uint8_t> blocks = m.blocks;
    if (order == BlockOrder::kGroupMajor) {
      ASSERT_OK(ToGroupMajorOrder(GgmlFromDType(dtype), absl::MakeSpan(blocks)));
    }
    void* w = nullptr;
    float* out = nullptr;
    ASSERT_EQ(cudaMalloc(&w, blocks.size()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&out), m.values.size() * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(w, blocks.data(), blocks.size(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(LaunchDequantize(w, ToKernelQuantType(dtype, order), m.n, m.k, out, KernelDType::kF32, nullptr),
              cudaSuccess);
    std::vector<float> got(m.values.size());
    ASSERT_EQ(cudaMemcpy(got.data(), out, got.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(w);
    cudaFree(out);
    for (size_t i = 0; i < got.size(); ++i) {
      // The same f32 operations, possibly fused: within a few ulps of the value.
      ASSERT_NEAR(got[i], m.values[i], 1e-6 + 4e-7 * std::fabs(m.values[i]))
          << DTypeName(dtype) << " " << BlockOrderName(order) << " value " << i;
    }
  }
#endif
}

TEST_P(QuantKernelTest, DecodeGemvMatchesTheFloat64Product) {
  SKIP_WITHOUT_CUDA_DEVICE();
#if TANDEM_HAVE_CUDA
  const DType dtype = GetParam();
  const QuantMatrix m = MakeQuantMatrix(dtype, 40, 768, 2);
  void* w = nullptr;
  float* x_dev = nullptr;
  float* y_dev = nullptr;
  const int max_rows = kQuantGemvMaxRows;
  const std::vector<float> x = RandomRows(max_rows, m.k, 3);
  ASSERT_EQ(cudaMalloc(&w, m.blocks.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&x_dev), x.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&y_dev), static_cast<size_t>(max_rows * m.n) * sizeof(float)),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(w, m.blocks.data(), m.blocks.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(x_dev, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  for (int rows = 1; rows <= max_rows; ++rows) {
    ASSERT_EQ(LaunchQuantGemv(w, ToKernelQuantType(dtype, BlockOrder::kGgml), m.n, m.k, x_dev, KernelDType::kF32, m.k,
                              rows, y_dev, m.n, nullptr),
              cudaSuccess);
    std::vector<float> got(static_cast<size_t>(rows * m.n));
    ASSERT_EQ(cudaMemcpy(got.data(), y_dev, got.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<double> want(got.size());
    for (int r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < m.n; ++j) {
        double s = 0;
        for (int64_t c = 0; c < m.k; ++c)
          s += x[static_cast<size_t>(r * m.k + c)] * m.values[static_cast<size_t>(j * m.k + c)];
        want[static_cast<size_t>(r * m.n + j)] = s;
      }
    }
    EXPECT_LT(Nmse(got, want), 1e-10) << DTypeName(dtype) << " at " << rows << " rows";
  }
  // More rows than the GEMV serves is refused, not truncated.
  EXPECT_EQ(LaunchQuantGemv(w, ToKernelQuantType(dtype, BlockOrder::kGgml), m.n, m.k, x_dev, KernelDType::kF32, m.k,
                            max_rows + 1, y_dev, m.n, nullptr),
            cudaErrorInvalidValue);
  (void)cudaGetLastError();
  cudaFree(w);
  cudaFree(x_dev);
  cudaFree(y_dev);
#endif
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantKernelTest, ::testing::ValuesIn(kFormats),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

// One layer of `experts` quantized experts (w1/w3 of `w13`, w2 of `w2`).
struct QuantLayer {
  std::vector<QuantMatrix> w1, w3, w2;  // [experts]
};

QuantLayer MakeLayer(int experts, int64_t d, int64_t i, DType w13, DType w2, uint32_t seed) {
  QuantLayer layer;
  for (int e = 0; e < experts; ++e) {
    layer.w1.push_back(MakeQuantMatrix(w13, i, d, seed + 10 * e));
    layer.w3.push_back(MakeQuantMatrix(w13, i, d, seed + 10 * e + 1));
    layer.w2.push_back(MakeQuantMatrix(w2, d, i, seed + 10 * e + 2));
  }
  return layer;
}

// y = W2 · (silu(W1 x) ⊙ W3 x) in float64 over the dequantized weights.
std::vector<double> ReferenceFfn(const QuantLayer& layer, int e, const std::vector<float>& x, int64_t rows) {
  const QuantMatrix& w1 = layer.w1[static_cast<size_t>(e)];
  const QuantMatrix& w3 = layer.w3[static_cast<size_t>(e)];
  const QuantMatrix& w2 = layer.w2[static_cast<size_t>(e)];
  const int64_t d = w1.k, i = w1.n;
  std::vector<double> y(static_cast<size_t>(rows * d)), h(static_cast<size_t>(i));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < i; ++j) {
      double g = 0, u = 0;
      for (int64_t c = 0; c < d; ++c) {
        const double xv = x[static_cast<size_t>(r * d + c)];
        g += xv * w1.values[static_cast<size_t>(j * d + c)];
        u += xv * w3.values[static_cast<size_t>(j * d + c)];
      }
      h[static_cast<size_t>(j)] = g / (1 + std::exp(-g)) * u;
    }
    for (int64_t j = 0; j < d; ++j) {
      double s = 0;
      for (int64_t c = 0; c < i; ++c) s += h[static_cast<size_t>(c)] * w2.values[static_cast<size_t>(j * i + c)];
      y[static_cast<size_t>(r * d + j)] = s;
    }
  }
  return y;
}

TEST(CudaQuantPoolTest, ComputesQuantizedExpertsAsTheFloat64Reference) {
  SKIP_WITHOUT_CUDA_DEVICE();
  constexpr int64_t kD = 512, kI = 768;
  constexpr int kExperts = 4;
  // Layer 0 Q4_K throughout, layer 1 Q4_K gate/up and Q6_K down (Q4_K_M's
  // mix), layer 2 Q8_0: three layouts in one pool.
  std::vector<QuantLayer> layers;
  layers.push_back(MakeLayer(kExperts, kD, kI, DType::kQ4_K, DType::kQ4_K, 100));
  layers.push_back(MakeLayer(kExperts, kD, kI, DType::kQ4_K, DType::kQ6_K, 200));
  layers.push_back(MakeLayer(kExperts, kD, kI, DType::kQ8_0, DType::kQ8_0, 300));
  ModelConfig config;
  config.hidden_size = kD;
  config.intermediate_size = kI;
  config.num_hidden_layers = static_cast<int64_t>(layers.size());
  config.num_local_experts = kExperts;
  std::vector<std::vector<ExpertWeights>> experts;
  for (const QuantLayer& layer : layers) {
    std::vector<ExpertWeights>& out = experts.emplace_back();
    for (int e = 0; e < kExperts; ++e) {
      const auto view = [](const QuantMatrix& m) { return LinearWeight{m.blocks.data(), m.dtype, m.n, m.k}; };
      ExpertWeights w;
      w.w1 = view(layer.w1[static_cast<size_t>(e)]);
      w.w3 = view(layer.w3[static_cast<size_t>(e)]);
      w.w2 = view(layer.w2[static_cast<size_t>(e)]);
      out.push_back(w);
    }
  }
  CudaExpertPoolOptions options;
  options.pool.num_slots = 4;
  options.pool.num_staging_buffers = 2;
  auto created = CudaExpertPool::Create(config, experts, options);
  ASSERT_OK(created);
  CudaExpertPool& pool = **created;
  EXPECT_EQ(pool.layout(1).DTypeNames(), "Q4_K/Q4_K/Q6_K");

  // Slots hold the blocks as stored; each migration records its layer's bytes.
  ASSERT_OK(pool.Place({0, 0}));
  ASSERT_OK(pool.Migrate({1, 1}, std::nullopt));
  ASSERT_OK(pool.Migrate({2, 3}, std::nullopt));
  for (ExpertKey key : {ExpertKey{0, 0}, ExpertKey{1, 1}, ExpertKey{2, 3}}) {
    auto held = pool.ReadHeld(key);
    ASSERT_OK(held);
    const QuantLayer& layer = layers[static_cast<size_t>(key.layer)];
    const size_t e = static_cast<size_t>(key.expert);
    std::vector<uint8_t> want = layer.w1[e].blocks;
    want.insert(want.end(), layer.w3[e].blocks.begin(), layer.w3[e].blocks.end());
    want.insert(want.end(), layer.w2[e].blocks.begin(), layer.w2[e].blocks.end());
    EXPECT_EQ(*held, want) << SlotPool::KeyName(key);
  }
  for (const MigrationRecord& r : pool.TakeCompletedMigrations()) {
    EXPECT_EQ(r.bytes, pool.layout(r.expert.layer).copy_bytes);
  }

  // Every expert of every layer, staged or in a slot, at row counts on both
  // sides of the decode GEMV's limit, in one call per layer.
  const std::vector<int64_t> rows = {1, kGemvRows, 9, 33};
  for (int l = 0; l < static_cast<int>(layers.size()); ++l) {
    ASSERT_OK(pool.ReleaseStaging());
    std::vector<std::vector<float>> x, y;
    std::vector<ExpertWork> work;
    for (int e = 0; e < kExperts; ++e) {
      if (!pool.Find({l, e}).held) {
        ASSERT_OK(pool.Stage({l, e}));
      }
      const int64_t r = rows[static_cast<size_t>(e) % rows.size()];
      x.push_back(RandomRows(r, kD, 50u + static_cast<uint32_t>(10 * l + e)));
      y.emplace_back(static_cast<size_t>(r * kD));
    }
    for (int e = 0; e < kExperts; ++e) {
      const int64_t r = rows[static_cast<size_t>(e) % rows.size()];
      work.push_back({e, r, x[static_cast<size_t>(e)].data(), y[static_cast<size_t>(e)].data()});
    }
    ASSERT_OK(pool.RunExperts(l, work, nullptr));
    for (int e = 0; e < kExperts; ++e) {
      const int64_t r = rows[static_cast<size_t>(e) % rows.size()];
      const std::vector<double> want = ReferenceFfn(layers[static_cast<size_t>(l)], e, x[static_cast<size_t>(e)], r);
      // bf16 activations (h always; x on the batched path): ~2^-9 relative per element.
      EXPECT_LT(Nmse(y[static_cast<size_t>(e)], want), 1e-4) << "layer " << l << " expert " << e << " rows " << r;
    }
  }
}

}  // namespace
}  // namespace tandem
