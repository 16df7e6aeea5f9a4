// HTTP by hand on raw loopback sockets, for the front end's hostile-client
// tests: a client library would add headers, retry, or read in the
// background, and hide what the server does with a trickled header, an
// oversized chunked body or a client that leaves.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/base/scoped_fd.h"

namespace tandem {

// A blocking TCP connection to 127.0.0.1:port.
absl::StatusOr<ScopedFd> ConnectLoopback(int port);

// Writes all of `bytes`; Unavailable when the peer closed or reset.
absl::Status SendAll(int fd, absl::string_view bytes);

// One response read from `fd`: through its header and its body (by
// Content-Length, or chunked up to the last chunk), or up to the close.
// DeadlineExceeded, with what came, when it is not complete in `timeout`.
absl::StatusOr<std::string> ReadResponse(int fd, absl::Duration timeout);

// The status code of a response ("HTTP/1.1 413 ..." -> 413); 0 when none.
int ResponseStatus(absl::string_view response);
// A header's value in a response (name case-insensitive); "" when absent.
std::string ResponseHeader(absl::string_view response, absl::string_view name);
// The body of a response with Content-Length or chunked framing, decoded.
std::string ResponseBody(absl::string_view response);

// Whether the peer closed (FIN or reset) within `timeout`, any bytes it sent
// first being read and dropped.
bool PeerClosed(int fd, absl::Duration timeout);

// Peak resident memory (VmHWM) and now (VmRSS) of a process, in KiB; 0 when
// /proc cannot tell.
int64_t PeakRssKb(int pid);
int64_t RssKb(int pid);

// "POST PATH HTTP/1.1" with Host, Content-Type: application/json and
// Content-Length for `body`.
std::string JsonPost(const std::string& path, const std::string& body, int port);

}  // namespace tandem
