#include "client/client.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include <grpcpp/support/proto_buffer_reader.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"

namespace tandem::sdk {
namespace {

FinishReason FromProto(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_EOS: return FinishReason::kEos;
    case v1::FINISH_REASON_STOP_ID: return FinishReason::kStopId;
    case v1::FINISH_REASON_STOP_STRING: return FinishReason::kStopString;
    case v1::FINISH_REASON_MAX_TOKENS: return FinishReason::kMaxTokens;
    default: return FinishReason::kUnspecified;
  }
}

StreamedToken FromProto(const v1::Token& t) {
  StreamedToken out{.id = t.id(), .text = t.text(), .logprob = t.logprob()};
  for (const v1::TopLogprob& lp : t.top_logprobs()) {
    out.top_logprobs.push_back({.id = lp.id(), .text = lp.text(), .logprob = lp.logprob()});
  }
  return out;
}

Usage FromProto(const v1::Usage& u) {
  return {.prompt_tokens = u.prompt_tokens(),
          .generated_tokens = u.generated_tokens(),
          .queue_ms = u.queue_ms(),
          .time_to_first_token_ms = u.time_to_first_token_ms(),
          .mean_inter_token_ms = u.mean_inter_token_ms(),
          .p50_inter_token_ms = u.p50_inter_token_ms(),
          .p99_inter_token_ms = u.p99_inter_token_ms(),
          .tokens_per_s = u.tokens_per_s(),
          .total_ms = u.total_ms()};
}

BeamSequence FromProto(const v1::BeamSequence& s) {
  return {.ids = {s.ids().begin(), s.ids().end()},
          .text = s.text(),
          .score = s.score(),
          .sum_logprob = s.sum_logprob(),
          .finish_reason = FromProto(s.finish_reason())};
}

ModelInfo FromProto(const v1::ModelInfo& m) {
  return {.model_dir = m.model_dir(),
          .architecture = m.architecture(),
          .vocab_size = m.vocab_size(),
          .hidden_size = m.hidden_size(),
          .intermediate_size = m.intermediate_size(),
          .num_layers = m.num_layers(),
          .num_experts = m.num_experts(),
          .experts_per_token = m.experts_per_token(),
          .max_context = m.max_context(),
          .parameters = m.parameters(),
          .expert_bytes = m.expert_bytes(),
          .fingerprint = m.fingerprint(),
          .has_tokenizer = m.has_tokenizer(),
          .bos_id = m.bos_id(),
          .eos_ids = {m.eos_ids().begin(), m.eos_ids().end()},
          .placement_summary = m.placement_summary(),
          .max_sequences = m.max_sequences(),
          .kv_cache_tokens = m.kv_cache_tokens()};
}

ServerStats FromProto(const v1::ServerStats& s) {
  ServerStats out{.uptime_s = s.uptime_s(),
                  .requests_total = s.requests_total(),
                  .requests_active = s.requests_active(),
                  .requests_waiting = s.requests_waiting(),
                  .requests_succeeded = s.requests_succeeded(),
                  .requests_failed = s.requests_failed(),
                  .requests_cancelled = s.requests_cancelled(),
                  .requests_rejected = s.requests_rejected(),
                  .prompt_tokens = s.prompt_tokens(),
                  .generated_tokens = s.generated_tokens(),
                  .steps = s.steps(),
                  .tokens_per_s = s.tokens_per_s(),
                  .window_s = s.window_s(),
                  .mean_step_ms = s.mean_step_ms(),
                  .mean_batch_rows = s.mean_batch_rows(),
                  .kv_blocks_in_use = s.kv_blocks_in_use(),
                  .kv_blocks_total = s.kv_blocks_total(),
                  .kv_block_size = s.kv_block_size(),
                  .active_sequences = s.active_sequences(),
                  .orchestrator_json = s.orchestrator_json(),
                  .cpu = s.cpu(),
                  .cpu_flags = s.cpu_flags(),
                  .isa = s.isa(),
                  .kernel_plan = s.kernel_plan(),
                  .kernels = s.kernels()};
  for (const v1::LayerTiming& l : s.layers()) {
    out.layers.push_back({.layer = l.layer(),
                          .attention_ms = l.attention_ms(),
                          .router_ms = l.router_ms(),
                          .experts_ms = l.experts_ms()});
  }
  for (const v1::WorkerHealth& w : s.workers()) {
    out.workers.push_back({.address = w.address(), .healthy = w.healthy(), .detail = w.detail()});
  }
  return out;
}

v1::GenerateRequest ToProto(const GenerateOptions& o) {
  v1::GenerateRequest r;
  r.set_prompt(o.prompt);
  r.mutable_prompt_ids()->Add(o.prompt_ids.begin(), o.prompt_ids.end());
  if (o.add_bos) r.set_add_bos(*o.add_bos);
  if (o.max_tokens) r.set_max_tokens(*o.max_tokens);
  if (o.temperature) r.set_temperature(*o.temperature);
  if (o.top_k) r.set_top_k(*o.top_k);
  if (o.top_p) r.set_top_p(*o.top_p);
  if (o.seed) r.set_seed(*o.seed);
  for (const std::string& s : o.stop) r.add_stop(s);
  r.mutable_stop_ids()->Add(o.stop_ids.begin(), o.stop_ids.end());
  r.set_ignore_eos(o.ignore_eos);
  r.set_logprobs(o.logprobs);
  r.mutable_logit_bias()->insert(o.logit_bias.begin(), o.logit_bias.end());
  return r;
}

v1::BeamSearchRequest ToProto(const BeamSearchOptions& o, bool stream_progress) {
  v1::BeamSearchRequest r;
  r.set_prompt(o.prompt);
  r.mutable_prompt_ids()->Add(o.prompt_ids.begin(), o.prompt_ids.end());
  if (o.add_bos) r.set_add_bos(*o.add_bos);
  r.set_beam_width(o.beam_width);
  if (o.max_tokens) r.set_max_tokens(*o.max_tokens);
  if (o.length_penalty) r.set_length_penalty(*o.length_penalty);
  r.set_early_stopping(o.early_stopping);
  if (o.num_return_sequences) r.set_num_return_sequences(*o.num_return_sequences);
  r.mutable_stop_ids()->Add(o.stop_ids.begin(), o.stop_ids.end());
  r.set_ignore_eos(o.ignore_eos);
  r.set_stream_progress(stream_progress);
  r.mutable_logit_bias()->insert(o.logit_bias.begin(), o.logit_bias.end());
  return r;
}

// The socket path of a unix target ("unix:PATH", "unix://PATH"); empty for TCP.
std::string UnixPath(const std::string& target) {
  if (!absl::StartsWith(target, "unix:")) return "";
  return target.substr(absl::StartsWith(target, "unix://") ? 7 : 5);
}

bool TrustedUid(uid_t uid) { return uid == geteuid() || uid == 0; }

// A prompt goes to a unix socket only when the socket and its folder are
// this user's or root's (and no one else may replace the socket): a socket
// another user put where our server's should be would receive the prompts.
absl::Status CheckUnixTarget(const std::string& target) {
  if (absl::StartsWith(target, "unix-abstract:")) {
    return absl::PermissionDeniedError(
        absl::StrCat(target, ": abstract unix sockets have no owner to check; tandem-server never listens on one"));
  }
  const std::string path = UnixPath(target);
  if (path.empty() && absl::StartsWith(target, "unix:")) {
    return absl::InvalidArgumentError(absl::StrCat("\"", target, "\": no socket path after unix:"));
  }
  if (path.empty()) return absl::OkStatus();
  if (path[0] == '@') {
    return absl::PermissionDeniedError(
        absl::StrCat(target, ": abstract unix sockets have no owner to check; tandem-server never listens on one"));
  }
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return absl::OkStatus();  // absent: the connect fails and says so
  struct stat link {};
  if (lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode) && !TrustedUid(link.st_uid)) {
    return absl::PermissionDeniedError(absl::StrCat(path, " is a symlink of uid ", link.st_uid,
                                                    ": refusing to send requests through another user's link"));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a socket: not a tandem server address"));
  }
  if (!TrustedUid(st.st_uid)) {
    return absl::PermissionDeniedError(absl::StrCat(
        path, " belongs to uid ", st.st_uid, ", not to you (uid ", geteuid(),
        ") or root: refusing to send requests to another user's socket (it may be posing as tandem-server)"));
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  struct stat dir {};
  if (stat(parent.empty() ? "." : parent.c_str(), &dir) == 0) {
    const bool others_write = (dir.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (dir.st_mode & S_ISVTX) == 0;
    if (!TrustedUid(dir.st_uid) || others_write) {
      return absl::PermissionDeniedError(absl::StrFormat(
          "%s lies in %s (uid %d, mode %04o), which another user may write to: the socket could be replaced; "
          "refusing to send requests there",
          path, parent.string(), dir.st_uid, dir.st_mode & 07777));
    }
  }
  return absl::OkStatus();
}

// Why a connection failed, for the error message, from a connect() of our
// own to the socket: absent, not ours to open, stale, or slow.
std::string ConnectHint(const std::string& target) {
  const std::string path = UnixPath(target);
  if (path.empty()) return "is tandem-server running and listening there?";
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof(address.sun_path)) return absl::StrCat(path, " is too long for a unix socket path");
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::StrCat("cannot create a socket: ", std::strerror(errno));
  const int err = connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0 ? 0 : errno;
  close(fd);
  struct stat st {};
  const bool have = stat(path.c_str(), &st) == 0;
  switch (err) {
    case ENOENT: return absl::StrCat("no socket at ", path, ": is tandem-server running?");
    case EACCES:
    case EPERM:
      return have ? absl::StrFormat(
                        "permission denied opening %s (owned by uid %d, mode %04o; you are uid %d): "
                        "the server runs as another user, whose socket only they may use",
                        path, st.st_uid, st.st_mode & 07777, geteuid())
                  : absl::StrCat("permission denied reaching ", path, ": a folder on the way is not yours to enter");
    case ECONNREFUSED:
      return absl::StrCat(path,
                          " exists but nothing listens on it: the socket of a server that has exited "
                          "(restart tandem-server)");
    case 0:
    case EAGAIN:
      return absl::StrCat(path, " accepts connections but did not answer in time: is tandem-server still starting?");
    default: return absl::StrCat("cannot connect to ", path, ": ", std::strerror(err));
  }
}

// The streaming calls are read as raw bytes and parsed here. With the typed
// reader, a message that does not parse (a string field with invalid UTF-8,
// say) makes Read return false as if the stream had ended, and Finish then
// waits for ever for the unread rest of the stream.
constexpr char kGenerateMethod[] = "/tandem.v1.Inference/Generate";
constexpr char kBeamSearchMethod[] = "/tandem.v1.Inference/BeamSearch";

template <class Request>
std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> StartStream(grpc::ChannelInterface* channel,
                                                                  const grpc::internal::RpcMethod& method,
                                                                  grpc::ClientContext* context,
                                                                  const Request& request) {
  return std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>>(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel, method, context, request));
}

// The next message: false at the end of the stream; Internal, the call
// cancelled, when the message does not parse.
template <class Message>
absl::StatusOr<bool> ReadMessage(grpc::ClientReader<grpc::ByteBuffer>& reader, grpc::ClientContext& context,
                                 Message* message) {
  grpc::ByteBuffer buffer;
  if (!reader.Read(&buffer)) return false;
  grpc::ProtoBufferReader bytes(&buffer);
  if (message->ParseFromZeroCopyStream(&bytes)) return true;
  context.TryCancel();
  return absl::InternalError(absl::StrCat("a ", Message::descriptor()->name(), " from the server does not parse (",
                                          buffer.Length(), " bytes; a string field with invalid UTF-8?)"));
}

// Reads what is left (Finish may only be called then) and returns the call's status.
absl::Status FinishStream(grpc::ClientReader<grpc::ByteBuffer>& reader) {
  grpc::ByteBuffer ignored;
  while (reader.Read(&ignored)) {
  }
  return FromGrpcStatus(reader.Finish());
}

}  // namespace

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kEos: return "eos";
    case FinishReason::kStopId: return "stop_id";
    case FinishReason::kStopString: return "stop_string";
    case FinishReason::kMaxTokens: return "max_tokens";
    case FinishReason::kUnspecified: break;
  }
  return "unspecified";
}

std::vector<int32_t> GenerateResult::ids() const {
  std::vector<int32_t> out;
  out.reserve(tokens.size());
  for (const StreamedToken& t : tokens) out.push_back(t.id);
  return out;
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  const int code = static_cast<int>(status.error_code());
  // gRPC and absl number their codes the same (0 OK .. 16 UNAUTHENTICATED).
  if (code < 0 || code > 16) return absl::UnknownError(status.error_message());
  return absl::Status(static_cast<absl::StatusCode>(code), status.error_message());
}

// ---- GenerateStream -----------------------------------------------------

GenerateStream::GenerateStream() = default;

GenerateStream::~GenerateStream() {
  if (!finished_ && reader_) {
    context_->TryCancel();
    Finish().IgnoreError();  // the caller gave up on the stream and its status
  }
}

void GenerateStream::Cancel() { context_->TryCancel(); }

absl::Status GenerateStream::Finish() {
  if (finished_) return status_;
  finished_ = true;
  status_ = FinishStream(*reader_);
  return status_;
}

absl::StatusOr<std::optional<StreamedToken>> GenerateStream::Next() {
  if (done_) return std::nullopt;
  while (pending_.empty()) {
    if (last_message_) {
      absl::Status status = Finish();
      // A Cancel that raced the last message cancelled nothing.
      if (!status.ok() && !absl::IsCancelled(status)) return status;
      done_ = true;
      return std::nullopt;
    }
    if (finished_) return status_;
    v1::GenerateResponse response;
    absl::StatusOr<bool> read = ReadMessage(*reader_, *context_, &response);
    if (!read.ok() || !*read) {
      absl::Status finished = Finish();
      if (!read.ok()) {
        status_ = read.status();
      } else if (finished.ok()) {
        status_ = absl::UnavailableError("the server ended the Generate stream without its final message");
      }
      return status_;
    }
    for (const v1::Token& token : response.tokens()) pending_.push_back(FromProto(token));
    if (response.done()) {
      last_message_ = true;
      result_.finish_reason = FromProto(response.finish_reason());
      result_.usage = FromProto(response.usage());
      result_.seed = response.seed();
    }
  }
  StreamedToken token = std::move(pending_.front());
  pending_.pop_front();
  result_.tokens.push_back(token);
  result_.text += token.text;
  return token;
}

// ---- Client ---------------------------------------------------------------

Client::Client(std::string target, ClientOptions options, std::shared_ptr<grpc::Channel> channel)
    : target_(std::move(target)),
      options_(options),
      channel_(std::move(channel)),
      stub_(v1::Inference::NewStub(channel_)),
      generate_method_(kGenerateMethod, grpc::internal::RpcMethod::SERVER_STREAMING, channel_),
      beam_search_method_(kBeamSearchMethod, grpc::internal::RpcMethod::SERVER_STREAMING, channel_) {}

Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& target, const ClientOptions& options) {
  if (target.empty()) {
    return absl::InvalidArgumentError("empty server address (expected unix:/path/to/server.sock or host:port)");
  }
  TANDEM_RETURN_IF_ERROR(CheckUnixTarget(target));
  grpc::ChannelArguments args;
  // A server that is starting or restarting is found within a tenth of a
  // second, not after gRPC's default reconnect backoff (1 s, growing to 120 s).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  auto channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  if (!channel->WaitForConnected(absl::ToChronoTime(deadline))) {
    return absl::UnavailableError(absl::StrCat("cannot connect to tandem server at ", target, " within ",
                                               absl::FormatDuration(options.connect_timeout), ": ",
                                               ConnectHint(target)));
  }
  std::unique_ptr<Client> client(new Client(target, options, channel));
  // Connected is not serving: GetModelInfo proves a tandem server answers
  // (and not, say, a CPU worker's socket).
  absl::Status last;
  do {
    CallOptions call{.timeout = std::max(deadline - absl::Now(), absl::Milliseconds(100))};
    auto info = client->Info(call);
    if (info.ok()) return client;
    last = info.status();
    if (absl::IsUnimplemented(last)) {
      return absl::FailedPreconditionError(
          absl::StrCat(target, " is not a tandem server (no tandem.v1.Inference service): ", last.message()));
    }
    if (!absl::IsUnavailable(last)) break;
    absl::SleepFor(absl::Milliseconds(50));
  } while (absl::Now() < deadline);
  return absl::Status(last.code(), absl::StrCat("tandem server at ", target, " did not answer: ", last.message()));
}

std::unique_ptr<grpc::ClientContext> Client::NewContext(const CallOptions& call, absl::Duration fallback) const {
  auto context = std::make_unique<grpc::ClientContext>();
  const absl::Duration timeout = call.timeout != absl::ZeroDuration() ? call.timeout : fallback;
  if (timeout != absl::InfiniteDuration()) context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return context;
}

absl::StatusOr<std::unique_ptr<GenerateStream>> Client::GenerateStreaming(const GenerateOptions& options,
                                                                          const CallOptions& call) {
  std::unique_ptr<GenerateStream> stream(new GenerateStream());
  stream->context_ = NewContext(call, options_.generate_timeout);
  stream->reader_ = StartStream(channel_.get(), generate_method_, stream->context_.get(), ToProto(options));
  return stream;
}

absl::StatusOr<GenerateResult> Client::Generate(const GenerateOptions& options, const TokenCallback& on_token,
                                                const CallOptions& call) {
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<GenerateStream> stream, GenerateStreaming(options, call));
  while (true) {
    TANDEM_ASSIGN_OR_RETURN(std::optional<StreamedToken> token, stream->Next());
    if (!token) break;
    if (on_token) on_token(*token);
  }
  return stream->result();
}

absl::StatusOr<BeamSearchResult> Client::BeamSearch(const BeamSearchOptions& options,
                                                    const ProgressCallback& on_progress, const CallOptions& call) {
  auto context = NewContext(call, options_.generate_timeout);
  auto reader = StartStream(channel_.get(), beam_search_method_, context.get(),
                            ToProto(options, /*stream_progress=*/bool(on_progress)));
  BeamSearchResult result;
  bool last_message = false;
  while (true) {
    v1::BeamSearchResponse response;
    absl::StatusOr<bool> read = ReadMessage(*reader, *context, &response);
    if (!read.ok()) {
      FinishStream(*reader).IgnoreError();  // Cancelled: ReadMessage cancelled the call
      return read.status();
    }
    if (!*read) break;
    if (response.has_progress() && on_progress) {
      const v1::BeamProgress& p = response.progress();
      on_progress(
          {.step = p.step(), .live_beams = p.live_beams(), .finished = p.finished(), .best = FromProto(p.best())});
    }
    if (response.done()) {
      last_message = true;
      for (const v1::BeamSequence& s : response.sequences()) result.sequences.push_back(FromProto(s));
      result.usage = FromProto(response.usage());
    }
  }
  TANDEM_RETURN_IF_ERROR(FinishStream(*reader));
  if (!last_message) return absl::UnavailableError("the server ended the BeamSearch stream without its final message");
  return result;
}

absl::StatusOr<TokenizeResult> Client::Tokenize(const std::string& text, std::optional<bool> add_bos,
                                                const CallOptions& call) {
  v1::TokenizeRequest request;
  request.set_text(text);
  if (add_bos) request.set_add_bos(*add_bos);
  v1::TokenizeResponse response;
  auto context = NewContext(call, options_.call_timeout);
  TANDEM_RETURN_IF_ERROR(FromGrpcStatus(stub_->Tokenize(context.get(), request, &response)));
  return TokenizeResult{.ids = {response.ids().begin(), response.ids().end()},
                        .pieces = {response.pieces().begin(), response.pieces().end()}};
}

absl::StatusOr<std::string> Client::Detokenize(const std::vector<int32_t>& ids, const CallOptions& call) {
  v1::DetokenizeRequest request;
  request.mutable_ids()->Add(ids.begin(), ids.end());
  v1::DetokenizeResponse response;
  auto context = NewContext(call, options_.call_timeout);
  TANDEM_RETURN_IF_ERROR(FromGrpcStatus(stub_->Detokenize(context.get(), request, &response)));
  return std::move(*response.mutable_text());
}

absl::StatusOr<ModelInfo> Client::Info(const CallOptions& call) {
  v1::ModelInfo response;
  auto context = NewContext(call, options_.call_timeout);
  TANDEM_RETURN_IF_ERROR(FromGrpcStatus(stub_->GetModelInfo(context.get(), v1::GetModelInfoRequest(), &response)));
  return FromProto(response);
}

absl::StatusOr<ServerStats> Client::Stats(const CallOptions& call) {
  v1::ServerStats response;
  auto context = NewContext(call, options_.call_timeout);
  TANDEM_RETURN_IF_ERROR(FromGrpcStatus(stub_->GetStats(context.get(), v1::GetStatsRequest(), &response)));
  return FromProto(response);
}

}  // namespace tandem::sdk
