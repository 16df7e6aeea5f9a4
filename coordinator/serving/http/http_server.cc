#include "coordinator/serving/http/http_server.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/base/log.h"
#include "common/base/progress.h"
#include "common/base/status_macros.h"
#include "coordinator/generation/json_schema_grammar.h"
#include "coordinator/generation/sampling_defaults.h"
#include "coordinator/generation/utf8_stream.h"
#include "coordinator/serving/http/http_error.h"
#include "coordinator/serving/http/openai_request.h"
#include "coordinator/serving/http/placement_json.h"
#include "coordinator/serving/http/prometheus_metrics.h"
#include "coordinator/serving/http/reasoning.h"
#include "coordinator/serving/http/tool_calls.h"
#include "coordinator/serving/http/web_page.h"

namespace tandem {

using Json = nlohmann::ordered_json;

struct HttpServer::Ready {
  const Model* model = nullptr;
  Scheduler* scheduler = nullptr;
  ServingOptions serving;
  std::unique_ptr<ChatSetup> chat;
  int64_t max_token_bytes = 1;  // MaxTokenTextBytes, for CheckPromptTextFits
  // Constrained decoding's view of the vocabulary (null without a tokenizer).
  std::shared_ptr<const VocabularyIndex> vocabulary;
  ToolCallFormat tool_format = ToolCallFormat::kNone;  // from the chat template
  bool thinks = false;  // the template's <think>: reasoning goes apart from content
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
    // A thinking model's output: its reasoning split off first; then, with
    // tools, the rest split into content and calls as it comes.
    std::optional<ReasoningSplitter> reasoning;
    std::optional<ToolCallParser> tool_parser;
    std::string reasoning_text, content;
    std::vector<ToolCall> calls;
    size_t reasoning_sent = 0, content_sent = 0, calls_sent = 0;  // streamed so far
    bool split() const { return reasoning || tool_parser; }
    // What the client reads as the message's content.
    const std::string& Content() const { return split() ? content : text; }
  };
  std::shared_ptr<const Ready> ready;
  OpenAiRequest request;
  std::string id;
  int64_t created = 0;
  int64_t prompt_tokens = 0;
  std::vector<Choice> choices;
};

// One request being answered: every response it gets carries its CORS headers.
struct HttpServer::Call {
  HttpRequest& request;
  HttpExchange& exchange;
  std::vector<std::pair<std::string, std::string>> cors;

  void Send(int status, std::string content_type, std::string body,
            std::vector<std::pair<std::string, std::string>> headers = {}) {
    HttpResponse r;
    r.status = status;
    r.content_type = std::move(content_type);
    r.body = std::move(body);
    r.headers = std::move(headers);
    r.headers.insert(r.headers.end(), cors.begin(), cors.end());
    exchange.Respond(std::move(r));
  }
  void SendJson(int status, const Json& body);
  void SendError(const HttpError& error) { Send(error.status, "application/json", error.ToJson()); }
};

namespace {

// How long a streaming handler waits on one choice before looking at the
// others, and how long without output before it writes a keep-alive
// comment (which is also how it notices a client that went away).
constexpr absl::Duration kPoll = absl::Milliseconds(10);
constexpr auto kKeepAlive = std::chrono::seconds(2);

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

std::string RandomId(absl::string_view prefix) {
  static absl::Mutex mu(absl::kConstInit);
  static std::mt19937_64 rng ABSL_GUARDED_BY(mu)(std::random_device{}());
  absl::MutexLock lock(&mu);
  return absl::StrFormat("%s%016x%08x", prefix, rng(), static_cast<uint32_t>(rng()));
}

absl::string_view FinishName(FinishReason reason) { return reason == FinishReason::kMaxTokens ? "length" : "stop"; }

HttpError ShuttingDown() {
  return HttpError::Make(503, "unavailable_error", "the server is shutting down", "", "shutting_down");
}

HttpError Loading() {
  return HttpError::Make(503, "unavailable_error", "the model is still loading", "", "model_loading");
}

// A choice's failure. HTTP requests carry no deadline of their own, so a
// DeadlineExceeded is a CPU worker that did not answer in time: the same
// 503 as one that refused the connection, not a 504 the client did not ask for.
HttpError GenerationError(const absl::Status& status) {
  if (absl::IsDeadlineExceeded(status)) {
    return HttpError::Make(503, "unavailable_error", std::string(status.message()), "", "worker_unavailable");
  }
  return HttpErrorFromStatus(status);
}

HttpResponse ErrorResponse(const HttpError& error) {
  HttpResponse r;
  r.status = error.status;
  r.body = error.ToJson();
  return r;
}

// The media type of a Content-Type header, lower-case, without parameters.
std::string MediaType(absl::string_view content_type) {
  return absl::AsciiStrToLower(absl::StripAsciiWhitespace(content_type.substr(0, content_type.find(';'))));
}

Json TokenBytes(absl::string_view piece) {
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
  // OpenAI's prompt caching report: the prompt tokens read from the cache.
  int64_t cached = 0;
  for (const auto& c : job.choices) cached = std::max(cached, c.usage.cached_prompt_tokens);
  return {{"prompt_tokens", job.prompt_tokens},
          {"completion_tokens", completion},
          {"total_tokens", job.prompt_tokens + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
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

// A special token's text ("[TOOL_CALLS]", "<|python_tag|>"): streamed
// text leaves special tokens out, but a tool call's markers may be one.
std::string SpecialText(const HttpServer::Ready& ready, const GeneratedToken& t) {
  const Model& model = *ready.model;
  if (model.tokenizer == nullptr || !t.text.empty() || !model.tokenizer->PieceText(t.id).empty()) return "";
  const std::vector<int32_t> eos = model.EosIds();
  if (std::find(eos.begin(), eos.end(), t.id) != eos.end()) return "";
  absl::StatusOr<std::string> text = model.tokenizer->Decode(std::span<const int32_t>(&t.id, 1),
                                                             DecodeOptions{.skip_special_tokens = false});
  return text.ok() ? *text : "";
}

void TakeToolOutput(HttpServer::Job::Choice& c, ToolCallParser::Output out) {
  c.content += out.content;
  for (ToolCall& call : out.calls) c.calls.push_back(std::move(call));
}

// Output text through the splitters: reasoning first, then tool calls.
// `end`: the output is over (what they held back goes out).
void Split(HttpServer::Job::Choice& c, const std::string& piece, bool end) {
  std::string rest = piece;
  if (c.reasoning) {
    ReasoningSplitter::Output out = c.reasoning->Push(piece);
    if (end) {
      ReasoningSplitter::Output last = c.reasoning->Finish();
      out.reasoning += last.reasoning;
      out.content += last.content;
    }
    c.reasoning_text += out.reasoning;
    rest = std::move(out.content);
  }
  if (c.tool_parser) {
    TakeToolOutput(c, c.tool_parser->Push(rest));
    if (end) TakeToolOutput(c, c.tool_parser->Finish());
  } else {
    c.content += rest;
  }
}

// Applies one event to its choice.
void Absorb(const HttpServer::Job& job, HttpServer::Job::Choice& c, StreamEvent& event) {
  for (GeneratedToken& t : event.tokens) {
    c.text += t.text;
    if (c.split()) Split(c, t.text + SpecialText(*job.ready, t), false);
    c.tokens.push_back(std::move(t));
  }
  if (event.done) {
    c.done = true;
    c.status = event.status;
    c.finish = event.finish_reason;
    c.usage = event.usage;
    c.beams = std::move(event.beams);
    if (c.split()) Split(c, "", true);
  }
}

// OpenAI's finish_reason: "tool_calls" when the model called tools.
std::string FinishOf(const HttpServer::Job::Choice& c) {
  if (!c.calls.empty() && c.finish != FinishReason::kMaxTokens) return "tool_calls";
  return std::string(FinishName(c.finish));
}

Json ToolCallJson(const ToolCall& call, size_t index, bool streamed) {
  Json j = {{"id", call.id}, {"type", "function"}, {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
  if (streamed) j["index"] = index;
  return j;
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
      Absorb(job, c, *event);
    }
  }
}

bool IsLoopback(absl::string_view host) {
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

// The prompt's ids: a chat through the template, or a completion's text or
// ids; text too long for the context refused by its size before tokenizing.
absl::StatusOr<std::vector<int32_t>> PromptOf(const HttpServer::Ready& ready, const OpenAiRequest& r,
                                              LargeTextTurns& large_texts, bool* opens_thinking) {
  const int64_t context = ready.model->config.max_position_embeddings;
  if (r.endpoint != OpenAiEndpoint::kChat) {
    TANDEM_RETURN_IF_ERROR(CheckPromptTextFits(r.prompt_text.size(), ready.max_token_bytes, context, "prompt"));
    LargeTextTurns::Turn turn(&large_texts, r.prompt_text.size());
    return PromptIds(*ready.model, r.prompt_text, r.prompt_ids, /*add_bos=*/true, "prompt", ready.max_token_bytes);
  }
  if (!r.tools.is_null() && ready.tool_format == ToolCallFormat::kNone) {
    return absl::InvalidArgumentError(
        "tools: this model's chat template writes no tool calls tandem can read (Hermes/Qwen <tool_call>, Llama 3, "
        "Mistral [TOOL_CALLS], DeepSeek); send tool_choice \"none\" or no tools");
  }
  absl::StatusOr<Json> messages = ToolMessagesForTemplate(r.messages, ready.tool_format);
  if (!messages.ok()) return messages.status();
  absl::StatusOr<std::string> text =
      ready.chat->Render(*messages, r.tools, r.add_generation_prompt, r.chat_template_kwargs);
  if (!text.ok()) {
    // A template that runs out of its work or output budget on these
    // messages always will: a bad request, not a busy server.
    const absl::Status& s = text.status();
    const absl::StatusCode code = absl::IsResourceExhausted(s) ? absl::StatusCode::kInvalidArgument : s.code();
    return absl::Status(code, absl::StrCat("messages: ", s.message()));
  }
  *opens_thinking = PromptOpensThinking(*text);
  TANDEM_RETURN_IF_ERROR(CheckPromptTextFits(text->size(), ready.max_token_bytes, context, "messages"));
  LargeTextTurns::Turn turn(&large_texts, text->size());
  absl::StatusOr<std::vector<int32_t>> ids = ready.chat->Encode(*ready.model, *text, /*add_special_tokens=*/false);
  if (ids.ok() && ids->empty()) return absl::InvalidArgumentError("messages: the chat renders to no tokens");
  return ids;
}

std::vector<LogitBias> LogitBiasOf(const OpenAiRequest& r) {
  std::vector<LogitBias> out;
  out.reserve(r.logit_bias.size());
  for (const auto& [id, bias] : r.logit_bias) out.push_back({id, bias});
  return out;
}

// What the output is constrained by: response_format's JSON, or the
// forced tool call; null for free text.
absl::StatusOr<std::shared_ptr<const TokenGrammar>> GrammarOf(const HttpServer::Ready& ready, const OpenAiRequest& r) {
  const bool forced_call = r.tool_choice == ToolChoice::kRequired || r.tool_choice == ToolChoice::kNamed;
  if (r.response_format == ResponseFormat::kText && !forced_call) return nullptr;
  if (ready.vocabulary == nullptr || ready.model->tokenizer == nullptr) {
    return absl::InvalidArgumentError(
        forced_call ? "tool_choice: a forced tool call needs the model's tokenizer"
                    : "response_format: structured output needs the model's tokenizer");
  }
  if (forced_call) {
    const ToolRequest tools{.tools = r.tools,
                            .forced = r.tool_choice_name,
                            .required = true,
                            .parallel = r.parallel_tool_calls};
    return ToolCallGrammar(ready.tool_format, tools, *ready.model->tokenizer, ready.vocabulary,
                           ready.model->EosIds());
  }
  auto grammar = std::make_shared<TokenGrammar>();
  grammar->vocabulary = ready.vocabulary;
  grammar->grammar.end_ids = ready.model->EosIds();
  if (r.response_format == ResponseFormat::kJsonObject) {
    grammar->grammar.root = AddAnyJsonObject(&grammar->grammar);
  } else {
    const char* where = r.endpoint == OpenAiEndpoint::kCompletion ? "json_schema" : "response_format.json_schema.schema";
    absl::StatusOr<int32_t> root = AddJsonSchema(r.json_schema, where, &grammar->grammar);
    if (!root.ok()) return WithParam(root.status(), "response_format");
    grammar->grammar.root = *root;
  }
  return grammar;
}

// The request's choices as scheduler jobs: n sampled sequences, or one beam
// search. On a refusal the choices already submitted are cancelled.
absl::Status Submit(HttpServer::Job& job, std::vector<int32_t> prompt, int32_t default_max_tokens,
                    bool opens_thinking) {
  const HttpServer::Ready& ready = *job.ready;
  const OpenAiRequest& r = job.request;
  // Defaults: the request, then generation_config.json, then OpenAI's.
  const GenerationDefaults& g = ready.model->defaults.generation;
  const int64_t context = ready.model->config.max_position_embeddings;
  const int64_t room = std::max<int64_t>(1, context - static_cast<int64_t>(prompt.size()));
  const int32_t max_tokens =
      r.max_tokens.value_or(static_cast<int32_t>(std::min<int64_t>(DefaultMaxTokens(g, default_max_tokens), room)));
  job.choices.resize(r.beam_width >= 2 ? 1 : static_cast<size_t>(r.n));
  absl::StatusOr<std::shared_ptr<const TokenGrammar>> grammar = GrammarOf(ready, r);
  if (!grammar.ok()) return grammar.status();
  for (HttpServer::Job::Choice& c : job.choices) {
    if (r.endpoint != OpenAiEndpoint::kChat || r.beam_width >= 2) break;
    // A forced call or JSON is the whole output: nothing to split off.
    const bool constrained = *grammar != nullptr;
    if (ready.thinks && !constrained) c.reasoning.emplace(opens_thinking);
    if (r.tool_choice != ToolChoice::kNone) c.tool_parser.emplace(ready.tool_format, r.parallel_tool_calls);
  }
  absl::Status submitted;
  if (r.beam_width >= 2) {
    BeamSearchJob beam;
    beam.prompt_ids = std::move(prompt);
    beam.params.beam_width = r.beam_width;
    beam.params.max_tokens = max_tokens;
    beam.params.length_penalty = r.length_penalty;
    beam.params.num_return_sequences = r.n;
    beam.params.logit_bias = LogitBiasOf(r);
    beam.ignore_eos = r.ignore_eos;
    absl::StatusOr<std::shared_ptr<RequestStream>> stream = ready.scheduler->SubmitBeamSearch(std::move(beam));
    if (stream.ok()) job.choices[0].stream = *stream;
    submitted = stream.status();
  } else {
    const uint64_t seed = r.seed.value_or(FreshSeed());
    for (size_t i = 0; i < job.choices.size() && submitted.ok(); ++i) {
      GenerateParams params;
      GenerationRequest& q = params.request;
      q.prompt_ids = prompt;
      q.max_tokens = max_tokens;
      q.sampling = ResolveSampling({.temperature = r.temperature,
                                    .top_p = r.top_p,
                                    .min_p = r.min_p,
                                    .repetition_penalty = r.repetition_penalty,
                                    .top_k = r.top_k},
                                   g);
      q.sampling.presence_penalty = r.presence_penalty;
      q.sampling.frequency_penalty = r.frequency_penalty;
      q.sampling.logit_bias = LogitBiasOf(r);
      q.sampling.grammar = *grammar;
      q.sampling.seed = seed + i;
      q.ignore_eos = r.ignore_eos;
      // The chosen token's logprob is always computed; alternatives only when asked.
      q.logprobs = r.top_logprobs;
      params.stop_strings = r.stop;
      absl::StatusOr<std::shared_ptr<RequestStream>> stream = ready.scheduler->SubmitGenerate(std::move(params));
      if (stream.ok()) job.choices[i].stream = *stream;
      submitted = stream.status();
    }
  }
  if (!submitted.ok()) {
    std::erase_if(job.choices, [](const HttpServer::Job::Choice& c) { return c.stream == nullptr; });
    CancelAll(job, absl::CancelledError("a sibling choice was refused"));
  }
  return submitted;
}

// A non-streamed response: every choice's text (or every beam), and usage.
Json WholeResponse(const HttpServer::Job& job) {
  const HttpServer::Ready& ready = *job.ready;
  const OpenAiRequest& r = job.request;
  const bool chat = r.endpoint == OpenAiEndpoint::kChat;
  auto choice_json = [&](size_t index, const std::string& text, const Json& logprobs, absl::string_view finish,
                         const std::vector<ToolCall>* calls = nullptr, const std::string* reasoning = nullptr) {
    Json choice = {{"index", index}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", text}};
      if (reasoning != nullptr && !reasoning->empty()) choice["message"]["reasoning_content"] = *reasoning;
      if (calls != nullptr && !calls->empty()) {
        Json list = Json::array();
        for (size_t k = 0; k < calls->size(); ++k) list.push_back(ToolCallJson((*calls)[k], k, false));
        if (text.empty()) choice["message"]["content"] = nullptr;
        choice["message"]["tool_calls"] = std::move(list);
      }
    } else {
      choice["text"] = text;
    }
    choice["logprobs"] = logprobs;
    choice["finish_reason"] = std::string(finish);
    return choice;
  };
  Json choices = Json::array();
  if (r.beam_width >= 2) {
    const std::vector<int32_t> eos = ready.model->EosIds();
    for (const BeamHypothesis& h : job.choices[0].beams) {
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
    for (size_t i = 0; i < job.choices.size(); ++i) {
      const HttpServer::Job::Choice& c = job.choices[i];
      choices.push_back(choice_json(i, c.Content(), r.logprobs ? LogprobsJson(job, c.tokens, 0) : Json(nullptr),
                                    FinishOf(c), &c.calls, &c.reasoning_text));
    }
  }
  Json out = Envelope(job, false);
  out["choices"] = std::move(choices);
  out["usage"] = UsageJson(job);
  return out;
}

// A boolean field of a llama.cpp-shaped body, or a 400 naming it.
absl::StatusOr<bool> BoolField(const Json& body, const char* field, bool fallback) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return absl::InvalidArgumentError(absl::StrCat(field, ": must be true or false"));
  return it->get<bool>();
}

// An endpoint: where it runs and what it needs.
struct Route {
  const char* method;
  const char* path;
  HttpLane lane;
  bool needs_model;
  bool json_body;  // POST with an application/json body
};

// Generation and tokenization wait on the model: the request lane. The
// rest answers at once and must stay answerable while every request thread
// is busy: the control lane.
constexpr Route kRoutes[] = {
    {"POST", "/v1/chat/completions", HttpLane::kRequest, true, true},
    {"POST", "/v1/completions", HttpLane::kRequest, true, true},
    {"POST", "/tokenize", HttpLane::kRequest, true, true},
    {"POST", "/detokenize", HttpLane::kRequest, true, true},
    {"POST", "/apply-template", HttpLane::kRequest, true, true},
    {"GET", "/v1/models", HttpLane::kControl, true, false},
    {"GET", "/v1/tandem/placement", HttpLane::kControl, true, false},
    {"GET", "/health", HttpLane::kControl, false, false},
    {"GET", "/metrics", HttpLane::kControl, false, false},
    {"GET", "/", HttpLane::kControl, false, false},
};

const Route* FindRoute(absl::string_view method, absl::string_view path, bool* path_known) {
  *path_known = false;
  for (const Route& r : kRoutes) {
    if (path != r.path) continue;
    *path_known = true;
    if (method == r.method) return &r;
  }
  return nullptr;
}

}  // namespace

void HttpServer::Call::SendJson(int status, const Json& body) { Send(status, "application/json", Dump(body)); }

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
    return absl::InvalidArgumentError(
        absl::StrCat("--http_listen: host \"", out.host,
                     "\" is not loopback: pass --http_allow_remote (with --api_key_file) to expose the HTTP API"));
  }
  return out;
}

HttpServer::HttpServer(HttpServerOptions options)
    : options_(std::move(options)),
      access_([this] {
        HttpAccessOptions access = options_.access;
        access.listen_host = options_.listen.host;
        return access;
      }()),
      created_unix_(absl::ToUnixSeconds(absl::Now())) {}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Create(HttpServerOptions options) {
  options.transport.host = options.listen.host;
  options.transport.port = options.listen.port;
  std::unique_ptr<HttpServer> server(new HttpServer(std::move(options)));
  HttpServer* self = server.get();
  HttpTransportHooks hooks;
  hooks.admit = [self](const HttpRequest& head, HttpLane* lane) { return self->Admit(head, lane); };
  hooks.handle = [self](HttpRequest& request, HttpExchange& exchange) { self->Handle(request, exchange); };
  hooks.counted = [self](const std::string& path, int status) { self->CountResponse(path, status); };
  absl::StatusOr<std::unique_ptr<HttpTransport>> transport =
      HttpTransport::Create(server->options_.transport, std::move(hooks));
  if (!transport.ok()) return transport.status();
  server->transport_ = std::move(*transport);
  server->port_ = server->transport_->port();
  return server;
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Stop(absl::Duration grace) {
  if (transport_ == nullptr) return;
  transport_->Drain();
  const absl::Time deadline = absl::Now() + grace;
  while (jobs_in_flight_.load() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  stopping_ = true;
  transport_->Stop();
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
  ready->max_token_bytes = MaxTokenTextBytes(*model);
  if (model->tokenizer != nullptr) {
    ready->vocabulary =
        VocabularyIndex::Build(*model->tokenizer, static_cast<int32_t>(model->config.vocab_size));
  }
  if (ready->chat != nullptr && ready->chat->chat_template != nullptr) {
    ready->tool_format = DetectToolCallFormat(ready->chat->chat_template->source());
    ready->thinks = options_.reasoning_content && TemplateThinks(ready->chat->chat_template->source());
  }
  absl::MutexLock lock(&mu_);
  ready_ = std::move(ready);
}

std::shared_ptr<const HttpServer::Ready> HttpServer::ready() const {
  absl::MutexLock lock(&mu_);
  return ready_;
}

void HttpServer::CountResponse(const std::string& path, int status) {
  bool known = false;
  FindRoute("GET", path, &known);
  absl::MutexLock lock(&mu_);
  ++responses_[{known ? path : "other", status}];
}

// On the I/O thread, with the header only: everything that can refuse a
// request without its body.
std::optional<HttpResponse> HttpServer::Admit(const HttpRequest& head, HttpLane* lane) {
  auto refuse = [&](const HttpError& error, std::vector<std::pair<std::string, std::string>> headers = {}) {
    HttpResponse r = ErrorResponse(error);
    r.headers = std::move(headers);
    for (auto& h : access_.CorsHeaders(head)) r.headers.push_back(std::move(h));
    return std::optional<HttpResponse>(std::move(r));
  };
  if (std::optional<HttpError> denied = access_.Check(head); denied) {
    if (denied->status == 401) return refuse(*denied, {{"WWW-Authenticate", "Bearer"}});
    return refuse(*denied);
  }
  if (head.method == "OPTIONS") return access_.Preflight(head);
  bool path_known = false;
  const Route* route = FindRoute(head.method, head.path, &path_known);
  if (route == nullptr && path_known) {
    std::string allow;
    for (const Route& r : kRoutes) {
      if (head.path == r.path) allow = r.method;
    }
    return refuse(
        HttpError::Make(405, "invalid_request_error", absl::StrCat(head.path, " takes ", allow, ", not ", head.method),
                        "", "method_not_allowed"),
        {{"Allow", allow}});
  }
  if (route == nullptr) {
    return refuse(
        HttpError::Make(404, "not_found_error", absl::StrCat("no such endpoint: ", head.method, " ", head.path)));
  }
  if (route->json_body && MediaType(head.Header("content-type")) != "application/json") {
    // Also what keeps a web page's "simple" cross-site POST (text/plain,
    // form data: no CORS preflight) from ever reaching a handler.
    return refuse(HttpError::Make(
        415, "invalid_request_error",
        absl::StrCat(head.path, " takes Content-Type: application/json, not \"", head.Header("content-type"), "\""), "",
        "unsupported_media_type"));
  }
  if (route->needs_model && ready() == nullptr) return refuse(Loading());
  *lane = route->lane;
  return std::nullopt;
}

void HttpServer::Handle(HttpRequest& request, HttpExchange& exchange) {
  Call call{request, exchange, access_.CorsHeaders(request)};
  if (stopping_) return call.SendError(ShuttingDown());
  if (exchange.ClientGone()) return call.Send(499, "application/json", "");  // nobody reads it
  const std::string& p = request.path;
  if (p == "/v1/chat/completions") return Completions(static_cast<int>(OpenAiEndpoint::kChat), call);
  if (p == "/v1/completions") return Completions(static_cast<int>(OpenAiEndpoint::kCompletion), call);
  if (p == "/tokenize") return Tokenize(call);
  if (p == "/detokenize") return Detokenize(call);
  if (p == "/apply-template") return ApplyTemplate(call);
  if (p == "/v1/models") return Models(call);
  if (p == "/v1/tandem/placement") return Placement(call);
  if (p == "/health") return Health(call);
  if (p == "/metrics") return Metrics(call);
  return Page(call);
}

// The request body as a JSON object, parsed under the JSON limits, its tree
// counted against the transport's memory budget. The error is sent here.
absl::StatusOr<Json> HttpServer::Body(Call& call) {
  absl::StatusOr<ParsedJson> parsed = ParseBoundedJson(call.request.body, options_.json, "the request body");
  if (!parsed.ok()) {
    const bool too_big = absl::IsOutOfRange(parsed.status());
    call.SendError(HttpError::Make(too_big ? 413 : 400, "invalid_request_error", std::string(parsed.status().message()),
                                   "", too_big ? "body_too_large" : "invalid_json"));
    return parsed.status();
  }
  if (!parsed->value.is_object()) {
    call.SendError(HttpError::Make(400, "invalid_request_error", "the request body must be a JSON object"));
    return absl::InvalidArgumentError("not an object");
  }
  if (!call.exchange.Reserve(parsed->estimated_bytes)) {
    call.SendError(HttpError::Make(503, "unavailable_error",
                                   "the server holds as many request bytes as it may; retry shortly", "",
                                   "server_overloaded"));
    return absl::ResourceExhaustedError("request memory");
  }
  // The raw body is no longer needed: its bytes stop counting when the
  // exchange ends, but the string itself goes now.
  std::string().swap(call.request.body);
  return std::move(parsed->value);
}

void HttpServer::Completions(int endpoint, Call& call) {
  jobs_in_flight_.fetch_add(1);
  struct Done {
    std::atomic<int>& count;
    ~Done() { count.fetch_sub(1); }
  } done{jobs_in_flight_};
  auto job = std::make_shared<Job>();
  job->ready = ready();
  const Ready& ready = *job->ready;
  absl::StatusOr<Json> body = Body(call);
  if (!body.ok()) return;
  absl::StatusOr<OpenAiRequest> parsed = ParseOpenAiRequest(static_cast<OpenAiEndpoint>(endpoint), *body);
  if (!parsed.ok()) return call.SendError(HttpErrorFromStatus(parsed.status()));
  job->request = std::move(*parsed);
  OpenAiRequest& r = job->request;
  r.model = options_.served_model_name;
  job->id = RandomId(r.endpoint == OpenAiEndpoint::kChat ? "chatcmpl-" : "cmpl-");
  job->created = absl::ToUnixSeconds(absl::Now());

  bool opens_thinking = false;
  absl::StatusOr<std::vector<int32_t>> prompt = PromptOf(ready, r, large_texts_, &opens_thinking);
  if (!prompt.ok()) return call.SendError(HttpErrorFromStatus(prompt.status(), "prompt"));
  job->prompt_tokens = static_cast<int64_t>(prompt->size());
  if (absl::Status submitted = Submit(*job, std::move(*prompt), options_.default_max_tokens, opens_thinking);
      !submitted.ok()) {
    return call.SendError(HttpErrorFromStatus(submitted));
  }
  if (r.stream) return RunStream(*job, call);
  if (!Collect(*job, call)) return;
  for (const Job::Choice& c : job->choices) {
    if (!c.status.ok()) return call.SendError(GenerationError(c.status));
  }
  call.SendJson(200, WholeResponse(*job));
}

// Waits for every choice to finish. False (the response sent or pointless)
// when the server shuts down or the client goes away first: the choices are
// cancelled and their KV cache freed.
bool HttpServer::Collect(Job& job, Call& call) {
  for (Job::Choice& c : job.choices) {
    while (!c.done) {
      if (stopping_) {
        CancelAll(job, absl::UnavailableError("the server is shutting down"));
        call.SendError(ShuttingDown());
        return false;
      }
      if (call.exchange.ClientGone()) {
        LOG_INFO("HTTP ", job.id, ": the client went away; its request is cancelled");
        CancelAll(job, absl::CancelledError("the client went away"));
        call.Send(499, "application/json", "");
        return false;
      }
      std::optional<StreamEvent> event = c.stream->Next(absl::Milliseconds(100));
      if (event) Absorb(job, c, *event);
    }
  }
  return true;
}

void HttpServer::RunStream(Job& job, Call& call) {
  std::vector<std::pair<std::string, std::string>> headers = {{"Cache-Control", "no-cache"},
                                                              {"X-Accel-Buffering", "no"}};
  headers.insert(headers.end(), call.cors.begin(), call.cors.end());
  HttpExchange& out = call.exchange;
  bool ok = out.StartStream(200, "text/event-stream", std::move(headers));
  auto last_write = std::chrono::steady_clock::now();
  auto write = [&](const std::string& data) {
    last_write = std::chrono::steady_clock::now();
    return out.Write(data);
  };
  auto send = [&](const Json& j) { return write(absl::StrCat("data: ", Dump(j), "\n\n")); };
  // An error after the 200 has gone: an error event, then [DONE].
  auto fail = [&](const HttpError& error, const absl::Status& reason) {
    send({{"error", Json::parse(error.ToJson())["error"]}});
    CancelAll(job, reason);
    write("data: [DONE]\n\n");
    out.EndStream();
  };
  if (ok && job.request.endpoint == OpenAiEndpoint::kChat) {
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
    if (stopping_) return fail(ShuttingDown(), absl::UnavailableError("the server is shutting down"));
    if (out.ClientGone()) {
      ok = false;
      break;
    }
    for (size_t i = 0; i < job.choices.size() && ok; ++i) {
      Job::Choice& c = job.choices[i];
      if (c.done) continue;
      std::optional<StreamEvent> event = c.stream->Next(kPoll);
      if (!event) continue;
      const size_t offset = c.text.size();
      const size_t first_token = c.tokens.size();
      Absorb(job, c, *event);
      if (c.reasoning_text.size() > c.reasoning_sent) {
        Json chunk = ChunkJson(job, i, "", nullptr, nullptr);
        chunk["choices"][0]["delta"] = {{"reasoning_content", c.reasoning_text.substr(c.reasoning_sent)}};
        c.reasoning_sent = c.reasoning_text.size();
        ok = send(chunk);
      }
      if (ok && (c.tokens.size() > first_token || c.content.size() > c.content_sent)) {
        const std::span<const GeneratedToken> fresh(c.tokens.data() + first_token, c.tokens.size() - first_token);
        const std::string text = c.split() ? c.content.substr(c.content_sent) : c.text.substr(offset);
        c.content_sent = c.content.size();
        if (!text.empty() || (job.request.logprobs && !fresh.empty())) {
          ok = send(ChunkJson(job, i, text, job.request.logprobs ? LogprobsJson(job, fresh, offset) : Json(nullptr),
                              nullptr));
        }
      }
      // A tool call goes out whole, once the model has finished writing it.
      for (; ok && c.calls_sent < c.calls.size(); ++c.calls_sent) {
        Json chunk = ChunkJson(job, i, "", nullptr, nullptr);
        chunk["choices"][0]["delta"] = {
            {"tool_calls", Json::array({ToolCallJson(c.calls[c.calls_sent], c.calls_sent, true)})}};
        ok = send(chunk);
      }
      if (ok && c.done) {
        if (!c.status.ok()) return fail(GenerationError(c.status), absl::CancelledError("a sibling choice failed"));
        ok = send(ChunkJson(job, i, "", nullptr, FinishOf(c)));
      }
    }
    if (ok && std::chrono::steady_clock::now() - last_write > kKeepAlive) ok = write(": keep-alive\n\n");
  }
  if (!ok) {
    LOG_INFO("HTTP event stream ", job.id, ": the client went away or took nothing for ",
             absl::FormatDuration(options_.transport.write_timeout), "; dropped");
    CancelAll(job, absl::CancelledError("the client went away"));
    return;
  }
  if (job.request.include_usage) {
    Json usage = Envelope(job, true);
    usage["choices"] = Json::array();
    usage["usage"] = UsageJson(job);
    if (!send(usage)) return;
  }
  write("data: [DONE]\n\n");
  out.EndStream();
}

void HttpServer::Models(Call& call) {
  const Ready& ready = *this->ready();
  Json model = {{"id", options_.served_model_name},
                {"object", "model"},
                {"created", created_unix_},
                {"owned_by", "tandem"},
                {"max_model_len", ready.model->config.max_position_embeddings}};
  call.SendJson(200, {{"object", "list"}, {"data", Json::array({model})}});
}

void HttpServer::Tokenize(Call& call) {
  const Ready& ready = *this->ready();
  absl::StatusOr<Json> body = Body(call);
  if (!body.ok()) return;
  auto content = body->find("content");
  if (content == body->end() || !content->is_string()) {
    return call.SendError(HttpError::Make(400, "invalid_request_error", "content: must be a string", "content"));
  }
  absl::StatusOr<bool> add_special = BoolField(*body, "add_special", false);
  if (!add_special.ok()) return call.SendError(HttpErrorFromStatus(add_special.status()));
  absl::StatusOr<bool> with_pieces = BoolField(*body, "with_pieces", false);
  if (!with_pieces.ok()) return call.SendError(HttpErrorFromStatus(with_pieces.status()));
  // Texts are tokenized to count a prompt's tokens: one too long for the
  // context is refused by its size, as a prompt would be.
  const std::string& text = content->get_ref<const std::string&>();
  if (absl::Status fits = CheckPromptTextFits(text.size(), ready.max_token_bytes,
                                              ready.model->config.max_position_embeddings, "content");
      !fits.ok()) {
    return call.SendError(HttpErrorFromStatus(fits));
  }
  LargeTextTurns::Turn turn(&large_texts_, text.size());
  absl::StatusOr<std::vector<int32_t>> ids = ready.chat->Encode(*ready.model, text, *add_special);
  if (!ids.ok()) return call.SendError(HttpErrorFromStatus(ids.status(), "content"));
  // Written out directly: a tree of one object per token costs far more
  // than the text it becomes.
  std::string out = "{\"tokens\":[";
  for (size_t i = 0; i < ids->size(); ++i) {
    if (i > 0) out.push_back(',');
    const int32_t id = (*ids)[i];
    if (*with_pieces) {
      absl::StrAppend(&out, "{\"id\":", id, ",\"piece\":", Dump(Json(SanitizeUtf8(Piece(*ready.model, id)))), "}");
    } else {
      absl::StrAppend(&out, id);
    }
  }
  out += "]}";
  call.Send(200, "application/json", std::move(out));
}

void HttpServer::Detokenize(Call& call) {
  const Ready& ready = *this->ready();
  absl::StatusOr<Json> body = Body(call);
  if (!body.ok()) return;
  auto tokens = body->find("tokens");
  if (tokens == body->end() || !tokens->is_array()) {
    return call.SendError(
        HttpError::Make(400, "invalid_request_error", "tokens: must be a list of token ids", "tokens"));
  }
  std::vector<int32_t> ids;
  for (size_t i = 0; i < tokens->size(); ++i) {
    const Json& id = (*tokens)[i];
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= ready.model->config.vocab_size) {
      return call.SendError(HttpError::Make(
          400, "invalid_request_error",
          absl::StrCat("tokens[", i, "]: must be a token id in [0, ", ready.model->config.vocab_size, ")"), "tokens"));
    }
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  if (ready.model->tokenizer == nullptr) {
    return call.SendError(HttpError::Make(400, "invalid_request_error", "this model has no tokenizer"));
  }
  absl::StatusOr<std::string> text = ready.model->tokenizer->Decode(ids);
  if (!text.ok()) return call.SendError(HttpErrorFromStatus(text.status(), "tokens"));
  call.SendJson(200, {{"content", SanitizeUtf8(*text)}});
}

void HttpServer::ApplyTemplate(Call& call) {
  const Ready& ready = *this->ready();
  absl::StatusOr<Json> body = Body(call);
  if (!body.ok()) return;
  absl::StatusOr<OpenAiRequest> parsed = ParseOpenAiRequest(OpenAiEndpoint::kApplyTemplate, *body);
  if (!parsed.ok()) return call.SendError(HttpErrorFromStatus(parsed.status()));
  absl::StatusOr<Json> messages = ToolMessagesForTemplate(parsed->messages, ready.tool_format);
  if (!messages.ok()) return call.SendError(HttpErrorFromStatus(messages.status(), "messages"));
  absl::StatusOr<std::string> prompt =
      ready.chat->Render(*messages, parsed->tools, parsed->add_generation_prompt, parsed->chat_template_kwargs);
  if (!prompt.ok()) return call.SendError(HttpErrorFromStatus(prompt.status(), "messages"));
  call.SendJson(200, {{"prompt", *prompt}});
}

void HttpServer::Health(Call& call) {
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
    out["error"] = Json::parse(Loading().ToJson())["error"];
    return call.SendJson(503, out);
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
  call.SendJson(healthy ? 200 : 503, out);
}

void HttpServer::Placement(Call& call) {
  std::shared_ptr<const Ready> ready = this->ready();
  const std::string orchestrator = ready->serving.orchestrator_json ? ready->serving.orchestrator_json() : "";
  absl::StatusOr<Json> placement =
      PlacementJson(ready->model->config, ready->scheduler->Stats(), ready->serving, orchestrator);
  if (!placement.ok()) return call.SendError(HttpErrorFromStatus(placement.status()));
  call.SendJson(200, *placement);
}

void HttpServer::Metrics(Call& call) {
  std::shared_ptr<const Ready> ready = this->ready();
  HttpMetrics http;
  {
    absl::MutexLock lock(&mu_);
    http.responses = responses_;
  }
  http.transport = transport_->Stats();
  constexpr char kType[] = "text/plain; version=0.0.4";
  if (ready == nullptr) return call.Send(200, kType, PrometheusLoadingText(http));
  std::vector<WorkerHealthInfo> workers;
  if (ready->serving.worker_health) workers = ready->serving.worker_health();
  http.ready = std::all_of(workers.begin(), workers.end(), [](const WorkerHealthInfo& w) { return w.healthy; });
  const std::string orchestrator = ready->serving.orchestrator_json ? ready->serving.orchestrator_json() : "";
  call.Send(200, kType, PrometheusText(ready->scheduler->Stats(), workers, orchestrator, http));
}

// The page works while the model loads: it says so, and polls.
void HttpServer::Page(Call& call) {
  call.Send(200, "text/html; charset=utf-8", std::string(kWebPageHtml, sizeof(kWebPageHtml) - 1),
            {{"Cache-Control", "no-cache"}});
}

}  // namespace tandem
