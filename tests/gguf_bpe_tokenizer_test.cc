// GGUF "gpt2" vocabularies (tokenizer.ggml.*) built in memory: what the
// pre-tokenizer name selects, added tokens from token types, the
// converter's padding, add_bos/add_eos, and each malformed vocabulary
// refused with the key and value named. (tokenizer_vectors_test and
// tokenizer_oracle_test run real vocabulary files against Hugging Face.)
#include <string>
#include <vector>

#include "common/gguf/gguf_metadata.h"
#include "common/model/gguf_tokenizer.h"
#include "common/tokenizer/byte_level.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The 256 byte characters (ids 0..255), "he", "hel", "hell", "hello", a
// control token, a user-defined token and two converter paddings.
GgufMetadata Vocabulary(const std::string& pre) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(ByteLevelChar(static_cast<uint8_t>(b)));
  for (const char* t : {"he", "hel", "hell", "hello", "<|endoftext|>", "<tool>", "[PAD262]", "[PAD263]"})
    tokens.push_back(t);
  std::vector<int32_t> types(tokens.size(), 1);
  types[260] = 3;  // control
  types[261] = 4;  // user-defined
  types[262] = 4;  // an older converter's padding
  types[263] = 5;  // unused
  GgufMetadata m("vocab.gguf");
  m.Set("tokenizer.ggml.model", "gpt2");
  if (!pre.empty()) m.Set("tokenizer.ggml.pre", pre);
  m.Set("tokenizer.ggml.tokens", GgufArray(tokens));
  m.Set("tokenizer.ggml.token_type", GgufArray(types));
  m.Set("tokenizer.ggml.merges", GgufArray(std::vector<std::string>{"h e", "he l", "hel l", "hell o"}));
  m.Set("tokenizer.ggml.bos_token_id", uint32_t{260});
  m.Set("tokenizer.ggml.eos_token_id", uint32_t{260});
  return m;
}

TEST(GgufBpeTokenizerTest, ReadsTokensMergesAddedTokensAndPadding) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tokenizer, TokenizerFromGguf(Vocabulary("gpt-2"), "vocab.gguf"));
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> ids, tokenizer->Encode("hello<|endoftext|><tool>[PAD262]", false));
  EXPECT_EQ(ids.size(), 3u + 8u) << "hello, the control and user-defined tokens, [PAD262] spelled byte by byte";
  EXPECT_EQ(ids[0], 259);
  EXPECT_EQ(ids[1], 260);
  EXPECT_EQ(ids[2], 261);
  EXPECT_EQ(tokenizer->bos_id(), 260);
  EXPECT_EQ(tokenizer->eos_id(), 260);
  EXPECT_EQ(tokenizer->vocab_size(), 262) << "the trailing fillers hold no token";
  ASSERT_OK_AND_ASSIGN(std::string text, tokenizer->Decode(ids));
  EXPECT_EQ(text, "hello<tool>[PAD262]") << "the control token is special";
}

TEST(GgufBpeTokenizerTest, AddBosFollowsTheKeyElseThePreTokenizersDefault) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> gpt2, TokenizerFromGguf(Vocabulary("gpt-2"), "vocab.gguf"));
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> ids, gpt2->Encode("hello", true));
  EXPECT_THAT(ids, ElementsAre(259)) << "GPT-2 adds no BOS";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> llama3, TokenizerFromGguf(Vocabulary("llama-bpe"), "vocab.gguf"));
  ASSERT_OK_AND_ASSIGN(ids, llama3->Encode("hello", true));
  EXPECT_THAT(ids, ElementsAre(260, 259)) << "Llama 3 does";
  GgufMetadata with_keys = Vocabulary("gpt-2");
  with_keys.Set("tokenizer.ggml.add_bos_token", true);
  with_keys.Set("tokenizer.ggml.add_eos_token", true);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> both, TokenizerFromGguf(with_keys, "vocab.gguf"));
  ASSERT_OK_AND_ASSIGN(ids, both->Encode("hello", true));
  EXPECT_THAT(ids, ElementsAre(260, 259, 260));
  ASSERT_OK_AND_ASSIGN(ids, both->Encode("hello", false));
  EXPECT_THAT(ids, ElementsAre(259));
}

TEST(GgufBpeTokenizerTest, MissingPreTokenizerMeansGpt2) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tokenizer, TokenizerFromGguf(Vocabulary(""), "vocab.gguf"));
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> ids, tokenizer->Encode("hello", false));
  EXPECT_THAT(ids, ElementsAre(259));
}

struct Broken {
  const char* what;
  std::function<void(GgufMetadata&)> mutate;
  const char* message;
};

TEST(GgufBpeTokenizerTest, MalformedVocabulariesAreRefusedNamingTheKey) {
  const std::vector<Broken> cases = {
      {"unknown pre-tokenizer", [](GgufMetadata& m) { m.Set("tokenizer.ggml.pre", "made-up"); },
       "vocab.gguf: key tokenizer.ggml.pre: pre-tokenizer \"made-up\" is not one tandem knows (known: "},
      {"merge without a space",
       [](GgufMetadata& m) { m.Set("tokenizer.ggml.merges", GgufArray(std::vector<std::string>{"hel"})); },
       "key tokenizer.ggml.merges[0] is \"hel\", not two tokens"},
      {"merge of unknown tokens",
       [](GgufMetadata& m) { m.Set("tokenizer.ggml.merges", GgufArray(std::vector<std::string>{"x yz"})); },
       "model.merges[0]: \"x\" + \"yz\": token \"yz\" is not in the vocabulary"},
      {"duplicate token",
       [](GgufMetadata& m) {
         std::vector<std::string> tokens = *m.Find("tokenizer.ggml.tokens")->As<GgufArray>()->As<std::string>();
         tokens[257] = "he";
         m.Set("tokenizer.ggml.tokens", GgufArray(tokens));
       },
       "key tokenizer.ggml.tokens[257]: \"he\" is also token 256"},
      {"token not UTF-8",
       [](GgufMetadata& m) {
         std::vector<std::string> tokens = *m.Find("tokenizer.ggml.tokens")->As<GgufArray>()->As<std::string>();
         tokens[258] = "\xFF";
         m.Set("tokenizer.ggml.tokens", GgufArray(tokens));
       },
       "key tokenizer.ggml.tokens[258]: not valid UTF-8 at byte 0"},
      {"types of another length",
       [](GgufMetadata& m) {
         m.Set("tokenizer.ggml.token_type", GgufArray(std::vector<int32_t>{1, 1}));
       },
       "must have one entry per token"},
      {"bad token type",
       [](GgufMetadata& m) {
         std::vector<int32_t> types(264, 1);
         types[5] = 9;
         m.Set("tokenizer.ggml.token_type", GgufArray(types));
       },
       "key tokenizer.ggml.token_type[5] is 9"},
      {"BOS outside", [](GgufMetadata& m) { m.Set("tokenizer.ggml.bos_token_id", uint32_t{100000}); },
       "key tokenizer.ggml.bos_token_id is 100000, outside the vocabulary"},
      {"add_bos without BOS",
       [](GgufMetadata& m) {
         m.Erase("tokenizer.ggml.bos_token_id");
         m.Set("tokenizer.ggml.add_bos_token", true);
       },
       "key tokenizer.ggml.add_bos_token is true but the file names no BOS token id"},
      {"a tokenizer model tandem does not read", [](GgufMetadata& m) { m.Set("tokenizer.ggml.model", "rwkv"); },
       "key tokenizer.ggml.model is \"rwkv\""},
  };
  for (const Broken& c : cases) {
    GgufMetadata m = Vocabulary("gpt-2");
    c.mutate(m);
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = TokenizerFromGguf(m, "vocab.gguf");
    ASSERT_FALSE(tokenizer.ok()) << c.what;
    EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << tokenizer.status();
    EXPECT_THAT(std::string(tokenizer.status().message()), HasSubstr(c.message)) << c.what;
  }
}

}  // namespace
}  // namespace tandem
