#include "coordinator/serving/http/http_transport.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <future>
#include <list>
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/log.h"

namespace tandem {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

// Bounds what the kernel holds for a client that does not read (Linux
// autotunes a send buffer up to tcp_wmem's 4 MiB otherwise): beyond it a
// streamed write waits, the scheduler pauses the request, and write_timeout
// closes the connection.
constexpr int kSendBufferBytes = 256 << 10;
constexpr int kMaxQueuedControl = 256;

std::chrono::nanoseconds ToChrono(absl::Duration d) { return absl::ToChronoNanoseconds(d); }

// A fixed set of named threads running queued tasks in order.
class HandlerLane {
 public:
  HandlerLane(const std::string& name, int threads, int max_queued) : max_queued_(max_queued) {
    for (int i = 0; i < threads; ++i) {
      threads_.emplace_back([this, name, i] {
        pthread_setname_np(pthread_self(), absl::StrCat(name, i).substr(0, 15).c_str());
        Run();
      });
    }
  }
  ~HandlerLane() { Stop(); }

  // False when the lane stopped, or every thread is busy and max_queued
  // tasks wait (tasks not yet picked up by an idle thread do not count).
  bool Submit(std::function<void()> task) {
    absl::MutexLock lock(&mu_);
    const int64_t idle = static_cast<int64_t>(threads_.size()) - busy_;
    if (stopping_ || static_cast<int64_t>(queue_.size()) >= max_queued_ + std::max<int64_t>(idle, 0)) return false;
    queue_.push_back(std::move(task));
    return true;
  }

  // Runs what is queued, then joins.
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

  int64_t queued() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int64_t>(queue_.size());
  }
  int64_t busy() const {
    absl::MutexLock lock(&mu_);
    return busy_;
  }

 private:
  void Run() {
    for (;;) {
      std::function<void()> task;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](HandlerLane* lane)
                 ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane->mu_) { return lane->stopping_ || !lane->queue_.empty(); },
            this));
        if (queue_.empty()) return;  // stopping, and nothing left
        task = std::move(queue_.front());
        queue_.pop_front();
        ++busy_;
      }
      task();
      absl::MutexLock lock(&mu_);
      --busy_;
    }
  }

  const int max_queued_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t busy_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::thread> threads_;
};

}  // namespace

absl::string_view HttpRequest::Header(absl::string_view lower_name) const {
  for (const auto& [name, value] : headers) {
    if (name == lower_name) return value;
  }
  return {};
}

class HttpTransport::Impl {
 public:
  Impl(HttpTransportOptions options, HttpTransportHooks hooks)
      : options_(std::move(options)),
        hooks_(std::move(hooks)),
        acceptor_(io_),
        accept_retry_(io_),
        control_("http-ctl", options_.control_threads, kMaxQueuedControl),
        request_("http-req", options_.max_request_threads, options_.max_queued_requests) {}

  absl::Status Bind();
  void StartIo();
  void Drain();
  void Stop();
  HttpTransportStats Stats() const;

  // I/O thread.
  void Accept();
  void OnAccepted(tcp::socket socket);
  bool EvictIdlest();
  void Forget(HttpConnection* connection);
  bool Dispatch(HttpLane lane, std::function<void()> task) {
    return (lane == HttpLane::kControl ? control_ : request_).Submit(std::move(task));
  }

  // Any thread.
  bool TryReserve(int64_t bytes) {
    int64_t now = memory_in_use_.load();
    do {
      if (now + bytes > options_.max_request_memory_bytes) return false;
    } while (!memory_in_use_.compare_exchange_weak(now, now + bytes));
    return true;
  }
  void Release(int64_t bytes) { memory_in_use_ -= bytes; }
  void Count(const std::string& path, int status) {
    if (hooks_.counted) hooks_.counted(path, status);
  }

  const HttpTransportOptions options_;
  const HttpTransportHooks hooks_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::steady_timer accept_retry_;
  int port_ = 0;
  std::atomic<bool> draining_{false};
  std::atomic<bool> stopped_{false};
  std::atomic<int64_t> memory_in_use_{0};
  std::atomic<int64_t> open_{0};
  std::atomic<int64_t> header_timeouts_{0}, body_timeouts_{0}, idle_evictions_{0}, overload_refusals_{0},
      clients_gone_{0};

  // I/O thread only.
  std::list<std::shared_ptr<HttpConnection>> connections_;
  bool accept_paused_ = false;

  HandlerLane control_;
  HandlerLane request_;
  std::thread io_thread_;  // last: starts once the rest exists
};

// One client connection. Every member is touched on the I/O thread only,
// except the atomics and what the Post* calls hand over through the io_context.
class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  enum class State { kReadingHeader, kReadingBody, kHandling, kClosed };

  HttpConnection(HttpTransport::Impl* server, tcp::socket socket)
      : server_(server), socket_(std::move(socket)), timer_(server->io_) {
    boost::system::error_code ec;
    const tcp::endpoint peer = socket_.remote_endpoint(ec);
    if (!ec) peer_ = absl::StrCat(peer.address().to_string(), ":", peer.port());
  }

  void Start() { ReadHeader(); }
  void Close();
  State state() const { return state_; }
  Clock::time_point since() const { return since_; }
  std::list<std::shared_ptr<HttpConnection>>::iterator& slot() { return slot_; }
  bool idle_between_requests() const { return state_ == State::kReadingHeader && buffer_.size() == 0 && !reading_; }

  // From the lane thread that handles the request.
  void PostRespond(HttpResponse response);
  bool PostStreamHeader(int status, std::string content_type, std::vector<std::pair<std::string, std::string>> headers);
  bool PostChunk(std::string chunk);
  void PostStreamEnd();
  bool gone() const { return gone_.load(); }
  bool Reserve(int64_t bytes) {
    if (!server_->TryReserve(bytes)) return false;
    reserved_ += bytes;
    return true;
  }

 private:
  void ReadHeader();
  void OnHeader(beast::error_code ec);
  void OnBody(beast::error_code ec);
  void Admit();
  void Handle();
  void WatchPeer();
  void RespondNow(HttpResponse response);
  void RequestDone(bool keep_alive);
  void Linger();
  void Discard();
  void Arm(absl::Duration timeout, std::function<void()> on_expiry);
  void Disarm() {
    ++timer_generation_;
    timer_.cancel();
  }
  void ReleaseReservation() { server_->Release(reserved_.exchange(0)); }
  // Runs `fn` on the I/O thread and waits for the bool it reports.
  bool RunOnIo(std::function<void(std::shared_ptr<std::promise<bool>>)> fn);

  HttpTransport::Impl* const server_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  uint64_t timer_generation_ = 0;
  std::string peer_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  HttpRequest request_;
  State state_ = State::kReadingHeader;
  bool reading_ = false;  // a header read has taken bytes
  Clock::time_point since_ = Clock::now();
  HttpLane request_lane_ = HttpLane::kRequest;
  int64_t body_reserved_ = 0;  // what Admit reserved for the body
  std::string counted_path_;   // the request's path, kept for counting its response
  bool keep_alive_ = true;
  bool stream_chunked_ = true;
  uint64_t watch_generation_ = 0;
  std::vector<char> discard_;  // Linger's reads
  std::atomic<bool> gone_{false};
  std::atomic<int64_t> reserved_{0};
  std::list<std::shared_ptr<HttpConnection>>::iterator slot_;
};

namespace {

std::string Lower(absl::string_view s) { return absl::AsciiStrToLower(s); }

HttpResponse ErrorResponse(int status, absl::string_view type, absl::string_view message, absl::string_view code) {
  HttpResponse r;
  r.status = status;
  // OpenAI's error shape, built by hand: this layer knows no JSON library.
  std::string escaped;
  for (char c : message) {
    if (c == '"' || c == '\\') escaped.push_back('\\');
    escaped.push_back(c);
  }
  r.body = absl::StrCat("{\"error\":{\"message\":\"", escaped, "\",\"type\":\"", type,
                        "\",\"param\":null,\"code\":", code.empty() ? "null" : absl::StrCat("\"", code, "\""), "}}");
  r.close = true;
  return r;
}

HttpResponse Overloaded(absl::string_view message) {
  HttpResponse r = ErrorResponse(503, "unavailable_error", message, "server_overloaded");
  r.headers.push_back({"Retry-After", "1"});
  return r;
}

}  // namespace

void HttpConnection::Arm(absl::Duration timeout, std::function<void()> on_expiry) {
  const uint64_t generation = ++timer_generation_;
  timer_.expires_after(ToChrono(timeout));
  timer_.async_wait([self = shared_from_this(), generation, on_expiry = std::move(on_expiry)](beast::error_code ec) {
    if (ec || generation != self->timer_generation_ || self->state_ == State::kClosed) return;
    on_expiry();
  });
}

void HttpConnection::Close() {
  if (state_ == State::kClosed) return;
  const std::shared_ptr<HttpConnection> keep = shared_from_this();  // Forget drops the server's reference
  state_ = State::kClosed;
  Disarm();
  boost::system::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  ReleaseReservation();
  server_->Forget(this);
}

void HttpConnection::ReadHeader() {
  state_ = State::kReadingHeader;
  since_ = Clock::now();
  reading_ = buffer_.size() > 0;
  request_ = HttpRequest{};
  request_.peer = peer_;
  counted_path_.clear();
  parser_.emplace();
  parser_->header_limit(static_cast<std::uint32_t>(server_->options_.max_header_bytes));
  parser_->body_limit(server_->options_.max_body_bytes);
  Arm(server_->options_.header_timeout, [this] {
    // Bytes of a header that did not complete in time: a slow or hostile
    // client. Nothing at all: an idle keep-alive connection.
    if (reading_ || buffer_.size() > 0) ++server_->header_timeouts_;
    Close();
  });
  http::async_read_header(socket_, buffer_, *parser_,
                          [self = shared_from_this()](beast::error_code ec, std::size_t) { self->OnHeader(ec); });
}

void HttpConnection::OnHeader(beast::error_code ec) {
  if (state_ == State::kClosed) return;
  Disarm();
  if (ec == http::error::header_limit) {
    return RespondNow(
        ErrorResponse(431, "invalid_request_error",
                      absl::StrCat("the request header is larger than ", server_->options_.max_header_bytes, " bytes"),
                      "header_too_large"));
  }
  if (ec == http::error::body_limit) {
    return RespondNow(ErrorResponse(413, "invalid_request_error",
                                    absl::StrCat("the request body is larger than ", server_->options_.max_body_bytes,
                                                 " bytes (--http_max_body_bytes)"),
                                    "body_too_large"));
  }
  if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset ||
      ec == asio::error::operation_aborted) {
    return Close();
  }
  if (ec) return RespondNow(ErrorResponse(400, "invalid_request_error", "malformed HTTP request", "bad_request"));
  const auto& head = parser_->get();
  request_.method = std::string(head.method_string());
  request_.target = std::string(head.target());
  request_.path = request_.target.substr(0, request_.target.find('?'));
  counted_path_ = request_.path;
  request_.version = static_cast<int>(head.version());
  int fields = 0;
  for (const auto& field : head) {
    if (++fields > server_->options_.max_header_fields) {
      return RespondNow(ErrorResponse(
          431, "invalid_request_error",
          absl::StrCat("the request has more than ", server_->options_.max_header_fields, " header fields"),
          "header_too_large"));
    }
    request_.headers.emplace_back(Lower(std::string(field.name_string())), std::string(field.value()));
  }
  keep_alive_ = head.keep_alive();
  Admit();
}

// The header is in: refuse what can be refused before reading the body.
void HttpConnection::Admit() {
  if (server_->draining_) {
    return RespondNow(ErrorResponse(503, "unavailable_error", "the server is shutting down", "shutting_down"));
  }
  const boost::optional<std::uint64_t> length = parser_->content_length();
  if (length && *length > server_->options_.max_body_bytes) {
    return RespondNow(ErrorResponse(413, "invalid_request_error",
                                    absl::StrCat("the request body is larger than ", server_->options_.max_body_bytes,
                                                 " bytes (--http_max_body_bytes)"),
                                    "body_too_large"));
  }
  // A chunked body's size is unknown until read: it holds the whole limit.
  const int64_t body_bytes = length ? static_cast<int64_t>(*length)
                                    : (parser_->chunked() ? static_cast<int64_t>(server_->options_.max_body_bytes) : 0);
  body_reserved_ = body_bytes;
  if (!Reserve(body_bytes)) {
    body_reserved_ = 0;
    ++server_->overload_refusals_;
    return RespondNow(
        Overloaded("the server holds as many request bytes as it may (--http_max_request_memory_mb); "
                   "retry shortly"));
  }
  HttpLane lane = HttpLane::kRequest;
  if (server_->hooks_.admit) {
    if (std::optional<HttpResponse> early = server_->hooks_.admit(request_, &lane); early) {
      return RespondNow(std::move(*early));
    }
  }
  request_lane_ = lane;
  if (parser_->is_done()) return Handle();
  state_ = State::kReadingBody;
  since_ = Clock::now();
  auto read_body = [self = shared_from_this()] {
    self->Arm(self->server_->options_.body_timeout, [raw = self.get()] {
      ++raw->server_->body_timeouts_;
      raw->Close();
    });
    http::async_read(self->socket_, self->buffer_, *self->parser_,
                     [self](beast::error_code ec, std::size_t) { self->OnBody(ec); });
  };
  if (request_.version >= 11 && absl::EqualsIgnoreCase(request_.Header("expect"), "100-continue")) {
    static constexpr absl::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    asio::async_write(socket_, asio::buffer(kContinue.data(), kContinue.size()),
                      [self = shared_from_this(), read_body](beast::error_code ec, std::size_t) {
                        if (ec) return self->Close();
                        read_body();
                      });
    return;
  }
  read_body();
}

void HttpConnection::OnBody(beast::error_code ec) {
  if (state_ == State::kClosed) return;
  Disarm();
  if (ec == http::error::body_limit) {
    return RespondNow(ErrorResponse(413, "invalid_request_error",
                                    absl::StrCat("the request body is larger than ", server_->options_.max_body_bytes,
                                                 " bytes (--http_max_body_bytes)"),
                                    "body_too_large"));
  }
  if (ec == http::error::partial_message || ec == asio::error::eof || ec == asio::error::connection_reset ||
      ec == asio::error::operation_aborted) {
    return Close();
  }
  if (ec) return RespondNow(ErrorResponse(400, "invalid_request_error", "malformed HTTP request body", "bad_request"));
  // A chunked body reserved the whole limit: keep what it took.
  const int64_t taken = static_cast<int64_t>(parser_->get().body().size());
  if (taken < body_reserved_) {
    server_->Release(body_reserved_ - taken);
    reserved_ -= body_reserved_ - taken;
  }
  Handle();
}

void HttpConnection::Handle() {
  state_ = State::kHandling;
  since_ = Clock::now();
  request_.body = std::move(parser_->get().body());
  parser_.reset();
  auto request = std::make_shared<HttpRequest>(std::move(request_));
  const bool queued = server_->Dispatch(request_lane_, [self = shared_from_this(), request] {
    HttpExchange exchange(self);
    try {
      if (self->server_->hooks_.handle) self->server_->hooks_.handle(*request, exchange);
    } catch (const std::exception& e) {
      // A handler's bug must not leak library text to the client or take
      // the server down: logged here, a plain 500 there.
      LOG_ERROR("HTTP ", request->method, " ", request->path, ": handler threw: ", e.what());
    }
  });
  if (!queued) {
    ++server_->overload_refusals_;
    return RespondNow(Overloaded(absl::StrCat("the server is handling ", server_->options_.max_request_threads,
                                              " requests and has ", server_->options_.max_queued_requests,
                                              " queued (--http_max_connections); retry shortly")));
  }
  WatchPeer();
}

// While the request is handled the client should send nothing: readable
// with nothing to read is its FIN (or a reset).
void HttpConnection::WatchPeer() {
  const uint64_t generation = ++watch_generation_;
  socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this(), generation](beast::error_code ec) {
    if (generation != self->watch_generation_ || self->state_ != State::kHandling) return;
    if (ec == asio::error::operation_aborted) return;
    char byte;
    const ssize_t n = ec ? -1 : ::recv(self->socket_.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) return;  // the next request, pipelined: it waits in the kernel
    if (n < 0 && !ec && (errno == EAGAIN || errno == EINTR)) return self->WatchPeer();
    if (!self->gone_.exchange(true)) ++self->server_->clients_gone_;
  });
}

void HttpConnection::RespondNow(HttpResponse response) {
  server_->Count(counted_path_.empty() ? "other" : counted_path_, response.status);
  // Refused before its body was read: the connection cannot be reused.
  const bool early = state_ != State::kHandling && !(parser_ && parser_->is_done());
  if (early) ReleaseReservation();  // nothing of the request is kept: its body is never read
  auto res = std::make_shared<http::response<http::string_body>>();
  res->version(request_.version == 10 ? 10 : 11);
  res->result(static_cast<unsigned>(response.status));
  res->set(http::field::server, "tandem");
  res->set(http::field::content_type, response.content_type);
  for (auto& [name, value] : response.headers) res->set(name, value);
  const bool keep = keep_alive_ && !response.close && !early && !server_->draining_;
  res->keep_alive(keep);
  res->body() = std::move(response.body);
  res->prepare_payload();
  Arm(server_->options_.write_timeout, [this] { Close(); });
  http::async_write(socket_, *res, [self = shared_from_this(), res, keep, early](beast::error_code ec, std::size_t) {
    if (self->state_ == State::kClosed) return;
    self->Disarm();
    if (ec) return self->Close();
    if (early) return self->Linger();
    self->RequestDone(keep);
  });
}

// Closes after a response sent before the request's body was read: the
// unread bytes are drained for a moment first, since closing with data
// unread sends a reset that can destroy the response in flight.
void HttpConnection::Linger() {
  state_ = State::kReadingBody;  // evictable, and no longer a request
  boost::system::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_send, ignored);
  Arm(absl::Seconds(2), [this] { Close(); });
  discard_.resize(4096);
  Discard();
}

void HttpConnection::Discard() {
  socket_.async_read_some(asio::buffer(discard_), [self = shared_from_this()](beast::error_code ec, std::size_t) {
    if (self->state_ == State::kClosed) return;
    if (ec) return self->Close();
    self->Discard();
  });
}

void HttpConnection::RequestDone(bool keep_alive) {
  ReleaseReservation();
  body_reserved_ = 0;
  if (!keep_alive || server_->draining_) return Close();
  ++watch_generation_;
  boost::system::error_code ignored;
  socket_.cancel(ignored);  // the peer watch
  ReadHeader();
}

bool HttpConnection::RunOnIo(std::function<void(std::shared_ptr<std::promise<bool>>)> fn) {
  auto done = std::make_shared<std::promise<bool>>();
  std::future<bool> result = done->get_future();
  asio::post(server_->io_, [self = shared_from_this(), fn = std::move(fn), done] {
    if (self->state_ == State::kClosed) return done->set_value(false);
    fn(done);
  });
  return result.get();
}

void HttpConnection::PostRespond(HttpResponse response) {
  asio::post(server_->io_, [self = shared_from_this(), response = std::move(response)]() mutable {
    if (self->state_ != State::kHandling) return;
    self->RespondNow(std::move(response));
  });
}

bool HttpConnection::PostStreamHeader(int status, std::string content_type,
                                      std::vector<std::pair<std::string, std::string>> headers) {
  return RunOnIo([this, status, content_type = std::move(content_type),
                  headers = std::move(headers)](std::shared_ptr<std::promise<bool>> done) {
    server_->Count(counted_path_, status);
    struct Head {
      http::response<http::empty_body> response;
      std::optional<http::response_serializer<http::empty_body>> serializer;
    };
    auto head = std::make_shared<Head>();
    http::response<http::empty_body>& res = head->response;
    stream_chunked_ = request_.version >= 11;
    res.version(stream_chunked_ ? 11 : 10);
    res.result(static_cast<unsigned>(status));
    res.set(http::field::server, "tandem");
    res.set(http::field::content_type, content_type);
    for (const auto& [name, value] : headers) res.set(name, value);
    res.keep_alive(stream_chunked_ && keep_alive_ && !server_->draining_);
    if (stream_chunked_) res.chunked(true);
    head->serializer.emplace(res);
    Arm(server_->options_.write_timeout, [this] { Close(); });
    http::async_write_header(socket_, *head->serializer,
                             [self = shared_from_this(), head, done](beast::error_code ec, std::size_t) {
                               if (self->state_ == State::kClosed) return done->set_value(false);
                               self->Disarm();
                               if (ec) self->Close();
                               done->set_value(!ec);
                             });
  });
}

bool HttpConnection::PostChunk(std::string chunk) {
  auto data = std::make_shared<std::string>(std::move(chunk));
  return RunOnIo([this, data](std::shared_ptr<std::promise<bool>> done) {
    Arm(server_->options_.write_timeout, [this] { Close(); });
    auto written = [self = shared_from_this(), data, done](beast::error_code ec, std::size_t) {
      if (self->state_ == State::kClosed) return done->set_value(false);
      self->Disarm();
      if (ec) self->Close();
      done->set_value(!ec);
    };
    if (stream_chunked_) {
      asio::async_write(socket_, http::make_chunk(asio::buffer(*data)), std::move(written));
    } else {
      asio::async_write(socket_, asio::buffer(*data), std::move(written));
    }
  });
}

void HttpConnection::PostStreamEnd() {
  asio::post(server_->io_, [self = shared_from_this()] {
    if (self->state_ != State::kHandling) return;
    if (!self->stream_chunked_) return self->Close();  // HTTP/1.0: the close ends the body
    self->Arm(self->server_->options_.write_timeout, [raw = self.get()] { raw->Close(); });
    asio::async_write(self->socket_, http::make_chunk_last(), [self](beast::error_code ec, std::size_t) {
      if (self->state_ == State::kClosed) return;
      self->Disarm();
      if (ec) return self->Close();
      self->RequestDone(self->keep_alive_);
    });
  });
}

// ---------------------------------------------------------------- HttpExchange

HttpExchange::HttpExchange(std::shared_ptr<HttpConnection> connection) : connection_(std::move(connection)) {}

HttpExchange::~HttpExchange() {
  if (!responded_) {
    Respond(ErrorResponse(500, "server_error", "the request failed inside the server", "internal_error"));
  } else if (streaming_) {
    EndStream();
  }
}

void HttpExchange::Respond(HttpResponse response) {
  if (responded_) return;
  responded_ = true;
  connection_->PostRespond(std::move(response));
}

bool HttpExchange::StartStream(int status, std::string content_type,
                               std::vector<std::pair<std::string, std::string>> headers) {
  if (responded_) return false;
  responded_ = true;
  streaming_ = true;
  failed_ = !connection_->PostStreamHeader(status, std::move(content_type), std::move(headers));
  return !failed_;
}

bool HttpExchange::Write(absl::string_view chunk) {
  if (!streaming_ || ended_ || failed_) return false;
  failed_ = !connection_->PostChunk(std::string(chunk));
  return !failed_;
}

void HttpExchange::EndStream() {
  if (!streaming_ || ended_) return;
  ended_ = true;
  if (!failed_) connection_->PostStreamEnd();
}

bool HttpExchange::ClientGone() const { return connection_->gone(); }

bool HttpExchange::Reserve(int64_t bytes) { return connection_->Reserve(bytes); }

// ---------------------------------------------------------------- the server

absl::Status HttpTransport::Impl::Bind() {
  boost::system::error_code ec;
  const std::string host = options_.host == "localhost" ? "127.0.0.1" : options_.host;
  const asio::ip::address address = asio::ip::make_address(host, ec);
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat("--http_listen: \"", options_.host, "\" is not an IP address"));
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(options_.port));
  auto fail = [&](absl::string_view step) {
    return absl::UnavailableError(
        absl::StrCat("--http_listen: cannot ", step, " ", options_.host, ":", options_.port, ": ", ec.message()));
  };
  acceptor_.open(endpoint.protocol(), ec);
  if (ec) return fail("open a socket for");
  // Rebinding a port in TIME_WAIT after a restart, never sharing a live
  // listener: on Linux SO_REUSEADDR refuses a port another socket listens
  // on, and SO_REUSEPORT (which would share it) is never set.
  acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (ec) return fail("set SO_REUSEADDR on");
  acceptor_.bind(endpoint, ec);
  if (ec) return fail("bind");
  acceptor_.listen(options_.listen_backlog, ec);
  if (ec) return fail("listen on");
  port_ = acceptor_.local_endpoint(ec).port();
  return absl::OkStatus();
}

void HttpTransport::Impl::Accept() {
  acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
      // EMFILE and the like: wait for descriptors to free, then go on.
      LOG_WARNING("HTTP: accept failed (", ec.message(), "); retrying in 100 ms");
      accept_retry_.expires_after(std::chrono::milliseconds(100));
      accept_retry_.async_wait([this](beast::error_code wait_ec) {
        if (!wait_ec && acceptor_.is_open()) Accept();
      });
      return;
    }
    OnAccepted(std::move(socket));
  });
}

void HttpTransport::Impl::OnAccepted(tcp::socket socket) {
  boost::system::error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);
  socket.set_option(asio::socket_base::send_buffer_size(kSendBufferBytes), ignored);
  auto connection = std::make_shared<HttpConnection>(this, std::move(socket));
  connections_.push_back(connection);
  connection->slot() = std::prev(connections_.end());
  ++open_;
  connection->Start();
  if (static_cast<int>(connections_.size()) > options_.max_open_connections && !EvictIdlest()) {
    accept_paused_ = true;  // the kernel's backlog holds the next ones
    return;
  }
  Accept();
}

// Closes the connection that has waited longest without a request in a
// handler, a newly accepted one excepted; those idle between requests go
// before those still sending one. False when every one is busy.
bool HttpTransport::Impl::EvictIdlest() {
  HttpConnection* victim = nullptr;
  const HttpConnection* newest = connections_.back().get();
  auto rank = [](const HttpConnection* c) { return std::make_pair(!c->idle_between_requests(), c->since()); };
  for (const auto& c : connections_) {
    if (c.get() == newest) continue;
    if (c->state() != HttpConnection::State::kReadingHeader && c->state() != HttpConnection::State::kReadingBody) {
      continue;
    }
    if (victim == nullptr || rank(c.get()) < rank(victim)) victim = c.get();
  }
  if (victim == nullptr) return false;
  ++idle_evictions_;
  victim->Close();
  return true;
}

void HttpTransport::Impl::Forget(HttpConnection* connection) {
  connections_.erase(connection->slot());
  --open_;
  if (accept_paused_ && !stopped_ && static_cast<int>(connections_.size()) <= options_.max_open_connections) {
    accept_paused_ = false;
    Accept();
  }
}

void HttpTransport::Impl::StartIo() {
  Accept();
  io_thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "http-io");
    auto guard = asio::make_work_guard(io_);
    io_.run();
  });
}

void HttpTransport::Impl::Drain() {
  if (draining_.exchange(true)) return;
  asio::post(io_, [this] {
    std::vector<std::shared_ptr<HttpConnection>> idle;
    for (const auto& c : connections_) {
      if (c->idle_between_requests()) idle.push_back(c);
    }
    for (const auto& c : idle) c->Close();
  });
}

void HttpTransport::Impl::Stop() {
  if (stopped_.exchange(true)) return;
  Drain();
  control_.Stop();
  request_.Stop();
  if (!io_thread_.joinable()) return;
  asio::post(io_, [this] {
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    accept_retry_.cancel();
    std::vector<std::shared_ptr<HttpConnection>> all(connections_.begin(), connections_.end());
    for (const auto& c : all) c->Close();
    io_.stop();
  });
  io_thread_.join();
}

HttpTransportStats HttpTransport::Impl::Stats() const {
  HttpTransportStats s;
  s.open_connections = open_.load();
  s.requests_in_handlers = control_.busy() + request_.busy();
  s.requests_queued = request_.queued();
  s.memory_in_use_bytes = memory_in_use_.load();
  s.memory_limit_bytes = options_.max_request_memory_bytes;
  s.header_timeouts = header_timeouts_.load();
  s.body_timeouts = body_timeouts_.load();
  s.idle_evictions = idle_evictions_.load();
  s.overload_refusals = overload_refusals_.load();
  s.clients_gone = clients_gone_.load();
  return s;
}

HttpTransport::HttpTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpTransport::~HttpTransport() { Stop(); }

absl::StatusOr<std::unique_ptr<HttpTransport>> HttpTransport::Create(HttpTransportOptions options,
                                                                     HttpTransportHooks hooks) {
  if (options.max_request_threads < 1) return absl::InvalidArgumentError("HTTP: max_request_threads must be >= 1");
  if (options.control_threads < 1) return absl::InvalidArgumentError("HTTP: control_threads must be >= 1");
  if (options.max_queued_requests < 0) return absl::InvalidArgumentError("HTTP: max_queued_requests must be >= 0");
  if (options.max_open_connections < 1) return absl::InvalidArgumentError("HTTP: max_open_connections must be >= 1");
  if (options.max_body_bytes < 1) return absl::InvalidArgumentError("HTTP: max_body_bytes must be >= 1");
  if (options.max_request_memory_bytes < static_cast<int64_t>(options.max_body_bytes)) {
    return absl::InvalidArgumentError("HTTP: max_request_memory_bytes must hold at least one largest body");
  }
  for (absl::Duration d : {options.header_timeout, options.body_timeout, options.write_timeout}) {
    if (d <= absl::ZeroDuration()) return absl::InvalidArgumentError("HTTP: timeouts must be > 0");
  }
  auto impl = std::make_unique<Impl>(std::move(options), std::move(hooks));
  if (absl::Status bound = impl->Bind(); !bound.ok()) return bound;
  impl->StartIo();
  return std::unique_ptr<HttpTransport>(new HttpTransport(std::move(impl)));
}

int HttpTransport::port() const { return impl_->port_; }
const HttpTransportOptions& HttpTransport::options() const { return impl_->options_; }
void HttpTransport::Drain() { impl_->Drain(); }
void HttpTransport::Stop() { impl_->Stop(); }
HttpTransportStats HttpTransport::Stats() const { return impl_->Stats(); }

}  // namespace tandem
