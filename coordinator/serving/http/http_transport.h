// HTTP/1.1 for tandem-server's OpenAI front end: an event-driven server
// (Boost.Asio, requests parsed by Boost.Beast) whose limits hold whatever a
// client sends or withholds.
//
// One I/O thread owns every socket: it accepts, reads each request's header
// and body, and writes responses, never blocking on a handler. A request
// that is complete goes to one of two lanes of handler threads:
//   control  /health, /metrics and the like: answered even while every
//            request thread is busy generating;
//   request  generation, tokenization: max_request_threads at once, then a
//            bounded queue, then 503 (Retry-After).
// Limits, each answered in the same way whatever the encoding:
//   header bytes (431) and fields (431), read within header_timeout from the
//   first byte (a client trickling its header is closed, not waited for);
//   body bytes, chunked included (413), read within body_timeout;
//   the bytes held by requests in flight, bodies plus what handlers Reserve
//   (503 while over budget: load that will pass);
//   open connections: at the cap the connection idle longest (waiting for a
//   request, or still sending one) is closed to admit the new one; when
//   none is idle, accepting pauses and the kernel's backlog (4096) holds
//   the rest, so a burst of clients waits instead of being reset.
// A client that closes its connection while its request is handled is
// noticed at once (HttpExchange::ClientGone), streaming or not.
// The port is bound exclusively: no SO_REUSEPORT, so a second server on
// the same port fails to start instead of sharing the requests.
//
// Thread contract: Create, Drain, Stop and Stats from any thread; the hooks
// run on the I/O thread (admit) or a lane thread (handle); an HttpExchange
// is used from the one lane thread that was given it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem {

struct HttpTransportOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port
  size_t max_body_bytes = 8 << 20;
  size_t max_header_bytes = 16 << 10;  // request line and every field
  int max_header_fields = 64;
  absl::Duration header_timeout = absl::Seconds(10);  // a whole header, keep-alive wait included
  absl::Duration body_timeout = absl::Seconds(60);    // a whole body
  absl::Duration write_timeout = absl::Seconds(30);   // one write the client takes nothing of
  int max_open_connections = 512;
  int max_request_threads = 64;   // requests handled at once in the request lane
  int max_queued_requests = 256;  // waiting for one of them
  int control_threads = 2;
  int64_t max_request_memory_bytes = int64_t{1} << 30;  // bodies in flight plus reservations
  int listen_backlog = 4096;
};

enum class HttpLane { kControl, kRequest };

struct HttpRequest {
  std::string method;                                        // as sent ("GET")
  std::string target;                                        // "/v1/models?x=1"
  std::string path;                                          // the target without its query
  int version = 11;                                          // 10 or 11
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-case, in order
  std::string body;
  std::string peer;  // "127.0.0.1:51234"

  // The first field named `lower_name`, or "" when absent.
  absl::string_view Header(absl::string_view lower_name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  bool close = false;  // close the connection after this response
};

class HttpConnection;

// A request's way back to its client: Respond once, or StartStream, Write
// any number of chunks, EndStream. A handler that returns having done
// neither gets a 500 sent for it.
class HttpExchange {
 public:
  explicit HttpExchange(std::shared_ptr<HttpConnection> connection);
  ~HttpExchange();
  HttpExchange(const HttpExchange&) = delete;
  HttpExchange& operator=(const HttpExchange&) = delete;

  void Respond(HttpResponse response);
  // A chunked response (HTTP/1.0: a body ended by closing). False when the
  // client is gone or took nothing for write_timeout (the connection is
  // closed then); the Write and EndStream calls after that do nothing.
  bool StartStream(int status, std::string content_type, std::vector<std::pair<std::string, std::string>> headers);
  bool Write(absl::string_view chunk);  // blocks until the kernel has the bytes
  void EndStream();
  // The client closed its side (or the connection failed) since the request
  // was read.
  bool ClientGone() const;
  // Memory this request holds beyond its body (a parsed tree, say), counted
  // against max_request_memory_bytes until the exchange ends. False, with
  // nothing reserved, when the budget would be exceeded.
  bool Reserve(int64_t bytes);
  bool responded() const { return responded_; }

 private:
  std::shared_ptr<HttpConnection> connection_;
  bool responded_ = false;
  bool streaming_ = false;
  bool ended_ = false;
  bool failed_ = false;
};

struct HttpTransportHooks {
  // On the I/O thread once a request's header is in (its body not yet
  // read): the lane to handle it in, or a response to send at once (the
  // body is then never read and the connection closes), e.g. a refused
  // origin or an unknown path. Must not block.
  std::function<std::optional<HttpResponse>(const HttpRequest& head, HttpLane* lane)> admit;
  // On a lane thread, with the whole request.
  std::function<void(HttpRequest& request, HttpExchange& exchange)> handle;
  // After a response's status is decided (any thread): for metrics.
  std::function<void(const std::string& path, int status)> counted;
};

struct HttpTransportStats {
  int64_t open_connections = 0;
  int64_t requests_in_handlers = 0;  // both lanes
  int64_t requests_queued = 0;       // request lane, waiting for a thread
  int64_t memory_in_use_bytes = 0;
  int64_t memory_limit_bytes = 0;
  int64_t header_timeouts = 0;    // closed for not finishing a header in time
  int64_t body_timeouts = 0;      // or a body
  int64_t idle_evictions = 0;     // closed at the connection cap
  int64_t overload_refusals = 0;  // 503: queue full or memory over budget
  int64_t clients_gone = 0;       // closed by the client while handled
};

class HttpTransport {
 public:
  // Binds host:port (exclusively) and starts answering. Unavailable naming
  // the address when it cannot be bound; InvalidArgument for bad options.
  static absl::StatusOr<std::unique_ptr<HttpTransport>> Create(HttpTransportOptions options, HttpTransportHooks hooks);
  ~HttpTransport();  // Stop()
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  int port() const;
  const HttpTransportOptions& options() const;
  // From now on every new request is answered 503 and its connection
  // closed; requests already in handlers go on.
  void Drain();
  // Waits for the handlers to return (they should have been told to end),
  // then closes every connection and joins every thread. Idempotent.
  void Stop();
  HttpTransportStats Stats() const;

  class Impl;

 private:
  explicit HttpTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
