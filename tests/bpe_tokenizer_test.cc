// BpeTokenizer read from small tokenizer.json documents built here: the
// byte-level pipeline, added tokens and their flags, special tokens in
// decoding, post-processor templates, ignore_merges, byte_fallback and
// unknown tokens, pieces for streaming, concurrent use, and every kind of
// malformed file refused with an error naming the file and the field.
// (tokenizer_oracle_test checks the same code against Hugging Face itself.)
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/chat/special_tokens.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/tokenizer_json.h"
#include "common/tokenizer/unicode_text.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A byte-level vocabulary: the 256 byte characters (ids 0..255, by byte),
// then the merges below, each making the next id.
Json ByteLevelDocument() {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[std::string(ByteLevelChar(static_cast<uint8_t>(b)))] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"},          {"he", "ll"},         {"hell", "o"},         {"\xC4\xA0", "w"},  // Ġw
      {"o", "r"}, {"\xC4\xA0w", "or"}, {"\xC4\xA0wor", "l"}, {"\xC4\xA0worl", "d"}, {"a", "b"}};
  Json merge_list = Json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    vocab[a + b] = next++;
    merge_list.push_back(Json::array({a, b}));
  }
  vocab["abc"] = next++;  // no merge makes it: only ignore_merges finds it
  return {{"version", "1.0"},
          {"added_tokens", Json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}}};
}

int32_t Id(const BpeTokenizer& tokenizer, const std::string& token) {
  return tokenizer.model().TokenToId(token).value_or(-1);
}

std::unique_ptr<BpeTokenizer> Load(const Json& document) {
  absl::StatusOr<std::unique_ptr<BpeTokenizer>> tokenizer = TokenizerFromJson(document, {.source = "test.json"});
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? std::move(*tokenizer) : nullptr;
}

TEST(BpeTokenizerTest, ByteLevelMergesAndDecodesBack) {
  auto tokenizer = Load(ByteLevelDocument());
  ASSERT_NE(tokenizer, nullptr);
  ASSERT_OK_AND_ASSIGN(const std::vector<int32_t> ids, tokenizer->Encode("hello world", false));
  EXPECT_THAT(ids, ElementsAre(Id(*tokenizer, "hello"), Id(*tokenizer, "\xC4\xA0world")));
  ASSERT_OK_AND_ASSIGN(const std::string text, tokenizer->Decode(ids));
  EXPECT_EQ(text, "hello world");
}

TEST(BpeTokenizerTest, AnyTextRoundTripsAndPiecesAreRawBytes) {
  auto tokenizer = Load(ByteLevelDocument());
  ASSERT_NE(tokenizer, nullptr);
  const std::string text = "h\xC3\xA9llo \xF0\x9F\x98\x80 \xE4\xB8\xAD\n\t  end";  // héllo 😀 中
  ASSERT_OK_AND_ASSIGN(const std::vector<int32_t> ids, tokenizer->Encode(text, false));
  ASSERT_OK_AND_ASSIGN(const std::string decoded, tokenizer->Decode(ids));
  EXPECT_EQ(decoded, text);
  std::string pieces;
  bool some_piece_ends_inside_a_character = false;
  for (int32_t id : ids) {
    const std::string piece = tokenizer->PieceText(id);
    some_piece_ends_inside_a_character |= !CheckUtf8(piece, "").ok();
    pieces += piece;
  }
  EXPECT_EQ(pieces, text);
  EXPECT_TRUE(some_piece_ends_inside_a_character) << "the emoji's four bytes are four tokens";
}

TEST(BpeTokenizerTest, IgnoreMergesTakesAWholeWordFromTheVocabulary) {
  Json document = ByteLevelDocument();
  auto plain = Load(document);
  ASSERT_NE(plain, nullptr);
  ASSERT_OK_AND_ASSIGN(const std::vector<int32_t> merged, plain->Encode("abc", false));
  EXPECT_THAT(merged, ElementsAre(Id(*plain, "ab"), Id(*plain, "c")));
  document["model"]["ignore_merges"] = true;
  auto ignoring = Load(document);
  ASSERT_NE(ignoring, nullptr);
  ASSERT_OK_AND_ASSIGN(const std::vector<int32_t> whole, ignoring->Encode("abc", false));
  EXPECT_THAT(whole, ElementsAre(Id(*ignoring, "abc")));
}

Json WithAddedTokens() {
  Json document = ByteLevelDocument();
  const int64_t base = static_cast<int64_t>(document["model"]["vocab"].size());
  auto token = [](int64_t id, const char* content, bool special, bool lstrip, bool rstrip, bool single_word) {
    return Json{{"id", id},         {"content", content},  {"special", special},        {"lstrip", lstrip},
                {"rstrip", rstrip}, {"normalized", false}, {"single_word", single_word}};
  };
  document["added_tokens"] = {token(base, "<|im_start|>", true, false, true, false),
                              token(base + 1, "<|im_end|>", true, true, false, false),
                              token(base + 2, "[W]", false, false, false, true)};
  document["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<|im_start|>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair", Json::array()},
      {"special_tokens", {{"<|im_start|>", {{"id", "<|im_start|>"}, {"ids", {base}}, {"tokens", {"<|im_start|>"}}}}}}};
  return document;
}

TEST(BpeTokenizerTest, AddedTokensSplitWithTheirFlags) {
  auto tokenizer = Load(WithAddedTokens());
  ASSERT_NE(tokenizer, nullptr);
  const int32_t start = tokenizer->vocab_size() - 3, end = start + 1, word = start + 2;
  // rstrip: the spaces after <|im_start|> go with it; lstrip: those before <|im_end|>.
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> ids, tokenizer->Encode("<|im_start|>  hello  <|im_end|>", false));
  EXPECT_THAT(ids, ElementsAre(start, Id(*tokenizer, "hello"), end));
  // single_word: only where no word character touches it.
  ASSERT_OK_AND_ASSIGN(ids, tokenizer->Encode("[W] x[W]", false));
  EXPECT_EQ(ids.front(), word);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), word), 1);
  // The post-processor's template, only when asked for.
  ASSERT_OK_AND_ASSIGN(ids, tokenizer->Encode("hello", true));
  EXPECT_THAT(ids, ElementsAre(start, Id(*tokenizer, "hello")));
  EXPECT_EQ(tokenizer->bos_id(), start);
}

TEST(BpeTokenizerTest, SpecialTokensDecodeOnlyWhenKept) {
  auto tokenizer = Load(WithAddedTokens());
  ASSERT_NE(tokenizer, nullptr);
  const int32_t start = tokenizer->vocab_size() - 3, word = start + 2;
  const std::vector<int32_t> ids = {start, Id(*tokenizer, "hello"), word};
  ASSERT_OK_AND_ASSIGN(const std::string skipped, tokenizer->Decode(ids));
  EXPECT_EQ(skipped, "hello[W]");
  ASSERT_OK_AND_ASSIGN(const std::string kept, tokenizer->Decode(ids, {.skip_special_tokens = false}));
  EXPECT_EQ(kept, "<|im_start|>hello[W]");
  EXPECT_EQ(tokenizer->PieceText(start), "");
  EXPECT_EQ(tokenizer->PieceText(word), "[W]");
  EXPECT_EQ(tokenizer->PieceText(-1), "");
  EXPECT_EQ(tokenizer->PieceText(tokenizer->vocab_size()), "");
  ASSERT_OK_AND_ASSIGN(const std::string outside, tokenizer->Decode(std::vector<int32_t>{-5, 1 << 30}));
  EXPECT_EQ(outside, "");
}

// A SentencePiece-style model: characters with no token fall back to
// <0xNN> tokens, or to <unk> (fused) when those are missing too.
TEST(BpeTokenizerTest, ByteFallbackThenUnknownToken) {
  Json vocab = {{"<unk>", 0},
                {"\xE2\x96\x81", 1},
                {"a", 2},
                {"b", 3},
                {"\xE2\x96\x81"
                 "a",
                 4},
                {"<0xC3>", 5},
                {"<0xA9>", 6}};
  Json document = {{"normalizer",
                    {{"type", "Sequence"},
                     {"normalizers",
                      {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
                       {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}}}}},
                   {"decoder",
                    {{"type", "Sequence"},
                     {"decoders",
                      {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                       {{"type", "ByteFallback"}},
                       {{"type", "Fuse"}},
                       {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
                   {"model",
                    {{"type", "BPE"},
                     {"unk_token", "<unk>"},
                     {"byte_fallback", true},
                     {"fuse_unk", true},
                     {"vocab", vocab},
                     {"merges", {"\xE2\x96\x81 a"}}}}};
  auto tokenizer = Load(document);
  ASSERT_NE(tokenizer, nullptr);
  // é is <0xC3><0xA9>; x and y have neither a token nor all their bytes: one fused <unk>.
  ASSERT_OK_AND_ASSIGN(const std::vector<int32_t> ids, tokenizer->Encode("a \xC3\xA9xyb", false));
  EXPECT_THAT(ids, ElementsAre(4, 1, 5, 6, 0, 3));
  ASSERT_OK_AND_ASSIGN(const std::string text, tokenizer->Decode(std::vector<int32_t>{4, 1, 5, 6, 3}));
  EXPECT_EQ(text,
            "a \xC3\xA9"
            "b");
  ASSERT_OK_AND_ASSIGN(const std::string broken, tokenizer->Decode(std::vector<int32_t>{4, 5, 3}));
  EXPECT_EQ(broken,
            "a\xEF\xBF\xBD"
            "b")
      << "a lone byte decodes to U+FFFD, as HF's ByteFallback";
  EXPECT_EQ(tokenizer->PieceText(5), "\xC3") << "streamed pieces stay raw";
}

// The chat path splits a rendered prompt at the special tokens first
// (common/chat/special_tokens.h) and encodes the text between them; with a
// BPE tokenizer that gives the ids the tokenizer's own added-token split does.
TEST(BpeTokenizerTest, ChatSpecialTokenSplitAgreesWithTheTokenizer) {
  auto tokenizer = Load(WithAddedTokens());
  ASSERT_NE(tokenizer, nullptr);
  std::vector<SpecialTokenPattern> patterns;
  for (const AddedVocabulary::Token& token : tokenizer->added_vocabulary().tokens()) {
    patterns.push_back({.content = token.content, .id = token.id, .lstrip = token.lstrip, .rstrip = token.rstrip});
  }
  ASSERT_OK_AND_ASSIGN(const SpecialTokenMatcher matcher, SpecialTokenMatcher::Create(patterns));
  const std::string prompt = "<|im_start|>  user\nhello world<|im_end|>\n<|im_start|>assistant\n";
  ASSERT_OK_AND_ASSIGN(const std::vector<int32_t> whole, tokenizer->Encode(prompt, false));
  ASSERT_OK_AND_ASSIGN(const std::vector<int32_t> split,
                       EncodeWithSpecialTokens(prompt, matcher, [&](std::string_view text) {
                         return tokenizer->Encode(text, /*add_bos=*/false);
                       }));
  EXPECT_EQ(split, whole);
  EXPECT_EQ(std::count(whole.begin(), whole.end(), tokenizer->vocab_size() - 3), 2);
}

TEST(BpeTokenizerTest, ManyThreadsEncodeTheSameAsOne) {
  auto tokenizer = Load(WithAddedTokens());
  ASSERT_NE(tokenizer, nullptr);
  const std::string text = "<|im_start|>hello world, \xE4\xB8\xAD\xE6\x96\x87 [W] <|im_end|> abc";
  ASSERT_OK_AND_ASSIGN(const std::vector<int32_t> expected, tokenizer->Encode(text, true));
  std::vector<std::thread> threads;
  std::vector<int> mismatches(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(text, true);
        mismatches[t] += !ids.ok() || *ids != expected;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_THAT(mismatches, ::testing::Each(0));
}

TEST(BpeTokenizerTest, InvalidUtf8IsRefusedNamingTheTokenizerAndByte) {
  auto tokenizer = Load(ByteLevelDocument());
  ASSERT_NE(tokenizer, nullptr);
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode("ok\xC3(", false);
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ids.status().message()),
              HasSubstr("test.json: text to encode: not valid UTF-8 at byte 2 (0xC3)"));
}

// Each malformed document is refused with the file and the field in the message.
struct Malformed {
  const char* what;
  std::function<void(Json&)> mutate;
  const char* message;
};

TEST(BpeTokenizerTest, MalformedFilesAreRefusedNamingTheField) {
  const std::vector<Malformed> cases = {
      {"model missing", [](Json& d) { d.erase("model"); }, "test.json: model: missing"},
      {"WordPiece", [](Json& d) { d["model"]["type"] = "WordPiece"; }, "model type \"WordPiece\" is not supported"},
      {"merge of unknown tokens",
       [](Json& d) {
         d["model"]["merges"].push_back(Json::array({"zz", "q"}));
       },
       "test.json: model.merges[10]: \"zz\" + \"q\": token \"zz\" is not in the vocabulary"},
      {"legacy merge", [](Json& d) { d["model"]["merges"] = {"a b c"}; },
       "model.merges[0]: \"a b c\" is not two tokens"},
      {"id out of range", [](Json& d) { d["model"]["vocab"]["zzz"] = -1; },
       "model.vocab[\"zzz\"]: expected a token id"},
      {"huge id", [](Json& d) { d["model"]["vocab"]["zzz"] = int64_t{1} << 40; },
       "model.vocab[\"zzz\"]: expected a token id"},
      {"duplicate id", [](Json& d) { d["model"]["vocab"]["zzz"] = 7; }, "model.vocab: id 7 is given to two tokens"},
      {"dropout", [](Json& d) { d["model"]["dropout"] = 0.1; }, "model.dropout: 0.1: BPE dropout"},
      {"unk not in vocabulary", [](Json& d) { d["model"]["unk_token"] = "<nope>"; }, "model.unk_token: \"<nope>\""},
      {"unsupported pre-tokenizer",
       [](Json& d) {
         d["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       "test.json.pre_tokenizer: pre-tokenizer type \"Whitespace\" is not supported"},
      {"bad regex",
       [](Json& d) {
         d["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
       },
       "pre_tokenizer.pattern: regex \"(unclosed\" does not compile"},
      {"bad behavior",
       [](Json& d) {
         d["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Sideways"}};
       },
       "pre_tokenizer.behavior: \"Sideways\" is no SplitDelimiterBehavior"},
      {"unsupported normalizer",
       [](Json& d) {
         d["normalizer"] = {{"type", "BertNormalizer"}};
       },
       "normalizer type \"BertNormalizer\" is not supported"},
      {"unsupported decoder",
       [](Json& d) {
         d["decoder"] = {{"type", "WordPiece"}};
       },
       "decoder type \"WordPiece\" is not supported"},
      {"unsupported post-processor",
       [](Json& d) {
         d["post_processor"] = {{"type", "RobertaProcessing"}};
       },
       "post-processor type \"RobertaProcessing\" is not supported"},
      {"template id out of range",
       [](Json& d) {
         d["post_processor"] = {{"type", "TemplateProcessing"},
                                {"single", {{{"SpecialToken", {{"id", "X"}}}}}},
                                {"special_tokens", {{"X", {{"id", "X"}, {"ids", {999999}}, {"tokens", {"X"}}}}}}};
       },
       "post_processor.special_tokens.X.ids[0]: 999999 is not a token id of this vocabulary"},
      {"added token without content",
       [](Json& d) {
         d["added_tokens"] = {{{"id", 1}}};
       },
       "added_tokens[0].content: missing"},
      {"Metaspace replacement of two characters",
       [](Json& d) {
         d["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "ab"}};
       },
       "pre_tokenizer.replacement: expected one character"},
      {"version", [](Json& d) { d["version"] = "2.0"; }, "test.json.version: unknown version \"2.0\""},
      {"BOS not in vocabulary", [](Json& d) {}, ""},
  };
  for (const Malformed& c : cases) {
    if (std::string(c.message).empty()) continue;
    Json document = ByteLevelDocument();
    c.mutate(document);
    absl::StatusOr<std::unique_ptr<BpeTokenizer>> tokenizer = TokenizerFromJson(document, {.source = "test.json"});
    ASSERT_FALSE(tokenizer.ok()) << c.what;
    EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_THAT(std::string(tokenizer.status().message()), HasSubstr(c.message)) << c.what;
  }
  absl::StatusOr<std::unique_ptr<BpeTokenizer>> bos =
      TokenizerFromJson(ByteLevelDocument(), {.source = "test.json", .bos_token = std::string("<s>")});
  ASSERT_FALSE(bos.ok());
  EXPECT_THAT(std::string(bos.status().message()),
              HasSubstr("the BOS token \"<s>\" is neither an added token nor in the vocabulary"));
}

TEST(BpeTokenizerTest, SyntaxErrorsNameTheByte) {
  absl::StatusOr<std::unique_ptr<BpeTokenizer>> tokenizer =
      ParseTokenizerJson("{\"model\": [1, 2,", {.source = "x/tokenizer.json"});
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_THAT(std::string(tokenizer.status().message()), HasSubstr("x/tokenizer.json: not valid JSON at byte 17"));
}

}  // namespace
}  // namespace tandem
