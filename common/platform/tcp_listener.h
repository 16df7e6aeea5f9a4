// A listening TCP socket that accepts as UnixListener does
// (AcceptConnection: EMFILE and other transient failures wait and retry, so
// a flood of connections never stops the listener for good). tandem-server
// accepts its own connections and hands them to gRPC, because gRPC's own
// TCP listener gives up for good after one EMFILE.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace tandem {

// Owns the descriptor. Accept may be called from one thread; Interrupt from any.
class TcpListener {
 public:
  // `host` a numeric address or name ("127.0.0.1", "::1", "0.0.0.0",
  // "localhost"; IPv6 without brackets), `port` in 1..65535. Unavailable
  // naming `what` and the address when it cannot be bound (in use).
  static absl::StatusOr<std::unique_ptr<TcpListener>> Listen(const std::string& host, int port, const std::string& what,
                                                             int backlog = 128);
  ~TcpListener();
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;

  // The next connection (non-blocking, close-on-exec, TCP_NODELAY), or
  // Cancelled once Interrupt was called.
  absl::StatusOr<int> Accept();
  void Interrupt();  // idempotent

  const std::string& name() const { return name_; }  // "host:port"

 private:
  TcpListener() = default;
  std::string name_;
  int fd_ = -1;
  int wake_[2] = {-1, -1};
  std::atomic<bool> interrupted_{false};
};

}  // namespace tandem
