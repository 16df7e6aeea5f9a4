// How a model's experts are divided between CPU workers (ARCHITECTURE.md):
//   split — every expert's intermediate dimension I is cut into one contiguous
//           range per worker; each worker computes a partial output
//           W2[:, range] · (silu(W1[range] x) ⊙ W3[range] x) and the
//           coordinator sums the partials (both sockets' bandwidth on every
//           expert, perfect balance at decode);
//   shard — whole experts, each on one worker.
// The division itself and its arithmetic, free of any model type, so the
// planner (which depends on base/ only) can count CPU time per division.
// Pure functions; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

enum class ExpertDivision { kSplit, kShard };

absl::StatusOr<ExpertDivision> ParseExpertDivision(const std::string& name);  // "split" | "shard"
std::string ExpertDivisionName(ExpertDivision division);

// The building blocks of PartitionExperts (common/model/expert_partition.h),
// for code that needs every worker's part at once (the coordinator's
// dispatch, LocalExpertExecutor's split_ways):

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
//
// `block` > 1 (a block-quantized down_proj, whose rows are cut along I: a
// slice must be whole blocks): every boundary is a multiple of
// lcm(16, block) when I allows, else of `block`; InvalidArgument saying so
// when I is not a multiple of `block` or has fewer blocks than workers.
absl::StatusOr<std::vector<IntermediateRange>> SplitIntermediate(int64_t intermediate_size, int num_workers,
                                                                 int64_t block = 1);

// The worker that holds (layer, expert) whole under shard: (expert + layer)
// mod num_workers. num_workers must be >= 1.
int ShardWorker(int layer, int expert, int num_workers);

}  // namespace tandem
