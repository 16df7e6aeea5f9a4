// The `tandem` CLI against a real tandem-server process: generate, beam,
// info, stats and tokenize with --json print one object each that parses and
// agrees with the in-process engine; bad command lines and bad requests exit
// non-zero with a message naming the problem.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/sdk_testlib.h"
#include "tests/server_process_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"
#include "tests/tokens_testlib.h"

namespace tandem {
namespace {

const char kCli[] = TANDEM_BINARY_DIR "/bin/tandem";

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    *start_ = WriteTestModel(dir_->path() / "model");
    if (!start_->ok()) return;
    server_ = new ServerProcess({.model_dir = dir_->path() / "model",
                                 .socket = dir_->path() / "server.sock",
                                 .extra_args = {"--threads", "1"},
                                 .log = dir_->path() / "server.log"});
    *start_ = server_->Start();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(start_->ok()) << *start_; }
  void TearDown() override {
    if (HasFailure() && server_ != nullptr) std::cerr << "server log:\n" << server_->LogTail() << "\n";
  }

  // Runs `tandem args... --server <ours>`.
  static ProcessResult Cli(std::vector<std::string> args, bool with_server = true) {
    args.insert(args.begin(), kCli);
    if (with_server) args.push_back("--server=" + server_->address());
    auto result = RunProcess(args, {}, dir_->path(), absl::Seconds(60));
    EXPECT_OK(result);
    return result.ok() ? *result : ProcessResult{};
  }
  static nlohmann::json Json(const ProcessResult& r) {
    EXPECT_EQ(r.exit_code, 0) << r.err;
    nlohmann::json j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(j.is_discarded()) << "not JSON: " << r.out;
    return j;
  }

  static ScopedTempDir* dir_;
  static ServerProcess* server_;
  static absl::Status* start_;
};

ScopedTempDir* CliTest::dir_ = nullptr;
ServerProcess* CliTest::server_ = nullptr;
absl::Status* CliTest::start_ = new absl::Status();

TEST_F(CliTest, GenerateJsonEqualsInProcessGreedy) {
  const std::vector<int32_t> prompt = RandomTokens(6, 512, /*seed=*/11);
  auto expected = GreedyInProcess(dir_->path() / "model", prompt, 10);
  ASSERT_OK(expected);
  const nlohmann::json j = Json(Cli({"generate", "--prompt_ids", absl::StrJoin(prompt, ","), "-n", "10",
                                     "--temperature", "0", "--ignore_eos", "--logprobs", "2", "--json"}));
  ASSERT_TRUE(j.is_object()) << j;
  EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(), *expected);
  ASSERT_EQ(j["tokens"].size(), 10u);
  EXPECT_EQ(j["tokens"][0]["id"], (*expected)[0]);
  EXPECT_EQ(j["tokens"][0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(j["finish_reason"], "max_tokens");
  EXPECT_EQ(j["usage"]["generated_tokens"], 10);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 6);
  EXPECT_TRUE(j["text"].is_string());
}

TEST_F(CliTest, LogitBiasBansTheGreedyToken) {
  const std::vector<int32_t> prompt = RandomTokens(6, 512, /*seed=*/11);
  const std::vector<std::string> base = {"generate", "--prompt_ids", absl::StrJoin(prompt, ","), "-n", "1",
                                         "--temperature", "0", "--ignore_eos", "--json"};
  const nlohmann::json plain = Json(Cli(base));
  const int32_t greedy = plain["ids"][0];
  std::vector<std::string> banned = base;
  banned.insert(banned.end(), {"--logit_bias", absl::StrCat(greedy, ":-100")});
  const nlohmann::json biased = Json(Cli(banned));
  ASSERT_EQ(biased["ids"].size(), 1u) << biased;
  EXPECT_NE(biased["ids"][0], greedy);
  ProcessResult r = Cli({"generate", "--prompt_ids", "5", "--logit_bias", "5=1"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--logit_bias: \"5=1\" is not ID:BIAS"), std::string::npos) << r.err;
  r = Cli({"generate", "--prompt_ids", "5", "--logit_bias", "5:1,5:2"});
  EXPECT_NE(r.err.find("token 5 is given twice"), std::string::npos) << r.err;
  r = Cli({"generate", "--prompt_ids", "5", "--logit_bias", "5:300"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("logit_bias"), std::string::npos) << r.err;
}

TEST_F(CliTest, GenerateTextStreamsAndPrintsUsage) {
  const ProcessResult r = Cli({"generate", "--prompt", "The licensee may", "-n", "6", "--temperature", "0",
                               "--ignore_eos", "--stop", "zzzz", "--stop=qqqq"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("The licensee may", 0), 0u) << r.out;  // the prompt, then the continuation
  EXPECT_NE(r.err.find("6 generated (max_tokens)"), std::string::npos) << r.err;
}

TEST_F(CliTest, InfoStatsTokenizeJson) {
  const nlohmann::json info = Json(Cli({"info", "--json"}));
  EXPECT_EQ(info["vocab_size"], 512);
  EXPECT_EQ(info["architecture"], "MixtralForCausalLM");
  EXPECT_EQ(info["has_tokenizer"], true);
  const nlohmann::json stats = Json(Cli({"stats", "--json"}));
  EXPECT_TRUE(stats["requests_total"].is_number()) << stats;
  EXPECT_TRUE(stats["layers"].is_array()) << stats;
  const nlohmann::json tokens = Json(Cli({"tokenize", "--prompt", "The licensee may", "--json"}));
  ASSERT_TRUE(tokens["ids"].is_array()) << tokens;
  const nlohmann::json text = Json(
      Cli({"detokenize", "--prompt_ids", absl::StrJoin(tokens["ids"].get<std::vector<int32_t>>(), ","), "--json"}));
  EXPECT_EQ(text["text"], "The licensee may");
  // And as text.
  const ProcessResult plain = Cli({"info"});
  EXPECT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_NE(plain.out.find("vocab_size: 512"), std::string::npos) << plain.out;
}

TEST_F(CliTest, BeamJson) {
  const nlohmann::json j = Json(Cli({"beam", "--prompt_ids", "5,6,7", "--beam_width", "3", "-n", "4",
                                     "--num_return_sequences", "2", "--ignore_eos", "--progress", "--json"}));
  ASSERT_EQ(j["sequences"].size(), 2u) << j;
  EXPECT_EQ(j["sequences"][0]["ids"].size(), 4u);
  EXPECT_GE(j["sequences"][0]["score"].get<double>(), j["sequences"][1]["score"].get<double>());
  EXPECT_FALSE(j["progress"].empty());
}

TEST_F(CliTest, BadRequestsAndCommandLinesExitNonZero) {
  ProcessResult r = Cli({"generate", "--prompt_ids", "5,6", "--top_p", "2"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("INVALID_ARGUMENT"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("top_p"), std::string::npos) << r.err;

  r = Cli({"frobnicate"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("unknown command \"frobnicate\""), std::string::npos) << r.err;
  r = Cli({}, /*with_server=*/false);
  EXPECT_NE(r.exit_code, 0);
  r = Cli({"info", "--temperature", "0.5"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--temperature does not apply to 'info'"), std::string::npos) << r.err;
  r = Cli({"generate", "--prompt", "a", "--prompt_ids", "1"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("exactly one of --prompt and --prompt_ids"), std::string::npos) << r.err;
  r = Cli({"generate", "--prompt_ids", "1,x"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("\"x\" is not an integer"), std::string::npos) << r.err;
  r = Cli({"generate", "--no_such_flag"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("no_such_flag"), std::string::npos) << r.err;

  const std::string missing = (dir_->path() / "nobody.sock").string();
  r = Cli({"info", "--server", "unix:" + missing, "--connect_timeout_s", "0.3"}, /*with_server=*/false);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(missing), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tandem
