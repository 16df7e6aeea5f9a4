// Anonymous memory laid out for transparent huge pages: 2 MiB-aligned and
// advised with MADV_HUGEPAGE (distributions often set THP to "madvise", so
// nothing else gets them). Weights the kernels stream and the big scratch
// arrays of a forward pass both live in it: 4 KiB pages cost a TLB miss
// every 4 KiB streamed and a page fault each on first touch.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// `bytes` (rounded up to a multiple of 2 MiB) of zeroed anonymous memory
// starting on a 2 MiB boundary, so that every 2 MiB of it can be one huge
// page; null when it cannot be mapped. Release with UnmapHugePageAligned
// and the same `bytes`.
uint8_t* MapHugePageAligned(size_t bytes);
void UnmapHugePageAligned(uint8_t* base, size_t bytes);

// `bytes` rounded up to whole 2 MiB pages.
constexpr size_t RoundUpToHugePages(size_t bytes) { return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes; }

}  // namespace tandem
