// A model served with a byte-level BPE tokenizer.json (no tokenizer.model):
// text prompts tokenize, hot sampling streams pieces that end inside UTF-8
// characters, and the stream still carries only whole characters (a string
// field with a broken one would not even parse), exactly the text the
// tokenizer's pieces give through coordinator/utf8_stream. Tokenize and
// Detokenize answer with the same tokenizer.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/model/model_tokenizer.h"
#include "common/model/synthetic_model.h"
#include "common/tokenizer/json_fields.h"
#include "common/tokenizer/unicode_text.h"
#include "coordinator/generation/utf8_stream.h"
#include "tests/sdk_testlib.h"
#include "tests/server_process_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"

namespace tandem {
namespace {

// 512 tokens for the tiny model's 512 rows: GPT-2's 256 byte characters
// (by byte), then the 256 pairs of the letters a..p as merges.
void WriteByteLevelTokenizerJson(const std::filesystem::path& file) {
  Json vocab = Json::object(), merges = Json::array();
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const char32_t c = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(next++);
    std::string utf8;
    AppendUtf8(c, &utf8);
    vocab[utf8] = b;
  }
  int id = 256;
  for (char x = 'a'; x <= 'p'; ++x) {
    for (char y = 'a'; y <= 'p'; ++y) {
      vocab[std::string{x, y}] = id++;
      merges.push_back(Json::array({std::string(1, x), std::string(1, y)}));
    }
  }
  const Json document = {{"version", "1.0"},
                         {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
                         {"decoder", {{"type", "ByteLevel"}}},
                         {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
  std::ofstream(file) << document.dump();
}

class BpeStreamingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    ASSERT_OK(WriteSyntheticModel(SyntheticModelSpec{.preset = "tiny", .seed = 7, .dtype = DType::kBF16}, model_dir(),
                                  {.with_tokenizer = false}));
    WriteByteLevelTokenizerJson(model_dir() / "tokenizer.json");
    server_ = new ServerProcess({.model_dir = model_dir(),
                                 .socket = dir_->path() / "server.sock",
                                 .extra_args = {"--threads", "2"},
                                 .log = dir_->path() / "server.log"});
    ASSERT_OK(server_->Start());
  }
  static void TearDownTestSuite() {
    delete server_;
    delete dir_;
  }
  static std::filesystem::path model_dir() { return dir_->path() / "model"; }

  static inline ScopedTempDir* dir_ = nullptr;
  static inline ServerProcess* server_ = nullptr;
};

TEST_F(BpeStreamingTest, StreamsWholeCharactersFromPiecesThatSplitThem) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tokenizer, LoadTokenizerAt(model_dir()));
  auto stub = server_->NewStub();
  v1::GenerateRequest request;
  request.set_prompt("caf\xC3\xA9 \xE2\x82\xAC \xE4\xB8\xAD\xE6\x96\x87 abc");
  request.set_max_tokens(160);
  request.set_temperature(2.0f);
  request.set_seed(5);
  request.set_ignore_eos(true);
  grpc::ClientContext context;
  auto reader = stub->Generate(&context, request);
  v1::GenerateResponse response;
  std::vector<int32_t> ids;
  std::string streamed;
  while (reader->Read(&response)) {
    for (const v1::Token& token : response.tokens()) {
      EXPECT_OK(CheckUtf8(token.text(), "streamed text"));
      ids.push_back(token.id());
      streamed += token.text();
    }
  }
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_EQ(ids.size(), 160u);
  // What the tokenizer's pieces give through the stream's assembler.
  Utf8Stream utf8;
  std::string expected;
  bool split_a_character = false;
  for (int32_t id : ids) {
    const std::string piece = tokenizer->PieceText(id);
    split_a_character |= !CheckUtf8(piece, "").ok();
    expected += utf8.Push(piece);
  }
  expected += utf8.Flush();
  EXPECT_EQ(streamed, expected);
  EXPECT_TRUE(split_a_character) << "hot sampling over 256 byte tokens picks bytes >= 0x80";
}

TEST_F(BpeStreamingTest, TokenizeAndDetokenizeUseTheTokenizerJson) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tokenizer, LoadTokenizerAt(model_dir()));
  const std::string text = "abcd efgh \xF0\x9F\x98\x80!";
  ASSERT_OK_AND_ASSIGN(const std::vector<int32_t> expected, tokenizer->Encode(text, /*add_bos=*/false));
  auto stub = server_->NewStub();
  grpc::ClientContext context;
  v1::TokenizeRequest request;
  request.set_text(text);
  request.set_add_bos(false);
  v1::TokenizeResponse response;
  ASSERT_TRUE(stub->Tokenize(&context, request, &response).ok());
  EXPECT_EQ(std::vector<int32_t>(response.ids().begin(), response.ids().end()), expected);
  EXPECT_EQ(expected.front(), 256 + 1) << "\"ab\" is one merged token";

  grpc::ClientContext back_context;
  v1::DetokenizeRequest back;
  for (int32_t id : expected) back.add_ids(id);
  v1::DetokenizeResponse text_back;
  ASSERT_TRUE(stub->Detokenize(&back_context, back, &text_back).ok());
  EXPECT_EQ(text_back.text(), text);
}

}  // namespace
}  // namespace tandem
