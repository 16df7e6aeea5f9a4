// A real client end to end: the official `openai` npm package (pinned by
// tests/node/package-lock.json, installed into the build folder with npm ci)
// drives tandem-server's HTTP API — models, completions and chat, streamed
// and not — and the texts it gets equal what the gRPC API returns for the
// same greedy requests. Skipped, saying why, without node and npm or when
// the package cannot be installed (no registry).
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/http_testlib.h"
#include "tests/sdk_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"

namespace tandem {
namespace {

using nlohmann::json;

std::string Which(const std::string& program) {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "", ':', absl::SkipEmpty())) {
    const std::filesystem::path candidate = std::filesystem::path(std::string(dir)) / program;
    if (access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return "";
}

// Greedy text through gRPC for a prompt text (BOS added as the HTTP
// completions endpoint does) or ids.
std::string GrpcGreedyText(ServerProcess& server, const std::string& text, const std::vector<int32_t>& ids,
                           bool add_bos, int max_tokens) {
  v1::GenerateRequest request;
  if (ids.empty()) request.set_prompt(text);
  request.mutable_prompt_ids()->Add(ids.begin(), ids.end());
  request.set_add_bos(add_bos);
  request.set_max_tokens(max_tokens);
  request.set_temperature(0);
  request.set_seed(7);
  grpc::ClientContext context;
  auto reader = server.NewStub()->Generate(&context, request);
  std::string out;
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    for (const v1::Token& t : response.tokens()) out += t.text();
  }
  EXPECT_TRUE(reader->Finish().ok());
  return out;
}

TEST(HttpOpenAiClientTest, TheOfficialClientGetsWhatGrpcGives) {
  const std::string node = Which("node"), npm = Which("npm");
  if (node.empty() || npm.empty()) GTEST_SKIP() << "node or npm is not on PATH: the openai client cannot run";
  // The package, installed once per build folder from the committed lock file.
  const std::filesystem::path prefix = std::filesystem::path(TANDEM_BINARY_DIR) / "node";
  const std::filesystem::path sources = std::filesystem::path(TANDEM_SOURCE_DIR) / "tests" / "node";
  std::filesystem::create_directories(prefix);
  for (const char* file : {"package.json", "package-lock.json"}) {
    std::filesystem::copy_file(sources / file, prefix / file, std::filesystem::copy_options::overwrite_existing);
  }
  ScopedTempDir dir;
  if (!std::filesystem::exists(prefix / "node_modules" / "openai" / "package.json")) {
    absl::StatusOr<ProcessResult> install =
        RunProcess({npm, "ci", "--prefix", prefix.string(), "--ignore-scripts", "--no-audit", "--no-fund"}, {},
                   dir.path(), absl::Seconds(300));
    ASSERT_OK(install);
    if (install->exit_code != 0) GTEST_SKIP() << "npm ci could not install the openai package: " << install->err;
  }
  std::filesystem::copy_file(sources / "openai_client.mjs", prefix / "openai_client.mjs",
                             std::filesystem::copy_options::overwrite_existing);

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
  const std::string expected_completion = GrpcGreedyText(*server->server, prompt, {}, true, max_tokens);
  const std::string expected_chat = GrpcGreedyText(*server->server, chat_prompt, {}, false, max_tokens);

  const json input = {{"base_url", absl::StrCat("http://127.0.0.1:", server->port)},
                      {"prompt", prompt},
                      {"messages", messages},
                      {"max_tokens", max_tokens}};
  absl::StatusOr<ProcessResult> run =
      RunProcess({node, (prefix / "openai_client.mjs").string()}, {absl::StrCat("TANDEM_E2E=", input.dump())},
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
