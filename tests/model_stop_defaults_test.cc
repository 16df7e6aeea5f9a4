// The model's own stops and sampling defaults (generation_config.json) reach
// every generation path: LoadModel fills Model::defaults, Model::EosIds adds
// generation_config's ids to config.json's, a tandem-server stops on the
// second of two listed eos ids through gRPC and HTTP, and a request that
// leaves sampling fields unset gets the model's defaults before the
// server's.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/model/model.h"
#include "coordinator/generation/sampling_defaults.h"
#include "tests/http_testlib.h"
#include "tests/sdk_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"
#include "tests/tokens_testlib.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

void WriteFile(const std::filesystem::path& path, const std::string& text) { std::ofstream(path) << text; }

TEST(ModelDefaultsLoadTest, LoadModelReadsGenerationConfigAndUnitesEosIds) {
  ScopedTempDir dir;
  ASSERT_OK(WriteTestModel(dir.path()));
  WriteFile(dir.path() / "generation_config.json",
            R"({"eos_token_id": [7, 2, 300], "temperature": 0.6, "top_p": 0.9, "do_sample": true})");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Model> model, LoadModel(dir.path()));
  EXPECT_THAT(model->defaults.generation.eos_token_ids, ElementsAre(7, 2, 300));
  ASSERT_TRUE(model->defaults.generation.temperature.has_value());
  EXPECT_DOUBLE_EQ(*model->defaults.generation.temperature, 0.6);
  // config.json's first, then the new ones, once each.
  ASSERT_THAT(model->config.eos_token_ids, ElementsAre(2));
  EXPECT_THAT(model->EosIds(), ElementsAre(2, 7, 300));
}

TEST(ModelDefaultsLoadTest, BadGenerationConfigFailsTheLoadNamingFileAndField) {
  ScopedTempDir dir;
  ASSERT_OK(WriteTestModel(dir.path()));
  WriteFile(dir.path() / "generation_config.json", R"({"eos_token_id": [2, 100000]})");
  absl::StatusOr<std::unique_ptr<Model>> model = LoadModel(dir.path());
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(model.status().message(), HasSubstr("generation_config.json"));
  EXPECT_THAT(model.status().message(), HasSubstr("100000"));
  EXPECT_THAT(model.status().message(), HasSubstr("vocabulary"));

  WriteFile(dir.path() / "generation_config.json", R"({"top_p": "high"})");
  model = LoadModel(dir.path());
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(model.status().message(), HasSubstr("generation_config.json"));
  EXPECT_THAT(model.status().message(), HasSubstr("top_p"));
}

TEST(SamplingDefaultsTest, RequestThenModelThenServer) {
  GenerationDefaults model;
  SamplingParams p = ResolveSampling({}, model);
  EXPECT_EQ(p.temperature, 1.0f);
  EXPECT_EQ(p.top_p, 1.0f);
  EXPECT_EQ(p.top_k, 0);
  EXPECT_EQ(p.min_p, 0.0f);
  EXPECT_EQ(p.repetition_penalty, 1.0f);
  EXPECT_EQ(DefaultMaxTokens(model, 16), 16);

  model.temperature = 0.6;
  model.top_p = 0.9;
  model.top_k = 40;
  model.min_p = 0.05;
  model.repetition_penalty = 1.1;
  model.max_new_tokens = 99;
  p = ResolveSampling({}, model);
  EXPECT_FLOAT_EQ(p.temperature, 0.6f);
  EXPECT_FLOAT_EQ(p.top_p, 0.9f);
  EXPECT_EQ(p.top_k, 40);
  EXPECT_FLOAT_EQ(p.min_p, 0.05f);
  EXPECT_FLOAT_EQ(p.repetition_penalty, 1.1f);
  EXPECT_EQ(DefaultMaxTokens(model, 16), 99);

  p = ResolveSampling({.temperature = 0.2f, .top_p = 0.5f, .min_p = 0.0f, .repetition_penalty = 1.0f, .top_k = 3},
                      model);
  EXPECT_FLOAT_EQ(p.temperature, 0.2f);
  EXPECT_FLOAT_EQ(p.top_p, 0.5f);
  EXPECT_EQ(p.top_k, 3);
  EXPECT_EQ(p.min_p, 0.0f);
  EXPECT_EQ(p.repetition_penalty, 1.0f);

  // do_sample: false makes the default greedy; a request may still sample.
  model.do_sample = false;
  EXPECT_EQ(ResolveSampling({}, model).temperature, 0.0f);
  EXPECT_FLOAT_EQ(ResolveSampling({.temperature = 0.7f}, model).temperature, 0.7f);
}

struct GrpcRun {
  std::vector<int32_t> ids;
  std::string text;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
};

// A request that sets only the prompt (and ignore_eos): everything else is
// the model's or the server's default.
GrpcRun GrpcGenerate(ServerProcess& server, const std::vector<int32_t>& prompt, bool ignore_eos) {
  v1::GenerateRequest request;
  request.mutable_prompt_ids()->Add(prompt.begin(), prompt.end());
  request.set_ignore_eos(ignore_eos);
  request.set_seed(5);
  grpc::ClientContext context;
  auto reader = server.NewStub()->Generate(&context, request);
  GrpcRun out;
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    for (const v1::Token& t : response.tokens()) {
      out.ids.push_back(t.id());
      out.text += t.text();
    }
    if (response.done()) out.finish = response.finish_reason();
  }
  const grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  return out;
}

// Greedy decoding of the test model, then a generation_config.json that
// lists an id never generated and the token greedy decoding emits at step
// `kStopAt` (first seen there), makes greedy the default and sets
// max_new_tokens: the server must stop right after that token.
TEST(ModelStopDefaultsServerTest, StopsOnTheSecondEosIdThroughGrpcAndHttp) {
  constexpr int kMaxNew = 14;
  ScopedTempDir dir;
  const std::filesystem::path model_dir = dir.path() / "model";
  ASSERT_OK(WriteTestModel(model_dir));
  const std::vector<int32_t> prompt = RandomTokens(7, 512, 77);
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> greedy, GreedyInProcess(model_dir, prompt, kMaxNew));
  ASSERT_EQ(greedy.size(), static_cast<size_t>(kMaxNew));
  // The first step whose token is new and is no config.json eos (2).
  size_t stop_at = 2;
  while (stop_at < greedy.size() && (greedy[stop_at] == 2 || std::find(greedy.begin(), greedy.begin() + stop_at,
                                                                       greedy[stop_at]) != greedy.begin() + stop_at)) {
    ++stop_at;
  }
  ASSERT_LT(stop_at, greedy.size() - 1) << "greedy decoding repeats itself: pick another prompt";
  int32_t never = 3;
  while (never == 2 || std::find(greedy.begin(), greedy.end(), never) != greedy.end()) ++never;
  WriteFile(model_dir / "generation_config.json",
            absl::StrCat(R"({"eos_token_id": [)", never, ", ", greedy[stop_at],
                         R"(], "do_sample": false, "max_new_tokens": )", kMaxNew, "}"));

  ASSERT_OK_AND_ASSIGN(HttpServerProcess server, StartHttpServer(model_dir, dir.path(), {"--threads", "2"}, "server"));
  const std::vector<int32_t> expected(greedy.begin(), greedy.begin() + stop_at + 1);

  // gRPC: no temperature, no max_tokens: greedy by the model's do_sample,
  // stopped by its second eos id.
  GrpcRun stopped = GrpcGenerate(*server.server, prompt, /*ignore_eos=*/false);
  EXPECT_EQ(stopped.ids, expected) << server.server->LogTail();
  EXPECT_EQ(stopped.finish, v1::FINISH_REASON_EOS);
  // ignore_eos: runs to the model's max_new_tokens, still greedy.
  GrpcRun whole = GrpcGenerate(*server.server, prompt, /*ignore_eos=*/true);
  EXPECT_EQ(whole.ids, greedy);
  EXPECT_EQ(whole.finish, v1::FINISH_REASON_MAX_TOKENS);

  // HTTP: the same stop, finish_reason "stop", and the eos text left out.
  ASSERT_OK_AND_ASSIGN(HttpReply reply, HttpPost(server.port, "/v1/completions", nlohmann::json{{"prompt", prompt}}));
  ASSERT_EQ(reply.status, 200) << reply.body;
  const nlohmann::json& choice = reply.json["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "stop") << reply.body;
  EXPECT_EQ(reply.json["usage"]["completion_tokens"], static_cast<int>(expected.size())) << reply.body;
  ASSERT_OK_AND_ASSIGN(HttpReply ignored, HttpPost(server.port, "/v1/completions",
                                                   nlohmann::json{{"prompt", prompt}, {"ignore_eos", true}}));
  ASSERT_EQ(ignored.status, 200) << ignored.body;
  EXPECT_EQ(ignored.json["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(ignored.json["usage"]["completion_tokens"], kMaxNew);
  EXPECT_EQ(ignored.json["choices"][0]["text"], whole.text);
}

}  // namespace
}  // namespace tandem
