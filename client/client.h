// The C++ SDK for a tandem server (tandem.v1.Inference over gRPC): what a
// program links (target tandem_sdk: protos + gRPC + absl, no engine) to
// generate text, run beam search and read the model and server figures.
//
//   auto client = tandem::sdk::Client::Connect("unix:/run/user/1000/tandem-me/server.sock");
//   if (!client.ok()) ...
//   tandem::sdk::GenerateOptions options{.prompt = "The licensee may", .max_tokens = 32};
//   auto result = (*client)->Generate(options, [](const tandem::sdk::StreamedToken& t) {
//     std::cout << t.text << std::flush;
//   });
//
// Errors are the server's: the gRPC status code (same numbering as
// absl::StatusCode) and message, unchanged; e.g. InvalidArgument naming the
// field at fault, Unavailable when the server cannot be reached.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client_types.h"
#include "tandem/v1/inference.grpc.pb.h"

namespace tandem::sdk {

struct ClientOptions {
  // How long Connect waits for the server to accept connections and answer.
  absl::Duration connect_timeout = absl::Seconds(10);
  // Default deadlines when CallOptions::timeout is zero: short requests
  // (tokenize, info, stats) and whole generations / beam searches.
  absl::Duration call_timeout = absl::Seconds(30);
  absl::Duration generate_timeout = absl::Hours(1);
};

// grpc::Status -> absl::Status with the same code and message.
absl::Status FromGrpcStatus(const grpc::Status& status);

// One Generate call in flight, read token by token. Owns the call. Next is
// called from one thread at a time; Cancel may be called from any thread.
// Destroying an unfinished stream cancels it.
class GenerateStream {
 public:
  ~GenerateStream();
  GenerateStream(const GenerateStream&) = delete;
  GenerateStream& operator=(const GenerateStream&) = delete;

  // The next token; std::nullopt once the server has sent its last message
  // (result() is then complete). An error is the call's status (Cancelled
  // after Cancel, DeadlineExceeded, or the server's error).
  absl::StatusOr<std::optional<StreamedToken>> Next();
  // Asks the server to stop; the next Next returns Cancelled (tokens already
  // received are still returned first).
  void Cancel();
  // Every token returned so far; after Next returned std::nullopt also the
  // finish reason, usage and seed.
  const GenerateResult& result() const { return result_; }
  bool done() const { return done_; }

 private:
  friend class Client;
  GenerateStream();
  absl::Status Finish();

  std::unique_ptr<grpc::ClientContext> context_;
  // Raw messages, parsed by Next (see StreamReader in client.cc).
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader_;
  std::deque<StreamedToken> pending_;  // received, not yet returned by Next
  GenerateResult result_;
  bool last_message_ = false;  // the server's done message has arrived
  bool done_ = false;          // ... and Next has returned every token
  bool finished_ = false;      // reader_->Finish() has been called
  absl::Status status_;        // the call's final status, once finished_
};

// A connection to one server (one gRPC channel). Thread-safe: any thread may
// call any method, concurrently.
class Client {
 public:
  // target: "unix:/path/to/server.sock" or "host:port". Waits up to
  // options.connect_timeout for the server to answer; Unavailable naming the
  // target otherwise.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& target, const ClientOptions& options = {});
  ~Client();

  using TokenCallback = std::function<void(const StreamedToken&)>;
  using ProgressCallback = std::function<void(const BeamProgress&)>;

  // Generates to the end; on_token (optional) sees each token as it arrives.
  absl::StatusOr<GenerateResult> Generate(const GenerateOptions& options, const TokenCallback& on_token = {},
                                          const CallOptions& call = {});
  // Starts a generation to be read token by token.
  absl::StatusOr<std::unique_ptr<GenerateStream>> GenerateStreaming(const GenerateOptions& options,
                                                                    const CallOptions& call = {});
  // on_progress (optional; asks the server to stream progress) sees every step.
  absl::StatusOr<BeamSearchResult> BeamSearch(const BeamSearchOptions& options,
                                              const ProgressCallback& on_progress = {}, const CallOptions& call = {});

  absl::StatusOr<TokenizeResult> Tokenize(const std::string& text, std::optional<bool> add_bos = std::nullopt,
                                          const CallOptions& call = {});
  absl::StatusOr<std::string> Detokenize(const std::vector<int32_t>& ids, const CallOptions& call = {});
  absl::StatusOr<ModelInfo> Info(const CallOptions& call = {});
  absl::StatusOr<ServerStats> Stats(const CallOptions& call = {});

  const std::string& target() const { return target_; }

 private:
  Client(std::string target, ClientOptions options, std::shared_ptr<grpc::Channel> channel);
  // A context whose deadline is call.timeout, or `fallback` when that is zero.
  std::unique_ptr<grpc::ClientContext> NewContext(const CallOptions& call, absl::Duration fallback) const;

  std::string target_;
  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Inference::Stub> stub_;  // unary calls
  // The streaming calls, read as raw bytes (see client.cc).
  grpc::internal::RpcMethod generate_method_;
  grpc::internal::RpcMethod beam_search_method_;
};

}  // namespace tandem::sdk
