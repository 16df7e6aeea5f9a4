// How a model's experts are divided between CPU workers (ARCHITECTURE.md):
//   split — every expert's intermediate dimension I is cut into one contiguous
//           range per worker; each worker computes a partial output
//           W2[:, range] · (silu(W1[range] x) ⊙ W3[range] x) and the
//           coordinator sums the partials (both sockets' bandwidth on every
//           expert, perfect balance at decode);
//   shard — whole experts, each on one worker.
// Never a full copy per worker. Pure functions; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_config.h"

namespace tandem {

enum class ExpertDivision { kSplit, kShard };

absl::StatusOr<ExpertDivision> ParseExpertDivision(const std::string& name);  // "split" | "shard"
std::string ExpertDivisionName(ExpertDivision division);

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

// The building blocks of PartitionExperts, for code that needs every
// worker's part at once (the coordinator's dispatch, LocalExpertExecutor's
// split_ways):

// Rows [begin, end) of one expert's intermediate dimension.
struct IntermediateRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// The split of I = `intermediate_size` rows between workers 0..num_workers-1,
// in worker order, covering [0, I) exactly once. When I >= 16 * num_workers
// every boundary is a multiple of 16 and only the last range may end off one
// (when I is not a multiple of 16); otherwise rows are dealt one by one.
// Sizes differ by at most 16 rows (by at most one row in the row-by-row case).
// InvalidArgument when num_workers < 1, I < 1, or I < num_workers.
absl::StatusOr<std::vector<IntermediateRange>> SplitIntermediate(int64_t intermediate_size, int num_workers);

// The worker that holds (layer, expert) whole under shard: (expert + layer)
// mod num_workers. num_workers must be >= 1.
int ShardWorker(int layer, int expert, int num_workers);

}  // namespace tandem
