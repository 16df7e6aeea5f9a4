// The CUDA compute backend against the CPU backend, op by op and as a whole
// model:
//  - every op (embed, attention, router, combine, logits) equals CpuBackend
//    up to rounding, by normalised mean squared error (nmse = Σ(a-b)² / Σb²)
//    over shape sweeps: rows 1..64 and beyond, prefill lengths across query
//    tiles (16) and KV blocks (4, 16, non-multiples), several sequences with
//    prior cached lengths in one batch, decode batches, GQA ratios 1/2/4/8,
//    head_dim 16..256, f32/f16/bf16 weights, both architectures (Mixtral:
//    RMSNorm, softmax top-k; PhiMoE: LayerNorm, biases, longrope, sliding
//    window, sparsemixer);
//  - the whole tiny model (both presets) through the Engine: teacher-forced
//    on the CPU's greedy tokens, every step's logits within bf16 tolerance
//    and the same argmax wherever the CPU's top-2 margin is not a near tie;
//  - decode CUDA graphs give the same results as no graphs;
//  - copy-on-write of a forked sequence's block on the device leaves the
//    parent's block unchanged.
//
// Bounds: attention deltas are compared (output minus the residual input)
// so the residual does not hide errors. With bf16 (f16) weights the GEMM
// activations are rounded to bf16 (f16): the expected nmse is ~1e-5
// (bf16 has 8 bits of mantissa: 2^-9 relative rounding per input), bounded
// at 2e-3; f32 weights: cuBLAS f32 GEMMs (no TF32), bounded at 1e-8. A
// wrong key position, head, block or mask gives nmse 1e-2 .. 1.
//
// Without a CUDA device (or without CUDA in the build) every test skips,
// saying why.
//
// Legend: T rows, D hidden, H heads, Hkv kv heads, hd head_dim, V vocab,
// E experts, K experts per token, B KV block size.
#include "gpu_worker/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/base/dtype.h"
#include "common/model/model.h"
#include "common/model/synthetic_model.h"
#include "coordinator/engine/cpu_backend.h"
#include "coordinator/engine/engine.h"
#include "coordinator/engine/kv_cache.h"
#include "cpu_worker/local_expert_executor.h"
#include "gpu_worker/cuda/cuda_device.h"
#include "gtest/gtest.h"
#include "tests/cuda_skip_testlib.h"
#include "tests/status_testlib.h"

#if TANDEM_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace tandem {
namespace {

constexpr double kBf16Nmse = 2e-3;
constexpr double kF32Nmse = 1e-8;

double Nmse(std::span<const float> actual, std::span<const float> reference) {
  double err = 0.0, ref = 0.0;
  for (size_t i = 0; i < reference.size(); ++i) {
    const double d = static_cast<double>(actual[i]) - reference[i];
    err += d * d;
    ref += static_cast<double>(reference[i]) * reference[i];
  }
  return ref > 0.0 ? err / ref : err;
}

std::vector<float> RandomVector(size_t n, std::mt19937& rng, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A model of random dense weights for any config (no experts: the op tests
// never run them), so that head counts, head_dim and dtypes can be swept
// beyond the synthetic presets. Owns its storage.
class TestWeights {
 public:
  TestWeights(const ModelConfig& config, DType dtype, uint32_t seed) : rng_(seed), dtype_(dtype) {
    ModelConfig& c = w_.config;
    c = config;
    const int64_t d = c.hidden_size;
    const float in_d = 1.0f / std::sqrt(static_cast<float>(d));
    w_.embed_tokens = View("embed_tokens", c.vocab_size, d, in_d);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      LayerWeights lw;
      lw.input_norm = Norm(c);
      lw.post_attention_norm = Norm(c);
      lw.q_proj = Linear(c.q_dim(), d, in_d);
      lw.k_proj = Linear(c.kv_dim(), d, in_d);
      lw.v_proj = Linear(c.kv_dim(), d, in_d);
      lw.o_proj = Linear(d, c.q_dim(), 1.0f / std::sqrt(static_cast<float>(c.q_dim())));
      if (c.attention_bias) {
        lw.q_bias = RandomVector(static_cast<size_t>(c.q_dim()), rng_, 0.1f);
        lw.k_bias = RandomVector(static_cast<size_t>(c.kv_dim()), rng_, 0.1f);
        lw.v_bias = RandomVector(static_cast<size_t>(c.kv_dim()), rng_, 0.1f);
        lw.o_bias = RandomVector(static_cast<size_t>(d), rng_, 0.1f);
      }
      lw.router = Linear(c.num_local_experts, d, 2.0f * in_d);
      w_.layers.push_back(std::move(lw));
    }
    w_.final_norm = Norm(c);
    w_.lm_head = Linear(c.vocab_size, d, 3.0f * in_d);
    if (c.lm_head_bias) w_.lm_head_bias = RandomVector(static_cast<size_t>(c.vocab_size), rng_, 0.1f);
  }
  const ModelWeights* get() const { return &w_; }

 private:
  const void* Fill(int64_t count, float stddev) {
    const size_t elt = DTypeSize(dtype_);
    storage_.push_back(std::make_unique<uint8_t[]>(static_cast<size_t>(count) * elt));
    uint8_t* p = storage_.back().get();
    std::normal_distribution<float> dist(0.0f, stddev);
    for (int64_t i = 0; i < count; ++i) {
      const float v = dist(rng_);
      StoreAsDType(p, dtype_, static_cast<size_t>(i), v);
    }
    return p;
  }
  LinearWeight Linear(int64_t n, int64_t k, float stddev) {
    return LinearWeight{.data = Fill(n * k, stddev), .dtype = dtype_, .n = n, .k = k};
  }
  TensorView View(const std::string& name, int64_t n, int64_t k, float stddev) {
    TensorView v;
    v.name = name;
    v.dtype = dtype_;
    v.shape = {n, k};
    v.data = Fill(n * k, stddev);
    v.size_bytes = static_cast<size_t>(n * k) * DTypeSize(dtype_);
    return v;
  }
  NormWeights Norm(const ModelConfig& c) {
    NormWeights n;
    n.weight = RandomVector(static_cast<size_t>(c.hidden_size), rng_, 0.1f);
    for (float& x : n.weight) x += 1.0f;
    if (c.norm_kind() == NormKind::kLayerNorm) n.bias = RandomVector(static_cast<size_t>(c.hidden_size), rng_, 0.1f);
    return n;
  }

  ModelWeights w_;
  std::vector<std::unique_ptr<uint8_t[]>> storage_;
  std::mt19937 rng_;
  DType dtype_;
};

// One op-test shape: a preset's config with its attention geometry changed.
struct OpCase {
  std::string preset;  // "tiny" (Mixtral) or "tiny-phimoe"
  int64_t heads, kv_heads, head_dim;
  DType dtype;
  int64_t block_size;
};
void PrintTo(const OpCase& c, std::ostream* os) {
  *os << c.preset << " H=" << c.heads << " Hkv=" << c.kv_heads << " hd=" << c.head_dim << " " << DTypeName(c.dtype)
      << " B=" << c.block_size;
}

ModelConfig CaseConfig(const OpCase& c) {
  absl::StatusOr<ModelConfig> base = SyntheticConfig(SyntheticModelSpec{.preset = c.preset});
  EXPECT_OK(base);
  ModelConfig config = *base;
  config.num_attention_heads = c.heads;
  config.num_key_value_heads = c.kv_heads;
  config.head_dim = c.head_dim;
  if (config.rope_scaling.type == "longrope") {
    // Same shape of factors as the preset's, for the new head_dim.
    const int64_t half = c.head_dim / 2;
    config.rope_scaling.short_factor.clear();
    config.rope_scaling.long_factor.clear();
    for (int64_t i = 0; i < half; ++i) {
      const double t = static_cast<double>(i) / static_cast<double>(half);
      config.rope_scaling.short_factor.push_back(1.0 + 0.1 * t * t);
      config.rope_scaling.long_factor.push_back(1.0 + 30.0 * t * t);
    }
  }
  return config;
}

double BoundFor(DType dtype) { return dtype == DType::kF32 ? kF32Nmse : kBf16Nmse; }

// Both backends, each with its own KV pool, on one set of weights.
struct Pair {
  std::unique_ptr<CpuBackend> cpu;
  std::unique_ptr<CudaBackend> gpu;
  std::unique_ptr<KvBlockPool> cpu_pool, gpu_pool;  // destroyed before the backends (declared after)
};

Pair MakePair(const ModelWeights* w, int64_t block_size, CudaBackendOptions options = {}) {
  Pair p;
  p.cpu = std::make_unique<CpuBackend>(w, nullptr);
  auto gpu = CudaBackend::Create(w, options);
  EXPECT_OK(gpu);
  if (!gpu.ok()) return p;
  p.gpu = std::move(*gpu);
  const KvCacheOptions kv{.num_layers = w->config.num_hidden_layers,
                          .kv_dim = w->config.kv_dim(),
                          .block_size = block_size,
                          .max_blocks = 4096};
  auto cpu_pool = KvBlockPool::Create(kv);
  auto gpu_pool = p.gpu->CreateKvPool(kv);
  EXPECT_OK(cpu_pool);
  EXPECT_OK(gpu_pool);
  if (cpu_pool.ok()) p.cpu_pool = std::move(*cpu_pool);
  if (gpu_pool.ok()) p.gpu_pool = std::move(*gpu_pool);
  return p;
}

TEST(CudaBackendTest, CreateExplainsWhyNot) {
  absl::StatusOr<ModelConfig> config = SyntheticConfig(SyntheticModelSpec{.preset = "tiny"});
  ASSERT_OK(config);
  TestWeights w(*config, DType::kBF16, 1);
  auto backend = CudaBackend::Create(w.get());
  if (!BuiltWithCuda()) {
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnimplemented);
    GTEST_SKIP() << "built without CUDA: " << backend.status().message();
  }
  if (!ListCudaDevices().ok()) {
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnavailable) << backend.status();
    GTEST_SKIP() << backend.status().message();  // "no CUDA device: ..."
  }
  ASSERT_OK(backend);
  const CudaBackendStats stats = (*backend)->stats();
  std::cout << "[ weights  ] " << stats.weight_bytes << " bytes of dense weights on the device\n";
  EXPECT_GT(stats.weight_bytes, 0);
}

class CudaBackendOpTest : public ::testing::TestWithParam<OpCase> {};

TEST_P(CudaBackendOpTest, EmbedRouterCombineLogitsMatchCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const OpCase& c = GetParam();
  TestWeights w(CaseConfig(c), c.dtype, 11);
  const ModelConfig& config = w.get()->config;
  Pair p = MakePair(w.get(), c.block_size, CudaBackendOptions{.max_rows = 8});  // small: the sweep grows it
  ASSERT_NE(p.gpu, nullptr);
  const int64_t d = config.hidden_size, e = config.num_local_experts, k = config.num_experts_per_tok;
  const int64_t vocab = config.vocab_size;
  std::mt19937 rng(5);
  for (int64_t t : {1, 2, 7, 16, 33, 64, 100}) {
    SCOPED_TRACE(testing::Message() << "rows " << t);
    const auto n = static_cast<size_t>(t);
    // Embed: a gather and a widening, exact.
    std::vector<int32_t> tokens(n);
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab - 1));
    for (int32_t& id : tokens) id = tok(rng);
    std::vector<float> hc(n * static_cast<size_t>(d)), hg(hc.size());
    ASSERT_OK(p.cpu->Embed(tokens, hc.data()));
    ASSERT_OK(p.gpu->Embed(tokens, hg.data()));
    EXPECT_EQ(hc, hg) << "embedding";

    // Router: the norm in f32 (f64 sums), the router GEMM in f32 (f32
    // weights on the device): routing must agree exactly.
    const std::vector<float> hidden = RandomVector(n * static_cast<size_t>(d), rng);
    for (int layer = 0; layer < config.num_hidden_layers; ++layer) {
      std::vector<float> mc(hidden.size()), mg(hidden.size()), lc(n * static_cast<size_t>(e)), lg(lc.size());
      std::vector<int32_t> ec(n * static_cast<size_t>(k)), eg(ec.size());
      std::vector<float> wc(ec.size()), wg(ec.size());
      ASSERT_OK(p.cpu->Router(layer, t, hidden.data(), mc.data(), lc.data(), ec.data(), wc.data()));
      const absl::Status st = p.gpu->Router(layer, t, hidden.data(), mg.data(), lg.data(), eg.data(), wg.data());
      ASSERT_OK(st);
      EXPECT_LT(Nmse(mg, mc), 1e-12) << "moe_input layer " << layer;
      EXPECT_LT(Nmse(lg, lc), 1e-10) << "router logits layer " << layer;
      EXPECT_EQ(eg, ec) << "experts layer " << layer;
      for (size_t i = 0; i < wc.size(); ++i) EXPECT_NEAR(wg[i], wc[i], 1e-5) << "weight " << i;
    }

    // Combine: f32 multiply-adds in the same order.
    const std::vector<float> weights = RandomVector(n * static_cast<size_t>(k), rng);
    const std::vector<float> expert_out = RandomVector(n * static_cast<size_t>(k * d), rng);
    std::vector<float> cc = hidden, cg = hidden;
    ASSERT_OK(p.cpu->Combine(t, weights.data(), expert_out.data(), cc.data()));
    ASSERT_OK(p.gpu->Combine(t, weights.data(), expert_out.data(), cg.data()));
    EXPECT_LT(Nmse(cg, cc), 1e-12) << "combine";

    // Logits of a subset of rows (every third, and the last).
    std::vector<int64_t> rows;
    for (int64_t r = 0; r < t; r += 3) rows.push_back(r);
    if (rows.back() != t - 1) rows.push_back(t - 1);
    std::vector<float> oc(rows.size() * static_cast<size_t>(vocab)), og(oc.size());
    ASSERT_OK(p.cpu->Logits(rows, hidden.data(), oc.data()));
    const absl::Status st = p.gpu->Logits(rows, hidden.data(), og.data());
    ASSERT_OK(st);
    EXPECT_LT(Nmse(og, oc), BoundFor(c.dtype)) << "logits";
  }
}

// One step of an attention scenario: new tokens per sequence (0: the
// sequence sits this step out).
using Step = std::vector<int64_t>;

// Runs `steps` over `num_sequences` sequences on both backends, every layer,
// comparing each call's attention delta. Sequences keep their caches across
// steps, so later steps attend over prior cached positions.
void RunScenario(Pair& p, const ModelConfig& config, int num_sequences, const std::vector<Step>& steps, double bound,
                 uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t d = config.hidden_size;
  std::vector<std::unique_ptr<SequenceKv>> cpu_kv, gpu_kv;
  for (int s = 0; s < num_sequences; ++s) {
    cpu_kv.push_back(std::make_unique<SequenceKv>(p.cpu_pool.get()));
    gpu_kv.push_back(std::make_unique<SequenceKv>(p.gpu_pool.get()));
  }
  double worst = 0.0;
  for (size_t step = 0; step < steps.size(); ++step) {
    std::vector<SequenceSlice> cs, gs;
    int64_t rows = 0;
    for (int s = 0; s < num_sequences; ++s) {
      const int64_t n = steps[step][static_cast<size_t>(s)];
      if (n == 0) continue;
      const int64_t start = cpu_kv[static_cast<size_t>(s)]->length();
      ASSERT_OK(cpu_kv[static_cast<size_t>(s)]->Reserve(start + n));
      ASSERT_OK(gpu_kv[static_cast<size_t>(s)]->Reserve(start + n));
      cs.push_back(SequenceSlice{cpu_kv[static_cast<size_t>(s)].get(), start, n, rows});
      gs.push_back(SequenceSlice{gpu_kv[static_cast<size_t>(s)].get(), start, n, rows});
      rows += n;
    }
    for (int layer = 0; layer < config.num_hidden_layers; ++layer) {
      SCOPED_TRACE(testing::Message() << "step " << step << " layer " << layer << " rows " << rows);
      const std::vector<float> input = RandomVector(static_cast<size_t>(rows * d), rng);
      std::vector<float> hc = input, hg = input;
      ASSERT_OK(p.cpu->Attention(layer, cs, rows, hc.data()));
      const absl::Status st = p.gpu->Attention(layer, gs, rows, hg.data());
      ASSERT_OK(st);
      for (size_t i = 0; i < input.size(); ++i) {
        hc[i] -= input[i];
        hg[i] -= input[i];
      }
      const double nmse = Nmse(hg, hc);
      worst = std::max(worst, nmse);
      EXPECT_LT(nmse, bound);
    }
    for (int s = 0; s < num_sequences; ++s) {
      const int64_t n = steps[step][static_cast<size_t>(s)];
      cpu_kv[static_cast<size_t>(s)]->set_length(cpu_kv[static_cast<size_t>(s)]->length() + n);
      gpu_kv[static_cast<size_t>(s)]->set_length(gpu_kv[static_cast<size_t>(s)]->length() + n);
    }
  }
  std::cout << "[ nmse     ] attention delta, worst of " << steps.size() << " steps: " << worst << " (bound " << bound
            << ")\n";
}

TEST_P(CudaBackendOpTest, AttentionMatchesCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const OpCase& c = GetParam();
  TestWeights w(CaseConfig(c), c.dtype, 13);
  const ModelConfig& config = w.get()->config;
  Pair p = MakePair(w.get(), c.block_size, CudaBackendOptions{.max_rows = 8});
  ASSERT_NE(p.gpu, nullptr);
  const double bound = BoundFor(c.dtype);
  {
    SCOPED_TRACE("single sequences: prefill lengths across tiles and blocks, then two decode steps");
    for (int64_t len : {1, 5, 15, 16, 17, 33, 64, 70, 100}) {
      RunScenario(p, config, 1, {{len}, {1}, {1}}, bound, static_cast<uint32_t>(len));
    }
  }
  {
    SCOPED_TRACE("several sequences with prior cached lengths, mixed prefill/decode, then decode");
    RunScenario(p, config, 4, {{3, 16, 21, 1}, {1, 7, 16, 2}, {1, 1, 1, 1}, {0, 1, 1, 0}, {1, 1, 1, 1}, {5, 0, 40, 1}},
                bound, 21);
  }
  {
    SCOPED_TRACE("64 sequences: a 64-row decode batch over different cached lengths");
    Step prefill(64), decode(64, 1);
    for (int s = 0; s < 64; ++s) prefill[static_cast<size_t>(s)] = (s * 7) % 23 + 1;
    RunScenario(p, config, 64, {prefill, decode, decode}, bound, 31);
  }
  {
    SCOPED_TRACE("a long prefill over a prior cache (past the window and the longrope switch)");
    RunScenario(p, config, 2, {{30, 3}, {100, 50}, {1, 1}}, bound, 41);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaBackendOpTest,
                         ::testing::Values(OpCase{"tiny", 4, 2, 16, DType::kBF16, 16},         // the preset: GQA 2
                                           OpCase{"tiny", 4, 4, 16, DType::kBF16, 4},          // MHA, small blocks
                                           OpCase{"tiny", 8, 2, 32, DType::kF16, 16},          // GQA 4, f16
                                           OpCase{"tiny", 8, 1, 64, DType::kF32, 16},          // GQA 8 (MQA), f32
                                           OpCase{"tiny", 8, 2, 128, DType::kBF16, 16},        // Mixtral's head_dim
                                           OpCase{"tiny", 4, 2, 256, DType::kBF16, 16},        // the largest head_dim
                                           OpCase{"tiny-phimoe", 4, 2, 16, DType::kBF16, 16},  // the preset
                                           OpCase{"tiny-phimoe", 8, 2, 64, DType::kBF16, 4},
                                           OpCase{"tiny-phimoe", 8, 4, 128, DType::kF32, 16}),
                         [](const ::testing::TestParamInfo<OpCase>& info) {
                           std::string name =
                               info.param.preset + "_H" + std::to_string(info.param.heads) + "_Hkv" +
                               std::to_string(info.param.kv_heads) + "_hd" + std::to_string(info.param.head_dim) + "_" +
                               std::string(DTypeName(info.param.dtype)) + "_B" + std::to_string(info.param.block_size);
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// ---- the whole model through the Engine ----

struct ModelRun {
  std::unique_ptr<Model> model;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<LocalExpertExecutor> experts;
  std::unique_ptr<CpuBackend> cpu;
  std::unique_ptr<CudaBackend> gpu;
  std::unique_ptr<KvBlockPool> cpu_kv, gpu_kv;
  std::unique_ptr<Engine> cpu_engine, gpu_engine;
};

std::unique_ptr<ModelRun> MakeModelRun(const std::string& preset, CudaBackendOptions options) {
  auto run = std::make_unique<ModelRun>();
  auto model = LoadSyntheticModel(SyntheticModelSpec{.preset = preset, .seed = 7, .dtype = DType::kBF16});
  EXPECT_OK(model);
  if (!model.ok()) return nullptr;
  run->model = std::move(*model);
  const ModelConfig& config = run->model->config;
  run->pool = std::make_unique<ThreadPool>(ThreadPoolOptions{.num_threads = 2, .name = "test"});
  std::vector<std::vector<ExpertFfnWeights>> local;
  for (const LayerWeights& layer : run->model->weights->layers) local.push_back(layer.experts);
  run->experts = std::make_unique<LocalExpertExecutor>(std::move(local), run->pool.get());
  run->cpu = std::make_unique<CpuBackend>(run->model->weights.get(), run->pool.get());
  auto gpu = CudaBackend::Create(run->model->weights.get(), options);
  EXPECT_OK(gpu);
  if (!gpu.ok()) return nullptr;
  run->gpu = std::move(*gpu);
  const KvCacheOptions kv{
      .num_layers = config.num_hidden_layers, .kv_dim = config.kv_dim(), .block_size = 16, .max_blocks = 256};
  auto cpu_kv = KvBlockPool::Create(kv);
  auto gpu_kv = run->gpu->CreateKvPool(kv);
  EXPECT_OK(cpu_kv);
  EXPECT_OK(gpu_kv);
  if (!cpu_kv.ok() || !gpu_kv.ok()) return nullptr;
  run->cpu_kv = std::move(*cpu_kv);
  run->gpu_kv = std::move(*gpu_kv);
  run->cpu_engine = std::make_unique<Engine>(config, run->cpu.get(), run->experts.get());
  run->gpu_engine = std::make_unique<Engine>(config, run->gpu.get(), run->experts.get());
  return run;
}

// Teacher-forced greedy decode: the CPU picks each next token; both engines
// are fed the same tokens. Returns the GPU's logits of every step [N, V].
std::vector<float> CompareGreedy(ModelRun& run, int64_t prompt_len, int64_t steps, uint32_t seed) {
  const ModelConfig& config = run.model->config;
  const auto vocab = static_cast<size_t>(config.vocab_size);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(config.vocab_size - 1));
  std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
  for (int32_t& t : prompt) t = tok(rng);
  SequenceKv ckv(run.cpu_kv.get()), gkv(run.gpu_kv.get());
  std::vector<float> all_gpu;
  std::vector<int32_t> next = prompt;
  int mismatches = 0, near_ties = 0;
  double worst = 0.0;
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<float> lc, lg;
    const ForwardInput ci{&ckv, next, false}, gi{&gkv, next, false};
    const absl::Status cs = run.cpu_engine->Forward({&ci, 1}, &lc);
    const absl::Status gs = run.gpu_engine->Forward({&gi, 1}, &lg);
    EXPECT_OK(cs);
    EXPECT_OK(gs);
    if (!cs.ok() || !gs.ok() || lc.size() != vocab || lg.size() != vocab) return all_gpu;
    const double nmse = Nmse(lg, lc);
    worst = std::max(worst, nmse);
    EXPECT_LT(nmse, kBf16Nmse) << "step " << step;
    std::vector<float> sorted = lc;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    const auto cpu_top = static_cast<int32_t>(std::max_element(lc.begin(), lc.end()) - lc.begin());
    const auto gpu_top = static_cast<int32_t>(std::max_element(lg.begin(), lg.end()) - lg.begin());
    if (cpu_top != gpu_top) {
      // A flip is only acceptable on a near tie (bf16 activations move
      // logits by ~1e-2 here).
      if (sorted[0] - sorted[1] < 0.05f) {
        ++near_ties;
      } else {
        ++mismatches;
        ADD_FAILURE() << "step " << step << ": GPU picks " << gpu_top << ", CPU " << cpu_top << " (margin "
                      << sorted[0] - sorted[1] << ")";
      }
    }
    all_gpu.insert(all_gpu.end(), lg.begin(), lg.end());
    next = {cpu_top};
  }
  std::cout << "[ greedy   ] " << steps << " steps, prompt " << prompt_len << ": worst logits nmse " << worst
            << ", argmax flips on near ties " << near_ties << ", real mismatches " << mismatches << "\n";
  return all_gpu;
}

class CudaBackendModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaBackendModelTest, GreedyTokensAndLogitsMatchCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  // Prompt 40: a prefill of 3 query tiles, not a multiple of the block (16);
  // 40 + 32 positions also cross tiny-phimoe's window (48) and its longrope
  // switch (64).
  auto run = MakeModelRun(GetParam(), CudaBackendOptions{});
  ASSERT_NE(run, nullptr);
  CompareGreedy(*run, 40, 32, 3);
  auto short_run = MakeModelRun(GetParam(), CudaBackendOptions{});
  ASSERT_NE(short_run, nullptr);
  CompareGreedy(*short_run, 1, 32, 4);
}

TEST_P(CudaBackendModelTest, DecodeGraphsEqualNoGraphs) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto plain = MakeModelRun(GetParam(), CudaBackendOptions{.decode_graphs = false});
  auto graphs = MakeModelRun(GetParam(), CudaBackendOptions{.decode_graphs = true});
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(graphs, nullptr);
  const std::vector<float> a = CompareGreedy(*plain, 9, 40, 8);
  const std::vector<float> b = CompareGreedy(*graphs, 9, 40, 8);
  ASSERT_EQ(a.size(), b.size());
  // Same kernels, same inputs: a replayed graph gives the same results (the
  // same bits, unless cuBLAS picks another algorithm under capture; a stale
  // block table or position in a replay would give nmse 1e-3 or more).
  const double nmse = Nmse(b, a);
  std::cout << "[ nmse     ] graphs vs no graphs: " << nmse << (a == b ? " (bitwise equal)" : "") << "\n";
  EXPECT_LT(nmse, 1e-10);
  const CudaBackendStats stats = graphs->gpu->stats();
  std::cout << "[ graphs   ] captured " << stats.graphs_captured << ", replayed " << stats.graph_launches << "\n";
  EXPECT_GT(stats.graphs_captured, 0);
  EXPECT_GT(stats.graph_launches, stats.graphs_captured) << "steps within one block-table bucket replay";
}

INSTANTIATE_TEST_SUITE_P(Presets, CudaBackendModelTest, ::testing::Values("tiny", "tiny-phimoe"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// Beam search forks a sequence by block table; the first write into the
// shared last block copies it (on the device here). The parent's block must
// stay bit for bit as it was, and both sequences must keep attending as the
// CPU's do.
TEST(CudaBackendTest, CopyOnWriteOnDeviceLeavesTheParentUnchanged) {
  SKIP_WITHOUT_CUDA_DEVICE();
  absl::StatusOr<ModelConfig> config = SyntheticConfig(SyntheticModelSpec{.preset = "tiny"});
  ASSERT_OK(config);
  TestWeights w(*config, DType::kBF16, 17);
  Pair p = MakePair(w.get(), /*block_size=*/4);
  ASSERT_NE(p.gpu, nullptr);
  EXPECT_FALSE(p.gpu_pool->storage()->host_accessible());
  const int64_t d = config->hidden_size;
  std::mt19937 rng(3);

  // Runs every layer's attention over one slice on both backends; returns
  // the worst delta nmse.
  auto attend = [&](SequenceKv& ckv, SequenceKv& gkv, int64_t start, int64_t n) {
    EXPECT_OK(ckv.Reserve(start + n));
    EXPECT_OK(gkv.Reserve(start + n));
    const SequenceSlice cs{&ckv, start, n, 0}, gs{&gkv, start, n, 0};
    double worst = 0.0;
    for (int layer = 0; layer < config->num_hidden_layers; ++layer) {
      const std::vector<float> input = RandomVector(static_cast<size_t>(n * d), rng);
      std::vector<float> hc = input, hg = input;
      EXPECT_OK(p.cpu->Attention(layer, {&cs, 1}, n, hc.data()));
      const absl::Status st = p.gpu->Attention(layer, {&gs, 1}, n, hg.data());
      EXPECT_OK(st);
      for (size_t i = 0; i < input.size(); ++i) hc[i] -= input[i], hg[i] -= input[i];
      worst = std::max(worst, Nmse(hg, hc));
    }
    ckv.set_length(start + n);
    gkv.set_length(start + n);
    return worst;
  };

  SequenceKv cpu_parent(p.cpu_pool.get()), gpu_parent(p.gpu_pool.get());
  EXPECT_LT(attend(cpu_parent, gpu_parent, 0, 6), kBf16Nmse);  // blocks 0 (full) and 1 (2 of 4 rows)
  const int32_t shared = gpu_parent.blocks()[1];
#if TANDEM_HAVE_CUDA
  std::vector<uint8_t> before(static_cast<size_t>(p.gpu_pool->bytes_per_block())), after(before.size());
  ASSERT_EQ(cudaMemcpy(before.data(), p.gpu_pool->BlockData(shared), before.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
#endif

  // The child rewrites positions 4..6: 4 and 5 live in the shared block.
  SequenceKv cpu_child(p.cpu_pool.get()), gpu_child(p.gpu_pool.get());
  cpu_child.ForkFrom(cpu_parent);
  gpu_child.ForkFrom(gpu_parent);
  EXPECT_EQ(p.gpu_pool->ref_count(shared), 2);
  cpu_child.set_length(4);
  gpu_child.set_length(4);
  EXPECT_LT(attend(cpu_child, gpu_child, 4, 3), kBf16Nmse);
  EXPECT_NE(gpu_child.blocks()[1], shared) << "the write copied the shared block";
  EXPECT_EQ(gpu_child.blocks()[0], gpu_parent.blocks()[0]) << "the full block stays shared";
  EXPECT_EQ(p.gpu_pool->ref_count(shared), 1);
  EXPECT_EQ(p.gpu_pool->copies_on_write(), 1);
#if TANDEM_HAVE_CUDA
  ASSERT_EQ(cudaMemcpy(after.data(), p.gpu_pool->BlockData(shared), after.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(before, after) << "the parent's block changed under the child's write";
#endif

  // Both keep decoding from their own caches like the CPU's.
  EXPECT_LT(attend(cpu_parent, gpu_parent, 6, 1), kBf16Nmse);
  EXPECT_LT(attend(cpu_child, gpu_child, 7, 1), kBf16Nmse);
}

TEST(CudaBackendTest, RejectsAHostKvCache) {
  SKIP_WITHOUT_CUDA_DEVICE();
  absl::StatusOr<ModelConfig> config = SyntheticConfig(SyntheticModelSpec{.preset = "tiny"});
  ASSERT_OK(config);
  TestWeights w(*config, DType::kBF16, 19);
  Pair p = MakePair(w.get(), 16);
  ASSERT_NE(p.gpu, nullptr);
  SequenceKv host(p.cpu_pool.get());
  ASSERT_OK(host.Reserve(1));
  const SequenceSlice slice{&host, 0, 1, 0};
  std::vector<float> hidden(static_cast<size_t>(config->hidden_size), 0.5f);
  EXPECT_EQ(p.gpu->Attention(0, {&slice, 1}, 1, hidden.data()).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tandem
