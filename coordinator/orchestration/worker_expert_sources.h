// The expert pool's sources when CPU worker processes hold the experts: the
// workers' shared-memory expert stores, mapped here, so a migration copies
// the very bytes the workers compute from and this process keeps no copy of
// the experts at all (ARCHITECTURE.md, Processes: "the coordinator maps it
// read-only and registers it for DMA"). Mapped read-only unless the caller
// asks for `writable`: the workers compute from these bytes, and a
// read-only mapping lets the kernel guarantee that no bug here changes
// them. Writable only for a CUDA pool whose GPU cannot page-lock read-only
// mappings (cudaDevAttrHostRegisterReadOnlySupported 0: discrete GPUs in
// x86 hosts), since a plain registration pins with write access
// (gpu_worker/pinned_regions.h); read-only there, the stores would stay
// pageable and every migration would be staged by the driver. With the split
// division each expert lies in slices across the workers (w1/w3 rows, w2
// columns); the pools gather the pieces (gpu_worker/expert_source.h).
//
// Owns the mappings (they stay valid if a worker dies or restarts: the pages
// live while mapped). Immutable after Open; any thread may read.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/expert_store_view.h"
#include "common/model/model_config.h"
#include "gpu_worker/expert_source.h"
#include "gpu_worker/pinned_regions.h"

namespace tandem {

class WorkerExpertSources {
 public:
  // Maps every region (worker order) and assembles each expert's pieces.
  // InvalidArgument naming the worker when it has no store (e.g. an echo
  // worker); the store's own error (NotFound: not on this host) naming the
  // region; InvalidArgument naming the expert when the stores together do
  // not hold every expert of `config` exactly once.
  // `writable`: map the stores read-write (see above); nothing here writes.
  static absl::StatusOr<std::unique_ptr<WorkerExpertSources>> Open(const ModelConfig& config,
                                                                   const std::vector<std::string>& regions,
                                                                   bool writable = false);

  const ExpertSources& sources() const { return sources_; }  // [layer][expert]
  // The whole mappings, to page-lock each in one piece.
  std::vector<PinnedHostRegion> regions() const;
  int64_t mapped_bytes() const;

 private:
  WorkerExpertSources() = default;
  std::vector<ExpertStoreView> views_;
  ExpertSources sources_;
};

}  // namespace tandem
