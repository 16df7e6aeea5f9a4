// Everything needed to run a model in one process, wired together: the model,
// the compute threads, the CPU compute backend, the in-process CPU expert
// executor (or an external one: CPU worker processes), the KV block pool, the
// engine and the generator. Used by the
// tandem-generate CLI, the benchmarks and the tests.
#pragma once

#include <filesystem>
#include <memory>

#include "absl/status/statusor.h"
#include "common/model.h"
#include "common/thread_pool.h"
#include "coordinator/cpu_backend.h"
#include "coordinator/engine.h"
#include "coordinator/generator.h"
#include "coordinator/kv_cache.h"
#include "cpu_worker/local_expert_executor.h"

namespace tandem {

struct LocalRuntimeOptions {
  int num_threads = 0;              // 0: every core this process may use
  int64_t kv_cache_tokens = 0;      // 0: one sequence of the model's full context
  int64_t kv_block_size = 16;
  EngineOptions engine;
  // Computes the experts instead of the in-process CPU executor, e.g. a
  // RemoteExpertExecutor over CPU worker processes. Not owned; must outlive
  // the runtime. Null: every expert runs in this process.
  ExpertExecutor* expert_executor = nullptr;
};

// Owns every part; one caller thread at a time.
class LocalRuntime {
 public:
  static absl::StatusOr<std::unique_ptr<LocalRuntime>> Create(std::unique_ptr<Model> model,
                                                              const LocalRuntimeOptions& options = {});
  static absl::StatusOr<std::unique_ptr<LocalRuntime>> Open(const std::filesystem::path& model_dir,
                                                            const LocalRuntimeOptions& options = {});

  const Model& model() const { return *model_; }
  ThreadPool& pool() { return *pool_; }
  KvBlockPool& kv_pool() { return *kv_pool_; }
  Engine& engine() { return *engine_; }
  Generator& generator() { return *generator_; }

 private:
  LocalRuntime() = default;
  std::unique_ptr<Model> model_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<LocalExpertExecutor> experts_;
  std::unique_ptr<KvBlockPool> kv_pool_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Generator> generator_;
};

}  // namespace tandem
