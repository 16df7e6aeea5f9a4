// The GPU path as a user turns it on: LocalRuntime (and so tandem-server and
// tandem-generate) with --backend cuda and --expert_pool cuda. What needs no
// GPU runs everywhere: a clear failure (never a silent CPU fallback) when a
// GPU is asked for and there is none, and the comparison below run on the
// no-GPU host pool (which must match exactly). What needs one skips with
// the reason (no CUDA in the build, or no device): the tiny model through
// the CUDA backend, the CUDA pool, and both, against the CPU runtime.
//
// The comparison is teacher-forced, as cuda_backend_test's: the CPU runtime
// picks each next token greedily and both runtimes are fed it, so that one
// argmax flip cannot derail every later step. Each step's logits must be
// within bf16 rounding of the CPU's by normalised mean squared error (the
// GPU rounds GEMM activations to bf16, the CPU keeps f32), and the argmax
// must agree unless the CPU's top-2 margin is a near tie. Free-running
// greedy tokens bit-equal to the CPU's would fail on the first near tie.
//
// Self-contained (no other programs), so deploy/gpu-check.sh carries it to
// the GPU machine; the programs' flag errors are in gpu_flags_test.cc, the
// page-locked regions' arithmetic in pinned_regions_test.cc.
#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/model/model.h"
#include "common/model/synthetic_model.h"
#include "coordinator/engine/kv_cache.h"
#include "coordinator/runtime/local_runtime.h"
#include "gpu_worker/cuda/cuda_device.h"
#include "gpu_worker/cuda/cuda_expert_pool.h"
#include "gpu_worker/pinned_regions.h"
#include "gtest/gtest.h"
#include "tests/cuda_skip_testlib.h"
#include "tests/status_testlib.h"
#include "tests/test_cost_testlib.h"
#include "tests/tokens_testlib.h"

namespace tandem {
namespace {

constexpr uint64_t kSeed = 7;

std::unique_ptr<Model> TinyModel() {
  auto model = LoadSyntheticModel(SyntheticModelSpec{.preset = "tiny", .seed = kSeed});
  EXPECT_OK(model);
  return model.ok() ? std::move(*model) : nullptr;
}

// The tiny model's weights are bf16: the GPU's GEMMs round activations to
// bf16 (8 bits of mantissa), which moves logits by ~1e-2 and their nmse to
// ~1e-5; a wrong position, head or expert gives 1e-2 .. 1.
constexpr double kBf16Nmse = 2e-3;
constexpr float kNearTie = 0.05f;  // CPU top-2 margin under which an argmax flip is rounding

double Nmse(std::span<const float> actual, std::span<const float> reference) {
  double err = 0.0, ref = 0.0;
  for (size_t i = 0; i < reference.size(); ++i) {
    if (!std::isfinite(actual[i])) return INFINITY;
    const double d = static_cast<double>(actual[i]) - reference[i];
    err += d * d;
    ref += static_cast<double>(reference[i]) * reference[i];
  }
  return ref > 0 ? err / ref : err;
}

std::unique_ptr<LocalRuntime> MakeRuntime(const LocalRuntimeOptions& base) {
  LocalRuntimeOptions options = base;
  options.num_threads = 2;
  auto rt = LocalRuntime::Create(TinyModel(), options);
  EXPECT_OK(rt);
  return rt.ok() ? std::move(*rt) : nullptr;
}

// Two prompts (one long enough for a multi-tile prefill), 16 teacher-forced
// steps each, through `gpu` and a CPU runtime side by side: every step's
// logits within kBf16Nmse, the same argmax unless the CPU's margin is a
// near tie. `inspect` (may be empty) sees the GPU runtime afterwards.
void CompareTeacherForced(const LocalRuntimeOptions& gpu_options,
                          const std::function<void(LocalRuntime&)>& inspect = {}) {
  std::unique_ptr<LocalRuntime> cpu = MakeRuntime({});
  std::unique_ptr<LocalRuntime> gpu = MakeRuntime(gpu_options);
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(gpu, nullptr);
  const auto vocab = static_cast<size_t>(cpu->model().config.vocab_size);
  int steps = 0, near_ties = 0;
  double worst = 0.0;
  for (auto [length, seed] : {std::pair{7, 300u}, std::pair{70, 301u}}) {
    SequenceKv cpu_kv(&cpu->kv_pool()), gpu_kv(&gpu->kv_pool());
    std::vector<int32_t> next = RandomTokens(length, static_cast<int64_t>(vocab), seed);
    for (int step = 0; step < 16; ++step, ++steps) {
      std::vector<float> lc, lg;
      const ForwardInput ci{&cpu_kv, next, false}, gi{&gpu_kv, next, false};
      const absl::Status cs = cpu->engine().Forward({&ci, 1}, &lc);
      const absl::Status gs = gpu->engine().Forward({&gi, 1}, &lg);
      ASSERT_OK(cs);
      ASSERT_OK(gs);
      ASSERT_EQ(lc.size(), vocab);
      ASSERT_EQ(lg.size(), vocab);
      const double nmse = Nmse(lg, lc);
      worst = std::max(worst, nmse);
      EXPECT_LT(nmse, kBf16Nmse) << "prompt " << length << ", step " << step;
      std::vector<float> sorted = lc;
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      const auto cpu_top = static_cast<int32_t>(std::max_element(lc.begin(), lc.end()) - lc.begin());
      const auto gpu_top = static_cast<int32_t>(std::max_element(lg.begin(), lg.end()) - lg.begin());
      if (cpu_top != gpu_top) {
        if (sorted[0] - sorted[1] < kNearTie) {
          ++near_ties;
        } else {
          ADD_FAILURE() << "prompt " << length << ", step " << step << ": GPU picks " << gpu_top << ", CPU " << cpu_top
                        << " (CPU margin " << sorted[0] - sorted[1] << ")";
        }
      }
      next = {cpu_top};
    }
  }
  std::cout << "[ forced   ] " << gpu->backend_name() << (gpu->expert_pool() ? " + " + gpu->expert_pool()->kind() : "")
            << ": " << steps << " steps, worst logits nmse " << worst << ", argmax flips on near ties " << near_ties
            << "\n";
  if (inspect) inspect(*gpu);
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
      ASSERT_OK(rt);
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
      ASSERT_OK(rt);
      EXPECT_NE((*rt)->expert_pool()->kind().find("CUDA pool"), std::string::npos) << (*rt)->expert_pool()->kind();
    } else {
      ASSERT_FALSE(rt.ok());
      EXPECT_EQ(rt.status().code(), want) << rt.status();
    }
  }
}

// The comparison itself, on every machine: the orchestrator over the no-GPU
// host pool computes every expert with the CPU's own kernel, so it must
// follow the CPU runtime exactly (nmse 0, no flips) and the harness must
// drive an orchestrated engine step by step. A GPU run then tests the GPU,
// not this test.
TEST(GpuRuntimeTest, TeacherForcedComparisonHoldsForTheHostPool) {
  LocalRuntimeOptions options;
  options.orchestrator = CudaPool();
  options.orchestrator.pool = ExpertPoolKind::kHost;
  CompareTeacherForced(options, [](LocalRuntime& rt) {
    ASSERT_NE(rt.expert_pool(), nullptr);
    const ExpertPoolStats pool = rt.expert_pool()->stats();
    EXPECT_GT(pool.slot_runs + pool.staging_runs, 0) << "the planner never used the pool";
    EXPECT_EQ(pool.pageable_copies, 0) << "only the CUDA pool copies from pageable memory";
  });
}

TEST(GpuRuntimeTest, CudaBackendFollowsTheCpuTeacherForced) {
  SKIP_WITHOUT_CUDA_DEVICE();
  LocalRuntimeOptions options;
  options.backend = BackendKind::kCuda;
  CompareTeacherForced(options, [](LocalRuntime& rt) {
    auto* cuda = dynamic_cast<CudaBackend*>(&rt.backend());
    ASSERT_NE(cuda, nullptr) << rt.backend_name();
    EXPECT_GT(cuda->stats().weight_bytes, 0);
    EXPECT_GT(cuda->stats().h2d_bytes, 0);
  });
}

// The pool page-locks the tiny model's expert weights (a writable anonymous
// mapping: lockable on every GPU, read-only registration or not), so no copy
// comes from pageable memory.
void ExpectCudaPoolUsedAndPinned(LocalRuntime& rt) {
  ASSERT_NE(rt.expert_pool(), nullptr);
  const ExpertPoolStats pool = rt.expert_pool()->stats();
  EXPECT_NE(pool.kind.find("CUDA pool"), std::string::npos) << pool.kind;
  EXPECT_GT(pool.slot_runs + pool.staging_runs, 0) << "the planner never used the GPU pool";
  EXPECT_GT(pool.migrations_completed, 0);
  EXPECT_EQ(pool.pageable_copies, 0);
  auto* cuda = dynamic_cast<CudaExpertPool*>(rt.expert_pool());
  ASSERT_NE(cuda, nullptr);
  for (HostPinMode mode : cuda->host_pin_modes()) EXPECT_NE(mode, HostPinMode::kPageable);
}

TEST(GpuRuntimeTest, CudaExpertPoolFollowsTheCpuTeacherForced) {
  SKIP_WITHOUT_CUDA_DEVICE();
  LocalRuntimeOptions options;
  options.orchestrator = CudaPool();
  CompareTeacherForced(options, ExpectCudaPoolUsedAndPinned);
}

TEST(GpuRuntimeTest, CudaBackendAndPoolTogetherFollowTheCpuTeacherForced) {
  SKIP_WITHOUT_CUDA_DEVICE();
  LocalRuntimeOptions options;
  options.backend = BackendKind::kCuda;
  options.orchestrator = CudaPool();
  CompareTeacherForced(options, ExpectCudaPoolUsedAndPinned);
}

}  // namespace
}  // namespace tandem
