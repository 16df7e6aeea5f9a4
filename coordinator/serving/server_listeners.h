// tandem-server's listening sockets. The server accepts its connections
// itself and hands each to gRPC (grpc::AddInsecureChannelFromFd), as the
// CPU worker does, because gRPC 1.51's own listener stops accepting for good
// after one EMFILE ("accept4: Too many open files"): a connection flood
// would kill it while the process stayed up. Here an accept that fails for
// lack of descriptors waits and retries (AcceptConnection), and each
// listener holds at most `max_connections` open connections: one more is
// accepted and closed at once (the client sees the connection refused, the
// server keeps its descriptors), counted and logged.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "common/platform/tcp_listener.h"
#include "common/platform/unix_socket.h"

namespace tandem {

// One --listen entry, parsed: a unix socket path, or a TCP host and port.
struct ServerListenAddress {
  std::string address;    // as gRPC names it: unix:/path or host:port (for logs)
  std::string unix_path;  // empty for TCP
  std::string host;       // TCP only, without brackets
  int port = 0;           // TCP only
};

// Owns the sockets and their accept threads. Start and Stop from one thread.
class ServerListeners {
 public:
  // Binds every address (a unix socket is 0600 before it accepts; see
  // UnixListener); nothing is accepted before Start.
  static absl::StatusOr<std::unique_ptr<ServerListeners>> Bind(const std::vector<ServerListenAddress>& addresses,
                                                               int max_connections);
  ~ServerListeners();

  // Accepts into `server` (built without listening ports) until Stop.
  void Start(grpc::Server* server);
  // Stops accepting and joins the threads; the socket files are removed if
  // still ours. Connections already handed over stay gRPC's. Idempotent.
  void Stop();

  // Connections refused because a listener was at max_connections. Any thread.
  int64_t refused() const { return refused_.load(); }

 private:
  struct Listener;
  ServerListeners();
  void AcceptLoop(Listener& listener, grpc::Server* server);

  int max_connections_ = 0;
  std::vector<std::unique_ptr<Listener>> listeners_;
  std::vector<std::thread> threads_;
  std::atomic<int64_t> refused_{0};
};

}  // namespace tandem
