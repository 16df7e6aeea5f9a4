#include "gpu_worker/pinned_regions.h"

#include <algorithm>
#include <utility>

#include "common/base/dtype.h"

namespace tandem {

std::vector<PinnedHostRegion> ExpertHostRegions(const ExpertSources& experts, size_t page_bytes) {
  // [begin, end) of whole pages, as integers so that rounding is exact.
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  const uintptr_t mask = ~static_cast<uintptr_t>(page_bytes - 1);
  for (const std::vector<ExpertSource>& layer : experts) {
    for (const ExpertSource& expert : layer) {
      const size_t elt = DTypeSize(expert.dtype);
      for (const std::vector<MatrixPiece>* m : {&expert.w1, &expert.w3, &expert.w2}) {
        for (const MatrixPiece& piece : *m) {
          if (piece.data == nullptr || piece.rows <= 0 || piece.cols <= 0) continue;
          const uintptr_t begin = reinterpret_cast<uintptr_t>(piece.data);
          const uintptr_t end = begin + piece.SpanBytes(elt);
          ranges.emplace_back(begin & mask, (end + page_bytes - 1) & mask);
        }
      }
    }
  }
  std::sort(ranges.begin(), ranges.end());
  std::vector<PinnedHostRegion> regions;
  uintptr_t begin = 0, end = 0;
  for (const auto& [b, e] : ranges) {
    if (end != 0 && b <= end) {  // touches or overlaps the current region
      end = std::max(end, e);
      continue;
    }
    if (end != 0) regions.push_back({reinterpret_cast<const void*>(begin), static_cast<size_t>(end - begin), true});
    begin = b;
    end = e;
  }
  if (end != 0) regions.push_back({reinterpret_cast<const void*>(begin), static_cast<size_t>(end - begin), true});
  return regions;
}

}  // namespace tandem
