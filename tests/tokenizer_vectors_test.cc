// llama.cpp's published tokenizer test vectors (../shared/tokenizer-vectors,
// see its README): for each vocabulary-only GGUF file, the ids Hugging Face's
// `tokenizers` gives ~40 hard strings (whitespace runs, digits, emoji,
// CJK, Khmer, apostrophes...). Every one must match, loaded the way the
// server loads a model's tokenizer (LoadTokenizerAt), and decode back to the
// string. A vocabulary whose GGUF file is not there (too large to ship:
// llama-bpe, qwen2, command-r, chameleon) is skipped by name, and the folder
// missing altogether skips everything, saying where it looked.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/model/model_tokenizer.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

// TANDEM_TOKENIZER_VECTORS overrides where the folder is looked for.
fs::path VectorsDir() {
  if (const char* dir = std::getenv("TANDEM_TOKENIZER_VECTORS")) return dir;
  return fs::path(TANDEM_SOURCE_DIR).parent_path() / "shared" / "tokenizer-vectors";
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

struct Vectors {
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> ids;
};

// NAME.gguf.inp: strings each followed by "\n__ggml_vocab_test__\n";
// NAME.gguf.out: one line of space-separated ids per string.
Vectors ReadVectors(const fs::path& gguf) {
  Vectors v;
  v.texts = absl::StrSplit(ReadFile(gguf.string() + ".inp"), "\n__ggml_vocab_test__\n");
  if (!v.texts.empty() && v.texts.back().empty()) v.texts.pop_back();
  for (absl::string_view line : absl::StrSplit(ReadFile(gguf.string() + ".out"), '\n')) {
    std::vector<int32_t> ids;
    for (absl::string_view number : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      int32_t id = -1;
      EXPECT_TRUE(absl::SimpleAtoi(number, &id)) << gguf << ".out: \"" << number << "\"";
      ids.push_back(id);
    }
    v.ids.push_back(std::move(ids));
  }
  v.ids.resize(v.texts.size());
  return v;
}

bool HoldsAddedToken(const Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  const auto* bpe = dynamic_cast<const BpeTokenizer*>(&tokenizer);
  return bpe != nullptr &&
         std::any_of(ids.begin(), ids.end(), [bpe](int32_t id) { return bpe->added_vocabulary().Find(id) != nullptr; });
}

class TokenizerVectorsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerVectorsTest, EncodesAsHuggingFaceAndDecodesBack) {
  const fs::path dir = VectorsDir();
  if (!fs::is_directory(dir)) GTEST_SKIP() << "no tokenizer vectors at " << dir << " (set TANDEM_TOKENIZER_VECTORS)";
  const fs::path gguf = dir / ("ggml-vocab-" + GetParam() + ".gguf");
  if (!fs::exists(gguf)) GTEST_SKIP() << gguf << " is not there (only its .inp/.out are): nothing to tokenize with";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tokenizer, LoadTokenizerAt(gguf));
  const Vectors vectors = ReadVectors(gguf);
  ASSERT_GE(vectors.texts.size(), 30u) << gguf;
  int differing = 0;
  for (size_t i = 0; i < vectors.texts.size(); ++i) {
    const std::string& text = vectors.texts[i];
    ASSERT_OK_AND_ASSIGN(const std::vector<int32_t> ids, tokenizer->Encode(text, /*add_bos=*/false));
    if (ids != vectors.ids[i]) ++differing;
    EXPECT_EQ(absl::StrJoin(ids, " "), absl::StrJoin(vectors.ids[i], " "))
        << GetParam() << " string " << i << ": \"" << text << "\"";
    // HF decodes an added token's content through the decoder too: DeepSeek's
    // added "ü" (byte 0xFC in the byte-level alphabet) comes back as U+FFFD,
    // as tokenizer_oracle_test checks against HF itself. Other strings
    // decode to themselves.
    if (!HoldsAddedToken(*tokenizer, ids)) {
      ASSERT_OK_AND_ASSIGN(const std::string decoded, tokenizer->Decode(ids));
      EXPECT_EQ(decoded, text) << GetParam() << " string " << i;
    }
  }
  RecordProperty("strings", static_cast<int>(vectors.texts.size()));
  RecordProperty("differing", differing);
  std::cout << GetParam() << ": " << vectors.texts.size() << " strings, " << differing << " differing\n";
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, TokenizerVectorsTest,
                         ::testing::Values("gpt-2", "llama-bpe", "qwen2", "deepseek-llm", "deepseek-coder", "falcon",
                                           "mpt", "starcoder", "refact", "command-r", "chameleon", "llama-spm",
                                           "phi-3"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

// The vocabulary files no tokenizer of tandem's reads are refused by name.
TEST(TokenizerVectorsRefusalTest, BertVocabularyIsRefusedByName) {
  const fs::path gguf = VectorsDir() / "ggml-vocab-bert-bge.gguf";
  if (!fs::exists(gguf)) GTEST_SKIP() << gguf << " is not there";
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizerAt(gguf);
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_THAT(std::string(tokenizer.status().message()), ::testing::HasSubstr("\"bert\""));
}

}  // namespace
}  // namespace tandem
