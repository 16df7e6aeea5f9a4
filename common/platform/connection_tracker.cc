#include "common/platform/connection_tracker.h"

#include <sys/stat.h>

namespace tandem {

void ConnectionTracker::Add(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return;
  fds_[fd] = Identity{st.st_dev, st.st_ino};
}

size_t ConnectionTracker::Live() {
  for (auto it = fds_.begin(); it != fds_.end();) {
    struct stat st {};
    const bool same = fstat(it->first, &st) == 0 && st.st_dev == it->second.dev && st.st_ino == it->second.ino;
    it = same ? std::next(it) : fds_.erase(it);
  }
  return fds_.size();
}

}  // namespace tandem
