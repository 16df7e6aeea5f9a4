#include "coordinator/serving/server_listeners.h"

#include <unistd.h>

#include <chrono>

#include <grpcpp/server_posix.h>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/platform/connection_tracker.h"

namespace tandem {

// One socket, unix or TCP, and the connections it handed over.
struct ServerListeners::Listener {
  std::string name;
  std::unique_ptr<UnixListener> unix_socket;
  std::unique_ptr<TcpListener> tcp;
  ConnectionTracker connections;  // the accept thread's

  absl::StatusOr<int> Accept() { return unix_socket ? unix_socket->Accept() : tcp->Accept(); }
  void Interrupt() {
    if (unix_socket) unix_socket->Interrupt();
    if (tcp) tcp->Interrupt();
  }
};

ServerListeners::ServerListeners() = default;
ServerListeners::~ServerListeners() { Stop(); }

absl::StatusOr<std::unique_ptr<ServerListeners>> ServerListeners::Bind(
    const std::vector<ServerListenAddress>& addresses, int max_connections) {
  if (max_connections < 1) return absl::InvalidArgumentError("--max_connections must be >= 1");
  auto out = std::unique_ptr<ServerListeners>(new ServerListeners());
  out->max_connections_ = max_connections;
  for (const ServerListenAddress& a : addresses) {
    auto listener = std::make_unique<Listener>();
    listener->name = a.address;
    if (!a.unix_path.empty()) {
      TANDEM_ASSIGN_OR_RETURN(listener->unix_socket, UnixListener::Listen(a.unix_path, "--listen", /*backlog=*/128));
    } else {
      TANDEM_ASSIGN_OR_RETURN(listener->tcp, TcpListener::Listen(a.host, a.port, "--listen"));
    }
    out->listeners_.push_back(std::move(listener));
  }
  return out;
}

void ServerListeners::Start(grpc::Server* server) {
  for (auto& listener : listeners_) {
    threads_.emplace_back([this, l = listener.get(), server] { AcceptLoop(*l, server); });
    pthread_setname_np(threads_.back().native_handle(), "accept");
  }
}

void ServerListeners::Stop() {
  for (auto& listener : listeners_) listener->Interrupt();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
  listeners_.clear();  // closes the sockets; a unix socket's file goes if still ours
}

void ServerListeners::AcceptLoop(Listener& listener, grpc::Server* server) {
  const size_t cap = static_cast<size_t>(max_connections_);
  for (;;) {
    absl::StatusOr<int> fd = listener.Accept();
    if (!fd.ok()) {
      if (absl::IsCancelled(fd.status())) return;
      // Not transient (those are retried inside Accept), but a listener
      // must not die of it: log, back off, try again.
      LOG_ERROR("tandem-server: accepting on ", listener.name, ": ", fd.status().message(), "; retrying in 1 s");
      std::this_thread::sleep_for(std::chrono::seconds(1));
      continue;
    }
    if (listener.connections.size() >= cap && listener.connections.Live() >= cap) {
      close(*fd);
      const int64_t refused = refused_.fetch_add(1) + 1;
      if (refused <= 10 || refused % 1000 == 0) {
        LOG_WARNING("tandem-server: ", listener.name, " has ", cap,
                    " connections open (--max_connections); refused one (", refused, " so far)");
      }
      continue;
    }
    listener.connections.Add(*fd);
    grpc::AddInsecureChannelFromFd(server, *fd);  // gRPC owns the descriptor from here
  }
}

}  // namespace tandem
