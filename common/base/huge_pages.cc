#include "common/base/huge_pages.h"

#include <sys/mman.h>

namespace tandem {

uint8_t* MapHugePageAligned(size_t bytes) {
  bytes = RoundUpToHugePages(bytes);
  if (bytes == 0) return nullptr;
  // Mapped with 2 MiB to spare; the unaligned head and tail are given back.
  void* raw = ::mmap(nullptr, bytes + kHugePageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  uint8_t* start = static_cast<uint8_t*>(raw);
  uint8_t* base = reinterpret_cast<uint8_t*>(RoundUpToHugePages(reinterpret_cast<uintptr_t>(start)));
  if (base > start) ::munmap(start, static_cast<size_t>(base - start));
  const size_t tail = static_cast<size_t>(start + bytes + kHugePageBytes - (base + bytes));
  if (tail > 0) ::munmap(base + bytes, tail);
  // A hint: without THP the memory keeps 4 KiB pages and works the same.
  ::madvise(base, bytes, MADV_HUGEPAGE);
  return base;
}

void UnmapHugePageAligned(uint8_t* base, size_t bytes) {
  if (base != nullptr) ::munmap(base, RoundUpToHugePages(bytes));
}

}  // namespace tandem
