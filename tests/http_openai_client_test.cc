// A real client end to end: the official `openai` npm package (pinned by
// tests/node/package-lock.json, installed into the build folder with npm ci)
// drives tandem-server's HTTP API — models, completions and chat, streamed
// and not — and the texts it gets equal what the gRPC API returns for the
// same greedy requests. Skipped, saying why, without node and npm or when
// the package cannot be installed (no registry).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/http_testlib.h"
#include "tests/node_testlib.h"
#include "tests/sdk_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"

namespace tandem {
namespace {

using nlohmann::json;

TEST(HttpOpenAiClientTest, TheOfficialClientGetsWhatGrpcGives) {
  ScopedTempDir dir;
  // The package, installed once per build folder from the committed lock file.
  absl::StatusOr<std::filesystem::path> prefix = InstallNodePackages("openai", dir.path());
  if (absl::IsFailedPrecondition(prefix.status()) || absl::IsUnavailable(prefix.status())) {
    GTEST_SKIP() << "the openai client cannot run: " << prefix.status().message();
  }
  ASSERT_OK(prefix);
  const std::string node = FindOnPath("node");

  ASSERT_OK(WriteTestModel(dir.path() / "model"));
  std::ofstream(dir.path() / "chatml.jinja") << kChatmlTemplate;
  absl::StatusOr<HttpServerProcess> server =
      StartHttpServer(dir.path() / "model", dir.path(),
                      {"--threads", "2", "--chat_template", (dir.path() / "chatml.jinja").string()}, "server");
  ASSERT_OK(server);

  const std::string prompt = "Once upon a time";
  const json messages = json::array({{{"role", "user"}, {"content", "Tell me a story."}}});
  const int max_tokens = 12;
  absl::StatusOr<HttpReply> applied = HttpPost(server->port, "/apply-template", json{{"messages", messages}});
  ASSERT_OK(applied);
  const std::string chat_prompt = applied->json["prompt"];
  ASSERT_OK_AND_ASSIGN(const std::string expected_completion,
                       GrpcGreedyText(*server->server, prompt, {}, true, max_tokens));
  ASSERT_OK_AND_ASSIGN(const std::string expected_chat,
                       GrpcGreedyText(*server->server, chat_prompt, {}, false, max_tokens));

  const json input = {{"base_url", absl::StrCat("http://127.0.0.1:", server->port)},
                      {"prompt", prompt},
                      {"messages", messages},
                      {"max_tokens", max_tokens}};
  absl::StatusOr<ProcessResult> run =
      RunProcess({node, (*prefix / "openai_client.mjs").string()}, {absl::StrCat("TANDEM_E2E=", input.dump())},
                 dir.path(), absl::Seconds(120));
  ASSERT_OK(run);
  ASSERT_EQ(run->exit_code, 0) << run->err << "\nserver log: " << server->server->LogTail();
  const json got = json::parse(run->out, nullptr, false);
  ASSERT_FALSE(got.is_discarded()) << run->out;
  EXPECT_EQ(got["model"], "model");
  EXPECT_EQ(got["completion"], expected_completion);
  EXPECT_EQ(got["completion_stream"], expected_completion);
  EXPECT_EQ(got["chat"], expected_chat);
  EXPECT_EQ(got["chat_stream"], expected_chat);
  // The tiny model may end early on its EOS; either way both paths agree.
  EXPECT_EQ(got["completion_finish"], got["completion_stream_finish"]);
  EXPECT_EQ(got["chat_finish"], got["chat_stream_finish"]);
  EXPECT_TRUE(got["completion_usage"]["prompt_tokens"].get<int>() > 0) << got;
  EXPECT_TRUE(got["chat_stream_usage"]["completion_tokens"].get<int>() > 0) << got;
  EXPECT_EQ(got["error_status"], 400);
}

}  // namespace
}  // namespace tandem
