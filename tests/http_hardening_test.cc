// tandem-server's HTTP front end against what the internet and a browser tab
// can send, as a real process (the findings of a hostile-client probe, each
// one a test that failed before its fix):
//   - bodies nested 100,000 deep (a stack overflow before) are 400, through
//     every field that takes JSON, and the server lives on;
//   - eight 8 MB bodies of '[' at once, 4 million values, a 64 MB chunked
//     body: refused, and the server's peak memory grows by less than 256 MB
//     (5.4 GB before);
//   - browsers: text/plain and form bodies 415, a foreign Origin or Host 403,
//     CORS only for --cors_origins;
//   - requests that can never succeed are 400/413, not the 429 clients retry;
//   - a prompt text too long for the context is refused before tokenizing;
//   - clients that leave non-streaming requests get their work cancelled, and
//     /health and /metrics answer while every request thread is busy;
//   - no library exception text or server path in any response;
//   - SIGTERM drains: new requests 503, streams end with an error event and
//     [DONE]; a second server on the port fails to start; a remote listener
//     needs an API key (or --insecure_no_auth, logged loudly);
//   - tandem-generate given a FIFO as the model fails instead of hanging.
#include <signal.h>
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/model/synthetic_model.h"
#include "tests/http_testlib.h"
#include "tests/raw_http_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"

namespace tandem {
namespace {

using nlohmann::json;

constexpr absl::Duration kWait = absl::Seconds(60);

// The "demo" preset: a 4096-token context and slow enough steps that a
// request of a few thousand tokens is still running seconds later.
absl::Status WriteDemoModel(const std::filesystem::path& dir) {
  return WriteSyntheticModel(SyntheticModelSpec{.preset = "demo", .seed = 3}, dir, {.with_tokenizer = true});
}

// One request by hand: the whole response text.
std::string Exchange(int port, const std::string& request, absl::Duration timeout = kWait) {
  absl::StatusOr<ScopedFd> fd = ConnectLoopback(port);
  if (!fd.ok()) return fd.status().ToString();
  if (absl::Status sent = SendAll(fd->get(), request); !sent.ok()) {
    // The server may answer and close before taking a large body whole.
    absl::StatusOr<std::string> early = ReadResponse(fd->get(), absl::Seconds(5));
    return early.ok() ? *early : sent.ToString();
  }
  absl::StatusOr<std::string> response = ReadResponse(fd->get(), timeout);
  return response.ok() ? *response : response.status().ToString();
}

std::string Post(int port, const std::string& path, const std::string& body,
                 const std::string& content_type = "application/json", const std::string& extra_headers = "") {
  return absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: 127.0.0.1:", port, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\n", extra_headers, "\r\n", body);
}

std::string Get(int port, const std::string& path, const std::string& extra_headers = "") {
  return absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: 127.0.0.1:", port, "\r\n", extra_headers, "\r\n");
}

json BodyJson(const std::string& response) {
  return json::parse(ResponseBody(response), nullptr, /*allow_exceptions=*/false);
}

class HttpHardeningTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    ASSERT_OK(WriteDemoModel(dir_->path() / "model"));
    // A template that raises on request: its error must not name where it lives.
    std::ofstream(dir_->path() / "raising.jinja")
        << "{% if messages[0]['content'] == 'raise' %}{{ raise_exception('refused by the template') }}{% endif %}"
           "{% for m in messages %}{{ m['content'] }}{% endfor %}";
    absl::StatusOr<HttpServerProcess> started = StartHttpServer(
        dir_->path() / "model", dir_->path(),
        {"--threads", "2", "--max_sequences", "4", "--kv_cache_tokens", "8192", "--http_max_connections", "8",
         "--http_max_queued", "8", "--chat_template", (dir_->path() / "raising.jinja").string()},
        "server");
    ASSERT_OK(started);
    server_ = new HttpServerProcess(std::move(*started));
  }
  static void TearDownTestSuite() {
    delete server_;
    delete dir_;
  }
  static int port() { return server_->port; }
  static int pid() { return server_->server->process().pid(); }

  static int64_t Metric(const std::string& series) {
    const std::string response = Exchange(port(), Get(port(), "/metrics"), absl::Seconds(10));
    for (absl::string_view line : absl::StrSplit(ResponseBody(response), '\n')) {
      if (absl::StartsWith(line, series + " ")) {
        double v = 0;
        if (absl::SimpleAtod(line.substr(series.size() + 1), &v)) return static_cast<int64_t>(v);
      }
    }
    return -1;
  }
  static void ExpectAlive() {
    EXPECT_EQ(ResponseStatus(Exchange(port(), Get(port(), "/health"))), 200) << server_->server->LogTail();
  }

  static ScopedTempDir* dir_;
  static HttpServerProcess* server_;
};

ScopedTempDir* HttpHardeningTest::dir_ = nullptr;
HttpServerProcess* HttpHardeningTest::server_ = nullptr;

TEST_F(HttpHardeningTest, DeepNestingIsA400ThroughEveryJsonField) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::vector<std::pair<std::string, std::string>> bodies = {
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":)" + deep + "}]}"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"tools":)" + deep + "}"},
      {"/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"x":)" + deep + "}}"},
      {"/apply-template", R"({"messages":[{"role":"user","content":)" + deep + "}]}"},
      {"/v1/completions", R"({"prompt":)" + deep + "}"},
      {"/tokenize", R"({"content":)" + deep + "}"},
  };
  for (const auto& [path, body] : bodies) {
    const std::string response = Exchange(port(), Post(port(), path, body));
    EXPECT_EQ(ResponseStatus(response), 400) << path << ": " << response.substr(0, 300);
    EXPECT_TRUE(absl::StrContains(response, "deeper than 64 levels")) << response.substr(0, 300);
    ExpectAlive();
  }
}

TEST_F(HttpHardeningTest, HostileBodiesKeepMemoryBounded) {
  const int64_t peak_before = PeakRssKb(pid());
  ASSERT_GT(peak_before, 0);
  // Eight 8 MB bodies of '[' at once.
  const std::string brackets(8 << 20, '[');
  std::vector<std::thread> clients;
  std::vector<int> statuses(8);
  for (int i = 0; i < 8; ++i) {
    clients.emplace_back([&, i] {
      statuses[i] = ResponseStatus(Exchange(port(), Post(port(), "/v1/chat/completions", brackets)));
    });
  }
  for (std::thread& t : clients) t.join();
  for (int status : statuses) EXPECT_EQ(status, 400);
  // Four million values within the byte limit: refused by count.
  std::string zeros = R"({"prompt":[)";
  while (zeros.size() < (8u << 20) - 16) zeros += "0,";
  zeros += "0]}";
  EXPECT_EQ(ResponseStatus(Exchange(port(), Post(port(), "/v1/completions", zeros))), 413);
  // 64 MB chunked: refused once it passes the 8 MiB limit.
  absl::StatusOr<ScopedFd> fd = ConnectLoopback(port());
  ASSERT_OK(fd);
  ASSERT_OK(SendAll(fd->get(), absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:", port(),
                                            "\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")));
  const std::string chunk = absl::StrCat("100000\r\n", std::string(1 << 20, 'a'), "\r\n");
  for (int i = 0; i < 64 && SendAll(fd->get(), chunk).ok(); ++i) {
  }
  absl::StatusOr<std::string> refused = ReadResponse(fd->get(), absl::Seconds(10));
  ASSERT_OK(refused);
  EXPECT_EQ(ResponseStatus(*refused), 413) << refused->substr(0, 300);
  const int64_t grew_mb = (PeakRssKb(pid()) - peak_before) / 1024;
  EXPECT_LT(grew_mb, 256) << "peak RSS grew by " << grew_mb << " MB";
  ExpectAlive();
  EXPECT_EQ(Metric("tandem_http_request_memory_bytes"), 0);
}

TEST_F(HttpHardeningTest, BrowserRequestsFromOtherSitesAreRefused) {
  const std::string chat = R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":1})";
  EXPECT_EQ(ResponseStatus(Exchange(port(), Post(port(), "/v1/chat/completions", chat, "text/plain"))), 415);
  EXPECT_EQ(ResponseStatus(Exchange(port(), Post(port(), "/v1/chat/completions", chat,
                                                 "application/x-www-form-urlencoded"))),
            415);
  EXPECT_EQ(ResponseStatus(
                Exchange(port(), Post(port(), "/v1/chat/completions", chat, "application/json",
                                      "Origin: https://evil.example\r\n"))),
            403);
  const std::string rebound = absl::StrCat("GET /v1/models HTTP/1.1\r\nHost: evil.example:", port(), "\r\n\r\n");
  EXPECT_EQ(ResponseStatus(Exchange(port(), rebound)), 403);
  const std::string preflight =
      absl::StrCat("OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:", port(),
                   "\r\nOrigin: https://evil.example\r\nAccess-Control-Request-Method: POST\r\n\r\n");
  const std::string answer = Exchange(port(), preflight);
  EXPECT_EQ(ResponseStatus(answer), 403);
  EXPECT_EQ(ResponseHeader(answer, "access-control-allow-origin"), "");
  // The server's own page may call it.
  EXPECT_EQ(ResponseStatus(Exchange(port(), Get(port(), "/v1/models",
                                                absl::StrCat("Origin: http://127.0.0.1:", port(), "\r\n")))),
            200);
}

TEST_F(HttpHardeningTest, RequestsThatCanNeverSucceedAreNot429) {
  // beam_width 8 > --max_sequences 4.
  const std::string beam = Exchange(
      port(), Post(port(), "/v1/completions", R"({"prompt":"The licensee","beam_width":8,"max_tokens":4})"));
  EXPECT_EQ(ResponseStatus(beam), 400) << beam;
  EXPECT_TRUE(absl::StrContains(beam, "max_sequences")) << beam;
  // More KV cache than the whole pool (8192 tokens): 4 beams of 1000 + 3000.
  json ids = json::array();
  for (int i = 0; i < 1000; ++i) ids.push_back(5 + i % 100);
  const std::string kv = Exchange(
      port(), Post(port(), "/v1/completions",
                   json{{"prompt", ids}, {"max_tokens", 3000}, {"beam_width", 4}, {"n", 1}}.dump()));
  EXPECT_EQ(ResponseStatus(kv), 400) << kv.substr(0, 400);
  // 100,000 messages, and a 4M-element tools array: refused by size.
  std::string many = R"({"messages":[)";
  for (int i = 0; i < 100000; ++i) many += R"({"role":"user","content":"x"},)";
  many.back() = ']';
  many += "}";
  EXPECT_EQ(ResponseStatus(Exchange(port(), Post(port(), "/v1/chat/completions", many))), 413);
  std::string tools = R"({"messages":[{"role":"user","content":"x"}],"tools":[)";
  while (tools.size() < (8u << 20) - 16) tools += "1,";
  tools += "1]}";
  EXPECT_EQ(ResponseStatus(Exchange(port(), Post(port(), "/v1/chat/completions", tools))), 413);
}

TEST_F(HttpHardeningTest, BadFieldsAreNamedWithoutLibraryTextOrPaths) {
  const std::string tokenize =
      Exchange(port(), Post(port(), "/tokenize", R"({"content":"hello","add_special":"yes"})"));
  EXPECT_EQ(ResponseStatus(tokenize), 400) << tokenize;
  EXPECT_EQ(BodyJson(tokenize)["error"]["param"], "add_special") << tokenize;
  EXPECT_EQ(ResponseHeader(tokenize, "exception_what"), "");
  EXPECT_FALSE(absl::StrContains(tokenize, "json.exception")) << tokenize;
  const std::string raised = Exchange(
      port(), Post(port(), "/v1/chat/completions", R"({"messages":[{"role":"user","content":"raise"}]})"));
  EXPECT_EQ(ResponseStatus(raised), 400) << raised;
  EXPECT_TRUE(absl::StrContains(raised, "refused by the template")) << raised;
  EXPECT_FALSE(absl::StrContains(raised, dir_->path().string())) << raised;
  const std::string models = Exchange(port(), Get(port(), "/v1/models"));
  EXPECT_FALSE(absl::StrContains(models, dir_->path().string())) << models;
}

TEST_F(HttpHardeningTest, LongPromptTextIsRefusedBeforeTokenizing) {
  std::string text(7900000, 'a');
  for (size_t i = 5; i < text.size(); i += 6) text[i] = ' ';
  const std::string response =
      Exchange(port(), Post(port(), "/v1/completions", json{{"prompt", text}, {"max_tokens", 1}}.dump()));
  EXPECT_EQ(ResponseStatus(response), 400) << response.substr(0, 300);
  // The bound on its size, not a count after tokenizing, refused it.
  EXPECT_TRUE(absl::StrContains(response, "bytes of text are at least")) << response.substr(0, 300);
}

TEST_F(HttpHardeningTest, ClientsThatLeaveHaveTheirWorkCancelled) {
  const std::string long_request =
      Post(port(), "/v1/completions", R"({"prompt":"The licensee","max_tokens":4000,"ignore_eos":true})");
  {
    std::vector<ScopedFd> clients;
    for (int i = 0; i < 16; ++i) {
      absl::StatusOr<ScopedFd> fd = ConnectLoopback(port());
      ASSERT_OK(fd);
      ASSERT_OK(SendAll(fd->get(), long_request));
      clients.push_back(std::move(*fd));
    }
    absl::SleepFor(absl::Milliseconds(500));
  }  // all 16 leave, running and queued alike
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  while (absl::Now() < deadline &&
         (Metric("tandem_requests_active") != 0 || Metric("tandem_queue_depth") != 0 ||
          Metric("tandem_http_requests_in_handlers") > 1 || Metric("tandem_http_requests_queued") != 0)) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(Metric("tandem_requests_active"), 0);
  EXPECT_EQ(Metric("tandem_queue_depth"), 0);
  EXPECT_EQ(Metric("tandem_kv_blocks_in_use"), 0);
  EXPECT_EQ(Metric("tandem_http_requests_queued"), 0);
}

TEST_F(HttpHardeningTest, HealthAndMetricsAnswerWhileEveryRequestThreadIsBusy) {
  // 8 streams fill the 8 request threads; 4 more wait in the queue.
  const std::string stream = Post(
      port(), "/v1/completions", R"({"prompt":"The licensee","max_tokens":3000,"ignore_eos":true,"stream":true})");
  std::vector<ScopedFd> clients;
  for (int i = 0; i < 12; ++i) {
    absl::StatusOr<ScopedFd> fd = ConnectLoopback(port());
    ASSERT_OK(fd);
    ASSERT_OK(SendAll(fd->get(), stream));
    clients.push_back(std::move(*fd));
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (Metric("tandem_http_requests_queued") < 4 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_GE(Metric("tandem_http_requests_queued"), 1);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(ResponseStatus(Exchange(port(), Get(port(), "/health"), absl::Seconds(5))), 200);
    EXPECT_EQ(ResponseStatus(Exchange(port(), Get(port(), "/metrics"), absl::Seconds(5))), 200);
  }
  clients.clear();
}

// Servers of their own.
class HttpLifecycleTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_OK(WriteDemoModel(dir_.path() / "model")); }
  ScopedTempDir dir_;
};

TEST_F(HttpLifecycleTest, SigtermDrainsStreamsWithAnErrorEventAndDone) {
  absl::StatusOr<HttpServerProcess> server =
      StartHttpServer(dir_.path() / "model", dir_.path(), {"--threads", "2", "--shutdown_grace_s", "0.5"}, "drain");
  ASSERT_OK(server);
  const int port = server->port;
  absl::StatusOr<ScopedFd> fd = ConnectLoopback(port);
  ASSERT_OK(fd);
  ASSERT_OK(SendAll(fd->get(), Post(port, "/v1/completions",
                                    R"({"prompt":"The licensee","max_tokens":4000,"ignore_eos":true,"stream":true})")));
  absl::SleepFor(absl::Milliseconds(500));
  server->server->process().Kill(SIGTERM);
  absl::StatusOr<std::string> response = ReadResponse(fd->get(), absl::Seconds(20));
  ASSERT_OK(response);
  absl::StatusOr<std::vector<json>> events = SseData(ResponseBody(*response));
  ASSERT_OK(events);
  ASSERT_GE(events->size(), 2u);
  EXPECT_EQ(events->back(), "[DONE]");
  const json& error = (*events)[events->size() - 2];
  ASSERT_TRUE(error.contains("error")) << error;
  EXPECT_EQ(error["error"]["code"], "shutting_down") << error;
  absl::StatusOr<int> exit_code = server->server->process().Wait(absl::Seconds(20));
  ASSERT_OK(exit_code);
  EXPECT_EQ(*exit_code, 0) << server->server->LogTail();
}

TEST_F(HttpLifecycleTest, ASecondServerCannotShareThePort) {
  absl::StatusOr<HttpServerProcess> first = StartHttpServer(dir_.path() / "model", dir_.path(), {}, "first");
  ASSERT_OK(first);
  ServerProcess second(ServerProcessOptions{
      .model_dir = dir_.path() / "model",
      .socket = dir_.path() / "second.sock",
      .extra_args = {"--http_listen", absl::StrCat("127.0.0.1:", first->port)},
      .log = dir_.path() / "second.log"});
  EXPECT_FALSE(second.Start(absl::Seconds(30)).ok());
  EXPECT_TRUE(absl::StrContains(second.LogTail(), "in use")) << second.LogTail();
  EXPECT_EQ(ResponseStatus(Exchange(first->port, Get(first->port, "/health"))), 200);
}

TEST_F(HttpLifecycleTest, ARemoteListenerNeedsAKeyOrASaidInsecureFlag) {
  ServerProcess refused(ServerProcessOptions{.model_dir = dir_.path() / "model",
                                             .socket = dir_.path() / "refused.sock",
                                             .extra_args = {"--http_listen", "0.0.0.0:0", "--http_allow_remote"},
                                             .log = dir_.path() / "refused.log"});
  EXPECT_FALSE(refused.Start(absl::Seconds(30)).ok());
  EXPECT_TRUE(absl::StrContains(refused.LogTail(), "--api_key_file")) << refused.LogTail();

  ServerProcess insecure(
      ServerProcessOptions{.model_dir = dir_.path() / "model",
                           .socket = dir_.path() / "insecure.sock",
                           .extra_args = {"--http_listen", "0.0.0.0:0", "--http_allow_remote", "--insecure_no_auth"},
                           .log = dir_.path() / "insecure.log"});
  ASSERT_OK(insecure.Start());
  EXPECT_TRUE(absl::StrContains(insecure.LogTail(), "NO AUTHENTICATION")) << insecure.LogTail();
  insecure.Stop();

  const std::string key_file = (dir_.path() / "key").string();
  std::ofstream(key_file) << "sk-test-0123456789abcdef\n";
  ::chmod(key_file.c_str(), 0600);
  absl::StatusOr<HttpServerProcess> keyed =
      StartHttpServer(dir_.path() / "model", dir_.path(), {"--api_key_file", key_file}, "keyed");
  ASSERT_OK(keyed);
  const int port = keyed->port;
  const std::string denied = Exchange(port, Get(port, "/v1/models"));
  EXPECT_EQ(ResponseStatus(denied), 401) << denied;
  EXPECT_EQ(BodyJson(denied)["error"]["code"], "invalid_api_key");
  EXPECT_EQ(ResponseStatus(Exchange(port, Get(port, "/v1/models", "Authorization: Bearer wrong-key-0123456789\r\n"))),
            401);
  EXPECT_EQ(
      ResponseStatus(Exchange(port, Get(port, "/v1/models", "Authorization: Bearer sk-test-0123456789abcdef\r\n"))),
      200);
  EXPECT_EQ(ResponseStatus(Exchange(port, Get(port, "/health"))), 200);
}

TEST_F(HttpLifecycleTest, CorsOriginsAreAnsweredWhenListed) {
  absl::StatusOr<HttpServerProcess> server = StartHttpServer(
      dir_.path() / "model", dir_.path(), {"--cors_origins", "https://app.example"}, "cors");
  ASSERT_OK(server);
  const int port = server->port;
  const std::string preflight =
      absl::StrCat("OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:", port,
                   "\r\nOrigin: https://app.example\r\nAccess-Control-Request-Method: POST\r\n"
                   "Access-Control-Request-Headers: authorization, content-type\r\n\r\n");
  const std::string answer = Exchange(port, preflight);
  EXPECT_EQ(ResponseStatus(answer), 204) << answer;
  EXPECT_EQ(ResponseHeader(answer, "access-control-allow-origin"), "https://app.example");
  const std::string models = Exchange(port, Get(port, "/v1/models", "Origin: https://app.example\r\n"));
  EXPECT_EQ(ResponseStatus(models), 200);
  EXPECT_EQ(ResponseHeader(models, "access-control-allow-origin"), "https://app.example");
}

TEST(GenerateFifoTest, AFifoAsTheModelFailsInsteadOfHanging) {
  ScopedTempDir dir;
  const std::string fifo = (dir.path() / "model.gguf").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ChildProcess generate;
  ASSERT_OK(generate.Spawn({TANDEM_BINARY_DIR "/bin/tandem-generate", "--model", fifo, "--prompt", "hi"},
                           dir.path() / "generate.log"));
  absl::StatusOr<int> exit_code = generate.Wait(absl::Seconds(30));
  ASSERT_OK(exit_code) << generate.LogTail();
  EXPECT_NE(*exit_code, 0);
  EXPECT_TRUE(absl::StrContains(generate.LogTail(), "not a regular file")) << generate.LogTail();
}

}  // namespace
}  // namespace tandem
