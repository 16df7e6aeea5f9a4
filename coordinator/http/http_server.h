// The OpenAI-compatible HTTP front end of tandem-server, beside the gRPC
// InferenceService over the same Scheduler: requests become the same
// SubmitGenerate / SubmitBeamSearch jobs (prompts checked by the shared
// coordinator/serving.h, every field by the scheduler's own validation), and
// the jobs' RequestStream events become OpenAI's JSON or server-sent events.
//
//   POST /v1/chat/completions, /v1/completions   (stream or not)
//   GET  /v1/models
//   POST /tokenize, /detokenize, /apply-template  (llama.cpp's server shapes)
//   GET  /health   200 ready; 503 loading, or a CPU worker down
//   GET  /metrics  Prometheus text
//   GET  /v1/tandem/placement  where every expert is, per layer (placement_json.h)
//   GET  /         the web page: chat playground and the experts at work (web/index.html)
//
// It listens from Create on, before the model is loaded: until Serve,
// /health and /metrics say "loading", / serves the page, and everything
// else answers 503.
// A streaming client that goes away cancels its requests (the scheduler
// frees their KV cache at its next step). Bounds: the request body
// (max_body_bytes, else 413), the requests handled at once
// (max_connections worker threads; further connections wait in the accept
// queue), and per stream at most one event's chunk is buffered (the socket
// write blocks until the client reads).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/http/chat_setup.h"
#include "coordinator/scheduler.h"
#include "coordinator/serving.h"

namespace httplib {
class Server;
class Request;
class Response;
class DataSink;
}  // namespace httplib

namespace tandem {

struct HttpListenAddress {
  std::string host;
  int port = 0;  // 0: any free port
};

// --http_listen: PORT (on 127.0.0.1) or HOST:PORT ([::1]:PORT for IPv6).
// InvalidArgument naming the flag for a malformed value, and for a host
// that is not loopback unless `allow_remote`.
absl::StatusOr<HttpListenAddress> ParseHttpListen(const std::string& flag, bool allow_remote);

struct HttpServerOptions {
  HttpListenAddress listen;
  std::string served_model_name = "tandem";  // /v1/models and every response's "model"
  int max_connections = 64;                  // requests handled at once
  size_t max_body_bytes = 8 << 20;
  int32_t default_max_tokens = 512;  // when neither the request nor generation_config says
  // A client that takes none of a write for this long is dropped (its
  // request stopped, its connection closed), so a client that never reads
  // an event stream holds a connection thread no longer than that.
  // tandem-server: --max_stall_s plus a second, so the scheduler's stall
  // limit (RESOURCE_EXHAUSTED) decides first.
  absl::Duration write_timeout = absl::Seconds(30);
};

// Owns the HTTP server and its threads. Serve and Stop may be called from
// any thread; the handlers run on the server's worker threads.
class HttpServer {
 public:
  // Binds the address and starts answering (in the loading state).
  // Unavailable when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Create(HttpServerOptions options);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Ready: borrows the model and scheduler until Stop.
  void Serve(const Model* model, Scheduler* scheduler, ServingOptions serving, std::unique_ptr<ChatSetup> chat);
  // Cancels the streams in flight, closes the listening socket and joins
  // the threads. Idempotent.
  void Stop();

  std::string address() const;  // host:port as bound
  int port() const { return port_; }

  struct Ready;
  struct Job;

 private:
  explicit HttpServer(HttpServerOptions options);
  std::shared_ptr<const Ready> ready() const;
  void Route();

  void Completions(int endpoint, const httplib::Request& req, httplib::Response& res);
  void Models(httplib::Response& res);
  void Tokenize(const httplib::Request& req, httplib::Response& res);
  void Detokenize(const httplib::Request& req, httplib::Response& res);
  void ApplyTemplate(const httplib::Request& req, httplib::Response& res);
  void Health(httplib::Response& res);
  void Placement(httplib::Response& res);
  void Metrics(httplib::Response& res);

  bool RunStream(Job& job, httplib::DataSink& sink);
  void Collect(Job& job);
  void CountResponse(const std::string& path, int status);

  HttpServerOptions options_;
  std::unique_ptr<httplib::Server> server_;
  int port_ = 0;
  const int64_t created_unix_;
  std::atomic<bool> stopping_{false};

  mutable std::mutex mu_;
  std::shared_ptr<const Ready> ready_;                        // guarded by mu_
  std::map<std::pair<std::string, int>, int64_t> responses_;  // guarded by mu_

  std::thread thread_;  // listen loop; last, starts once the rest exists
};

}  // namespace tandem
