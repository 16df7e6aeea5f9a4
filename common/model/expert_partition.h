// The experts each CPU worker holds under a division (base/expert_division.h).
// Pure functions; any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/expert_division.h"
#include "common/model/model_config.h"

namespace tandem {

// The part of one expert a worker holds: intermediate rows [begin, end).
struct ExpertSlice {
  int layer = 0;
  int expert = 0;
  int64_t intermediate_begin = 0;
  int64_t intermediate_end = 0;
  int64_t size() const { return intermediate_end - intermediate_begin; }
};

// Every slice worker `worker_index` of `num_workers` holds, in (layer, expert)
// order. Split ranges are multiples of 16 rows where I allows (SIMD-friendly)
// and differ in size by at most one such unit; shard assigns expert e of
// layer l to worker (e + l) mod num_workers so consecutive layers rotate the
// load. InvalidArgument when num_workers < 1, worker_index out of range, or a
// split would leave a worker with no rows.
absl::StatusOr<std::vector<ExpertSlice>> PartitionExperts(const ModelConfig& config, ExpertDivision division,
                                                          int worker_index, int num_workers);

}  // namespace tandem
