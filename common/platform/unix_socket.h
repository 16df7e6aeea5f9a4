// Unix-domain sockets as tandem's processes use them: the addresses they
// accept, the checks before one is bound (never delete what another process
// or user owns), a listener whose socket file is 0600 from the moment it can
// accept, and the peer's credentials (SO_PEERCRED).
//
// A socket file's permissions are the only guard on who may connect, so
// abstract sockets (which have none) are refused, and a path is never taken
// over from a live server or from another user: PrepareSocketPath connects
// to whatever socket is there first and removes only a stale one of ours.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem {

// The path of "unix:PATH" (or "unix://PATH"). InvalidArgument naming `what`
// (e.g. "--listen") for an empty path, an abstract socket ("unix:@name",
// "unix-abstract:"), a NUL or a path longer than sun_path allows.
absl::StatusOr<std::string> ParseUnixAddress(const std::string& address, const std::string& what);

// Makes `path` free for a new socket: its folder must pass EnsureSocketDir
// (created 0700 when missing); nothing there is fine; a socket that accepts
// a connection is a live server (AlreadyExists: refused, left alone); a
// socket nothing listens on is stale and removed only when it is ours
// (PermissionDenied otherwise); anything else (a file, a folder, a symlink)
// is refused, never removed (AlreadyExists naming what it is).
absl::Status PrepareSocketPath(const std::string& path, const std::string& what);

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};
// SO_PEERCRED of a connected unix socket.
absl::StatusOr<PeerCredentials> PeerCredentialsOf(int fd);
// Whether a peer with `uid` may talk to this process: this user or root
// (root may read our memory anyway; refusing it would protect nothing).
bool TrustedPeerUid(uid_t uid);

// The next connection on the listening socket `listen_fd` (non-blocking,
// close-on-exec), or Cancelled once `wake_fd` is readable or `interrupted`
// is set. Transient failures (EMFILE, ENFILE, ECONNABORTED, ...) wait a
// little and retry rather than fail: a listener must outlive a burst of
// connections and accept again once descriptors are free. `name` is for
// messages. UnixListener and TcpListener (tcp_listener.h) accept with it.
absl::StatusOr<int> AcceptConnection(int listen_fd, int wake_fd, const std::atomic<bool>& interrupted,
                                     const std::string& name);

// A listening unix socket at a path, created by Listen (after
// PrepareSocketPath) with mode 0600 before it accepts anything. Owns the
// descriptor and the file: the destructor closes it and removes the file if
// it is still this socket's. Accept may be called from one thread; Interrupt
// from any.
class UnixListener {
 public:
  static absl::StatusOr<std::unique_ptr<UnixListener>> Listen(const std::string& path, const std::string& what,
                                                              int backlog = 64);
  ~UnixListener();
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  // The next connection (non-blocking, as gRPC wants it; close-on-exec), or
  // Cancelled once Interrupt was called. Transient failures (EMFILE, ENFILE,
  // ECONNABORTED, ...) wait a little and retry rather than fail: a
  // listener must outlive a burst of connections.
  absl::StatusOr<int> Accept();
  // Makes a blocked Accept return Cancelled; idempotent.
  void Interrupt();

  const std::string& path() const { return path_; }
  int fd() const { return fd_; }

 private:
  UnixListener() = default;
  std::string path_;
  int fd_ = -1;
  int wake_[2] = {-1, -1};  // a pipe: Interrupt writes, Accept polls
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  std::atomic<bool> interrupted_{false};
};

}  // namespace tandem
