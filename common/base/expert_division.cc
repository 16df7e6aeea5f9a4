#include "common/base/expert_division.h"

#include <numeric>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

// Split boundaries fall on multiples of this many rows: two AVX2 vectors of
// f32 and the packed kernel's panel width, and 32 bytes of a bf16 W2 row.
constexpr int64_t kSplitUnit = 16;

}  // namespace

absl::StatusOr<ExpertDivision> ParseExpertDivision(const std::string& name) {
  if (name == "split") return ExpertDivision::kSplit;
  if (name == "shard") return ExpertDivision::kShard;
  return absl::InvalidArgumentError(absl::StrCat("expert division must be \"split\" or \"shard\", got \"", name, "\""));
}

std::string ExpertDivisionName(ExpertDivision division) {
  return division == ExpertDivision::kSplit ? "split" : "shard";
}

absl::StatusOr<std::vector<IntermediateRange>> SplitIntermediate(int64_t intermediate_size, int num_workers,
                                                                 int64_t block) {
  if (num_workers < 1) return absl::InvalidArgumentError(absl::StrCat("num_workers must be >= 1, got ", num_workers));
  if (intermediate_size < 1)
    return absl::InvalidArgumentError(absl::StrCat("intermediate_size must be >= 1, got ", intermediate_size));
  if (block < 1) return absl::InvalidArgumentError(absl::StrCat("split block must be >= 1, got ", block));
  if (intermediate_size % block != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("intermediate_size ", intermediate_size, " is not a whole number of ", block, "-value blocks"));
  if (intermediate_size / block < num_workers)
    return absl::InvalidArgumentError(
        block == 1 ? absl::StrCat("a split of intermediate_size ", intermediate_size, " between ", num_workers,
                                  " workers would leave a worker with no rows")
                   : absl::StrCat("a split of intermediate_size ", intermediate_size, " (", intermediate_size / block,
                                  " blocks of ", block, ") between ", num_workers,
                                  " workers would leave a worker without a whole block"));
  // Whole units when every worker gets at least one; the rows past the last
  // whole unit go to the last worker, which never got an extra unit, so sizes
  // still differ by at most one unit. With blocks, the unit is a multiple of
  // the block, so every boundary (and the end, I) is too.
  const int64_t wide = std::lcm(kSplitUnit, block);
  const int64_t unit = intermediate_size >= wide * num_workers ? wide : block;
  const int64_t units = intermediate_size / unit;
  std::vector<IntermediateRange> ranges(static_cast<size_t>(num_workers));
  int64_t begin = 0;
  for (int w = 0; w < num_workers; ++w) {
    const int64_t count = units / num_workers + (w < units % num_workers ? 1 : 0);
    const int64_t end = w + 1 == num_workers ? intermediate_size : begin + count * unit;
    ranges[static_cast<size_t>(w)] = IntermediateRange{begin, end};
    begin = end;
  }
  return ranges;
}

int ShardWorker(int layer, int expert, int num_workers) {
  // Rotating by layer: when E is not a multiple of num_workers, the workers
  // that get one expert more change from layer to layer instead of always
  // being the first ones.
  return (expert + layer) % num_workers;
}

}  // namespace tandem
