// The command-line flags tandem-generate and tandem-server share: the model
// (--model DIR, or --synthetic PRESET[:layers] --synthetic_seed N generated in memory),
// compute threads, the CPU worker processes, the orchestrator (execution, cache and
// placement policies over the expert pool), DAOP pre-calculation, and
// routing/usage recording. Defined once here so both programs accept the
// same flags with the same checks.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/flags_usage.h"
#include "common/programs/kernel_flags.h"
#include "coordinator/orchestration/remote_expert_executor.h"
#include "coordinator/runtime/local_runtime.h"

namespace tandem {

// A runtime opened as the flags say. `remote` (the workers, when --workers is
// given) is declared first so it outlives the runtime whose engine calls it.
struct RuntimeFromFlags {
  std::unique_ptr<RemoteExpertExecutor> remote;
  // With --workers and --execution_policy: the workers' expert stores, the
  // pool's sources (outlive the runtime, so declared before it).
  std::unique_ptr<WorkerExpertSources> worker_experts;
  std::unique_ptr<LocalRuntime> runtime;
};

// --help's groups for the flags defined here, for the programs that link
// them: the model's (first in every listing), then the rest in the order a
// user meets them (threads, CPU workers, GPU and placement, kernels,
// recording).
std::vector<std::string> RuntimeModelFlags();
std::vector<FlagGroup> RuntimeFlagGroups();

// --model, --synthetic and --synthetic_seed (ParseModelSource). InvalidArgument naming
// the flag.
absl::StatusOr<ModelSource> ModelSourceFromFlags();

// Loads the model the flags name, connects the workers if --workers is set,
// and creates the runtime with `base` plus what the flags set. A synthetic
// model is generated on --threads threads, with its tokenizer, and without
// the experts when workers hold them (--workers: the orchestrator's pool
// then copies from the workers' stores). InvalidArgument naming the flag for a bad value; the
// workers' or the loader's error otherwise. Call from main, once.
absl::StatusOr<RuntimeFromFlags> OpenRuntimeFromFlags(LocalRuntimeOptions base);

}  // namespace tandem
