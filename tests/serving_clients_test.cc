// bench/serving_clients.py, the client side of bench/vs_llama_server.sh,
// against a real tandem-server: every request of every client count is
// answered and counted, one JSON line per count. Skipped only when no
// python3 was found at configure time.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/http_testlib.h"
#include "tests/sdk_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"

namespace tandem {
namespace {

TEST(ServingClientsScriptTest, DrivesTandemServerAndCountsEveryToken) {
  const std::string python = TANDEM_PYTHON3;
  if (python.empty()) GTEST_SKIP() << "no python3 was found at configure time";
  ScopedTempDir dir;
  ASSERT_OK(WriteTestModel(dir.path() / "model"));
  auto http = StartHttpServer(dir.path() / "model", dir.path(), {"--threads", "1", "--max_sequences", "4"}, "serving");
  ASSERT_OK(http);
  auto run = RunProcess({python, TANDEM_SOURCE_DIR "/bench/serving_clients.py", "--server",
                         absl::StrCat("http://127.0.0.1:", http->port), "--clients", "1,3", "--requests", "2",
                         "--prompt_tokens", "16", "--max_tokens", "8", "--min_id", "3", "--max_id", "500", "--label",
                         "test"},
                        {"PYTHONDONTWRITEBYTECODE=1"}, dir.path());
  ASSERT_OK(run);
  ASSERT_EQ(run->exit_code, 0) << run->err << "\nserver log:\n" << http->server->LogTail();
  std::vector<nlohmann::json> lines;
  for (absl::string_view line : absl::StrSplit(run->out, '\n', absl::SkipEmpty())) {
    lines.push_back(nlohmann::json::parse(line));
  }
  ASSERT_EQ(lines.size(), 2u) << run->out;
  for (size_t i = 0; i < lines.size(); ++i) {
    const nlohmann::json& line = lines[i];
    const int clients = i == 0 ? 1 : 3;
    EXPECT_EQ(line["clients"], clients);
    EXPECT_EQ(line["requests"], clients * 2);
    EXPECT_EQ(line["completion_tokens"], clients * 2 * 8) << line.dump();
    EXPECT_TRUE(line["errors"].empty()) << line.dump();
    EXPECT_EQ(line["unencodable"], 0);
    EXPECT_GT(line["aggregate_tokens_per_s"].get<double>(), 0.0);
    EXPECT_EQ(line["aggregate_tokens_per_s"], line["aggregate_tokens_per_s_with_unencodable"]);
  }
}

}  // namespace
}  // namespace tandem
