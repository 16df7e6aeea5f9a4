// Counts the connections a listener handed to someone else (gRPC owns and
// closes them), so a listener can cap how many are open at once without
// being told when one closes: a connection is live while its descriptor
// number still names the same socket (device and inode, unique while the
// socket lives). A descriptor closed and reused for anything else no
// longer matches and is forgotten.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <unordered_map>

namespace tandem {

// Not thread-safe: one per accept loop.
class ConnectionTracker {
 public:
  // Remembers `fd`, a connected socket about to be handed over.
  void Add(int fd);
  // How many of the remembered connections are still open (forgets the rest).
  size_t Live();
  // How many are remembered (>= Live(); cheap).
  size_t size() const { return fds_.size(); }

 private:
  struct Identity {
    dev_t dev = 0;
    ino_t ino = 0;
  };
  std::unordered_map<int, Identity> fds_;
};

}  // namespace tandem
