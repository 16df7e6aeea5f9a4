#include "common/platform/huge_page_arena.h"

#include <algorithm>

#include "common/base/huge_pages.h"

namespace tandem {
namespace {

size_t RoundUp(size_t a, size_t b) { return (a + b - 1) / b * b; }

}  // namespace

HugePageArena::~HugePageArena() {
  for (const Chunk& chunk : chunks_) UnmapHugePageAligned(chunk.base, chunk.bytes);
}

uint8_t* HugePageArena::Allocate(size_t bytes) {
  constexpr size_t kAlign = 64;
  bytes = RoundUp(std::max<size_t>(bytes, 1), kAlign);
  if (bytes >= kMinChunkBytes) {  // a chunk of its own; the current one stays current
    const size_t chunk_bytes = RoundUpToHugePages(bytes);
    uint8_t* base = MapHugePageAligned(chunk_bytes);
    if (base == nullptr) return nullptr;
    chunks_.push_back({base, chunk_bytes});
    allocated_ += bytes;
    return base;
  }
  if (current_ == nullptr || current_bytes_ - used_ < bytes) {
    uint8_t* base = MapHugePageAligned(kMinChunkBytes);
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
