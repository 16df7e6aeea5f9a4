// The C++ SDK against a real tandem-server process on a unix socket, serving
// the tiny synthetic model: greedy generation equals the in-process engine's
// tokens (callback and stream forms), the unary calls answer, errors keep the
// server's code and message, connecting to nothing fails clearly, and a
// cancelled or timed-out stream ends with Cancelled / DeadlineExceeded while
// the server goes on serving.
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/model/model.h"
#include "gtest/gtest.h"
#include "tests/sdk_testlib.h"
#include "tests/server_process_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"
#include "tests/tokens_testlib.h"

namespace tandem {
namespace {

constexpr int kMaxTokens = 12;

class ClientSdkTest : public ::testing::Test {
 protected:
  // One model and one server for the suite: the tokenizer takes seconds to train.
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    absl::Status written = WriteTestModel(model_dir());
    if (!written.ok()) {
      *start_ = written;
      return;
    }
    server_ = new ServerProcess({.model_dir = model_dir(),
                                 .socket = dir_->path() / "server.sock",
                                 .extra_args = {"--threads", "1", "--max_sequences", "4"},
                                 .log = dir_->path() / "server.log"});
    *start_ = server_->Start();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
    delete dir_;
    dir_ = nullptr;
  }
  static std::filesystem::path model_dir() { return dir_->path() / "model"; }

  void SetUp() override {
    ASSERT_TRUE(start_->ok()) << *start_;
    auto client = sdk::Client::Connect(server_->address());
    ASSERT_OK(client);
    client_ = std::move(*client);
  }
  void TearDown() override {
    if (HasFailure() && server_ != nullptr) std::cerr << "server log:\n" << server_->LogTail() << "\n";
  }

  static std::vector<int32_t> Prompt() { return RandomTokens(5, 512, /*seed=*/3); }
  static sdk::GenerateOptions Greedy(int max_tokens = kMaxTokens) {
    return {.prompt_ids = Prompt(), .max_tokens = max_tokens, .temperature = 0.0f, .ignore_eos = true};
  }
  static std::vector<int32_t> Expected() {
    auto ids = GreedyInProcess(model_dir(), Prompt(), kMaxTokens);
    EXPECT_OK(ids);
    return ids.ok() ? *ids : std::vector<int32_t>{};
  }

  static ScopedTempDir* dir_;
  static ServerProcess* server_;
  static absl::Status* start_;
  std::unique_ptr<sdk::Client> client_;
};

ScopedTempDir* ClientSdkTest::dir_ = nullptr;
ServerProcess* ClientSdkTest::server_ = nullptr;
absl::Status* ClientSdkTest::start_ = new absl::Status();

TEST_F(ClientSdkTest, GreedyGenerateEqualsInProcess) {
  std::vector<int32_t> streamed;
  auto result = client_->Generate(Greedy(), [&](const sdk::StreamedToken& t) { streamed.push_back(t.id); });
  ASSERT_OK(result);
  EXPECT_EQ(result->ids(), Expected());
  EXPECT_EQ(streamed, result->ids());
  EXPECT_EQ(result->finish_reason, sdk::FinishReason::kMaxTokens);
  EXPECT_EQ(result->usage.prompt_tokens, 5);
  EXPECT_EQ(result->usage.generated_tokens, kMaxTokens);
  EXPECT_GT(result->usage.total_ms, 0);
  std::string text;
  for (const sdk::StreamedToken& t : result->tokens) text += t.text;
  EXPECT_EQ(result->text, text);
}

TEST_F(ClientSdkTest, StreamGivesTheSameTokens) {
  sdk::GenerateOptions options = Greedy();
  options.logprobs = 3;
  auto stream = client_->GenerateStreaming(options);
  ASSERT_OK(stream);
  std::vector<int32_t> ids;
  while (true) {
    auto token = (*stream)->Next();
    ASSERT_OK(token);
    if (!token->has_value()) break;
    ids.push_back((*token)->id);
    ASSERT_EQ((*token)->top_logprobs.size(), 3u);
    // Greedy: the chosen token is the most likely one.
    EXPECT_EQ((*token)->top_logprobs[0].id, (*token)->id);
  }
  EXPECT_EQ(ids, Expected());
  EXPECT_TRUE((*stream)->done());
  EXPECT_EQ((*stream)->result().ids(), ids);
  EXPECT_EQ((*stream)->result().finish_reason, sdk::FinishReason::kMaxTokens);
  auto after = (*stream)->Next();  // a finished stream stays finished
  ASSERT_OK(after);
  EXPECT_FALSE(after->has_value());
}

TEST_F(ClientSdkTest, SeededSamplingIsReproducibleAndReportsTheSeed) {
  sdk::GenerateOptions options{
      .prompt_ids = Prompt(), .max_tokens = 8, .temperature = 0.9f, .seed = 1234, .ignore_eos = true};
  auto a = client_->Generate(options);
  auto b = client_->Generate(options);
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_EQ(a->ids(), b->ids());
  EXPECT_EQ(a->seed, 1234u);
}

TEST_F(ClientSdkTest, InfoStatsTokenizeDetokenize) {
  auto model = LoadModel(model_dir());
  ASSERT_OK(model);
  ASSERT_NE((*model)->tokenizer, nullptr);
  const ModelConfig& config = (*model)->config;

  auto info = client_->Info();
  ASSERT_OK(info);
  EXPECT_EQ(info->vocab_size, config.vocab_size);
  EXPECT_EQ(info->hidden_size, config.hidden_size);
  EXPECT_EQ(info->num_layers, config.num_hidden_layers);
  EXPECT_EQ(info->num_experts, config.num_local_experts);
  EXPECT_EQ(info->architecture, "MixtralForCausalLM");
  EXPECT_TRUE(info->has_tokenizer);
  EXPECT_EQ(info->max_sequences, 4);
  EXPECT_FALSE(info->fingerprint.empty());

  const std::string text = "The licensee may copy the software";
  auto expected_ids = (*model)->tokenizer->Encode(text, /*add_bos=*/true);
  ASSERT_OK(expected_ids);
  auto tokens = client_->Tokenize(text);
  ASSERT_OK(tokens);
  EXPECT_EQ(tokens->ids, *expected_ids);
  EXPECT_EQ(tokens->pieces.size(), tokens->ids.size());
  auto no_bos = client_->Tokenize(text, /*add_bos=*/false);
  ASSERT_OK(no_bos);
  EXPECT_EQ(no_bos->ids.size() + 1, tokens->ids.size());

  auto decoded = client_->Detokenize(tokens->ids);
  ASSERT_OK(decoded);
  EXPECT_EQ(*decoded, text);

  ASSERT_OK(client_->Generate(Greedy(4)));
  auto stats = client_->Stats();
  ASSERT_OK(stats);
  EXPECT_GE(stats->requests_total, 1);
  EXPECT_GE(stats->generated_tokens, 4);
  EXPECT_GT(stats->uptime_s, 0);
  EXPECT_GT(stats->kv_blocks_total, 0);
}

TEST_F(ClientSdkTest, BeamSearchReturnsSequencesBestFirst) {
  std::vector<sdk::BeamProgress> progress;
  auto result = client_->BeamSearch(
      {.prompt_ids = Prompt(), .beam_width = 3, .max_tokens = 5, .num_return_sequences = 2, .ignore_eos = true},
      [&](const sdk::BeamProgress& p) { progress.push_back(p); });
  ASSERT_OK(result);
  ASSERT_EQ(result->sequences.size(), 2u);
  EXPECT_GE(result->sequences[0].score, result->sequences[1].score);
  for (const sdk::BeamSequence& s : result->sequences) {
    EXPECT_EQ(s.ids.size(), 5u);
    EXPECT_EQ(s.finish_reason, sdk::FinishReason::kMaxTokens);
  }
  EXPECT_FALSE(progress.empty());
  EXPECT_NE(result->sequences[0].ids, result->sequences[1].ids);
}

TEST_F(ClientSdkTest, InvalidRequestKeepsTheServersCodeAndMessage) {
  sdk::GenerateOptions options = Greedy();
  options.top_p = 2.0f;
  auto result = client_->Generate(options);
  ASSERT_FALSE(result.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(result.status())) << result.status();
  EXPECT_NE(result.status().message().find("top_p"), std::string::npos) << result.status();

  // The stream form reports the same error from Next.
  auto stream = client_->GenerateStreaming(options);
  ASSERT_OK(stream);
  auto token = (*stream)->Next();
  ASSERT_FALSE(token.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(token.status())) << token.status();

  auto beam = client_->BeamSearch({.prompt_ids = Prompt(), .beam_width = 0});
  ASSERT_FALSE(beam.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(beam.status())) << beam.status();
  EXPECT_NE(beam.status().message().find("beam_width"), std::string::npos) << beam.status();
}

TEST_F(ClientSdkTest, ConnectToAMissingSocketFailsNamingIt) {
  const std::string path = (dir_->path() / "nobody.sock").string();
  const absl::Time start = absl::Now();
  auto client = sdk::Client::Connect("unix:" + path, {.connect_timeout = absl::Milliseconds(300)});
  ASSERT_FALSE(client.ok());
  EXPECT_TRUE(absl::IsUnavailable(client.status())) << client.status();
  EXPECT_NE(client.status().message().find(path), std::string::npos) << client.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));

  auto empty = sdk::Client::Connect("");
  EXPECT_TRUE(absl::IsInvalidArgument(empty.status())) << empty.status();
}

TEST_F(ClientSdkTest, CancelledStreamEndsCancelledAndTheServerGoesOn) {
  // The tiny model generates its 240 tokens in tens of milliseconds: on a
  // loaded machine the server may finish them before the cancel reaches
  // it (then it counts the request completed, rightly). A few tries give
  // the cancel a chance to arrive first; the client's side must hold on
  // every try.
  bool counted = false;
  for (int attempt = 0; attempt < 3 && !counted; ++attempt) {
    auto before = client_->Stats();
    ASSERT_OK(before);
    // As long as the context allows: far more than is read before Cancel.
    auto stream = client_->GenerateStreaming({.prompt_ids = Prompt(), .max_tokens = 240, .ignore_eos = true});
    ASSERT_OK(stream);
    auto first = (*stream)->Next();
    ASSERT_OK(first);
    ASSERT_TRUE(first->has_value());
    (*stream)->Cancel();
    absl::Status end;
    for (int i = 0; i < 240 && end.ok(); ++i) {
      auto token = (*stream)->Next();
      if (!token.ok()) end = token.status();
      if (token.ok() && !token->has_value()) break;
    }
    EXPECT_TRUE(absl::IsCancelled(end)) << end;
    EXPECT_LT((*stream)->result().tokens.size(), 240u);

    // The server counts it and frees its slot (at its next step).
    absl::StatusOr<sdk::ServerStats> after;
    for (int i = 0; i < 100; ++i) {
      after = client_->Stats();
      ASSERT_OK(after);
      if (after->requests_cancelled > before->requests_cancelled && after->requests_active == 0) break;
      absl::SleepFor(absl::Milliseconds(50));
    }
    EXPECT_EQ(after->requests_active, 0);
    counted = after->requests_cancelled > before->requests_cancelled;
  }
  EXPECT_TRUE(counted) << "the server never counted a cancelled request in 3 tries";
  auto again = client_->Generate(Greedy());
  ASSERT_OK(again);
  EXPECT_EQ(again->ids(), Expected());
}

TEST_F(ClientSdkTest, DestroyingAnUnfinishedStreamCancelsIt) {
  {
    auto stream = client_->GenerateStreaming({.prompt_ids = Prompt(), .max_tokens = 240, .ignore_eos = true});
    ASSERT_OK(stream);
    ASSERT_OK((*stream)->Next());
  }
  auto again = client_->Generate(Greedy());
  ASSERT_OK(again);
}

TEST_F(ClientSdkTest, PerCallDeadline) {
  auto result = client_->Generate({.prompt_ids = Prompt(), .max_tokens = 240, .ignore_eos = true}, {},
                                  {.timeout = absl::Milliseconds(1)});
  ASSERT_FALSE(result.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(result.status())) << result.status();
  auto info = client_->Info({.timeout = absl::Seconds(5)});
  EXPECT_OK(info);
}

}  // namespace
}  // namespace tandem
