// tandem-server's OpenAI-compatible HTTP API as a real process (gRPC on a
// unix socket, HTTP on a free loopback port): completions and chat
// completions, streamed and not, equal the gRPC API's tokens for the same
// request; n, logprobs, stop, penalties, logit_bias and beam search in
// OpenAI's shapes; fields tandem does not implement refused by name;
// tokenize / detokenize / apply-template as llama.cpp's server has them;
// health and Prometheus metrics; every bad request an OpenAI-shaped error
// with the right status; and a streaming client that goes away cancels its
// request and frees its KV cache.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/http_testlib.h"
#include "tests/sdk_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"
#include "tests/tokens_testlib.h"

namespace tandem {
namespace {

using nlohmann::json;

struct GrpcText {
  std::vector<int32_t> ids;
  std::string text;
};

// Greedy through the gRPC API: the oracle of the HTTP answers.
GrpcText GrpcGreedy(ServerProcess& server, const std::vector<int32_t>& prompt, int max_tokens,
                    const std::map<int32_t, float>& logit_bias = {}) {
  v1::GenerateRequest request;
  request.mutable_prompt_ids()->Add(prompt.begin(), prompt.end());
  request.set_max_tokens(max_tokens);
  request.set_temperature(0);
  request.set_ignore_eos(true);
  for (const auto& [id, bias] : logit_bias) (*request.mutable_logit_bias())[id] = bias;
  grpc::ClientContext context;
  auto reader = server.NewStub()->Generate(&context, request);
  GrpcText out;
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    for (const v1::Token& t : response.tokens()) {
      out.ids.push_back(t.id());
      out.text += t.text();
    }
  }
  EXPECT_TRUE(reader->Finish().ok());
  return out;
}

std::vector<int32_t> GrpcTokenize(ServerProcess& server, const std::string& text, bool add_bos) {
  v1::TokenizeRequest request;
  request.set_text(text);
  request.set_add_bos(add_bos);
  v1::TokenizeResponse response;
  grpc::ClientContext context;
  EXPECT_TRUE(server.NewStub()->Tokenize(&context, request, &response).ok());
  return {response.ids().begin(), response.ids().end()};
}

// The text and finish reasons of a stream's chunks, and its usage chunk.
struct Streamed {
  std::vector<std::string> text;
  std::vector<std::string> finish;
  json usage;
  bool done = false;
  int role_chunks = 0;
};

Streamed Collect(const std::vector<json>& events, bool chat, size_t n = 1) {
  Streamed out;
  out.text.resize(n);
  out.finish.resize(n);
  for (const json& e : events) {
    if (e.is_string()) {
      out.done = e == "[DONE]";
      continue;
    }
    EXPECT_EQ(e["object"], chat ? "chat.completion.chunk" : "text_completion") << e;
    if (e.contains("usage") && !e["usage"].is_null()) out.usage = e["usage"];
    for (const json& c : e["choices"]) {
      const size_t i = c["index"];
      if (chat && c["delta"].contains("role")) ++out.role_chunks;
      if (chat && c["delta"].contains("content")) out.text[i] += c["delta"]["content"].get<std::string>();
      if (!chat) out.text[i] += c["text"].get<std::string>();
      if (!c["finish_reason"].is_null()) out.finish[i] = c["finish_reason"];
    }
  }
  return out;
}

class HttpServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    ASSERT_OK(WriteTestModel(dir_->path() / "model"));
    std::ofstream(dir_->path() / "chatml.jinja") << kChatmlTemplate;
    // --kernel_plan exact: the tests compare HTTP's text with gRPC's for the
    // same prompt, and the second of them reads the first one's prompt cache;
    // the default plan's bf16 GEMM rounds the recomputed rows differently.
    absl::StatusOr<HttpServerProcess> started = StartHttpServer(
        dir_->path() / "model", dir_->path(),
        {"--threads", "2", "--max_sequences", "16", "--chat_template", (dir_->path() / "chatml.jinja").string(),
         "--served_model_name", "tiny-test", "--http_max_body_bytes", "65536", "--kernel_plan", "exact"},
        "server");
    ASSERT_OK(started);
    server_ = new HttpServerProcess(std::move(*started));
  }
  static void TearDownTestSuite() {
    delete server_;
    delete dir_;
  }
  static int port() { return server_->port; }
  static ServerProcess& grpc() { return *server_->server; }

  HttpReply Post(const std::string& path, const json& body) {
    absl::StatusOr<HttpReply> reply = HttpPost(port(), path, body);
    EXPECT_OK(reply.status());
    return reply.ok() ? *reply : HttpReply{};
  }
  HttpReply Get(const std::string& path) {
    absl::StatusOr<HttpReply> reply = HttpGet(port(), path);
    EXPECT_OK(reply.status());
    return reply.ok() ? *reply : HttpReply{};
  }
  // An OpenAI error: status, type, and the param it names.
  void ExpectError(const HttpReply& reply, int status, const std::string& param) {
    EXPECT_EQ(reply.status, status) << reply.body;
    ASSERT_TRUE(reply.json.is_object()) << reply.body;
    ASSERT_TRUE(reply.json.contains("error")) << reply.body;
    const json& e = reply.json["error"];
    EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty()) << reply.body;
    EXPECT_TRUE(e["type"].is_string()) << reply.body;
    EXPECT_TRUE(e.contains("param") && e.contains("code")) << reply.body;
    if (!param.empty()) {
      EXPECT_EQ(e["param"], param) << reply.body;
    }
  }
  int64_t Metric(const std::string& series) {
    const HttpReply reply = Get("/metrics");
    for (absl::string_view line : absl::StrSplit(reply.body, '\n')) {
      if (absl::StartsWith(line, series + " ")) {
        double v = 0;
        if (absl::SimpleAtod(line.substr(series.size() + 1), &v)) return static_cast<int64_t>(v);
      }
    }
    ADD_FAILURE() << "no " << series << " in /metrics";
    return -1;
  }
  void ExpectAllBlocksFree() {
    for (int i = 0; i < 300 && Metric("tandem_kv_blocks_in_use") != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(Metric("tandem_kv_blocks_in_use"), 0);
  }

  static ScopedTempDir* dir_;
  static HttpServerProcess* server_;
};

ScopedTempDir* HttpServerTest::dir_ = nullptr;
HttpServerProcess* HttpServerTest::server_ = nullptr;

TEST_F(HttpServerTest, HealthAndModels) {
  HttpReply health = Get("/health");
  EXPECT_EQ(health.status, 200) << health.body;
  EXPECT_EQ(health.json["status"], "ok");
  HttpReply models = Get("/v1/models");
  ASSERT_EQ(models.status, 200) << models.body;
  EXPECT_EQ(models.json["object"], "list");
  ASSERT_EQ(models.json["data"].size(), 1u);
  EXPECT_EQ(models.json["data"][0]["id"], "tiny-test");
  EXPECT_EQ(models.json["data"][0]["object"], "model");
}

TEST_F(HttpServerTest, CompletionEqualsGrpcStreamedOrNot) {
  const auto prompt = RandomTokens(9, 512, 41);
  const GrpcText expected = GrpcGreedy(grpc(), prompt, 10);
  json request = {
      {"model", "tiny-test"}, {"prompt", prompt}, {"max_tokens", 10}, {"temperature", 0}, {"ignore_eos", true}};
  HttpReply reply = Post("/v1/completions", request);
  ASSERT_EQ(reply.status, 200) << reply.body;
  const json& r = reply.json;
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["model"], "tiny-test");
  EXPECT_TRUE(absl::StartsWith(r["id"].get<std::string>(), "cmpl-"));
  ASSERT_EQ(r["choices"].size(), 1u);
  EXPECT_EQ(r["choices"][0]["text"], expected.text);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(r["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(r["usage"]["prompt_tokens"], 9);
  EXPECT_EQ(r["usage"]["completion_tokens"], 10);
  EXPECT_EQ(r["usage"]["total_tokens"], 19);

  request["stream"] = true;
  request["stream_options"] = {{"include_usage", true}};
  HttpReply streamed = Post("/v1/completions", request);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  EXPECT_TRUE(absl::StartsWith(streamed.content_type, "text/event-stream")) << streamed.content_type;
  absl::StatusOr<std::vector<json>> events = SseData(streamed.body);
  ASSERT_OK(events);
  ASSERT_GE(events->size(), 3u);
  EXPECT_EQ(events->back(), "[DONE]");
  Streamed s = Collect(*events, /*chat=*/false);
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.text[0], expected.text);
  EXPECT_EQ(s.finish[0], "length");
  EXPECT_EQ(s.usage["completion_tokens"], 10);
  EXPECT_EQ(s.usage["prompt_tokens"], 9);
}

TEST_F(HttpServerTest, ChatRendersTheTemplateAndEqualsGrpc) {
  const json messages = json::array(
      {{{"role", "system"}, {"content", "You are terse."}}, {{"role", "user"}, {"content", "Name three colours."}}});
  HttpReply applied = Post("/apply-template", {{"messages", messages}});
  ASSERT_EQ(applied.status, 200) << applied.body;
  const std::string prompt = applied.json["prompt"];
  EXPECT_EQ(prompt,
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nName three colours.<|im_end|>\n"
            "<|im_start|>assistant\n");
  HttpReply no_gen = Post("/apply-template", {{"messages", messages}, {"add_generation_prompt", false}});
  EXPECT_FALSE(absl::EndsWith(no_gen.json["prompt"].get<std::string>(), "assistant\n"));

  const GrpcText expected = GrpcGreedy(grpc(), GrpcTokenize(grpc(), prompt, /*add_bos=*/false), 8);
  json request = {{"model", "x"}, {"messages", messages}, {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}};
  HttpReply reply = Post("/v1/chat/completions", request);
  ASSERT_EQ(reply.status, 200) << reply.body;
  const json& r = reply.json;
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_TRUE(absl::StartsWith(r["id"].get<std::string>(), "chatcmpl-"));
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r["choices"][0]["message"]["content"], expected.text);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["prompt_tokens"], GrpcTokenize(grpc(), prompt, false).size());

  request["stream"] = true;
  HttpReply streamed = Post("/v1/chat/completions", request);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  absl::StatusOr<std::vector<json>> events = SseData(streamed.body);
  ASSERT_OK(events);
  Streamed s = Collect(*events, /*chat=*/true);
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.role_chunks, 1);
  EXPECT_EQ(s.text[0], expected.text);
  EXPECT_EQ(s.finish[0], "length");
  EXPECT_TRUE(s.usage.is_null());  // not asked for
}

TEST_F(HttpServerTest, SeededSamplingIsReproducibleAndNGivesNChoices) {
  const json request = {{"prompt", "The quick brown fox"},
                        {"max_tokens", 6},
                        {"temperature", 0.9},
                        {"top_p", 0.95},
                        {"top_k", 40},
                        {"min_p", 0.01},
                        {"presence_penalty", 0.5},
                        {"frequency_penalty", 0.3},
                        {"repetition_penalty", 1.1},
                        {"seed", 1234},
                        {"n", 3},
                        {"ignore_eos", true}};
  HttpReply a = Post("/v1/completions", request);
  HttpReply b = Post("/v1/completions", request);
  ASSERT_EQ(a.status, 200) << a.body;
  ASSERT_EQ(a.json["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a.json["choices"][i]["index"], i);
    EXPECT_EQ(a.json["choices"][i]["text"], b.json["choices"][i]["text"]);
  }
  EXPECT_EQ(a.json["usage"]["completion_tokens"], 18);
  // Streamed n=3: every choice ends, each equal to the non-streamed one.
  json streaming = request;
  streaming["stream"] = true;
  HttpReply s = Post("/v1/completions", streaming);
  absl::StatusOr<std::vector<json>> events = SseData(s.body);
  ASSERT_OK(events);
  Streamed st = Collect(*events, false, 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(st.text[i], a.json["choices"][i]["text"]);
    EXPECT_EQ(st.finish[i], "length");
  }
}

TEST_F(HttpServerTest, StopStringsEndTheText) {
  const auto prompt = RandomTokens(7, 512, 99);
  const GrpcText full = GrpcGreedy(grpc(), prompt, 12);
  ASSERT_GE(full.text.size(), 4u);
  // Stop at an ASCII piece of the greedy text: the answer is what came before it.
  size_t from = full.text.size() / 2;
  while (from + 2 <= full.text.size() && (static_cast<unsigned char>(full.text[from]) >= 0x80 ||
                                          static_cast<unsigned char>(full.text[from + 1]) >= 0x80)) {
    ++from;
  }
  if (from + 2 > full.text.size()) GTEST_SKIP() << "no ASCII pair in the second half of " << full.text;
  const std::string stop = full.text.substr(from, 2);
  const size_t at = full.text.find(stop);
  HttpReply reply = Post("/v1/completions", {{"prompt", prompt},
                                             {"max_tokens", 12},
                                             {"temperature", 0},
                                             {"ignore_eos", true},
                                             {"stop", json::array({stop, "never-seen"})}});
  ASSERT_EQ(reply.status, 200) << reply.body;
  EXPECT_EQ(reply.json["choices"][0]["text"], full.text.substr(0, at));
  EXPECT_EQ(reply.json["choices"][0]["finish_reason"], "stop");
}

TEST_F(HttpServerTest, LogprobsInBothShapes) {
  const auto prompt = RandomTokens(5, 512, 7);
  HttpReply completion =
      Post("/v1/completions",
           {{"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}, {"ignore_eos", true}, {"logprobs", 2}});
  ASSERT_EQ(completion.status, 200) << completion.body;
  const json& lp = completion.json["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 4u);
  ASSERT_EQ(lp["token_logprobs"].size(), 4u);
  ASSERT_EQ(lp["top_logprobs"].size(), 4u);
  ASSERT_EQ(lp["text_offset"].size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
    EXPECT_EQ(lp["top_logprobs"][i].size(), 2u);
  }
  EXPECT_EQ(lp["text_offset"][0], 0);

  HttpReply chat = Post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                                 {"max_tokens", 3},
                                                 {"temperature", 0},
                                                 {"ignore_eos", true},
                                                 {"logprobs", true},
                                                 {"top_logprobs", 3}});
  ASSERT_EQ(chat.status, 200) << chat.body;
  const json& content = chat.json["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 3u);
  for (const json& t : content) {
    EXPECT_TRUE(t["token"].is_string());
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    EXPECT_TRUE(t["bytes"].is_array());
    ASSERT_EQ(t["top_logprobs"].size(), 3u);
    // Greedy: the chosen token is the most likely one.
    EXPECT_NEAR(t["top_logprobs"][0]["logprob"].get<double>(), t["logprob"].get<double>(), 1e-6);
  }
}

// logit_bias (OpenAI's): -100 on the greedy token makes another one
// greedy, +100 on a token forces it at every step with a logprob near 0
// (logprobs are of the biased distribution), and HTTP (completions and
// chat) and gRPC give the same tokens.
TEST_F(HttpServerTest, LogitBiasMovesTheGreedyTokenAndHttpAgreesWithGrpc) {
  const auto prompt = RandomTokens(6, 512, 77);
  const GrpcText plain = GrpcGreedy(grpc(), prompt, 3);
  ASSERT_EQ(plain.ids.size(), 3u);
  const int32_t greedy = plain.ids[0];
  const GrpcText banned = GrpcGreedy(grpc(), prompt, 3, {{greedy, -100.0f}});
  ASSERT_EQ(banned.ids.size(), 3u);
  for (int32_t id : banned.ids) EXPECT_NE(id, greedy);
  const int32_t forced_id = greedy == 300 ? 301 : 300;
  const GrpcText forced = GrpcGreedy(grpc(), prompt, 3, {{forced_id, 100.0f}});
  EXPECT_EQ(forced.ids, std::vector<int32_t>(3, forced_id));

  auto http = [&](const json& bias, bool logprobs) {
    json request = {{"prompt", prompt}, {"max_tokens", 3}, {"temperature", 0}, {"ignore_eos", true},
                    {"logit_bias", bias}};
    if (logprobs) request["logprobs"] = 1;
    return Post("/v1/completions", request);
  };
  HttpReply banned_http = http({{std::to_string(greedy), -100}}, false);
  ASSERT_EQ(banned_http.status, 200) << banned_http.body;
  EXPECT_EQ(banned_http.json["choices"][0]["text"], banned.text);
  HttpReply forced_http = http({{std::to_string(forced_id), 100}}, true);
  ASSERT_EQ(forced_http.status, 200) << forced_http.body;
  EXPECT_EQ(forced_http.json["choices"][0]["text"], forced.text);
  for (const json& logprob : forced_http.json["choices"][0]["logprobs"]["token_logprobs"]) {
    EXPECT_GT(logprob.get<double>(), -1e-3) << forced_http.body;
  }
  // Chat takes it too: every token the forced one, its logprob near 0.
  HttpReply chat = Post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                                 {"max_tokens", 2},
                                                 {"temperature", 0},
                                                 {"ignore_eos", true},
                                                 {"logprobs", true},
                                                 {"logit_bias", {{std::to_string(forced_id), 100}}}});
  ASSERT_EQ(chat.status, 200) << chat.body;
  const json& content = chat.json["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u) << chat.body;
  EXPECT_EQ(content[0]["bytes"], content[1]["bytes"]);
  for (const json& t : content) EXPECT_GT(t["logprob"].get<double>(), -1e-3) << chat.body;
  ExpectAllBlocksFree();
}

// The same bias through both APIs' beam search gives the same beams; keys
// outside the vocabulary are refused naming logit_bias and the key.
TEST_F(HttpServerTest, LogitBiasReachesBeamSearchAndBadKeysAreNamed) {
  const auto prompt = RandomTokens(6, 512, 77);
  const int32_t greedy = GrpcGreedy(grpc(), prompt, 1).ids.at(0);
  v1::BeamSearchRequest beam;
  beam.mutable_prompt_ids()->Add(prompt.begin(), prompt.end());
  beam.set_beam_width(2);
  beam.set_max_tokens(3);
  beam.set_ignore_eos(true);
  (*beam.mutable_logit_bias())[greedy] = -100.0f;
  grpc::ClientContext context;
  auto reader = grpc().NewStub()->BeamSearch(&context, beam);
  std::vector<std::vector<int32_t>> beams;
  std::string best_text;
  v1::BeamSearchResponse response;
  while (reader->Read(&response)) {
    for (const v1::BeamSequence& sequence : response.sequences()) {
      beams.emplace_back(sequence.ids().begin(), sequence.ids().end());
      if (best_text.empty()) best_text = sequence.text();
    }
  }
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_FALSE(beams.empty());
  for (int32_t id : beams[0]) EXPECT_NE(id, greedy);
  HttpReply beam_http = Post("/v1/completions", {{"prompt", prompt},
                                                 {"max_tokens", 3},
                                                 {"beam_width", 2},
                                                 {"ignore_eos", true},
                                                 {"logit_bias", {{std::to_string(greedy), -100}}}});
  ASSERT_EQ(beam_http.status, 200) << beam_http.body;
  EXPECT_EQ(beam_http.json["choices"][0]["text"], best_text);

  // Keys the model has no token for, and values out of range.
  auto http = [&](const json& bias) {
    return Post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 3}, {"logit_bias", bias}});
  };
  for (const json& bias : {json{{"512", 1}}, json{{"99999", -5}}}) {
    HttpReply bad = http(bias);
    ExpectError(bad, 400, "logit_bias");
    EXPECT_TRUE(absl::StrContains(bad.json["error"]["message"].get<std::string>(), bias.begin().key())) << bad.body;
  }
  ExpectError(http({{"abc", 1}}), 400, "logit_bias");
  ExpectError(http({{"5", 250}}), 400, "logit_bias");
  v1::GenerateRequest outside;
  outside.mutable_prompt_ids()->Add(prompt.begin(), prompt.end());
  (*outside.mutable_logit_bias())[512] = 1.0f;
  grpc::ClientContext outside_context;
  auto outside_reader = grpc().NewStub()->Generate(&outside_context, outside);
  v1::GenerateResponse ignored;
  while (outside_reader->Read(&ignored)) {
  }
  const grpc::Status status = outside_reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "logit_bias: key \"512\"")) << status.error_message();
  ExpectAllBlocksFree();
}

// Nothing is silently ignored: what tandem does not do is a 400 naming the
// field (openai_request_test checks every one; these through the server),
// and the harmless fields are accepted without changing the text.
TEST_F(HttpServerTest, UnsupportedFieldsAreRefusedAndHarmlessOnesChangeNothing) {
  const json messages = {{{"role", "user"}, {"content", "hi"}}};
  const json chat = {{"messages", messages}, {"max_tokens", 3}, {"temperature", 0}, {"ignore_eos", true}};
  auto with = [](json body, const char* field, json value) {
    body[field] = std::move(value);
    return body;
  };
  const json tool = {{"type", "function"}, {"function", {{"name", "f"}, {"parameters", json::object()}}}};
  // ChatML renders no tools: a call could not be read back.
  HttpReply tools = Post("/v1/chat/completions", with(chat, "tools", json::array({tool})));
  ExpectError(tools, 400, "tools");
  EXPECT_TRUE(absl::StrContains(tools.json["error"]["message"].get<std::string>(), "chat template")) << tools.body;
  ExpectError(Post("/v1/chat/completions", with(chat, "tool_choice", "required")), 400, "tool_choice");
  ExpectError(Post("/v1/chat/completions", with(chat, "response_format", {{"type", "json_object"}})), 400,
              "ignore_eos");
  ExpectError(Post("/v1/chat/completions",
                   {{"messages", messages}, {"json_schema", {{"type", "string"}, {"format", "email"}}}}),
              400, "response_format");
  ExpectError(Post("/v1/chat/completions", with(chat, "no_such_field", 1)), 400, "no_such_field");
  ExpectError(Post("/v1/completions", {{"prompt", "hi"}, {"echo", true}}), 400, "echo");
  ExpectError(Post("/v1/completions", {{"prompt", "hi"}, {"best_of", 3}}), 400, "best_of");
  ExpectError(Post("/v1/completions", {{"prompt", "hi"}, {"suffix", "end"}}), 400, "suffix");
  ExpectError(Post("/v1/completions", {{"prompt", "hi"}, {"grammar", "root ::= \"a\""}}), 400, "grammar");
  HttpReply unknown = Post("/v1/completions", {{"prompt", "hi"}, {"temprature", 0}});
  ExpectError(unknown, 400, "temprature");
  EXPECT_TRUE(absl::StrContains(unknown.json["error"]["message"].get<std::string>(), "unknown field")) << unknown.body;

  HttpReply plain = Post("/v1/chat/completions", chat);
  ASSERT_EQ(plain.status, 200) << plain.body;
  json harmless = chat;
  harmless["user"] = "someone";
  harmless["store"] = false;
  harmless["metadata"] = {{"k", "v"}};
  harmless["service_tier"] = "auto";
  harmless["tool_choice"] = "none";
  harmless["parallel_tool_calls"] = false;
  harmless["response_format"] = {{"type", "text"}};
  harmless["modalities"] = {"text"};
  harmless["n"] = 1;
  harmless["presence_penalty"] = 0;
  harmless["frequency_penalty"] = 0;
  HttpReply same = Post("/v1/chat/completions", harmless);
  ASSERT_EQ(same.status, 200) << same.body;
  EXPECT_EQ(same.json["choices"][0]["message"]["content"], plain.json["choices"][0]["message"]["content"]);
  HttpReply completion =
      Post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}, {"echo", false}, {"best_of", 1}, {"user", "u"}});
  EXPECT_EQ(completion.status, 200) << completion.body;
  // Structured output: the JSON parses and validates whatever the weights.
  const json schema = {{"type", "object"},
                       {"properties", {{"a", {{"enum", {"x", "y"}}}}, {"n", {{"type", "integer"}}}}},
                       {"required", {"a", "n"}}};
  // (Bounded whitespace, enums and digits: it ends within the tiny context.)
  HttpReply structured = Post("/v1/chat/completions", {{"messages", messages},
                                                       {"max_tokens", 210},
                                                       {"temperature", 0.8},
                                                       {"seed", 3},
                                                       {"n", 2},
                                                       {"response_format",
                                                        {{"type", "json_schema"},
                                                         {"json_schema", {{"name", "s"}, {"schema", schema}}}}}});
  ASSERT_EQ(structured.status, 200) << structured.body;
  for (const json& choice : structured.json["choices"]) {
    const json got = json::parse(choice["message"]["content"].get<std::string>(), nullptr, false);
    ASSERT_TRUE(got.is_object()) << choice;
    EXPECT_TRUE(got["a"] == "x" || got["a"] == "y") << got;
    EXPECT_TRUE(got["n"].is_number_integer()) << got;
    EXPECT_EQ(choice["finish_reason"], "stop");
  }
  HttpReply object = Post("/v1/completions", {{"prompt", "{"}, {"max_tokens", 240}, {"temperature", 0},
                                               {"json_schema", schema}});
  ASSERT_EQ(object.status, 200) << object.body;
  EXPECT_TRUE(json::parse(object.json["choices"][0]["text"].get<std::string>(), nullptr, false).is_object())
      << object.body;
  // /apply-template only renders: tools are fine there.
  HttpReply applied = Post("/apply-template", {{"messages", messages}, {"tools", json::array({tool})}});
  EXPECT_EQ(applied.status, 200) << applied.body;
}

TEST_F(HttpServerTest, BeamSearchThroughBeamWidth) {
  const auto prompt = RandomTokens(6, 512, 321);
  v1::BeamSearchRequest request;
  request.mutable_prompt_ids()->Add(prompt.begin(), prompt.end());
  request.set_beam_width(3);
  request.set_max_tokens(4);
  request.set_num_return_sequences(2);
  request.set_ignore_eos(true);
  grpc::ClientContext context;
  auto reader = grpc().NewStub()->BeamSearch(&context, request);
  std::vector<std::string> expected;
  v1::BeamSearchResponse response;
  while (reader->Read(&response)) {
    for (const v1::BeamSequence& s : response.sequences()) expected.push_back(s.text());
  }
  ASSERT_TRUE(reader->Finish().ok());
  HttpReply reply = Post("/v1/completions",
                         {{"prompt", prompt}, {"max_tokens", 4}, {"beam_width", 3}, {"n", 2}, {"ignore_eos", true}});
  ASSERT_EQ(reply.status, 200) << reply.body;
  ASSERT_EQ(reply.json["choices"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(reply.json["choices"][i]["text"], expected[i]);
    EXPECT_EQ(reply.json["choices"][i]["finish_reason"], "length");
    EXPECT_TRUE(reply.json["choices"][i]["beam_score"].is_number());
  }
  ExpectError(Post("/v1/completions", {{"prompt", prompt}, {"beam_width", 3}, {"stream", true}}), 400, "beam_width");
}

TEST_F(HttpServerTest, TokenizeAndDetokenize) {
  const std::string text = "Hello tandem world";
  HttpReply tokens = Post("/tokenize", {{"content", text}});
  ASSERT_EQ(tokens.status, 200) << tokens.body;
  std::vector<int32_t> ids = tokens.json["tokens"].get<std::vector<int32_t>>();
  EXPECT_EQ(ids, GrpcTokenize(grpc(), text, false));
  HttpReply with_bos = Post("/tokenize", {{"content", text}, {"add_special", true}});
  EXPECT_EQ(with_bos.json["tokens"].get<std::vector<int32_t>>(), GrpcTokenize(grpc(), text, true));
  HttpReply pieces = Post("/tokenize", {{"content", text}, {"with_pieces", true}});
  ASSERT_EQ(pieces.json["tokens"].size(), ids.size());
  EXPECT_EQ(pieces.json["tokens"][0]["id"], ids[0]);
  EXPECT_TRUE(pieces.json["tokens"][0]["piece"].is_string());
  HttpReply back = Post("/detokenize", {{"tokens", ids}});
  ASSERT_EQ(back.status, 200) << back.body;
  EXPECT_EQ(back.json["content"], text);
  ExpectError(Post("/detokenize", {{"tokens", {1, 100000}}}), 400, "tokens");
  ExpectError(Post("/tokenize", {{"text", "wrong field"}}), 400, "content");
}

TEST_F(HttpServerTest, ErrorsAreOpenAiShapedWithTheRightStatus) {
  const auto prompt = RandomTokens(4, 512, 5);
  ExpectError(HttpPost(port(), "/v1/completions", std::string("{not json")).value(), 400, "");
  ExpectError(Post("/v1/completions", json::array({1, 2})), 400, "");
  ExpectError(Post("/v1/completions", {{"max_tokens", 3}}), 400, "prompt");
  ExpectError(Post("/v1/completions", {{"prompt", prompt}, {"temperature", -1}}), 400, "temperature");
  ExpectError(Post("/v1/completions", {{"prompt", prompt}, {"temperature", "hot"}}), 400, "temperature");
  ExpectError(Post("/v1/completions", {{"prompt", prompt}, {"top_p", 1.5}}), 400, "top_p");
  ExpectError(Post("/v1/completions", {{"prompt", prompt}, {"min_p", 2}}), 400, "min_p");
  ExpectError(Post("/v1/completions", {{"prompt", prompt}, {"presence_penalty", 3}}), 400, "presence_penalty");
  ExpectError(Post("/v1/completions", {{"prompt", prompt}, {"frequency_penalty", -3}}), 400, "frequency_penalty");
  ExpectError(Post("/v1/completions", {{"prompt", prompt}, {"repetition_penalty", 0}}), 400, "repetition_penalty");
  ExpectError(Post("/v1/completions", {{"prompt", prompt}, {"n", 0}}), 400, "n");
  ExpectError(Post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 0}}), 400, "max_tokens");
  ExpectError(Post("/v1/completions", {{"prompt", prompt}, {"stop", 5}}), 400, "stop");
  ExpectError(Post("/v1/completions", {{"prompt", prompt}, {"logprobs", 50}}), 400, "logprobs");
  ExpectError(Post("/v1/completions", {{"prompt", {1, 999999}}}), 400, "");
  ExpectError(Post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 100000000}}), 400, "");
  ExpectError(Post("/v1/chat/completions", {{"messages", json::array()}}), 400, "messages");
  ExpectError(Post("/v1/chat/completions", {{"messages", {{{"content", "no role"}}}}}), 400, "messages[0].role");
  ExpectError(Post("/v1/chat/completions",
                   {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"logprobs", false}, {"top_logprobs", 2}}),
              400, "top_logprobs");
  ExpectError(Get("/v1/nothing-here"), 404, "");
  // Over --http_max_body_bytes (64 KiB).
  ExpectError(HttpPost(port(), "/v1/completions", std::string(70000, ' ')).value(), 413, "");
  // The server still serves.
  EXPECT_EQ(Get("/health").status, 200);
  ExpectAllBlocksFree();
}

// A raw HTTP/1.1 client: sends a streaming request, reads until the first
// token event, and hangs up.
void StreamAndHangUp(int port, const std::string& body) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string request =
      absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                   "Content-Type: application/json\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
  ASSERT_EQ(write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  std::string got;
  char buffer[4096];
  while (!absl::StrContains(got, "\"text\"")) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    ASSERT_GT(n, 0) << got;
    got.append(buffer, static_cast<size_t>(n));
  }
  EXPECT_TRUE(absl::StartsWith(got, "HTTP/1.1 200")) << got;
  close(fd);
}

// The client reads the first text chunk and closes. The tiny model can
// write all 240 tokens into the socket's buffer before a client the host
// has descheduled gets to close (seen under a load of 3.5): that request
// succeeded before anyone left, which tests nothing, so it is tried again.
TEST_F(HttpServerTest, ClientDisconnectCancelsAndFreesTheCache) {
  const json body = {{"prompt", RandomTokens(8, 512, 11)},
                     {"max_tokens", 240},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"stream", true}};
  bool cancelled = false;
  int outran = 0;
  for (int attempt = 0; attempt < 5 && !cancelled; ++attempt) {
    const int64_t cancelled_before = Metric("tandem_requests_total{outcome=\"cancelled\"}");
    const int64_t succeeded_before = Metric("tandem_requests_total{outcome=\"succeeded\"}");
    StreamAndHangUp(port(), body.dump());
    bool succeeded = false;
    for (int i = 0; i < 500 && !cancelled && !succeeded; ++i) {
      cancelled = Metric("tandem_requests_total{outcome=\"cancelled\"}") > cancelled_before;
      succeeded = Metric("tandem_requests_total{outcome=\"succeeded\"}") > succeeded_before;
      if (!cancelled && !succeeded) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (succeeded) ++outran;
    else if (!cancelled) break;  // neither in 10 s: the request ran on after its client left
  }
  EXPECT_TRUE(cancelled) << "the request ran on after its client left (" << outran
                         << " attempts finished before the hang-up)";
  ExpectAllBlocksFree();
}

TEST_F(HttpServerTest, MetricsInPrometheusFormat) {
  Post("/v1/completions", {{"prompt", RandomTokens(3, 512, 1)}, {"max_tokens", 2}, {"temperature", 0}});
  HttpReply metrics = Get("/metrics");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_TRUE(absl::StartsWith(metrics.content_type, "text/plain")) << metrics.content_type;
  for (const char* series :
       {"# TYPE tandem_requests_total counter", "tandem_requests_total{outcome=\"succeeded\"} ",
        "tandem_requests_total{outcome=\"failed\"} ", "tandem_requests_total{outcome=\"rejected\"} ",
        "tandem_generated_tokens_total ", "tandem_prompt_tokens_total ", "tandem_queue_depth ",
        "tandem_kv_blocks_in_use ", "tandem_kv_blocks_total ", "tandem_kv_cache_usage_ratio ",
        "tandem_step_latency_ms ", "tandem_layer_time_ms{layer=\"0\",part=\"experts\"} ", "tandem_ready 1",
        "tandem_http_responses_total{path=\"/v1/completions\",code=\"200\"} "}) {
    EXPECT_TRUE(absl::StrContains(metrics.body, series)) << series << "\n" << metrics.body;
  }
  EXPECT_GT(Metric("tandem_requests_total{outcome=\"succeeded\"}"), 0);
  EXPECT_GT(Metric("tandem_kv_blocks_total"), 0);
}

TEST(HttpServerFlagsTest, NoChatTemplateIsAClearErrorRemoteHostsNeedAFlagAndHelpListsFlags) {
  ScopedTempDir dir;
  ASSERT_OK(WriteTestModel(dir.path() / "model"));
  absl::StatusOr<HttpServerProcess> server =
      StartHttpServer(dir.path() / "model", dir.path(), {"--threads", "1"}, "plain");
  ASSERT_OK(server);
  absl::StatusOr<HttpReply> chat =
      HttpPost(server->port, "/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}});
  ASSERT_OK(chat);
  EXPECT_EQ(chat->status, 400) << chat->body;
  EXPECT_TRUE(absl::StrContains(chat->json["error"]["message"].get<std::string>(), "no chat template")) << chat->body;
  EXPECT_TRUE(absl::StrContains(chat->json["error"]["message"].get<std::string>(), "--chat_template")) << chat->body;
  // Completions need no template; the model's folder name is its name.
  absl::StatusOr<HttpReply> models = HttpGet(server->port, "/v1/models");
  ASSERT_OK(models);
  EXPECT_EQ(models->json["data"][0]["id"], "model");

  absl::StatusOr<ProcessResult> remote = RunProcess({std::string(TANDEM_BINARY_DIR) + "/bin/tandem-server", "--model",
                                                     (dir.path() / "model").string(), "--http_listen", "0.0.0.0:8080"},
                                                    {}, dir.path(), absl::Seconds(60));
  ASSERT_OK(remote);
  EXPECT_NE(remote->exit_code, 0);
  EXPECT_TRUE(absl::StrContains(remote->err, "--http_allow_remote")) << remote->err;
  absl::StatusOr<ProcessResult> bad =
      RunProcess({std::string(TANDEM_BINARY_DIR) + "/bin/tandem-server", "--model", (dir.path() / "model").string(),
                  "--http_listen", "localhost:notaport"},
                 {}, dir.path(), absl::Seconds(60));
  ASSERT_OK(bad);
  EXPECT_NE(bad->exit_code, 0);
  EXPECT_TRUE(absl::StrContains(bad->err, "--http_listen")) << bad->err;

  // --help lists the flags, grouped by what they are for, not by source file.
  for (const char* program : {"tandem-server", "tandem-cpu-worker", "tandem", "tandem-generate", "tandem-quantize"}) {
    absl::StatusOr<ProcessResult> help =
        RunProcess({absl::StrCat(TANDEM_BINARY_DIR, "/bin/", program), "--help"}, {}, dir.path(), absl::Seconds(30));
    ASSERT_OK(help);
    EXPECT_EQ(help->exit_code, 0) << program;
    const std::string text = help->out + help->err;
    EXPECT_FALSE(absl::StrContains(text, "No flags matched")) << program << ": " << text;
    EXPECT_FALSE(absl::StrContains(text, "Flags from")) << program << ": " << text;
    EXPECT_TRUE(absl::StrContains(text, "(default ")) << program << ": " << text;
  }
  const std::string server_binary = std::string(TANDEM_BINARY_DIR) + "/bin/tandem-server";
  absl::StatusOr<ProcessResult> help = RunProcess({server_binary, "--help"}, {}, dir.path(), absl::Seconds(30));
  ASSERT_OK(help);
  const std::vector<std::string> lines = absl::StrSplit(help->out, '\n');
  std::vector<std::string> listed;  // flag names in the order printed
  for (const std::string& line : lines) {
    if (absl::StartsWith(line, "  --")) listed.push_back(line.substr(4, line.find(' ', 4) - 4));
  }
  ASSERT_FALSE(listed.empty()) << help->out;
  EXPECT_EQ(listed[0], "model") << help->out;
  auto position = [&](const std::string& flag) {
    return std::find(listed.begin(), listed.end(), flag) - listed.begin();
  };
  EXPECT_LT(position("http_listen"), 12) << help->out;
  EXPECT_LT(position("threads"), 25) << help->out;
  for (const std::string& flag : listed) EXPECT_EQ(std::count(listed.begin(), listed.end(), flag), 1) << flag;
  for (const char* flag : {"http_allow_remote", "chat_template", "max_sequences", "api_key_file", "cors_origins",
                           "kv_cache_tokens", "workers", "max_isa", "http_max_queued", "max_rpc_threads"}) {
    EXPECT_LT(position(flag), static_cast<long>(listed.size())) << flag << " missing from --help";
  }
  EXPECT_LT(help->out.find("Model:"), help->out.find("Where it listens")) << help->out;
  absl::StatusOr<ProcessResult> short_help = RunProcess({server_binary, "-h"}, {}, dir.path(), absl::Seconds(30));
  ASSERT_OK(short_help);
  EXPECT_EQ(short_help->exit_code, 0);
  EXPECT_EQ(short_help->out, help->out);
  absl::StatusOr<ProcessResult> full = RunProcess({server_binary, "--helpfull"}, {}, dir.path(), absl::Seconds(30));
  ASSERT_OK(full);
  EXPECT_TRUE(absl::StrContains(full->out + full->err, "--flagfile")) << "--helpfull keeps absl's listing";
}

}  // namespace
}  // namespace tandem
