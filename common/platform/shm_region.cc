#include "common/platform/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/log.h"

namespace tandem {
namespace {

std::string ErrnoText(int err) { return std::string(std::strerror(err)); }

flock WholeFileLock(short type) {
  flock lock{};
  lock.l_type = type;
  lock.l_whence = SEEK_SET;
  lock.l_start = 0;
  lock.l_len = 0;  // to the end, however large
  lock.l_pid = 0;  // required for OFD locks
  return lock;
}

// Whether some open file description other than `fd`'s holds a lock on it.
bool LockedByOther(int fd) {
  flock lock = WholeFileLock(F_WRLCK);
  if (fcntl(fd, F_OFD_GETLK, &lock) != 0) return true;  // cannot tell: assume alive
  return lock.l_type != F_UNLCK;
}

// 64 random bits as 16 hex digits, from the kernel's generator.
absl::StatusOr<std::string> RandomSuffix() {
  uint64_t bits = 0;
  if (getrandom(&bits, sizeof(bits), 0) != static_cast<ssize_t>(sizeof(bits))) {
    return absl::InternalError(absl::StrCat("getrandom: ", ErrnoText(errno)));
  }
  return absl::StrFormat("-%016x", bits);
}

// Only this user's (or root's) regions are mapped: another user's region
// under the expected name is a plant.
absl::Status CheckOwner(const std::string& name, const struct stat& st) {
  if (st.st_uid != geteuid() && st.st_uid != 0) {
    return absl::PermissionDeniedError(absl::StrCat("shm region ", name, " belongs to uid ", st.st_uid,
                                                    ", not to you (uid ", geteuid(),
                                                    "): refusing to map another user's region"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateShmName(const std::string& name, const std::string& what) {
  if (name.size() < 2 || name.size() > 255 || name[0] != '/' || name.find('/', 1) != std::string::npos ||
      name.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " \"", name, "\" must be \"/\" followed by 1 to 254 characters, no other \"/\""));
  }
  return absl::OkStatus();
}

absl::StatusOr<ShmRegion> ShmRegion::Create(const std::string& requested, size_t bytes,
                                            const ShmCreateOptions& options) {
  std::string name = requested;
  if (options.unique_suffix) {
    // Random names: one that exists was taken by someone else; draw again.
    constexpr int kDraws = 4;
    for (int draw = 0; draw < kDraws; ++draw) {
      absl::StatusOr<std::string> suffix = RandomSuffix();
      if (!suffix.ok()) return suffix.status();
      ShmCreateOptions once = options;
      once.unique_suffix = false;
      once.reclaim_stale = false;
      absl::StatusOr<ShmRegion> region = Create(requested + *suffix, bytes, once);
      if (region.ok() || !absl::IsAlreadyExists(region.status())) return region;
      LOG_WARNING("shm region ", requested + *suffix,
                  " already exists (another process took that name): drawing "
                  "another");
    }
    return absl::AlreadyExistsError(absl::StrCat("shm regions ", requested, "-<random>: ", kDraws,
                                                 " random names in a row already existed; is someone creating "
                                                 "every name in /dev/shm?"));
  }
  if (absl::Status s = ValidateShmName(name); !s.ok()) return s;
  if (bytes == 0) return absl::InvalidArgumentError(absl::StrCat("shm region ", name, ": size must be > 0"));

  int fd = -1;
  for (int attempt = 0; attempt < 2 && fd < 0; ++attempt) {
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0) break;
    if (errno != EEXIST) {
      return absl::InternalError(absl::StrCat("shm_open(", name, ", O_CREAT|O_EXCL): ", ErrnoText(errno)));
    }
    // The name exists: a live owner keeps it, a stale one (killed creator) may be reclaimed.
    const int existing = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
    bool alive = true;
    struct stat st {};
    const bool foreign = existing < 0 ? errno == EACCES : (fstat(existing, &st) == 0 && st.st_uid != geteuid());
    if (existing >= 0) {
      alive = LockedByOther(existing);
      close(existing);
    }
    if (foreign) {
      return absl::AlreadyExistsError(absl::StrCat("shm region ", name,
                                                   " already exists and belongs to another user (squatted name); "
                                                   "choose another name or let the name be drawn at random"));
    }
    if (alive || !options.reclaim_stale || attempt > 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("shm region ", name, " already exists", alive ? " and is held by a live process" : " (stale)"));
    }
    shm_unlink(name.c_str());
  }

  ShmRegion region;
  region.name_ = name;
  region.fd_ = fd;
  region.owner_ = true;
  region.access_ = ShmAccess::kReadWrite;
  // O_EXCL made it ours; 0600 whatever the umask left.
  if (fchmod(fd, 0600) != 0) {
    const int err = errno;
    return absl::InternalError(absl::StrCat("shm region ", name, ": fchmod 0600: ", ErrnoText(err)));
  }
  flock lock = WholeFileLock(F_WRLCK);
  if (fcntl(fd, F_OFD_SETLK, &lock) != 0) {
    const int err = errno;
    return absl::InternalError(absl::StrCat("shm region ", name, ": owner lock: ", ErrnoText(err)));
  }
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    return absl::ResourceExhaustedError(
        absl::StrCat("shm region ", name, ": ftruncate to ", bytes, " bytes: ", ErrnoText(err)));
  }
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    const int err = errno;
    return absl::ResourceExhaustedError(
        absl::StrCat("shm region ", name, ": mmap ", bytes, " bytes: ", ErrnoText(err)));
  }
  region.data_ = data;
  region.size_ = bytes;
  return region;
}

absl::StatusOr<ShmRegion> ShmRegion::Open(const std::string& name, ShmAccess access) {
  if (absl::Status s = ValidateShmName(name); !s.ok()) return s;
  const bool rw = access == ShmAccess::kReadWrite;
  const int fd = shm_open(name.c_str(), (rw ? O_RDWR : O_RDONLY) | O_CLOEXEC, 0);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat("shm region ", name, " does not exist"));
    if (err == EACCES) {
      return absl::PermissionDeniedError(
          absl::StrCat("shm region ", name, ": permission denied (it belongs to another user): refusing to map it"));
    }
    return absl::InternalError(absl::StrCat("shm_open(", name, "): ", ErrnoText(err)));
  }
  ShmRegion region;
  region.name_ = name;
  region.fd_ = fd;
  region.access_ = access;
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    return absl::InternalError(absl::StrCat("fstat(shm region ", name, "): ", ErrnoText(err)));
  }
  if (absl::Status owner = CheckOwner(name, st); !owner.ok()) return owner;
  if (st.st_size <= 0) return absl::DataLossError(absl::StrCat("shm region ", name, " is empty"));
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* data = mmap(nullptr, bytes, rw ? (PROT_READ | PROT_WRITE) : PROT_READ, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    const int err = errno;
    return absl::InternalError(absl::StrCat("mmap shm region ", name, " (", bytes, " bytes): ", ErrnoText(err)));
  }
  region.data_ = data;
  region.size_ = bytes;
  return region;
}

ShmRegion::~ShmRegion() { Reset(); }

ShmRegion::ShmRegion(ShmRegion&& other) noexcept
    : name_(std::move(other.name_)),
      fd_(std::exchange(other.fd_, -1)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      owner_(std::exchange(other.owner_, false)),
      unlinked_(std::exchange(other.unlinked_, false)),
      access_(other.access_) {}

ShmRegion& ShmRegion::operator=(ShmRegion&& other) noexcept {
  if (this != &other) {
    Reset();
    name_ = std::move(other.name_);
    fd_ = std::exchange(other.fd_, -1);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    owner_ = std::exchange(other.owner_, false);
    unlinked_ = std::exchange(other.unlinked_, false);
    access_ = other.access_;
  }
  return *this;
}

bool ShmRegion::OwnerAlive() const {
  if (fd_ < 0) return false;
  if (owner_) return true;
  return LockedByOther(fd_);
}

void ShmRegion::Unlink() {
  if (owner_ && !unlinked_ && !name_.empty()) {
    shm_unlink(name_.c_str());
    unlinked_ = true;
  }
}

void ShmRegion::Reset() {
  if (data_ != nullptr) munmap(data_, size_);
  Unlink();
  if (fd_ >= 0) close(fd_);  // releases the owner lock
  data_ = nullptr;
  size_ = 0;
  fd_ = -1;
  owner_ = false;
  unlinked_ = false;
}

}  // namespace tandem
