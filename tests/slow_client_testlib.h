// Clients that stop reading, for the slow-reader tests (issue 15, item 7):
// requests written by hand on a raw socket, so the test decides when (if
// ever) the response is read. A real gRPC or HTTP client library keeps
// reading its socket in the background and would absorb what the server
// sends, hiding the server's behaviour.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include <google/protobuf/message.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/scoped_fd.h"

namespace tandem {

// One gRPC server-streaming call over HTTP/2 on a unix socket. After Start
// the client announces no more window than HTTP/2's default 65,535 bytes
// and does not read the socket, so the server can send at most that much
// before its writes block. One thread at a time.
class RawGrpcCall {
 public:
  // Connects, exchanges the HTTP/2 settings and sends `request` to `method`
  // ("/tandem.v1.Inference/Generate").
  static absl::StatusOr<std::unique_ptr<RawGrpcCall>> Start(const std::filesystem::path& socket,
                                                            const std::string& method,
                                                            const google::protobuf::Message& request);

  struct Result {
    int messages = 0;          // response messages received
    std::string data;          // their bytes, each with gRPC's 5-byte prefix
    std::string grpc_status;   // from the trailers ("8" is RESOURCE_EXHAUSTED)
    std::string grpc_message;  // percent-encoded as gRPC sends it
  };
  // Now reads: opens the window wide and takes everything up to the
  // trailers. DeadlineExceeded when they do not come within `timeout`.
  absl::StatusOr<Result> Drain(absl::Duration timeout);

 private:
  explicit RawGrpcCall(ScopedFd fd) : fd_(std::move(fd)) {}
  ScopedFd fd_;
};

// One HTTP/1.1 POST on TCP to 127.0.0.1:port whose response is not read
// until Drain; the socket's receive buffer is made as small as the kernel
// allows so that little of the response is absorbed on this side.
class RawHttpRequest {
 public:
  static absl::StatusOr<std::unique_ptr<RawHttpRequest>> Start(int port, const std::string& path,
                                                               const std::string& json_body);
  // Reads until the server closes the connection; DeadlineExceeded (with
  // what came) when it has not within `timeout`.
  absl::StatusOr<std::string> Drain(absl::Duration timeout);

 private:
  explicit RawHttpRequest(ScopedFd fd) : fd_(std::move(fd)) {}
  ScopedFd fd_;
};

// VmRSS of a process in KiB (/proc/PID/status); 0 when it cannot be read.
int64_t VmRssKb(int pid);

}  // namespace tandem
