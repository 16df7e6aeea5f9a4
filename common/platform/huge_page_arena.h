// Anonymous memory for weights the CPU kernels stream, in 2 MiB-aligned
// chunks advised for transparent huge pages (MADV_HUGEPAGE: distributions
// often set THP to "madvise", so nothing else gets them). A decode step
// streams GBs of weights; read from a file's mapping they sit in 4 KiB
// page-cache pages, and the same weights decode faster from 2 MiB pages
// (measured: docs/BENCHMARKS.md, "Loading and the first prompt").
//
// Owns its chunks (unmapped on destruction). Not thread-safe: one loader
// fills it; the bytes it hands out may then be read from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/base/huge_pages.h"

namespace tandem {

class HugePageArena {
 public:
  // Chunks are at least this big, so that few huge pages are left part-used.
  static constexpr size_t kMinChunkBytes = size_t{64} << 20;
  static constexpr size_t kHugePageBytes = tandem::kHugePageBytes;

  HugePageArena() = default;
  ~HugePageArena();
  HugePageArena(const HugePageArena&) = delete;
  HugePageArena& operator=(const HugePageArena&) = delete;

  // `bytes`, 64-byte aligned: below kMinChunkBytes from the current chunk
  // (a new one when it is full), else from a chunk of its own; null when the
  // memory cannot be mapped.
  uint8_t* Allocate(size_t bytes);

  size_t allocated_bytes() const { return allocated_; }  // handed out
  size_t mapped_bytes() const;                           // in chunks

 private:
  struct Chunk {
    uint8_t* base;
    size_t bytes;
  };
  std::vector<Chunk> chunks_;
  // The chunk small allocations come from (big ones get chunks of their own).
  uint8_t* current_ = nullptr;
  size_t current_bytes_ = 0;
  size_t used_ = 0;
  size_t allocated_ = 0;
};

}  // namespace tandem
