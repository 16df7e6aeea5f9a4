#include "common/platform/unix_socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/runtime_dir.h"

namespace tandem {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

absl::StatusOr<sockaddr_un> AddressOf(const std::string& path, const std::string& what) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": ", path.size(),
                                                   " characters, more than a unix socket path allows (",
                                                   sizeof(address.sun_path) - 1, ")"));
  }
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  return address;
}

std::string KindOf(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symlink";
  if (S_ISFIFO(mode)) return "a fifo";
  return "not a socket";
}

}  // namespace

absl::StatusOr<std::string> ParseUnixAddress(const std::string& address, const std::string& what) {
  if (absl::StartsWith(address, "unix-abstract:")) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", address,
                                                   ": abstract unix sockets have no file permissions, so anyone on "
                                                   "the host could connect; give a path (unix:/path/to.sock)"));
  }
  if (!absl::StartsWith(address, "unix:")) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", address, ": not a unix:PATH address"));
  }
  std::string path = address.substr(5);
  if (absl::StartsWith(path, "//")) path = path.substr(2);
  if (path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " \"", address,
                     "\": no path after unix: (an empty path would bind an abstract socket, which has no "
                     "file permissions); give unix:/path/to.sock"));
  }
  if (path[0] == '@' || path.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, " \"", address,
                                                   "\": abstract unix sockets (unix:@name) have no file permissions, "
                                                   "so anyone on the host could connect; give a path"));
  }
  if (absl::StatusOr<sockaddr_un> a = AddressOf(path, what); !a.ok()) return a.status();
  return path;
}

absl::Status PrepareSocketPath(const std::string& path, const std::string& what) {
  if (absl::StatusOr<sockaddr_un> a = AddressOf(path, what); !a.ok()) return a.status();
  const std::filesystem::path file(path);
  const std::string dir = file.has_parent_path() ? file.parent_path().string() : std::string(".");
  if (absl::Status s = EnsureSocketDir(dir, absl::StrCat(what, " ", path, ": its folder")); !s.ok()) return s;

  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::PermissionDeniedError(absl::StrCat(what, " ", path, ": cannot stat: ", ErrnoText(errno)));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::AlreadyExistsError(absl::StrCat(what, " ", path, " exists and is ", KindOf(st.st_mode),
                                                 " (owned by uid ", st.st_uid,
                                                 "), not a socket: not removing it; choose another path"));
  }
  // A socket: whoever accepts a connection on it is alive.
  const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (probe < 0) return absl::InternalError(absl::StrCat("socket(AF_UNIX): ", ErrnoText(errno)));
  sockaddr_un address = *AddressOf(path, what);
  const int connected = connect(probe, reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  const int err = connected == 0 ? 0 : errno;
  close(probe);
  if (err == 0 || err == EAGAIN || err == EINPROGRESS) {
    return absl::AlreadyExistsError(absl::StrCat(what, " ", path,
                                                 ": a live server is listening on this socket; stop it first or "
                                                 "choose another path (not removing it)"));
  }
  if (st.st_uid != geteuid()) {
    return absl::PermissionDeniedError(absl::StrCat(what, " ", path, " is a socket of uid ", st.st_uid,
                                                    " (you are uid ", geteuid(),
                                                    "): not removing another user's socket"));
  }
  if (err != ECONNREFUSED) {
    return absl::PermissionDeniedError(absl::StrCat(what, " ", path, ": cannot tell whether the socket there is live (",
                                                    ErrnoText(err), "): not removing it"));
  }
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, " ", path, ": cannot remove the stale socket: ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<PeerCredentials> PeerCredentialsOf(int fd) {
  ucred cred{};
  socklen_t length = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) != 0) {
    return absl::InternalError(absl::StrCat("SO_PEERCRED: ", ErrnoText(errno)));
  }
  return PeerCredentials{cred.pid, cred.uid, cred.gid};
}

bool TrustedPeerUid(uid_t uid) { return uid == geteuid() || uid == 0; }

absl::StatusOr<std::unique_ptr<UnixListener>> UnixListener::Listen(const std::string& path, const std::string& what,
                                                                   int backlog) {
  if (absl::Status s = PrepareSocketPath(path, what); !s.ok()) return s;
  absl::StatusOr<sockaddr_un> address = AddressOf(path, what);
  if (!address.ok()) return address.status();
  auto listener = std::unique_ptr<UnixListener>(new UnixListener());
  listener->path_ = path;
  if (pipe2(listener->wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", ErrnoText(errno)));
  }
  listener->fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listener->fd_ < 0) return absl::InternalError(absl::StrCat("socket(AF_UNIX): ", ErrnoText(errno)));
  if (bind(listener->fd_, reinterpret_cast<const sockaddr*>(&*address), sizeof(*address)) != 0) {
    return absl::UnavailableError(absl::StrCat(what, " ", path, ": bind: ", ErrnoText(errno)));
  }
  // Nothing can connect before listen(): the file is 0600 before anyone may.
  struct stat st {};
  if (chmod(path.c_str(), 0600) != 0 || lstat(path.c_str(), &st) != 0) {
    const int err = errno;
    unlink(path.c_str());
    return absl::PermissionDeniedError(absl::StrCat(what, " ", path, ": chmod 0600: ", ErrnoText(err)));
  }
  listener->dev_ = st.st_dev;
  listener->ino_ = st.st_ino;
  if (listen(listener->fd_, backlog) != 0) {
    return absl::UnavailableError(absl::StrCat(what, " ", path, ": listen: ", ErrnoText(errno)));
  }
  return listener;
}

UnixListener::~UnixListener() {
  if (fd_ >= 0) {
    // Remove the file only if it is still ours (a successor may have replaced it).
    struct stat st {};
    if (lstat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) unlink(path_.c_str());
    close(fd_);
  }
  for (int fd : wake_) {
    if (fd >= 0) close(fd);
  }
}

absl::StatusOr<int> AcceptConnection(int listen_fd, int wake_fd, const std::atomic<bool>& interrupted,
                                     const std::string& name) {
  for (;;) {
    if (interrupted.load()) return absl::CancelledError(absl::StrCat("listener on ", name, " interrupted"));
    pollfd fds[2] = {{listen_fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("poll on ", name, ": ", ErrnoText(errno)));
    }
    if ((fds[1].revents & POLLIN) != 0 || interrupted.load()) {
      return absl::CancelledError(absl::StrCat("listener on ", name, " interrupted"));
    }
    const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) return fd;
    switch (errno) {
      case EAGAIN:
      case EINTR:
      case ECONNABORTED:
      case EPROTO: continue;
      case EMFILE:
      case ENFILE:
      case ENOBUFS:
      case ENOMEM:
        // Out of descriptors or memory for now: wait, do not spin and do not give up.
        poll(&fds[1], 1, 100);
        continue;
      default: return absl::InternalError(absl::StrCat("accept on ", name, ": ", ErrnoText(errno)));
    }
  }
}

absl::StatusOr<int> UnixListener::Accept() { return AcceptConnection(fd_, wake_[0], interrupted_, path_); }

void UnixListener::Interrupt() {
  if (interrupted_.exchange(true)) return;
  const char byte = 1;
  if (write(wake_[1], &byte, 1) < 0) {
    // The pipe is non-blocking and holds at most this byte: nothing to do.
  }
}

}  // namespace tandem
