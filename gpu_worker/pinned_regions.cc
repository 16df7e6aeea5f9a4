#include "gpu_worker/pinned_regions.h"

#include <algorithm>
#include <utility>

#include "common/dtype.h"

namespace tandem {

std::vector<PinnedHostRegion> ExpertHostRegions(const std::vector<std::vector<ExpertWeights>>& experts,
                                                size_t page_bytes) {
  // [begin, end) of whole pages, as integers so that rounding is exact.
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  const uintptr_t mask = ~static_cast<uintptr_t>(page_bytes - 1);
  for (const std::vector<ExpertWeights>& layer : experts) {
    for (const ExpertWeights& expert : layer) {
      for (const LinearWeight* m : {&expert.w1, &expert.w3, &expert.w2}) {
        if (m->data == nullptr || m->n <= 0 || m->k <= 0) continue;
        const uintptr_t begin = reinterpret_cast<uintptr_t>(m->data);
        const uintptr_t end = begin + static_cast<uintptr_t>(m->n * m->k) * DTypeSize(m->dtype);
        ranges.emplace_back(begin & mask, (end + page_bytes - 1) & mask);
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
