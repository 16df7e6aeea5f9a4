#include "common/platform/tcp_listener.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/platform/unix_socket.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<TcpListener>> TcpListener::Listen(const std::string& host, int port,
                                                                 const std::string& what, int backlog) {
  auto listener = std::unique_ptr<TcpListener>(new TcpListener());
  listener->name_ = absl::StrCat(host.find(':') != std::string::npos ? absl::StrCat("[", host, "]") : host, ":", port);
  if (port < 1 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", listener->name_, ": port not in 1..65535"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int err = getaddrinfo(host.c_str(), absl::StrCat(port).c_str(), &hints, &found); err != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", listener->name_, ": ", gai_strerror(err)));
  }
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr && listener->fd_ < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      last_error = absl::StrCat("socket: ", std::strerror(errno));
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, backlog) != 0) {
      last_error = std::strerror(errno);
      close(fd);
      continue;
    }
    listener->fd_ = fd;
  }
  freeaddrinfo(found);
  if (listener->fd_ < 0) {
    return absl::UnavailableError(absl::StrCat(what, " ", listener->name_, ": cannot listen: ", last_error));
  }
  if (pipe2(listener->wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  return listener;
}

TcpListener::~TcpListener() {
  if (fd_ >= 0) close(fd_);
  for (int fd : wake_) {
    if (fd >= 0) close(fd);
  }
}

absl::StatusOr<int> TcpListener::Accept() {
  absl::StatusOr<int> fd = AcceptConnection(fd_, wake_[0], interrupted_, name_);
  if (fd.ok()) {
    const int one = 1;
    setsockopt(*fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // as gRPC sets on its own connections
  }
  return fd;
}

void TcpListener::Interrupt() {
  if (interrupted_.exchange(true)) return;
  const char byte = 1;
  if (write(wake_[1], &byte, 1) < 0) {
    // The pipe is non-blocking and holds at most this byte: nothing to do.
  }
}

}  // namespace tandem
