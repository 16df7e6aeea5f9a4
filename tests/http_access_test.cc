// Who may call the HTTP API (coordinator/http/http_access.h), decided from
// the header alone: the Host must name this server (DNS rebinding), a
// browser's Origin must be the server's own page or a --cors_origins one,
// and with a key every endpoint but /health and / needs it; the key file
// must be the user's alone.
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>

#include "absl/strings/match.h"
#include "coordinator/serving/http/http_access.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"

namespace tandem {
namespace {

HttpRequest Head(std::string path, std::vector<std::pair<std::string, std::string>> headers,
                 std::string method = "GET") {
  HttpRequest r;
  r.method = std::move(method);
  r.path = std::move(path);
  r.target = r.path;
  r.headers = std::move(headers);
  return r;
}

int StatusOf(const HttpAccess& access, const HttpRequest& head) {
  std::optional<HttpError> error = access.Check(head);
  return error ? error->status : 200;
}

TEST(HttpAccessTest, HostNameParsing) {
  EXPECT_EQ(HostName("Example.COM:8080"), "example.com");
  EXPECT_EQ(HostName("localhost"), "localhost");
  EXPECT_EQ(HostName("[::1]:80"), "::1");
  EXPECT_EQ(HostName("[::1]"), "::1");
  EXPECT_EQ(HostName("[::1"), "");
  EXPECT_EQ(HostName("a:b:c"), "");
  EXPECT_EQ(HostName(""), "");
}

TEST(HttpAccessTest, LoopbackServersAnswerOnlyTheirOwnNames) {
  const HttpAccess access({.listen_host = "127.0.0.1"});
  for (const char* host : {"127.0.0.1:8080", "localhost:8080", "LOCALHOST", "[::1]:8080"}) {
    EXPECT_EQ(StatusOf(access, Head("/v1/models", {{"host", host}})), 200) << host;
  }
  // A rebinding page: its own name, resolved to 127.0.0.1.
  EXPECT_EQ(StatusOf(access, Head("/v1/models", {{"host", "evil.example:8080"}})), 403);
  EXPECT_EQ(StatusOf(access, Head("/v1/models", {})), 400);  // HTTP/1.1 needs a Host
  HttpRequest old = Head("/v1/models", {});
  old.version = 10;
  EXPECT_EQ(StatusOf(access, old), 200);
  const HttpAccess named({.listen_host = "127.0.0.1", .allowed_hosts = {"box.lan"}});
  EXPECT_EQ(StatusOf(named, Head("/v1/models", {{"host", "box.lan:8080"}})), 200);
  const HttpAccess any({.listen_host = "127.0.0.1", .allowed_hosts = {"*"}});
  EXPECT_EQ(StatusOf(any, Head("/v1/models", {{"host", "whatever:1"}})), 200);
}

TEST(HttpAccessTest, WildcardServersTakeAnyNameUnlessNamed) {
  const HttpAccess open({.listen_host = "0.0.0.0", .api_key = "0123456789abcdef"});
  EXPECT_EQ(StatusOf(open, Head("/health", {{"host", "10.1.2.3:8080"}})), 200);
  const HttpAccess named({.listen_host = "::", .allowed_hosts = {"api.example"}});
  EXPECT_EQ(StatusOf(named, Head("/health", {{"host", "api.example"}})), 200);
  EXPECT_EQ(StatusOf(named, Head("/health", {{"host", "other.example"}})), 403);
}

TEST(HttpAccessTest, OriginsAreTheServersOwnPageOrListed) {
  const HttpAccess access({.listen_host = "127.0.0.1", .cors_origins = {"https://app.example"}});
  const std::pair<std::string, std::string> host = {"host", "127.0.0.1:8080"};
  EXPECT_EQ(StatusOf(access, Head("/v1/models", {host, {"origin", "http://127.0.0.1:8080"}})), 200);
  EXPECT_EQ(StatusOf(access, Head("/v1/models", {host, {"origin", "https://app.example"}})), 200);
  EXPECT_EQ(StatusOf(access, Head("/v1/models", {host, {"origin", "https://evil.example"}})), 403);
  EXPECT_EQ(StatusOf(access, Head("/v1/models", {host, {"origin", "null"}})), 403);
  // CORS headers only for the listed origin.
  EXPECT_TRUE(access.CorsHeaders(Head("/", {host, {"origin", "http://127.0.0.1:8080"}})).empty());
  const auto cors = access.CorsHeaders(Head("/", {host, {"origin", "https://app.example"}}));
  ASSERT_FALSE(cors.empty());
  EXPECT_EQ(cors[0].second, "https://app.example");
  // Preflights: answered for listed origins only.
  EXPECT_EQ(access.Preflight(Head("/v1/chat/completions", {host, {"origin", "https://app.example"}}, "OPTIONS")).status,
            204);
  EXPECT_EQ(
      access.Preflight(Head("/v1/chat/completions", {host, {"origin", "https://evil.example"}}, "OPTIONS")).status,
      403);
  const HttpAccess star({.listen_host = "127.0.0.1", .cors_origins = {"*"}});
  EXPECT_EQ(StatusOf(star, Head("/v1/models", {host, {"origin", "https://any.example"}})), 200);
}

TEST(HttpAccessTest, TheKeyIsAskedEverywhereButHealthAndThePage) {
  const HttpAccess access({.listen_host = "127.0.0.1", .api_key = "sk-0123456789abcdef"});
  const std::pair<std::string, std::string> host = {"host", "127.0.0.1:8080"};
  EXPECT_EQ(StatusOf(access, Head("/v1/models", {host})), 401);
  EXPECT_EQ(StatusOf(access, Head("/v1/models", {host, {"authorization", "Bearer sk-wrong"}})), 401);
  EXPECT_EQ(StatusOf(access, Head("/v1/models", {host, {"authorization", "sk-0123456789abcdef"}})), 401);
  EXPECT_EQ(StatusOf(access, Head("/v1/models", {host, {"authorization", "Bearer sk-0123456789abcdef"}})), 200);
  EXPECT_EQ(StatusOf(access, Head("/v1/models", {host, {"authorization", "bearer  sk-0123456789abcdef "}})), 200);
  EXPECT_EQ(StatusOf(access, Head("/health", {host})), 200);
  EXPECT_EQ(StatusOf(access, Head("/", {host})), 200);
  std::optional<HttpError> error = access.Check(Head("/metrics", {host}));
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->code, "invalid_api_key");
}

TEST(HttpAccessTest, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
  EXPECT_FALSE(ConstantTimeEquals("abcd", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

TEST(HttpAccessTest, KeyFilesMustBeTheUsersAlone) {
  ScopedTempDir dir;
  const std::string path = (dir.path() / "key").string();
  std::ofstream(path) << "sk-0123456789abcdef\n";
  ::chmod(path.c_str(), 0644);
  absl::StatusOr<std::string> shared = LoadApiKey("", path);
  ASSERT_FALSE(shared.ok());
  EXPECT_TRUE(absl::StrContains(shared.status().message(), "chmod 600")) << shared.status();
  ::chmod(path.c_str(), 0600);
  absl::StatusOr<std::string> key = LoadApiKey("", path);
  ASSERT_OK(key);
  EXPECT_EQ(*key, "sk-0123456789abcdef");
  EXPECT_FALSE(LoadApiKey("sk-0123456789abcdef", path).ok());  // both
  EXPECT_FALSE(LoadApiKey("short", "").ok());
  EXPECT_FALSE(LoadApiKey("has a space in it!", "").ok());
  EXPECT_FALSE(LoadApiKey("", (dir.path() / "missing").string()).ok());
  const std::string fifo = (dir.path() / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<std::string> from_fifo = LoadApiKey("", fifo);  // must not wait for a writer
  ASSERT_FALSE(from_fifo.ok());
  EXPECT_TRUE(absl::StrContains(from_fifo.status().message(), "not a regular file")) << from_fifo.status();
  absl::StatusOr<std::string> none = LoadApiKey("", "");
  ASSERT_OK(none);
  EXPECT_EQ(*none, "");
}

}  // namespace
}  // namespace tandem
