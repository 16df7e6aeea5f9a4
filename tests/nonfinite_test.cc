// NaN or Inf in a model (issue 15, item 14): generation used to return token
// 0 with a null logprob and no error. Now a NaN in a norm or bias is refused
// at load naming the tensor, and non-finite logits (a NaN in any matrix that
// reaches them) fail the request with DataLoss saying so, in process and
// through tandem-server and the CLI, which keeps serving.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/model/model.h"
#include "common/model/synthetic_model.h"
#include "coordinator/runtime/local_runtime.h"
#include "gtest/gtest.h"
#include "tests/sdk_testlib.h"
#include "tests/server_process_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

// Overwrites element 0 of `tensor` in the single-file checkpoint of `dir`
// with a bf16 NaN.
void PoisonTensor(const fs::path& dir, const std::string& tensor) {
  const fs::path file = dir / "model.safetensors";
  std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(io) << file;
  uint64_t header_bytes = 0;
  io.read(reinterpret_cast<char*>(&header_bytes), 8);
  std::string header(header_bytes, '\0');
  io.read(header.data(), static_cast<std::streamsize>(header_bytes));
  const nlohmann::json entries = nlohmann::json::parse(header);
  ASSERT_TRUE(entries.contains(tensor)) << tensor;
  ASSERT_EQ(entries[tensor]["dtype"], "BF16") << tensor;
  const uint64_t offset = 8 + header_bytes + entries[tensor]["data_offsets"][0].get<uint64_t>();
  const uint16_t nan = 0x7fc0;
  io.seekp(static_cast<std::streamoff>(offset));
  io.write(reinterpret_cast<const char*>(&nan), sizeof(nan));
}

class NonFiniteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK(WriteSyntheticModel(SyntheticModelSpec{.preset = "tiny", .seed = 4, .dtype = DType::kBF16}, model_,
                                  {.with_tokenizer = false}));
  }
  ScopedTempDir dir_;
  fs::path model_ = dir_.path() / "model";
};

TEST_F(NonFiniteTest, ANaNNormIsRefusedAtLoadNamingTheTensor) {
  ASSERT_NO_FATAL_FAILURE(PoisonTensor(model_, "model.norm.weight"));
  auto model = LoadModel(model_);
  ASSERT_FALSE(model.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(model.status())) << model.status();
  EXPECT_NE(model.status().message().find("model.norm.weight"), std::string::npos) << model.status();
  EXPECT_NE(model.status().message().find("must be finite"), std::string::npos) << model.status();
}

TEST_F(NonFiniteTest, NaNLogitsFailTheRequestInsteadOfSamplingToken0) {
  ASSERT_NO_FATAL_FAILURE(PoisonTensor(model_, "model.layers.0.self_attn.q_proj.weight"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Model> model, LoadModel(model_));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LocalRuntime> runtime,
                       LocalRuntime::Create(std::move(model), {.num_threads = 1}));
  GenerationRequest request;
  request.prompt_ids = {1, 20, 30};
  request.max_tokens = 4;
  request.logprobs = 2;
  auto result = runtime->generator().Generate(request);
  ASSERT_FALSE(result.ok()) << "generated token "
                            << (result.ok() && !result->tokens.empty() ? result->tokens[0].id : -1);
  EXPECT_TRUE(absl::IsDataLoss(result.status())) << result.status();
  EXPECT_NE(result.status().message().find("non-finite logits"), std::string::npos) << result.status();
}

TEST_F(NonFiniteTest, ThroughTheServerAndCliTheRequestFailsAndTheServerServesOn) {
  ASSERT_NO_FATAL_FAILURE(PoisonTensor(model_, "model.layers.0.self_attn.q_proj.weight"));
  ServerProcess server({.model_dir = model_,
                        .socket = dir_.path() / "server.sock",
                        .extra_args = {"--threads", "1"},
                        .log = dir_.path() / "server.log"});
  ASSERT_OK(server.Start());
  for (int attempt = 0; attempt < 2; ++attempt) {  // the server keeps serving after a failed request
    auto cli = RunProcess({TANDEM_BINARY_DIR "/bin/tandem", "generate", "--prompt_ids", "1,20,30", "-n", "4",
                           "--logprobs", "2", "--json", "--server", server.address()},
                          {}, dir_.path(), absl::Seconds(60));
    ASSERT_OK(cli);
    EXPECT_EQ(cli->exit_code, 1) << cli->out << cli->err;
    EXPECT_NE(cli->err.find("non-finite logits"), std::string::npos) << cli->err;
    EXPECT_EQ(cli->out.find("null"), std::string::npos) << "a token with a null logprob: " << cli->out;
  }
}

}  // namespace
}  // namespace tandem
