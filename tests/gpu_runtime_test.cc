// The GPU path as a user turns it on: LocalRuntime (and so tandem-server and
// tandem-generate) with --backend cuda and --expert_pool cuda. What needs no
// GPU runs everywhere: a clear failure (never a silent CPU fallback) when a
// GPU is asked for and there is none. What needs one skips with the reason
// (no CUDA in the build, or no device): the tiny model's greedy tokens with
// the CUDA backend, the CUDA pool, and both, equal to the CPU's.
// Self-contained (no other programs), so deploy/gpu-check.sh carries it to
// the GPU machine; the programs' flag errors are in gpu_flags_test.cc, the
// page-locked regions' arithmetic in pinned_regions_test.cc.
#include <memory>
#include <string>
#include <vector>

#include "client/local_runtime.h"
#include "common/model.h"
#include "common/synthetic_model.h"
#include "gpu_worker/cuda_device.h"
#include "gtest/gtest.h"
#include "tests/cuda_skip_testlib.h"
#include "tests/test_cost_testlib.h"
#include "tests/tokens_testlib.h"

namespace tandem {
namespace {

constexpr uint64_t kSeed = 7;

std::unique_ptr<Model> TinyModel() {
  auto model = LoadSyntheticModel(SyntheticModelSpec{.preset = "tiny", .seed = kSeed});
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

// Greedy ids of two prompts (one long enough for a multi-tile prefill).
std::vector<int32_t> GreedyIds(const LocalRuntimeOptions& base, CudaBackendStats* cuda_stats = nullptr,
                               ExpertPoolStats* pool_stats = nullptr) {
  LocalRuntimeOptions options = base;
  options.num_threads = 2;
  auto rt = LocalRuntime::Create(TinyModel(), options);
  EXPECT_TRUE(rt.ok()) << rt.status();
  if (!rt.ok()) return {};
  std::vector<int32_t> ids;
  const int64_t vocab = (*rt)->model().config.vocab_size;
  for (auto [length, seed] : {std::pair{7, 300u}, std::pair{70, 301u}}) {
    GenerationRequest request;
    request.prompt_ids = RandomTokens(length, vocab, seed);
    request.max_tokens = 16;
    request.ignore_eos = true;
    auto result = (*rt)->generator().Generate(request);
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) return {};
    const std::vector<int32_t> got = Ids(*result);
    ids.insert(ids.end(), got.begin(), got.end());
  }
  if (cuda_stats != nullptr) {
    if (auto* cuda = dynamic_cast<CudaBackend*>(&(*rt)->backend()); cuda != nullptr) *cuda_stats = cuda->stats();
  }
  if (pool_stats != nullptr && (*rt)->expert_pool() != nullptr) *pool_stats = (*rt)->expert_pool()->stats();
  return ids;
}

const std::vector<int32_t>& CpuReference() {
  static const std::vector<int32_t>* ids = new std::vector<int32_t>(GreedyIds({}));
  return *ids;
}

LocalOrchestratorOptions CudaPool() {
  LocalOrchestratorOptions o;
  o.enabled = true;
  o.pool = ExpertPoolKind::kCuda;
  o.execution = ExecutionPolicy::kMakespan;
  o.cache = CachePolicyKind::kLru;
  o.gpu_slots = 4;
  o.staging_buffers = 4;
  o.cost = PoolMattersCost(*SyntheticConfig({.preset = "tiny", .seed = kSeed}));
  return o;
}

// Asking for the GPU where there is none fails at start-up with the reason;
// it never quietly runs on the CPU instead. Where there is one, it works.
TEST(GpuRuntimeTest, AskingForTheGpuWorksOrFailsWithTheReason) {
  const bool have_gpu = !NoCudaDeviceReason().has_value();
  const absl::StatusCode want = BuiltWithCuda() ? absl::StatusCode::kUnavailable : absl::StatusCode::kUnimplemented;
  {
    LocalRuntimeOptions options;
    options.num_threads = 1;
    options.backend = BackendKind::kCuda;
    auto rt = LocalRuntime::Create(TinyModel(), options);
    if (have_gpu) {
      ASSERT_TRUE(rt.ok()) << rt.status();
      EXPECT_NE((*rt)->backend_name().find("CUDA backend"), std::string::npos) << (*rt)->backend_name();
    } else {
      ASSERT_FALSE(rt.ok());
      EXPECT_EQ(rt.status().code(), want) << rt.status();
      EXPECT_NE(rt.status().message().find("CUDA"), std::string::npos) << rt.status();
    }
  }
  {
    LocalRuntimeOptions options;
    options.num_threads = 1;
    options.orchestrator = CudaPool();
    auto rt = LocalRuntime::Create(TinyModel(), options);
    if (have_gpu) {
      ASSERT_TRUE(rt.ok()) << rt.status();
      EXPECT_NE((*rt)->expert_pool()->kind().find("CUDA pool"), std::string::npos) << (*rt)->expert_pool()->kind();
    } else {
      ASSERT_FALSE(rt.ok());
      EXPECT_EQ(rt.status().code(), want) << rt.status();
    }
  }
}

TEST(GpuRuntimeTest, CudaBackendGivesTheCpusGreedyTokens) {
  SKIP_WITHOUT_CUDA_DEVICE();
  LocalRuntimeOptions options;
  options.backend = BackendKind::kCuda;
  CudaBackendStats stats;
  EXPECT_EQ(GreedyIds(options, &stats), CpuReference());
  EXPECT_GT(stats.weight_bytes, 0);
  EXPECT_GT(stats.h2d_bytes, 0);
}

TEST(GpuRuntimeTest, CudaExpertPoolGivesTheCpusGreedyTokens) {
  SKIP_WITHOUT_CUDA_DEVICE();
  LocalRuntimeOptions options;
  options.orchestrator = CudaPool();
  ExpertPoolStats pool;
  EXPECT_EQ(GreedyIds(options, nullptr, &pool), CpuReference());
  EXPECT_NE(pool.kind.find("CUDA pool"), std::string::npos) << pool.kind;
  EXPECT_GT(pool.slot_runs + pool.staging_runs, 0) << "the planner never used the GPU pool";
  EXPECT_GT(pool.migrations_completed, 0);
}

TEST(GpuRuntimeTest, CudaBackendAndPoolTogetherGiveTheCpusGreedyTokens) {
  SKIP_WITHOUT_CUDA_DEVICE();
  LocalRuntimeOptions options;
  options.backend = BackendKind::kCuda;
  options.orchestrator = CudaPool();
  EXPECT_EQ(GreedyIds(options), CpuReference());
}

}  // namespace
}  // namespace tandem
