#include "common/base/scratch_memory.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/huge_pages.h"

namespace tandem {
namespace {

constexpr size_t kAlignment = 64;
// From here up, huge pages: below, a 2 MiB page would be mostly unused.
constexpr size_t kHugePageThreshold = kHugePageBytes / 2;

}  // namespace

ScratchMemory::ScratchMemory(ScratchMemory&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      capacity_(std::exchange(other.capacity_, 0)),
      mapped_(std::exchange(other.mapped_, false)) {}

ScratchMemory& ScratchMemory::operator=(ScratchMemory&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    capacity_ = std::exchange(other.capacity_, 0);
    mapped_ = std::exchange(other.mapped_, false);
  }
  return *this;
}

void* ScratchMemory::Reserve(size_t bytes) {
  if (bytes <= capacity_ && data_ != nullptr) return data_;
  size_t want = std::max(bytes, capacity_ + capacity_ / 2);
  want = std::max<size_t>((want + kAlignment - 1) / kAlignment * kAlignment, kAlignment);
  void* grown = nullptr;
  const bool mapped = want >= kHugePageThreshold;
  if (mapped) {
    want = RoundUpToHugePages(want);
    grown = MapHugePageAligned(want);
  } else {
    grown = std::aligned_alloc(kAlignment, want);
  }
  if (grown == nullptr) return nullptr;
  Release();
  data_ = grown;
  capacity_ = want;
  mapped_ = mapped;
  return data_;
}

void ScratchMemory::Release() {
  if (data_ == nullptr) return;
  if (mapped_) {
    UnmapHugePageAligned(static_cast<uint8_t*>(data_), capacity_);
  } else {
    std::free(data_);
  }
  data_ = nullptr;
  capacity_ = 0;
  mapped_ = false;
}

absl::Status ScratchGrowError(std::string_view what, int64_t count, size_t element_bytes) {
  if (count < 0) {
    return absl::InvalidArgumentError(absl::StrCat("negative size for ", std::string(what), ": ", count));
  }
  const double mb = static_cast<double>(count) * static_cast<double>(element_bytes) / 1e6;
  return absl::ResourceExhaustedError(absl::StrCat("no memory for ", std::string(what), ": ", count, " elements of ",
                                                   element_bytes, " bytes (", mb, " MB)"));
}

}  // namespace tandem
