// The expert pool and the cost model with a GGUF's experts kept as their
// quantized blocks (--gguf_experts quantized), on the CPU (runs everywhere):
//
//   - a pool's slots and migrations are sized by the blocks as stored, per
//     layer (the demo model as Q4_K_M: gate/up Q4_K, down Q4_K on layer 0
//     and Q6_K on layer 1), so the same memory budget holds more experts;
//     each migration copies (and records) its own layer's bytes, and the
//     slot holds exactly the model's blocks;
//   - the no-GPU host pool computes the blocks with the CPU's quantized
//     kernels, bit for bit as the in-process executor, and the whole
//     orchestrated engine on a quantized model gives the plain engine's
//     tokens and logits;
//   - calibration measures those experts: the profile's expert_bytes is the
//     quantized size, and its cache key tells bf16 and quantized apart (one
//     file, one fingerprint);
//   - the planner's choice moves with the bytes: with Mixtral's shape, a
//     copy to the GPU pays off at a smaller batch with Q4_K experts than
//     with BF16 ones, and a 24 GB budget holds ~3.5x the experts;
//   - which layouts the CUDA pool computes is decided on the host
//     (CheckGpuPoolLayouts) and a mix it has no kernel for is refused,
//     saying so.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/model/gguf_quantize.h"
#include "common/model/model.h"
#include "common/model/synthetic_model.h"
#include "coordinator/orchestration/calibration.h"
#include "coordinator/orchestration/planner/planner.h"
#include "coordinator/runtime/local_runtime.h"
#include "cpu_worker/expert_ffn.h"
#include "cpu_worker/local_expert_executor.h"
#include "gpu_worker/cuda/cuda_expert_pool.h"
#include "gpu_worker/gpu_pool_types.h"
#include "gpu_worker/host_expert_pool.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"
#include "tests/test_cost_testlib.h"
#include "tests/tokens_testlib.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kSeed = 9;

class QuantizedPoolTest : public ::testing::Test {
 protected:
  // The demo model (2 layers: hidden 512, intermediate 1024, whole 256-value
  // blocks) as Q4_K_M and Q8_0 GGUF files, once.
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    const fs::path folder = dir_->path() / "demo";
    ASSERT_OK(WriteSyntheticModel({.preset = "demo", .num_layers = 2, .seed = kSeed, .dtype = DType::kBF16}, folder,
                                  {.num_threads = 2}));
    for (const char* type : {"q4_k_m", "q8_0"}) {
      absl::StatusOr<GgufFileType> file_type = ParseGgufFileType(type);
      ASSERT_OK(file_type);
      ASSERT_OK(QuantizeModel({.model_dir = folder, .file_type = *file_type, .out = File(type), .num_threads = 2}));
    }
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static fs::path File(const std::string& type) { return dir_->path() / absl::StrCat("demo-", type, ".gguf"); }

  static std::unique_ptr<Model> Load(const std::string& type, QuantizedWeights quantized) {
    auto model = LoadModel(File(type), {.num_threads = 2, .quantized = quantized});
    EXPECT_OK(model);
    return model.ok() ? std::move(*model) : nullptr;
  }

  static std::vector<std::vector<ExpertWeights>> Experts(const Model& model) {
    std::vector<std::vector<ExpertWeights>> experts;
    for (const LayerWeights& layer : model.weights->layers) experts.push_back(layer.experts);
    return experts;
  }

  std::unique_ptr<HostExpertPool> MakePool(const Model& model, const ExpertPoolOptions& options) {
    ExpertFfn* ffn = &ffn_;
    auto pool = HostExpertPool::Create(
        model.config, Experts(model),
        [ffn](const ExpertWeights& w, const float* x, int64_t rows, float* y) { return ffn->Run(w, x, rows, y); },
        options);
    EXPECT_OK(pool);
    return pool.ok() ? std::move(*pool) : nullptr;
  }

  static ScopedTempDir* dir_;
  ExpertFfn ffn_{nullptr};
};

ScopedTempDir* QuantizedPoolTest::dir_ = nullptr;

TEST_F(QuantizedPoolTest, SlotsAndCopiesAreSizedByTheStoredBlocks) {
  std::unique_ptr<Model> q = Load("q4_k_m", QuantizedWeights::kKeepExperts);
  std::unique_ptr<Model> bf16 = Load("q4_k_m", QuantizedWeights::kDequantizeToBf16);
  ASSERT_NE(q, nullptr);
  ASSERT_NE(bf16, nullptr);
  const int64_t d = q->config.hidden_size, i = q->config.intermediate_size;

  ExpertPoolOptions options;
  options.memory_bytes = 64 << 20;
  options.num_staging_buffers = 1;
  std::unique_ptr<HostExpertPool> qpool = MakePool(*q, options);
  std::unique_ptr<HostExpertPool> fpool = MakePool(*bf16, options);
  ASSERT_NE(qpool, nullptr);
  ASSERT_NE(fpool, nullptr);

  // Per layer, each matrix as stored: Q4_K is 144 bytes per 256 values,
  // Q6_K 210.
  const ExpertLayout& l0 = qpool->layout(0);
  const ExpertLayout& l1 = qpool->layout(1);
  EXPECT_EQ(l0.DTypeNames(), "Q4_K");
  EXPECT_EQ(l1.DTypeNames(), "Q4_K/Q4_K/Q6_K");
  EXPECT_EQ(l0.copy_bytes, 3 * i * d / 256 * 144);
  EXPECT_EQ(l1.copy_bytes, 2 * i * d / 256 * 144 + d * i / 256 * 210);
  EXPECT_EQ(qpool->buffer_bytes(), l1.buffer_bytes);  // the largest layer's
  EXPECT_EQ(qpool->expert_bytes(), (l0.copy_bytes + l1.copy_bytes + 1) / 2);
  EXPECT_EQ(qpool->stats().expert_bytes, qpool->expert_bytes());
  EXPECT_EQ(fpool->expert_bytes(), 3 * i * d * 2);
  EXPECT_EQ(PoolExpertTypes(*qpool), "Q4_K,Q4_K/Q4_K/Q6_K");
  EXPECT_EQ(PoolExpertTypes(*fpool), "BF16");

  // The same budget: as many buffers as the blocks' size allows.
  EXPECT_EQ(qpool->num_slots(), options.memory_bytes / qpool->buffer_bytes() - 1);
  EXPECT_EQ(fpool->num_slots(), options.memory_bytes / fpool->buffer_bytes() - 1);
  EXPECT_GE(qpool->num_slots(), 3 * fpool->num_slots());

  // A migration copies its layer's bytes, which are the model's blocks.
  ASSERT_OK(qpool->Migrate({0, 1}, std::nullopt));
  ASSERT_OK(qpool->Migrate({1, 2}, std::nullopt));
  for (ExpertKey key : {ExpertKey{0, 1}, ExpertKey{1, 2}}) {
    auto held = qpool->HeldWeights(key);
    ASSERT_OK(held);
    const ExpertWeights& src =
        q->weights->layers[static_cast<size_t>(key.layer)].experts[static_cast<size_t>(key.expert)];
    const ExpertLayout& l = qpool->layout(key.layer);
    EXPECT_EQ(held->w2.dtype, l.w2_dtype);
    EXPECT_EQ(std::memcmp(held->w1.data, src.w1.data, static_cast<size_t>(l.w1_bytes)), 0);
    EXPECT_EQ(std::memcmp(held->w3.data, src.w3.data, static_cast<size_t>(l.w3_bytes)), 0);
    EXPECT_EQ(std::memcmp(held->w2.data, src.w2.data, static_cast<size_t>(l.w2_bytes)), 0);
  }
  std::vector<MigrationRecord> done = qpool->TakeCompletedMigrations();
  ASSERT_EQ(done.size(), 2u);
  for (const MigrationRecord& r : done) EXPECT_EQ(r.bytes, qpool->layout(r.expert.layer).copy_bytes);
  EXPECT_EQ(qpool->stats().bytes_copied, l0.copy_bytes + l1.copy_bytes);
}

// Also for experts copied in group-major order (a VNNI process's own copy):
// the pool's copy keeps its source's order, so it computes the bits the
// executor computes from the source (a copy read in ggml's order would not).
TEST_F(QuantizedPoolTest, HostPoolComputesTheBlocksAsTheCpuExecutor) {
  for (const BlockOrder order : {BlockOrder::kGgml, BlockOrder::kGroupMajor}) {
    for (const char* type : {"q4_k_m", "q8_0"}) {
      SCOPED_TRACE(absl::StrCat(type, " ", BlockOrderName(order)));
      auto loaded = LoadModel(File(type), {.num_threads = 2,
                                           .quantized = QuantizedWeights::kKeepExperts,
                                           .copy_weights_to_memory = true,
                                           .block_order = order});
      ASSERT_OK(loaded);
      std::unique_ptr<Model> q = std::move(*loaded);
      const LinearWeight& w2 = q->weights->layers[0].experts[0].w2;
      ASSERT_EQ(w2.order, HasGroupMajorOrder(w2.dtype) ? order : BlockOrder::kGgml);
      ExpertPoolOptions options;
      options.num_slots = 2;
      options.num_staging_buffers = 1;
      std::unique_ptr<HostExpertPool> pool = MakePool(*q, options);
      ASSERT_NE(pool, nullptr);
      const int64_t d = q->config.hidden_size;
      const int64_t rows = 5;
      std::vector<float> x(static_cast<size_t>(rows * d));
      for (size_t k = 0; k < x.size(); ++k) x[k] = static_cast<float>((k * 7919) % 97) / 97.0f - 0.5f;
      for (ExpertKey key : {ExpertKey{0, 0}, ExpertKey{1, 3}}) {
        ASSERT_OK(pool->Place(key));
        std::vector<float> got(x.size()), want(x.size());
        const ExpertWork work{key.expert, rows, x.data(), got.data()};
        ASSERT_OK(pool->RunExperts(key.layer, std::span<const ExpertWork>(&work, 1), nullptr));
        ASSERT_OK(ffn_.Run(q->weights->layers[static_cast<size_t>(key.layer)].experts[static_cast<size_t>(key.expert)],
                           x.data(), rows, want.data()));
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << SlotPool::KeyName(key);
      }
    }
  }
}

// Greedy tokens and every logit of `rt` on two prompts.
struct Run {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
};

absl::StatusOr<Run> Generate(std::unique_ptr<Model> model, LocalRuntimeOptions options,
                             OrchestratorStats* stats = nullptr) {
  Run run;
  options.num_threads = 2;
  options.engine.dump = [&](std::string_view name, int, const float* data, int64_t rows, int64_t cols) {
    if (name == "logits") run.logits.insert(run.logits.end(), data, data + rows * cols);
  };
  const int64_t vocab = model->config.vocab_size;
  auto rt = LocalRuntime::Create(std::move(model), options);
  if (!rt.ok()) return rt.status();
  for (uint32_t seed : {31u, 32u}) {
    GenerationRequest request;
    request.prompt_ids = RandomTokens(6, vocab, seed);
    request.max_tokens = 4;
    request.ignore_eos = true;
    auto result = (*rt)->generator().Generate(request);
    if (!result.ok()) return result.status();
    for (const GeneratedToken& t : result->tokens) run.tokens.push_back(t.id);
  }
  if (stats != nullptr && (*rt)->orchestrator() != nullptr) *stats = (*rt)->orchestrator()->stats();
  return run;
}

TEST_F(QuantizedPoolTest, OrchestratedEngineOnQuantizedExpertsGivesThePlainEnginesOutputs) {
  auto want = Generate(Load("q4_k_m", QuantizedWeights::kKeepExperts), {});
  ASSERT_OK(want);
  std::unique_ptr<Model> model = Load("q4_k_m", QuantizedWeights::kKeepExperts);
  ASSERT_NE(model, nullptr);
  LocalRuntimeOptions options;
  options.orchestrator.enabled = true;
  options.orchestrator.execution = ExecutionPolicy::kMakespan;
  options.orchestrator.gpu_slots = 4;
  options.orchestrator.staging_buffers = 4;
  options.orchestrator.cost = PoolMattersCost(model->config);  // BF16-sized: the runtime adopts the pool's bytes
  OrchestratorStats stats;
  auto got = Generate(std::move(model), options, &stats);
  ASSERT_OK(got);
  EXPECT_EQ(got->tokens, want->tokens);
  ASSERT_EQ(got->logits.size(), want->logits.size());
  EXPECT_EQ(std::memcmp(got->logits.data(), want->logits.data(), got->logits.size() * sizeof(float)), 0)
      << "logits differ from the plain engine's";
  SCOPED_TRACE(stats.ToJson());
  EXPECT_GT(stats.pool.slot_runs + stats.pool.staging_runs, 0);  // the pool computed quantized experts
  EXPECT_GT(stats.total.cpu_runs, 0);
}

TEST_F(QuantizedPoolTest, CalibrationMeasuresTheQuantizedExperts) {
  std::unique_ptr<Model> q = Load("q4_k_m", QuantizedWeights::kKeepExperts);
  std::unique_ptr<Model> bf16 = Load("q4_k_m", QuantizedWeights::kDequantizeToBf16);
  ASSERT_NE(q, nullptr);
  ASSERT_NE(bf16, nullptr);
  ExpertPoolOptions options;
  options.num_slots = 2;
  options.num_staging_buffers = 2;
  std::unique_ptr<HostExpertPool> qpool = MakePool(*q, options);
  std::unique_ptr<HostExpertPool> fpool = MakePool(*bf16, options);
  ASSERT_NE(qpool, nullptr);
  ASSERT_NE(fpool, nullptr);

  ThreadPool threads(ThreadPoolOptions{.num_threads = 1, .name = "calib"});
  LocalExpertExecutor cpu(Experts(*q), &threads);
  CalibrationSetup setup;
  setup.config = &q->config;
  setup.cpu = &cpu;
  setup.pool = qpool.get();
  setup.config_description = "quantized_pool_test";
  CalibrationOptions calibration;
  calibration.rows = {1, 4};
  calibration.repetitions = 1;
  calibration.migrations = 2;
  auto profile = Calibrate(setup, calibration);
  ASSERT_OK(profile);
  // What the planner weighs is what the pool copies: the blocks.
  EXPECT_EQ(profile->cost.expert_bytes, qpool->expert_bytes());
  EXPECT_LT(profile->cost.expert_bytes * 3, fpool->expert_bytes());
  EXPECT_GT(profile->cost.migrate.us_per_byte, 0);

  // One file, one fingerprint; bf16 and quantized experts are calibrated apart.
  const std::string quantized_key = CalibrationCacheKey(setup);
  setup.pool = fpool.get();
  const std::string bf16_key = CalibrationCacheKey(setup);
  EXPECT_NE(quantized_key, bf16_key);
  EXPECT_TRUE(absl::StrContains(quantized_key, "experts=Q4_K,Q4_K/Q4_K/Q6_K")) << quantized_key;
  EXPECT_TRUE(absl::StrContains(bf16_key, "experts=BF16")) << bf16_key;
}

// Mixtral-8x7B's expert shape; PCIe 4.0 x16-like copies, a CPU expert
// linear in its rows, a GPU expert flat (Fiddler's model). Only the bytes
// differ between the two cost models: the blocks as the pool stores them.
CostModelParams MixtralCost(DType dtype) {
  auto config = SyntheticConfig({.preset = "mixtral-8x7b"});
  EXPECT_OK(config);
  auto layout = ExpertLayout::ForModel(*config, dtype);
  EXPECT_OK(layout);
  CostModelParams p;
  p.expert_bytes = layout->copy_bytes;
  p.activation_row_bytes = config->hidden_size * 4;
  p.transports.push_back({"local", TransferCost{}});
  p.cpu_workers.push_back({RooflineCurve{0, 0, 2000}, 0});  // 2 ms per row
  p.gpu = RooflineCurve{300, 0, 0};
  p.migrate = TransferCost::FromBandwidth(20, 25);
  p.dma = TransferCost{};
  return p;
}

// The smallest batch at which `policy` copies one absent expert to the GPU.
int FirstBatchCopied(const CostModelParams& params, ExecutionPolicy policy) {
  auto cost = CostModel::Create(params);
  EXPECT_OK(cost);
  auto planner = Planner::Create(PlannerOptions{.policy = policy, .division = ExpertDivision::kSplit});
  EXPECT_OK(planner);
  std::vector<ExpertState> residency(8);  // every expert absent
  LayerPlan plan;
  for (int32_t s = 1; s <= 64; ++s) {
    std::vector<int32_t> rows(8, 0);
    rows[3] = s;
    EXPECT_OK(planner->Plan(LayerPlanInput{.layer = 0, .rows = rows, .residency = residency}, *cost, &plan));
    if (plan.experts[3].placement == ExpertPlacement::kMigrateThenGpu) return s;
  }
  return -1;
}

TEST(QuantizedCostTest, CopyToTheGpuPaysOffAtASmallerBatchWithQ4KExperts) {
  const CostModelParams bf16 = MixtralCost(DType::kBF16);
  const CostModelParams q4k = MixtralCost(DType::kQ4_K);
  EXPECT_EQ(bf16.expert_bytes, 3LL * 4096 * 14336 * 2);           // 352 MB
  EXPECT_EQ(q4k.expert_bytes, 3LL * 14336 * (4096 / 256) * 144);  // 99 MB
  for (ExecutionPolicy policy : {ExecutionPolicy::kThreshold, ExecutionPolicy::kMakespan}) {
    SCOPED_TRACE(ExecutionPolicyName(policy));
    const int bf16_first = FirstBatchCopied(bf16, policy);
    const int q4k_first = FirstBatchCopied(q4k, policy);
    // threshold: cpu(s) > gpu + migrate, 2000 s > 300 + 20 + bytes / 25 GB/s:
    // BF16 14.1 ms -> s = 8; Q4_K 4.0 ms -> s = 3.
    EXPECT_EQ(bf16_first, 8);
    EXPECT_EQ(q4k_first, 3);
  }
}

TEST(QuantizedCostTest, TheSameBudgetHoldsMoreQuantizedExperts) {
  auto config = SyntheticConfig({.preset = "mixtral-8x7b"});
  ASSERT_OK(config);
  ExpertPoolOptions options;
  options.memory_bytes = 24LL << 30;
  options.num_staging_buffers = 2;
  auto slots = [&](DType w1, DType w3, DType w2) {
    auto layout = ExpertLayout::ForMatrices(*config, w1, w3, w2);
    EXPECT_OK(layout);
    auto n = options.SlotCount(layout->buffer_bytes);
    EXPECT_OK(n);
    return *n;
  };
  const int bf16 = slots(DType::kBF16, DType::kBF16, DType::kBF16);
  const int q8 = slots(DType::kQ8_0, DType::kQ8_0, DType::kQ8_0);
  const int q4k = slots(DType::kQ4_K, DType::kQ4_K, DType::kQ4_K);
  const int q4km = slots(DType::kQ4_K, DType::kQ4_K, DType::kQ6_K);
  EXPECT_EQ(bf16, 71);  // of Mixtral's 256 experts
  EXPECT_GT(q8, bf16 * 18 / 10);
  EXPECT_GT(q4k, bf16 * 35 / 10);
  EXPECT_GT(q4k, q4km);
  EXPECT_GT(q4km, q8);
}

TEST(GpuPoolTypesTest, RefusesWhatItHasNoKernelFor) {
  ModelConfig config;
  config.hidden_size = 512;
  config.intermediate_size = 1024;
  auto layout = [&](DType w1, DType w3, DType w2) {
    auto l = ExpertLayout::ForMatrices(config, w1, w3, w2);
    EXPECT_OK(l);
    return *l;
  };
  // Every format the kernels decode, alone and mixed across matrices and layers.
  for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    EXPECT_TRUE(GpuDecodesBlocks(t)) << DTypeName(t);
    EXPECT_OK(CheckGpuPoolLayouts({layout(t, t, t)}));
  }
  EXPECT_FALSE(GpuDecodesBlocks(DType::kBF16));
  EXPECT_OK(CheckGpuPoolLayouts(
      {layout(DType::kQ4_K, DType::kQ4_K, DType::kQ4_K), layout(DType::kQ4_K, DType::kQ4_K, DType::kQ6_K)}));
  EXPECT_OK(CheckGpuPoolLayouts({layout(DType::kBF16, DType::kBF16, DType::kBF16)}));

  const absl::Status mixed = CheckGpuPoolLayouts({layout(DType::kQ8_0, DType::kQ8_0, DType::kBF16)});
  EXPECT_EQ(mixed.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(mixed.message(), "layer 0's experts (Q8_0/Q8_0/BF16)")) << mixed;
  EXPECT_TRUE(absl::StrContains(mixed.message(), "--gguf_experts bf16")) << mixed;
  const absl::Status float_then_blocks = CheckGpuPoolLayouts(
      {layout(DType::kF16, DType::kF16, DType::kF16), layout(DType::kQ4_0, DType::kQ4_0, DType::kQ4_0)});
  EXPECT_EQ(float_then_blocks.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(float_then_blocks.message(), "layer 1")) << float_then_blocks;
  const absl::Status two_floats = CheckGpuPoolLayouts(
      {layout(DType::kBF16, DType::kBF16, DType::kBF16), layout(DType::kF16, DType::kF16, DType::kF16)});
  EXPECT_EQ(two_floats.code(), absl::StatusCode::kInvalidArgument);

  // A row that is not whole blocks never gets a layout at all.
  config.hidden_size = 96;
  auto cut = ExpertLayout::ForMatrices(config, DType::kQ4_K, DType::kQ4_K, DType::kQ4_K);
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(cut.status().message(), "Q4_K")) << cut.status();
  EXPECT_TRUE(absl::StrContains(cut.status().message(), "256")) << cut.status();
}

TEST_F(QuantizedPoolTest, TheCudaPoolTakesQuantizedExpertsOrSaysWhyItCannotRun) {
  std::unique_ptr<Model> q = Load("q4_k_m", QuantizedWeights::kKeepExperts);
  ASSERT_NE(q, nullptr);
  CudaExpertPoolOptions options;
  options.pool.num_slots = 1;
  options.pool.num_staging_buffers = 1;
  auto pool = CudaExpertPool::Create(q->config, Experts(*q), options);
  if (pool.ok()) GTEST_SKIP() << "a CUDA device is present: cuda_quant_pool_test runs the quantized pool on it";
  // Never refused for its types: only for the build (no CUDA) or the machine (no device).
  EXPECT_TRUE(pool.status().code() == absl::StatusCode::kUnimplemented ||
              pool.status().code() == absl::StatusCode::kUnavailable)
      << pool.status();
}

}  // namespace
}  // namespace tandem
