#include "common/model/sentencepiece_tokenizer.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/sentencepiece_proto.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A newline (a byte-fallback piece in a line-based corpus) and a character no
// license text holds (ü, two byte-fallback pieces) besides ordinary words.
constexpr char kSentence[] = "The licensee may copy the Program.\nGrüße to everyone";

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// One vocab-512 tokenizer trained for the whole suite: training takes seconds.
class TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string pattern = (fs::path(::testing::TempDir()) / "tokenizer_test_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = new fs::path(pattern);
    ASSERT_FALSE(DefaultTokenizerCorpus().empty()) << "no files in " << kDefaultTokenizerCorpusDir;
    const absl::Status trained = TrainTokenizer(Options(*dir_ / "tok"));
    ASSERT_OK(trained);
    auto tokenizer = SentencePieceTokenizer::Load(*dir_ / "tok.model");
    ASSERT_OK(tokenizer);
    tokenizer_ = tokenizer->release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    fs::remove_all(*dir_);
    delete dir_;
  }
  static TokenizerTrainOptions Options(const fs::path& prefix) {
    return {.input_files = DefaultTokenizerCorpus(), .model_prefix = prefix, .vocab_size = 512};
  }

  static fs::path* dir_;
  static Tokenizer* tokenizer_;
};

fs::path* TokenizerTest::dir_ = nullptr;
Tokenizer* TokenizerTest::tokenizer_ = nullptr;

TEST_F(TokenizerTest, SpecialIdsAndSize) {
  EXPECT_EQ(tokenizer_->bos_id(), 1);
  EXPECT_EQ(tokenizer_->eos_id(), 2);
  EXPECT_EQ(tokenizer_->vocab_size(), 512);
  EXPECT_EQ(tokenizer_->PieceText(1), "");
  EXPECT_EQ(tokenizer_->PieceText(2), "");
  EXPECT_EQ(tokenizer_->PieceText(512), "");  // e.g. a padded embedding row
  EXPECT_EQ(tokenizer_->PieceText(-1), "");
}

TEST_F(TokenizerTest, EncodeDecodeRoundTrip) {
  auto ids = tokenizer_->Encode(kSentence, /*add_bos=*/true);
  ASSERT_OK(ids);
  ASSERT_GT(ids->size(), 1u);
  EXPECT_EQ(ids->front(), tokenizer_->bos_id());
  auto text = tokenizer_->Decode(*ids);
  ASSERT_OK(text);
  EXPECT_EQ(*text, kSentence);

  // Ids past the tokenizer decode to nothing.
  ids->push_back(tokenizer_->vocab_size() + 10);
  text = tokenizer_->Decode(*ids);
  ASSERT_OK(text);
  EXPECT_EQ(*text, kSentence);
}

TEST_F(TokenizerTest, PieceTextsConcatenateToDecodedText) {
  auto ids = tokenizer_->Encode(kSentence, /*add_bos=*/true);
  ASSERT_OK(ids);
  ids->push_back(tokenizer_->eos_id());
  std::string streamed;
  for (int32_t id : *ids) streamed += tokenizer_->PieceText(id);
  // Decode drops the dummy-prefix space SentencePiece puts before the first word.
  EXPECT_EQ(streamed, absl::StrCat(" ", kSentence));
  EXPECT_EQ(tokenizer_->PieceText(tokenizer_->Encode("\n", false)->back()), "\n");
}

TEST_F(TokenizerTest, TrainingIsDeterministic) {
  const fs::path prefix = *dir_ / "again";
  ASSERT_OK(TrainTokenizer(Options(prefix)));
  const std::string first = ReadFile(fs::path(prefix) += ".model");
  ASSERT_OK(TrainTokenizer(Options(prefix)));
  EXPECT_FALSE(first.empty());
  EXPECT_EQ(ReadFile(fs::path(prefix) += ".model"), first);
}

TEST_F(TokenizerTest, MissingModelNamesThePath) {
  const fs::path path = *dir_ / "absent.model";
  const absl::Status status = SentencePieceTokenizer::Load(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr(path.string()));
}

// SentencePiece threw an uncaught exception (std::terminate) for these
// (found by fuzz/ tokenizer_model; the input is in fuzz/regressions/).
TEST(TokenizerModelTest, EmptyOrNulPieceIsRefusedNamingIt) {
  for (const std::string& bad : {std::string(), std::string("\0", 1), std::string("a\0b", 3)}) {
    SentencePieceBpeSpec spec;
    spec.pieces = {{"<unk>", 0, 2}, {"a", -1, 1}, {bad, -2, 1}};
    const absl::Status status = SentencePieceTokenizer::FromModelProto(SerializeSentencePieceBpe(spec), "bad.model").status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr("bad.model"));
    EXPECT_THAT(status.message(), HasSubstr("piece 2"));
  }
}

TEST_F(TokenizerTest, TrainingWithoutTextSaysWhereItLooked) {
  const absl::Status status = TrainTokenizer({.model_prefix = *dir_ / "none", .vocab_size = 512});
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr(kDefaultTokenizerCorpusDir));
}

}  // namespace
}  // namespace tandem
