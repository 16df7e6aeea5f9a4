// The experts each CPU worker holds under a division (base/expert_division.h).
// Pure functions; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/expert_division.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"

namespace tandem {

// The part of one expert a worker holds: intermediate rows [begin, end).
struct ExpertSlice {
  int layer = 0;
  int expert = 0;
  int64_t intermediate_begin = 0;
  int64_t intermediate_end = 0;
  int64_t size() const { return intermediate_end - intermediate_begin; }
};

// What a split must cut the experts' down_proj rows (w2 [D, I], cut along
// I) into: whole blocks of its type. gate/up rows are cut whole, which any
// type allows.
struct ExpertSplitBlock {
  int64_t values = 1;          // 1 for float types, else DTypeBlockSize (32 or 256)
  DType dtype = DType::kBF16;  // the down_proj type with the largest block
  std::string tensor;          // one down_proj of that type, for messages
};
// The coarsest block over every expert's down_proj in `weights` (a Q4_K_M
// file mixes Q4_K, Q6_K and, for odd rows, Q8_0: their blocks divide each
// other, so the largest serves all).
ExpertSplitBlock ExpertSplitBlockOf(const ModelWeights& weights);

// Every slice worker `worker_index` of `num_workers` holds, in (layer, expert)
// order. Split ranges are multiples of 16 rows (and of `block`) where I
// allows (SIMD-friendly) and differ in size by at most one such unit; shard
// assigns expert e of layer l to worker (e + l) mod num_workers so
// consecutive layers rotate the load. InvalidArgument when num_workers < 1,
// worker_index out of range, or a split would leave a worker with no rows;
// for a quantized down_proj, when I has fewer whole blocks than workers,
// naming the tensor, its type and the block size.
absl::StatusOr<std::vector<ExpertSlice>> PartitionExperts(const ModelConfig& config, ExpertDivision division,
                                                          int worker_index, int num_workers,
                                                          const ExpertSplitBlock& block = {});

}  // namespace tandem
