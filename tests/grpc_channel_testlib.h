// A gRPC channel to a child process the test has just started.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

namespace tandem {

// An insecure channel to `address` that retries a refused connection within
// a twentieth of a second: gRPC's default reconnect backoff (1 s, 1.6 s, ...)
// would make every start-up poll wait seconds for a process that is up in a
// fraction of one. Pair it with ClientContext::set_wait_for_ready(true) on
// the polling call: a call that fails fast leaves no thread polling the
// channel, nobody reads the server's HTTP/2 settings, and the handshake
// times out attempt after attempt.
std::shared_ptr<grpc::Channel> ChannelToChild(const std::string& address);

}  // namespace tandem
