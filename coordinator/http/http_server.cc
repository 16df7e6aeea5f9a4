#include "coordinator/http/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <random>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/base/log.h"
#include "common/base/progress.h"
#include "coordinator/http/http_error.h"
#include "coordinator/http/openai_request.h"
#include "coordinator/http/placement_json.h"
#include "coordinator/http/prometheus_metrics.h"
#include "coordinator/http/web_page.h"
#include "coordinator/sampling_defaults.h"
#include "coordinator/utf8_stream.h"

namespace tandem {

using Json = nlohmann::ordered_json;

struct HttpServer::Ready {
  const Model* model = nullptr;
  Scheduler* scheduler = nullptr;
  ServingOptions serving;
  std::unique_ptr<ChatSetup> chat;
};

// One OpenAI request in flight: its choices' streams and what they produced.
struct HttpServer::Job {
  struct Choice {
    std::shared_ptr<RequestStream> stream;
    std::string text;
    std::vector<GeneratedToken> tokens;  // kept for logprobs
    bool done = false;
    absl::Status status;
    FinishReason finish = FinishReason::kMaxTokens;
    RequestUsage usage;
    std::vector<BeamHypothesis> beams;
  };
  std::shared_ptr<const Ready> ready;
  OpenAiRequest request;
  std::string id;
  int64_t created = 0;
  int64_t prompt_tokens = 0;
  std::vector<Choice> choices;
};

namespace {

// How long a streaming handler waits on one choice before looking at the
// others, and how long without output before it writes a keep-alive
// comment (which is also how it notices a client that went away).
constexpr absl::Duration kPoll = absl::Milliseconds(10);
constexpr auto kKeepAlive = std::chrono::seconds(2);
constexpr int kSendBufferBytes = 256 << 10;  // per HTTP connection (the kernel doubles it)

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

void SendJson(httplib::Response& res, int status, const Json& body) {
  res.status = status;
  res.set_content(Dump(body), "application/json");
}

void SendError(httplib::Response& res, const HttpError& error) {
  res.status = error.status;
  res.set_content(error.ToJson(), "application/json");
}

std::string RandomId(std::string_view prefix) {
  static std::mutex mu;
  static std::mt19937_64 rng(std::random_device{}());
  std::lock_guard<std::mutex> lock(mu);
  return absl::StrFormat("%s%016x%08x", prefix, rng(), static_cast<uint32_t>(rng()));
}

std::string_view FinishName(FinishReason reason) { return reason == FinishReason::kMaxTokens ? "length" : "stop"; }

// The request body as JSON, or a 400.
absl::StatusOr<Json> ParseBody(const httplib::Request& req) {
  Json body = Json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return absl::InvalidArgumentError("the request body is not valid JSON");
  if (!body.is_object()) return absl::InvalidArgumentError("the request body must be a JSON object");
  return body;
}

Json TokenBytes(std::string_view piece) {
  Json bytes = Json::array();
  for (unsigned char c : piece) bytes.push_back(static_cast<int>(c));
  return bytes;
}

std::string Piece(const Model& model, int32_t id) {
  return model.tokenizer ? model.tokenizer->PieceText(id) : absl::StrCat("<", id, ">");
}

// OpenAI's logprobs object for `tokens`: chat's {"content": [...]} or
// completions' {"tokens", "token_logprobs", "top_logprobs", "text_offset"}.
Json LogprobsJson(const HttpServer::Job& job, std::span<const GeneratedToken> tokens, size_t text_offset) {
  const Model& model = *job.ready->model;
  if (job.request.endpoint == OpenAiEndpoint::kChat) {
    Json content = Json::array();
    for (const GeneratedToken& t : tokens) {
      const std::string piece = Piece(model, t.id);
      Json top = Json::array();
      for (const auto& [id, logprob] : t.top_logprobs) {
        const std::string p = Piece(model, id);
        top.push_back({{"token", SanitizeUtf8(p)}, {"logprob", logprob}, {"bytes", TokenBytes(p)}});
      }
      content.push_back({{"token", SanitizeUtf8(piece)},
                         {"logprob", t.logprob},
                         {"bytes", TokenBytes(piece)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  Json out = {{"tokens", Json::array()},
              {"token_logprobs", Json::array()},
              {"top_logprobs", Json::array()},
              {"text_offset", Json::array()}};
  for (const GeneratedToken& t : tokens) {
    out["tokens"].push_back(SanitizeUtf8(Piece(model, t.id)));
    out["token_logprobs"].push_back(t.logprob);
    Json top = Json::object();
    for (const auto& [id, logprob] : t.top_logprobs) top[SanitizeUtf8(Piece(model, id))] = logprob;
    out["top_logprobs"].push_back(top);
    out["text_offset"].push_back(text_offset);
    text_offset += t.text.size();
  }
  return out;
}

Json UsageJson(const HttpServer::Job& job) {
  int64_t completion = 0;
  for (const auto& c : job.choices) {
    if (!c.beams.empty()) {
      for (const BeamHypothesis& h : c.beams) completion += static_cast<int64_t>(h.ids.size());
    } else {
      completion += c.usage.generated_tokens;
    }
  }
  return {{"prompt_tokens", job.prompt_tokens},
          {"completion_tokens", completion},
          {"total_tokens", job.prompt_tokens + completion}};
}

Json Envelope(const HttpServer::Job& job, bool chunk) {
  const bool chat = job.request.endpoint == OpenAiEndpoint::kChat;
  return {{"id", job.id},
          {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
          {"created", job.created},
          {"model", job.request.model}};
}

// One streamed chunk of choice `index`: its new text (and logprobs), or its end.
Json ChunkJson(const HttpServer::Job& job, size_t index, const std::string& text, const Json& logprobs,
               const Json& finish_reason) {
  Json choice = {{"index", index}};
  if (job.request.endpoint == OpenAiEndpoint::kChat) {
    choice["delta"] = finish_reason.is_null() ? Json{{"content", text}} : Json::object();
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = finish_reason;
  Json out = Envelope(job, true);
  out["choices"] = Json::array({choice});
  return out;
}

// Applies one event to its choice.
void Absorb(HttpServer::Job::Choice& c, StreamEvent& event) {
  for (GeneratedToken& t : event.tokens) {
    c.text += t.text;
    c.tokens.push_back(std::move(t));
  }
  if (event.done) {
    c.done = true;
    c.status = event.status;
    c.finish = event.finish_reason;
    c.usage = event.usage;
    c.beams = std::move(event.beams);
  }
}

// Cancels every unfinished choice and waits until the scheduler has let go
// of each (its KV blocks freed), as the gRPC front end does.
void CancelAll(HttpServer::Job& job, const absl::Status& reason) {
  for (auto& c : job.choices) {
    if (!c.done) c.stream->Cancel(reason);
  }
  for (auto& c : job.choices) {
    while (!c.done) {
      std::optional<StreamEvent> event = c.stream->Next(absl::Seconds(1));
      if (!event) break;
      Absorb(c, *event);
    }
  }
}

bool IsLoopback(absl::string_view host) {
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

}  // namespace

absl::StatusOr<HttpListenAddress> ParseHttpListen(const std::string& flag, bool allow_remote) {
  HttpListenAddress out;
  absl::string_view port = flag;
  out.host = "127.0.0.1";
  if (const size_t colon = flag.rfind(':'); colon != std::string::npos) {
    out.host = flag.substr(0, colon);
    port = absl::string_view(flag).substr(colon + 1);
    if (absl::StartsWith(out.host, "[") && absl::EndsWith(out.host, "]")) {
      out.host = out.host.substr(1, out.host.size() - 2);
    }
    if (out.host.empty()) out.host = "127.0.0.1";
  }
  if (port.empty() || !absl::SimpleAtoi(port, &out.port) || out.port < 0 || out.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http_listen: \"", flag, "\" is not PORT or HOST:PORT with a port in [0, 65535]"));
  }
  if (!allow_remote && !IsLoopback(out.host)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--http_listen: host \"", out.host,
        "\" is not loopback; the HTTP API has no authentication, so pass --http_allow_remote to expose it"));
  }
  return out;
}

HttpServer::HttpServer(HttpServerOptions options)
    : options_(std::move(options)),
      server_(std::make_unique<httplib::Server>()),
      created_unix_(absl::ToUnixSeconds(absl::Now())) {}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Create(HttpServerOptions options) {
  if (options.max_connections < 1) return absl::InvalidArgumentError("max_connections must be >= 1");
  if (options.write_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("write_timeout must be > 0");
  std::unique_ptr<HttpServer> server(new HttpServer(std::move(options)));
  httplib::Server& s = *server->server_;
  const size_t threads = static_cast<size_t>(server->options_.max_connections);
  s.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s.set_payload_max_length(server->options_.max_body_bytes);
  s.set_read_timeout(30, 0);
  const int64_t write_us = absl::ToInt64Microseconds(server->options_.write_timeout);
  s.set_write_timeout(static_cast<time_t>(write_us / 1000000), static_cast<time_t>(write_us % 1000000));
  s.set_keep_alive_timeout(5);
  // Bounds what the kernel holds for a client that does not read (Linux
  // autotunes a connection's send buffer up to tcp_wmem's 4 MiB otherwise):
  // beyond it the event-stream writer blocks, the scheduler pauses the
  // request and write_timeout drops it. Accepted connections inherit it.
  s.set_socket_options([](int sock) {
    httplib::default_socket_options(sock);
    const int bytes = kSendBufferBytes;
    setsockopt(sock, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  });
  server->Route();
  const HttpListenAddress& at = server->options_.listen;
  if (at.port == 0) {
    server->port_ = s.bind_to_any_port(at.host);
  } else {
    server->port_ = s.bind_to_port(at.host, at.port) ? at.port : -1;
  }
  if (server->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("--http_listen: cannot listen on ", at.host, ":", at.port,
                                               " (address in use, or not an address of this machine?)"));
  }
  HttpServer* self = server.get();
  server->thread_ = std::thread([self] { self->server_->listen_after_bind(); });
  return server;
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Stop() {
  stopping_ = true;
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

std::string HttpServer::address() const {
  return absl::StrCat(
      absl::StrContains(options_.listen.host, ':') ? "[" + options_.listen.host + "]" : options_.listen.host, ":",
      port_);
}

void HttpServer::Serve(const Model* model, Scheduler* scheduler, ServingOptions serving,
                       std::unique_ptr<ChatSetup> chat) {
  auto ready = std::make_shared<Ready>();
  ready->model = model;
  ready->scheduler = scheduler;
  ready->serving = std::move(serving);
  ready->chat = std::move(chat);
  std::lock_guard<std::mutex> lock(mu_);
  ready_ = std::move(ready);
}

std::shared_ptr<const HttpServer::Ready> HttpServer::ready() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ready_;
}

void HttpServer::CountResponse(const std::string& path, int status) {
  static const char* const kPaths[] = {"/",         "/v1/chat/completions", "/v1/completions", "/v1/models",
                                       "/tokenize", "/detokenize",          "/apply-template", "/health",
                                       "/metrics",  "/v1/tandem/placement"};
  const bool known = std::find(std::begin(kPaths), std::end(kPaths), path) != std::end(kPaths);
  std::lock_guard<std::mutex> lock(mu_);
  ++responses_[{known ? path : "other", status}];
}

void HttpServer::Route() {
  httplib::Server& s = *server_;
  // Everything but health and metrics needs the model.
  auto needs_model = [this](auto handler) {
    return [this, handler](const httplib::Request& req, httplib::Response& res) {
      if (ready() == nullptr) {
        SendError(res, HttpError::Make(503, "unavailable_error", "the model is still loading", "", "model_loading"));
        return;
      }
      handler(req, res);
    };
  };
  s.Post("/v1/chat/completions", needs_model([this](const httplib::Request& req, httplib::Response& res) {
           Completions(static_cast<int>(OpenAiEndpoint::kChat), req, res);
         }));
  s.Post("/v1/completions", needs_model([this](const httplib::Request& req, httplib::Response& res) {
           Completions(static_cast<int>(OpenAiEndpoint::kCompletion), req, res);
         }));
  s.Get("/v1/models", needs_model([this](const httplib::Request&, httplib::Response& res) { Models(res); }));
  s.Post("/tokenize", needs_model([this](const httplib::Request& req, httplib::Response& res) { Tokenize(req, res); }));
  s.Post("/detokenize",
         needs_model([this](const httplib::Request& req, httplib::Response& res) { Detokenize(req, res); }));
  s.Post("/apply-template",
         needs_model([this](const httplib::Request& req, httplib::Response& res) { ApplyTemplate(req, res); }));
  s.Get("/v1/tandem/placement",
        needs_model([this](const httplib::Request&, httplib::Response& res) { Placement(res); }));
  // The page works while the model loads: it says so, and polls.
  s.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_header("Cache-Control", "no-cache");
    res.set_content(kWebPageHtml, sizeof(kWebPageHtml) - 1, "text/html; charset=utf-8");
  });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) { Health(res); });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) { Metrics(res); });
  // Every error cpp-httplib answers itself (404, 405, 413, 400) in OpenAI's shape.
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string type = res.status == 404 ? "not_found_error" : "invalid_request_error";
    std::string message = res.status == 404 ? absl::StrCat("no such endpoint: ", req.method, " ", req.path)
                                            : absl::StrCat("HTTP ", res.status, ": ", req.method, " ", req.path);
    if (res.status == 413) message = "the request body is larger than the server accepts (--http_max_body_bytes)";
    SendError(res, HttpError::Make(res.status, type, message));
  });
  s.set_logger(
      [this](const httplib::Request& req, const httplib::Response& res) { CountResponse(req.path, res.status); });
}

void HttpServer::Completions(int endpoint, const httplib::Request& req, httplib::Response& res) {
  auto job = std::make_shared<Job>();
  job->ready = ready();
  const Ready& ready = *job->ready;
  absl::StatusOr<Json> body = ParseBody(req);
  if (!body.ok()) return SendError(res, HttpErrorFromStatus(body.status()));
  absl::StatusOr<OpenAiRequest> parsed = ParseOpenAiRequest(static_cast<OpenAiEndpoint>(endpoint), *body);
  if (!parsed.ok()) return SendError(res, HttpErrorFromStatus(parsed.status()));
  job->request = std::move(*parsed);
  OpenAiRequest& r = job->request;
  r.model = options_.served_model_name;
  job->id = RandomId(r.endpoint == OpenAiEndpoint::kChat ? "chatcmpl-" : "cmpl-");
  job->created = absl::ToUnixSeconds(absl::Now());

  // The prompt: a chat through the template, or a completion's text or ids.
  absl::StatusOr<std::vector<int32_t>> prompt;
  if (r.endpoint == OpenAiEndpoint::kChat) {
    absl::StatusOr<std::string> text =
        ready.chat->Render(r.messages, r.tools, r.add_generation_prompt, r.chat_template_kwargs);
    if (!text.ok()) return SendError(res, HttpErrorFromStatus(text.status(), "messages"));
    prompt = ready.chat->Encode(*ready.model, *text, /*add_bos=*/false);
    if (prompt.ok() && prompt->empty()) prompt = absl::InvalidArgumentError("messages: the chat renders to no tokens");
  } else {
    prompt = PromptIds(*ready.model, r.prompt_text, r.prompt_ids, /*add_bos=*/true);
  }
  if (!prompt.ok()) return SendError(res, HttpErrorFromStatus(prompt.status(), "prompt"));
  job->prompt_tokens = static_cast<int64_t>(prompt->size());

  // Defaults: the request, then generation_config.json, then OpenAI's.
  const GenerationDefaults& g = ready.model->defaults.generation;
  const int64_t context = ready.model->config.max_position_embeddings;
  const int64_t room = std::max<int64_t>(1, context - static_cast<int64_t>(prompt->size()));
  const int32_t max_tokens = r.max_tokens.value_or(
      static_cast<int32_t>(std::min<int64_t>(DefaultMaxTokens(g, options_.default_max_tokens), room)));

  job->choices.resize(r.beam_width >= 2 ? 1 : static_cast<size_t>(r.n));
  absl::Status submitted;
  if (r.beam_width >= 2) {
    BeamSearchJob beam;
    beam.prompt_ids = *prompt;
    beam.params.beam_width = r.beam_width;
    beam.params.max_tokens = max_tokens;
    beam.params.length_penalty = r.length_penalty;
    beam.params.num_return_sequences = r.n;
    beam.ignore_eos = r.ignore_eos;
    absl::StatusOr<std::shared_ptr<RequestStream>> stream = ready.scheduler->SubmitBeamSearch(std::move(beam));
    if (stream.ok()) job->choices[0].stream = *stream;
    submitted = stream.status();
  } else {
    const uint64_t seed = r.seed.value_or(FreshSeed());
    for (size_t i = 0; i < job->choices.size() && submitted.ok(); ++i) {
      GenerateParams params;
      GenerationRequest& q = params.request;
      q.prompt_ids = *prompt;
      q.max_tokens = max_tokens;
      q.sampling = ResolveSampling({.temperature = r.temperature,
                                    .top_p = r.top_p,
                                    .min_p = r.min_p,
                                    .repetition_penalty = r.repetition_penalty,
                                    .top_k = r.top_k},
                                   g);
      q.sampling.presence_penalty = r.presence_penalty;
      q.sampling.frequency_penalty = r.frequency_penalty;
      q.sampling.seed = seed + i;
      q.ignore_eos = r.ignore_eos;
      // The chosen token's logprob is always computed; alternatives only when asked.
      q.logprobs = r.top_logprobs;
      params.stop_strings = r.stop;
      absl::StatusOr<std::shared_ptr<RequestStream>> stream = ready.scheduler->SubmitGenerate(std::move(params));
      if (stream.ok()) job->choices[i].stream = *stream;
      submitted = stream.status();
    }
  }
  if (!submitted.ok()) {
    std::erase_if(job->choices, [](const Job::Choice& c) { return c.stream == nullptr; });
    CancelAll(*job, absl::CancelledError("a sibling choice was refused"));
    return SendError(res, HttpErrorFromStatus(submitted));
  }

  if (r.stream) {
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider("text/event-stream",
                                     [this, job](size_t, httplib::DataSink& sink) { return RunStream(*job, sink); });
    return;
  }
  Collect(*job);
  for (const Job::Choice& c : job->choices) {
    if (!c.status.ok()) return SendError(res, HttpErrorFromStatus(c.status));
  }
  Json out = Envelope(*job, false);
  Json choices = Json::array();
  const bool chat = r.endpoint == OpenAiEndpoint::kChat;
  auto choice_json = [&](size_t index, const std::string& text, const Json& logprobs, std::string_view finish) {
    Json choice = {{"index", index}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", text}};
    } else {
      choice["text"] = text;
    }
    choice["logprobs"] = logprobs;
    choice["finish_reason"] = std::string(finish);
    return choice;
  };
  if (r.beam_width >= 2) {
    const std::vector<int32_t> eos = ready.model->EosIds();
    for (const BeamHypothesis& h : job->choices[0].beams) {
      std::vector<int32_t> ids = h.ids;
      // The end token is not part of the text (as generation's EOS is not).
      if (h.end != BeamEnd::kMaxTokens && !ids.empty() && !r.ignore_eos &&
          std::find(eos.begin(), eos.end(), ids.back()) != eos.end()) {
        ids.pop_back();
      }
      std::string text;
      if (ready.model->tokenizer) {
        absl::StatusOr<std::string> decoded = ready.model->tokenizer->Decode(ids);
        if (decoded.ok()) text = SanitizeUtf8(*decoded);
      }
      Json choice = choice_json(choices.size(), text, nullptr, h.end == BeamEnd::kMaxTokens ? "length" : "stop");
      choice["beam_score"] = h.score;
      choices.push_back(std::move(choice));
    }
  } else {
    for (size_t i = 0; i < job->choices.size(); ++i) {
      const Job::Choice& c = job->choices[i];
      choices.push_back(
          choice_json(i, c.text, r.logprobs ? LogprobsJson(*job, c.tokens, 0) : Json(nullptr), FinishName(c.finish)));
    }
  }
  out["choices"] = std::move(choices);
  out["usage"] = UsageJson(*job);
  SendJson(res, 200, out);
}

void HttpServer::Collect(Job& job) {
  for (Job::Choice& c : job.choices) {
    while (!c.done) {
      if (stopping_) return CancelAll(job, absl::UnavailableError("the server is shutting down"));
      std::optional<StreamEvent> event = c.stream->Next(absl::Milliseconds(100));
      if (event) Absorb(c, *event);
    }
  }
}

bool HttpServer::RunStream(Job& job, httplib::DataSink& sink) {
  auto last_write = std::chrono::steady_clock::now();
  auto write = [&](const std::string& data) {
    last_write = std::chrono::steady_clock::now();
    return sink.write(data.data(), data.size());
  };
  auto send = [&](const Json& j) { return write(absl::StrCat("data: ", Dump(j), "\n\n")); };
  bool ok = true;
  if (job.request.endpoint == OpenAiEndpoint::kChat) {
    for (size_t i = 0; i < job.choices.size() && ok; ++i) {
      Json first = ChunkJson(job, i, "", nullptr, nullptr);
      first["choices"][0]["delta"] = {{"role", "assistant"}, {"content", ""}};
      ok = send(first);
    }
  }
  auto unfinished = [&] {
    return std::any_of(job.choices.begin(), job.choices.end(), [](const Job::Choice& c) { return !c.done; });
  };
  while (ok && unfinished()) {
    if (stopping_) {
      CancelAll(job, absl::UnavailableError("the server is shutting down"));
      return false;
    }
    for (size_t i = 0; i < job.choices.size() && ok; ++i) {
      Job::Choice& c = job.choices[i];
      if (c.done) continue;
      std::optional<StreamEvent> event = c.stream->Next(kPoll);
      if (!event) continue;
      const size_t offset = c.text.size();
      const size_t first_token = c.tokens.size();
      Absorb(c, *event);
      if (c.tokens.size() > first_token) {
        const std::span<const GeneratedToken> fresh(c.tokens.data() + first_token, c.tokens.size() - first_token);
        const std::string text = c.text.substr(offset);
        if (!text.empty() || job.request.logprobs) {
          ok = send(ChunkJson(job, i, text, job.request.logprobs ? LogprobsJson(job, fresh, offset) : Json(nullptr),
                              nullptr));
        }
      }
      if (ok && c.done) {
        if (!c.status.ok()) {
          // The stream has started (status 200): the error goes as an event.
          send({{"error", Json::parse(HttpErrorFromStatus(c.status).ToJson())["error"]}});
          CancelAll(job, absl::CancelledError("a sibling choice failed"));
          write("data: [DONE]\n\n");
          sink.done();
          return true;
        }
        ok = send(ChunkJson(job, i, "", nullptr, std::string(FinishName(c.finish))));
      }
    }
    if (ok && std::chrono::steady_clock::now() - last_write > kKeepAlive) ok = write(": keep-alive\n\n");
  }
  if (!ok) {
    LOG_INFO("HTTP event stream ", job.id, ": the client went away or took nothing for ",
             absl::FormatDuration(options_.write_timeout), "; dropped");
    CancelAll(job, absl::CancelledError("the client went away"));
    return false;
  }
  if (job.request.include_usage) {
    Json usage = Envelope(job, true);
    usage["choices"] = Json::array();
    usage["usage"] = UsageJson(job);
    if (!send(usage)) return false;
  }
  write("data: [DONE]\n\n");
  sink.done();
  return true;
}

void HttpServer::Models(httplib::Response& res) {
  const Ready& ready = *this->ready();
  Json model = {{"id", options_.served_model_name},
                {"object", "model"},
                {"created", created_unix_},
                {"owned_by", "tandem"},
                {"max_model_len", ready.model->config.max_position_embeddings},
                {"root", ready.serving.model_dir}};
  SendJson(res, 200, {{"object", "list"}, {"data", Json::array({model})}});
}

void HttpServer::Tokenize(const httplib::Request& req, httplib::Response& res) {
  const Ready& ready = *this->ready();
  absl::StatusOr<Json> body = ParseBody(req);
  if (!body.ok()) return SendError(res, HttpErrorFromStatus(body.status()));
  auto content = body->find("content");
  if (content == body->end() || !content->is_string()) {
    return SendError(res, HttpError::Make(400, "invalid_request_error", "content: must be a string", "content"));
  }
  const bool add_special = body->value("add_special", false);
  const bool with_pieces = body->value("with_pieces", false);
  absl::StatusOr<std::vector<int32_t>> ids = ready.chat->Encode(*ready.model, content->get<std::string>(), add_special);
  if (!ids.ok()) return SendError(res, HttpErrorFromStatus(ids.status(), "content"));
  Json tokens = Json::array();
  for (int32_t id : *ids) {
    if (with_pieces) {
      tokens.push_back({{"id", id}, {"piece", SanitizeUtf8(Piece(*ready.model, id))}});
    } else {
      tokens.push_back(id);
    }
  }
  SendJson(res, 200, {{"tokens", tokens}});
}

void HttpServer::Detokenize(const httplib::Request& req, httplib::Response& res) {
  const Ready& ready = *this->ready();
  absl::StatusOr<Json> body = ParseBody(req);
  if (!body.ok()) return SendError(res, HttpErrorFromStatus(body.status()));
  auto tokens = body->find("tokens");
  if (tokens == body->end() || !tokens->is_array()) {
    return SendError(res,
                     HttpError::Make(400, "invalid_request_error", "tokens: must be a list of token ids", "tokens"));
  }
  std::vector<int32_t> ids;
  for (size_t i = 0; i < tokens->size(); ++i) {
    const Json& id = (*tokens)[i];
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= ready.model->config.vocab_size) {
      return SendError(res, HttpError::Make(400, "invalid_request_error",
                                            absl::StrCat("tokens[", i, "]: must be a token id in [0, ",
                                                         ready.model->config.vocab_size, ")"),
                                            "tokens"));
    }
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  if (ready.model->tokenizer == nullptr) {
    return SendError(res, HttpError::Make(400, "invalid_request_error", "this model has no tokenizer.model"));
  }
  absl::StatusOr<std::string> text = ready.model->tokenizer->Decode(ids);
  if (!text.ok()) return SendError(res, HttpErrorFromStatus(text.status(), "tokens"));
  SendJson(res, 200, {{"content", SanitizeUtf8(*text)}});
}

void HttpServer::ApplyTemplate(const httplib::Request& req, httplib::Response& res) {
  const Ready& ready = *this->ready();
  absl::StatusOr<Json> body = ParseBody(req);
  if (!body.ok()) return SendError(res, HttpErrorFromStatus(body.status()));
  absl::StatusOr<OpenAiRequest> parsed = ParseOpenAiRequest(OpenAiEndpoint::kChat, *body);
  if (!parsed.ok()) return SendError(res, HttpErrorFromStatus(parsed.status()));
  absl::StatusOr<std::string> prompt =
      ready.chat->Render(parsed->messages, parsed->tools, parsed->add_generation_prompt, parsed->chat_template_kwargs);
  if (!prompt.ok()) return SendError(res, HttpErrorFromStatus(prompt.status(), "messages"));
  SendJson(res, 200, {{"prompt", *prompt}});
}

void HttpServer::Health(httplib::Response& res) {
  std::shared_ptr<const Ready> ready = this->ready();
  if (ready == nullptr) {
    Json out = {{"status", "loading"}};
    // The step running now (generating, reading or dequantizing weights):
    // how far, how fast, how long still. Absent between steps.
    if (const ProgressSnapshot p = CurrentProgress(); p.active) {
      out["progress"] = {{"step", p.what},           {"done_bytes", p.done_bytes}, {"total_bytes", p.total_bytes},
                         {"fraction", p.fraction()}, {"elapsed_s", p.elapsed_s},   {"bytes_per_s", p.bytes_per_s},
                         {"eta_s", p.eta_s}};
    }
    out["error"] = Json::parse(
        HttpError::Make(503, "unavailable_error", "the model is still loading", "", "model_loading").ToJson())["error"];
    return SendJson(res, 503, out);
  }
  Json workers = Json::array();
  bool healthy = true;
  if (ready->serving.worker_health) {
    for (const WorkerHealthInfo& w : ready->serving.worker_health()) {
      workers.push_back({{"address", w.address}, {"healthy", w.healthy}, {"detail", w.detail}});
      healthy = healthy && w.healthy;
    }
  }
  Json out = {{"status", healthy ? "ok" : "unhealthy"}, {"workers", workers}};
  if (!healthy) {
    out["error"] = Json::parse(
        HttpError::Make(503, "unavailable_error", "a CPU worker is down", "", "worker_down").ToJson())["error"];
  }
  SendJson(res, healthy ? 200 : 503, out);
}

void HttpServer::Placement(httplib::Response& res) {
  std::shared_ptr<const Ready> ready = this->ready();
  const std::string orchestrator = ready->serving.orchestrator_json ? ready->serving.orchestrator_json() : "";
  absl::StatusOr<Json> placement =
      PlacementJson(ready->model->config, ready->scheduler->Stats(), ready->serving, orchestrator);
  if (!placement.ok()) return SendError(res, HttpErrorFromStatus(placement.status()));
  SendJson(res, 200, *placement);
}

void HttpServer::Metrics(httplib::Response& res) {
  std::shared_ptr<const Ready> ready = this->ready();
  HttpMetrics http;
  {
    std::lock_guard<std::mutex> lock(mu_);
    http.responses = responses_;
  }
  res.status = 200;
  if (ready == nullptr) return res.set_content(PrometheusLoadingText(http), "text/plain; version=0.0.4");
  std::vector<WorkerHealthInfo> workers;
  if (ready->serving.worker_health) workers = ready->serving.worker_health();
  http.ready = std::all_of(workers.begin(), workers.end(), [](const WorkerHealthInfo& w) { return w.healthy; });
  const std::string orchestrator = ready->serving.orchestrator_json ? ready->serving.orchestrator_json() : "";
  res.set_content(PrometheusText(ready->scheduler->Stats(), workers, orchestrator, http), "text/plain; version=0.0.4");
}

}  // namespace tandem
