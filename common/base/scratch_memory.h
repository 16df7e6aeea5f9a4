// Working memory reused call after call (a forward pass's activations, a
// kernel's scratch): it grows to the largest size asked for and keeps it.
// Growing neither copies nor zero-fills: the contents are undefined after
// a growth. From 1 MiB up the memory is 2 MiB-aligned and advised for
// transparent huge pages (huge_pages.h), so its first touch costs one page
// fault per 2 MiB, not per 4 KiB. Why: a fresh process's first 512-token
// Mixtral prefill ran at about half its warm speed while std::vector
// scratch grew; each growth zero-filled and copied tens of MB and faulted
// every 4 KiB page (docs/BENCHMARKS.md, "Loading and the first prompt").
//
// Owns its memory (freed on growth and destruction). Not thread-safe: one
// owner grows it; between growths any thread may read and write it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "absl/status/status.h"

namespace tandem {

class ScratchMemory {
 public:
  ScratchMemory() = default;
  ~ScratchMemory() { Release(); }
  ScratchMemory(ScratchMemory&& other) noexcept;
  ScratchMemory& operator=(ScratchMemory&& other) noexcept;
  ScratchMemory(const ScratchMemory&) = delete;
  ScratchMemory& operator=(const ScratchMemory&) = delete;

  // At least `bytes`, 64-byte aligned; a growth takes max(bytes, 1.5 x the
  // capacity) so a slowly rising size grows a few times, not every call.
  // Null when the memory cannot be had (the old memory is kept then).
  void* Reserve(size_t bytes);
  void* data() const { return data_; }
  size_t capacity() const { return capacity_; }

 private:
  void Release();
  void* data_ = nullptr;
  size_t capacity_ = 0;
  bool mapped_ = false;  // from MapHugePageAligned, else aligned_alloc
};

// `count` elements of a trivial type in ScratchMemory.
template <class T>
class ScratchArray {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>,
                "ScratchArray holds plain values: growth neither constructs nor copies them");

 public:
  // Room for at least `count` elements (contents undefined after a
  // growth); an error naming `what` when it cannot grow (ResourceExhausted)
  // or `count` is negative (InvalidArgument).
  absl::Status Grow(int64_t count, std::string_view what);
  T* data() { return static_cast<T*>(memory_.data()); }
  const T* data() const { return static_cast<const T*>(memory_.data()); }
  int64_t capacity() const { return static_cast<int64_t>(memory_.capacity() / sizeof(T)); }
  T& operator[](int64_t i) { return data()[i]; }
  const T& operator[](int64_t i) const { return data()[i]; }

 private:
  ScratchMemory memory_;
};

absl::Status ScratchGrowError(std::string_view what, int64_t count, size_t element_bytes);

template <class T>
absl::Status ScratchArray<T>::Grow(int64_t count, std::string_view what) {
  if (count < 0) return ScratchGrowError(what, count, sizeof(T));
  if (count <= capacity()) return absl::OkStatus();
  if (static_cast<uint64_t>(count) > SIZE_MAX / sizeof(T) / 2 ||
      memory_.Reserve(static_cast<size_t>(count) * sizeof(T)) == nullptr)
    return ScratchGrowError(what, count, sizeof(T));
  return absl::OkStatus();
}

}  // namespace tandem
