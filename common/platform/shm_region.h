// A named POSIX shared-memory region (shm_open + mmap), owned RAII-style.
//
// The creator owns the name: it holds an open-file-description write lock on
// the region for as long as it lives (so another process can tell a live
// owner from a stale region left by a killed one, even before the owner is
// reaped) and unlinks the name when it is destroyed. Openers map an existing
// region read-only or read-write and never unlink it.
//
// Names follow shm_open(3): "/" followed by up to 254 characters, no other "/".
// /dev/shm is shared by every user, so a predictable name can be taken
// first by someone else: processes that must not be blocked that way ask
// for a random suffix (ShmCreateOptions::unique_suffix), and Open maps only
// regions owned by this user (or root), never another user's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace tandem {

enum class ShmAccess { kReadOnly, kReadWrite };

struct ShmCreateOptions {
  // When the name exists but no live owner holds it (its creator was killed),
  // unlink it and create a fresh one; otherwise AlreadyExists.
  bool reclaim_stale = true;
  // Append "-<16 random hex digits>" to the name (name() reports the full
  // one), drawn afresh from getrandom if it exists: the name cannot be
  // predicted, so it cannot be squatted. An existing name is never reclaimed
  // then (it is not ours); after a few draws all taken, AlreadyExists.
  bool unique_suffix = false;
};

// Movable, not copyable. Destruction unmaps, closes and (owner only) unlinks.
class ShmRegion {
 public:
  // A new region of `bytes` (> 0), zero-filled, mapped read-write, owned.
  // AlreadyExists naming the region when a live owner holds the name;
  // InvalidArgument for a bad name or size; Internal (with errno text) otherwise.
  static absl::StatusOr<ShmRegion> Create(const std::string& name, size_t bytes, const ShmCreateOptions& options = {});
  // An existing region, its size from fstat. NotFound when absent;
  // PermissionDenied naming the owner when it belongs to another user (a
  // region planted under a name we were told would be a sibling's).
  static absl::StatusOr<ShmRegion> Open(const std::string& name, ShmAccess access);

  ShmRegion() = default;
  ~ShmRegion();
  ShmRegion(ShmRegion&& other) noexcept;
  ShmRegion& operator=(ShmRegion&& other) noexcept;
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  bool valid() const { return data_ != nullptr; }
  void* data() const { return data_; }
  uint8_t* bytes() const { return static_cast<uint8_t*>(data_); }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  bool owner() const { return owner_; }
  ShmAccess access() const { return access_; }

  // True while some process (the creator) holds the owner lock on the region.
  // An opener uses it to tell a dead peer from a slow one. Never blocks.
  bool OwnerAlive() const;

  // Owner only: unlink the name now (the mapping stays valid). Idempotent.
  void Unlink();

 private:
  void Reset();

  std::string name_;
  int fd_ = -1;
  void* data_ = nullptr;
  size_t size_ = 0;
  bool owner_ = false;
  bool unlinked_ = false;
  ShmAccess access_ = ShmAccess::kReadOnly;
};

// Checks a shm name (see above); InvalidArgument naming `what` otherwise.
absl::Status ValidateShmName(const std::string& name, const std::string& what = "shared-memory region name");

}  // namespace tandem
