// The web page at / in a real browser: headless Chromium (Debian's
// chromium) driven by puppeteer-core (tests/node/web_page.mjs) against an
// orchestrated tandem-server. The page loads fetching nothing from other
// hosts, the heatmap has one cell per (layer, expert) and its GPU cells are
// the pool's slots, a chat streams its reply in several chunks and the reply
// is the gRPC API's greedy text for the same prompt, and the live view
// picks the request up. Skipped, saying why, without chromium, node and npm,
// or when npm cannot install puppeteer-core.
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "tests/http_testlib.h"
#include "tests/node_testlib.h"
#include "tests/sdk_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"

namespace tandem {
namespace {

using nlohmann::json;

// $TANDEM_CHROMIUM, else Debian's /usr/bin/chromium; "" when neither runs.
std::string Chromium() {
  const char* env = std::getenv("TANDEM_CHROMIUM");
  const std::string path = env != nullptr && *env != '\0' ? env : "/usr/bin/chromium";
  return access(path.c_str(), X_OK) == 0 ? path : "";
}

TEST(HttpWebPageTest, LoadsStreamsAChatAndShowsEveryExpert) {
  const std::string chromium = Chromium();
  if (chromium.empty()) {
    GTEST_SKIP() << "no chromium at /usr/bin/chromium (Debian: apt-get install chromium; or set TANDEM_CHROMIUM)";
  }
  ScopedTempDir dir;
  absl::StatusOr<std::filesystem::path> prefix = InstallNodePackages("puppeteer-core", dir.path());
  if (absl::IsFailedPrecondition(prefix.status()) || absl::IsUnavailable(prefix.status())) {
    GTEST_SKIP() << "puppeteer-core cannot run: " << prefix.status().message();
  }
  ASSERT_OK(prefix);

  ASSERT_OK(WriteTestModel(dir.path() / "model"));
  std::ofstream(dir.path() / "chatml.jinja") << kChatmlTemplate;
  ASSERT_OK_AND_ASSIGN(HttpServerProcess server,
                       StartHttpServer(dir.path() / "model", dir.path(),
                                       {"--threads", "2", "--chat_template", (dir.path() / "chatml.jinja").string(),
                                        "--execution_policy", "threshold", "--cache_policy", "lru", "--gpu_slots", "3"},
                                       "server"));
  const std::string text = "Tell me about the licensee.";
  const int max_tokens = 12;
  ASSERT_OK_AND_ASSIGN(HttpReply applied,
                       HttpPost(server.port, "/apply-template",
                                json{{"messages", json::array({{{"role", "user"}, {"content", text}}})}}));
  ASSERT_EQ(applied.status, 200) << applied.body;
  // No BOS: the chat template writes it.
  ASSERT_OK_AND_ASSIGN(const std::string expected,
                       GrpcGreedyText(*server.server, applied.json["prompt"], {}, false, max_tokens));
  ASSERT_FALSE(expected.empty());

  const json input = {{"base_url", absl::StrCat("http://127.0.0.1:", server.port)},
                      {"chromium", chromium},
                      {"prompt", text},
                      {"max_tokens", max_tokens},
                      {"layers", 2},
                      {"experts", 4}};
  ASSERT_OK_AND_ASSIGN(ProcessResult run,
                       RunProcess({FindOnPath("node"), (*prefix / "web_page.mjs").string()},
                                  {absl::StrCat("TANDEM_E2E=", input.dump()), "HOME=" + dir.path().string()},
                                  dir.path(), absl::Seconds(240)));
  ASSERT_EQ(run.exit_code, 0) << run.err << "\nserver log: " << server.server->LogTail();
  const json got = json::parse(run.out, nullptr, false);
  ASSERT_FALSE(got.is_discarded()) << run.out << run.err;
  EXPECT_TRUE(got["errors"].empty()) << got["errors"];
  EXPECT_EQ(got["status"], 200);
  EXPECT_EQ(got["title"], "tandem");
  EXPECT_TRUE(got["external"].empty()) << "the page fetched from other hosts: " << got["external"];

  // One cell per (layer, expert), each once.
  ASSERT_EQ(got["cells"].size(), 8u) << got;
  std::set<std::pair<int, int>> cells;
  for (const json& c : got["cells"]) cells.insert({c[0].get<int>(), c[1].get<int>()});
  EXPECT_EQ(cells.size(), 8u);
  EXPECT_EQ(got["plots"], 4);
  EXPECT_EQ(got["layer_rows"], 2);

  // The chat streamed, in more than one piece, and says what gRPC says.
  EXPECT_EQ(got["chat_state"], "done") << got["transcript"];
  EXPECT_EQ(got["reply"], expected);
  EXPECT_GE(got["chunks"].get<int>(), 2) << got;
  // Several server-sent events, each a delta, shown as they were parsed.
  ASSERT_TRUE(got["pieces"].is_array()) << got;
  EXPECT_EQ(got["pieces"].size(), got["chunks"].get<size_t>());
  std::string joined;
  for (const json& piece : got["pieces"]) joined += piece.get<std::string>();
  EXPECT_EQ(joined, expected);
  EXPECT_EQ(got["shown"], json::array({expected})) << "the transcript shows the reply";

  // The live view saw the request; its GPU cells are the pool's used slots.
  const json& placement = got["placement"];
  EXPECT_GT(placement["generated_tokens"].get<int>(), 0);
  EXPECT_EQ(got["slot_cells"], placement["used_slots"]);
  EXPECT_GT(got["gpu_cells"].get<int>(), 0);
  EXPECT_GE(got["history"].get<int>(), 2);
}

}  // namespace
}  // namespace tandem
