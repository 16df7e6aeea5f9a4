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
// The transport (http_transport.h) bounds what any client can make the
// server hold or wait for; access (http_access.h) decides from the header
// who may call; request bodies are parsed under JSON limits
// (bounded_json.h). A client that goes away, streaming or not, cancels its
// requests (the scheduler frees their KV cache at its next step).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/generation/scheduler.h"
#include "coordinator/serving/http/bounded_json.h"
#include "coordinator/serving/http/chat_setup.h"
#include "coordinator/serving/http/http_access.h"
#include "coordinator/serving/http/http_transport.h"
#include "coordinator/serving/http/large_text_turns.h"
#include "coordinator/serving/serving.h"

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
  int32_t default_max_tokens = 512;          // when neither the request nor generation_config says
  // A thinking model's <think> text as reasoning_content, apart from the
  // content (when its chat template thinks); false: left in the content.
  bool reasoning_content = true;
  // Connections, threads, timeouts and byte limits. Its write_timeout: a
  // client that takes none of a write for this long is dropped (its
  // request stopped); tandem-server sets --max_stall_s plus a second, so
  // the scheduler's stall limit (RESOURCE_EXHAUSTED) decides first.
  HttpTransportOptions transport;
  HttpAccessOptions access;  // its listen_host is filled from `listen`
  JsonLimits json;           // every request body
};

// Owns the HTTP server and its threads. Serve, Drain and Stop may be called
// from any thread; the handlers run on the transport's lane threads.
class HttpServer {
 public:
  // Binds the address and starts answering (in the loading state).
  // Unavailable when the address cannot be bound (in use, say).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Create(HttpServerOptions options);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Ready: borrows the model and scheduler until Stop.
  void Serve(const Model* model, Scheduler* scheduler, ServingOptions serving, std::unique_ptr<ChatSetup> chat);
  // Shutting down: new requests are answered 503 at once; requests in
  // flight get up to `grace` to finish, then streams end with an error
  // event and [DONE] and waiting requests with 503. Returns when every
  // handler has returned and every connection is closed. Idempotent.
  void Stop(absl::Duration grace = absl::ZeroDuration());

  std::string address() const;  // host:port as bound
  int port() const { return port_; }
  HttpTransportStats TransportStats() const { return transport_->Stats(); }

  struct Ready;
  struct Job;
  struct Call;

 private:
  explicit HttpServer(HttpServerOptions options);
  std::shared_ptr<const Ready> ready() const;
  std::optional<HttpResponse> Admit(const HttpRequest& head, HttpLane* lane);
  void Handle(HttpRequest& request, HttpExchange& exchange);

  void Completions(int endpoint, Call& call);
  void Models(Call& call);
  void Tokenize(Call& call);
  void Detokenize(Call& call);
  void ApplyTemplate(Call& call);
  void Health(Call& call);
  void Placement(Call& call);
  void Metrics(Call& call);
  void Page(Call& call);

  absl::StatusOr<nlohmann::ordered_json> Body(Call& call);
  void RunStream(Job& job, Call& call);
  bool Collect(Job& job, Call& call);
  void CountResponse(const std::string& path, int status);

  const HttpServerOptions options_;
  const HttpAccess access_;
  const int64_t created_unix_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> jobs_in_flight_{0};
  mutable LargeTextTurns large_texts_;  // prompts and /tokenize texts over 256 KiB take turns

  mutable absl::Mutex mu_;
  std::shared_ptr<const Ready> ready_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, int>, int64_t> responses_ ABSL_GUARDED_BY(mu_);

  std::unique_ptr<HttpTransport> transport_;  // last: its threads call the members above
};

}  // namespace tandem
