#include "common/platform/huge_page_arena.h"

#include <sys/mman.h>

#include <algorithm>

namespace tandem {
namespace {

size_t RoundUp(size_t a, size_t b) { return (a + b - 1) / b * b; }

// `bytes` (a multiple of 2 MiB) of anonymous memory starting on a 2 MiB
// boundary, so that every 2 MiB of it can be one huge page: mapped with
// 2 MiB to spare, the unaligned head and tail given back.
uint8_t* MapAligned(size_t bytes) {
  const size_t huge = HugePageArena::kHugePageBytes;
  void* raw = ::mmap(nullptr, bytes + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  uint8_t* start = static_cast<uint8_t*>(raw);
  uint8_t* base = reinterpret_cast<uint8_t*>(RoundUp(reinterpret_cast<uintptr_t>(start), huge));
  if (base > start) ::munmap(start, static_cast<size_t>(base - start));
  const size_t tail = static_cast<size_t>(start + bytes + huge - (base + bytes));
  if (tail > 0) ::munmap(base + bytes, tail);
  // A hint: without THP the chunk keeps 4 KiB pages and works the same.
  ::madvise(base, bytes, MADV_HUGEPAGE);
  return base;
}

}  // namespace

HugePageArena::~HugePageArena() {
  for (const Chunk& chunk : chunks_) ::munmap(chunk.base, chunk.bytes);
}

uint8_t* HugePageArena::Allocate(size_t bytes) {
  constexpr size_t kAlign = 64;
  bytes = RoundUp(std::max<size_t>(bytes, 1), kAlign);
  if (bytes >= kMinChunkBytes) {  // a chunk of its own; the current one stays current
    const size_t chunk_bytes = RoundUp(bytes, kHugePageBytes);
    uint8_t* base = MapAligned(chunk_bytes);
    if (base == nullptr) return nullptr;
    chunks_.push_back({base, chunk_bytes});
    allocated_ += bytes;
    return base;
  }
  if (current_ == nullptr || current_bytes_ - used_ < bytes) {
    uint8_t* base = MapAligned(kMinChunkBytes);
    if (base == nullptr) return nullptr;
    chunks_.push_back({base, kMinChunkBytes});
    current_ = base;
    current_bytes_ = kMinChunkBytes;
    used_ = 0;
  }
  uint8_t* out = current_ + used_;
  used_ += bytes;
  allocated_ += bytes;
  return out;
}

size_t HugePageArena::mapped_bytes() const {
  size_t total = 0;
  for (const Chunk& chunk : chunks_) total += chunk.bytes;
  return total;
}

}  // namespace tandem
