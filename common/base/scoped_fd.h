// A file descriptor owned by one scope: closed on every way out. Movable,
// not copyable. Any thread, one at a time per object.
#pragma once

#include <unistd.h>

#include <utility>

namespace tandem {

class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() { reset(); }
  ScopedFd(ScopedFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Closes the one held (if any) and holds `fd` instead.
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  // For calls that return a descriptor through a pointer (closes the old one).
  int* receive() {
    reset();
    return &fd_;
  }

 private:
  int fd_ = -1;
};

}  // namespace tandem
