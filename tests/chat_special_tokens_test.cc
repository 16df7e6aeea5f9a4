// Special tokens in a rendered prompt become their ids: SpecialTokenMatcher
// splits at the leftmost, longest added-token match, honours lstrip/rstrip,
// and EncodeWithSpecialTokens tokenizes only the text between tokens.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/chat/chat_template.h"
#include "common/chat/special_tokens.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

// "text" or "#id" per piece, joined by "|", for compact expectations.
std::string Describe(const std::vector<PromptPiece>& pieces) {
  std::string out;
  for (const PromptPiece& piece : pieces) {
    if (!out.empty()) out += "|";
    out += piece.is_special() ? absl::StrCat("#", piece.special_id) : piece.text;
  }
  return out;
}

SpecialTokenMatcher Matcher(const std::vector<SpecialTokenPattern>& patterns) {
  absl::StatusOr<SpecialTokenMatcher> matcher = SpecialTokenMatcher::Create(patterns);
  EXPECT_TRUE(matcher.ok()) << matcher.status();
  return std::move(matcher).value();
}

TEST(SpecialTokenMatcherTest, SplitsAtTokensAndKeepsTheTextBetween) {
  const SpecialTokenMatcher m = Matcher({{"<s>", 1}, {"</s>", 2}, {"[INST]", 3}, {"[/INST]", 4}});
  EXPECT_EQ(Describe(m.Split("<s>[INST] Hello [/INST] Hi</s>")), "#1|#3| Hello |#4| Hi|#2");
  EXPECT_EQ(Describe(m.Split("no tokens here")), "no tokens here");
  EXPECT_EQ(Describe(m.Split("")), "");
  EXPECT_EQ(Describe(m.Split("<s><s>")), "#1|#1");
  EXPECT_EQ(Describe(m.Split("almost <s but not </ s>")), "almost <s but not </ s>");
  EXPECT_EQ(Describe(m.Split("é<s>中文</s>🙂")), "é|#1|中文|#2|🙂");
  // Split's pieces give the text back.
  std::string joined;
  for (const PromptPiece& piece : m.Split("a<s>b[INST]c")) joined += piece.text;
  EXPECT_EQ(joined, "a<s>b[INST]c");
}

TEST(SpecialTokenMatcherTest, LongestMatchWinsAtTheSamePlace) {
  const SpecialTokenMatcher m = Matcher({{"<|im", 10}, {"<|im_start|>", 11}, {"<|im_end|>", 12}, {"<|", 13}});
  EXPECT_EQ(Describe(m.Split("<|im_start|>user\nhi<|im_end|>")), "#11|user\nhi|#12");
  EXPECT_EQ(Describe(m.Split("<|im_sta")), "#10|_sta");
  EXPECT_EQ(Describe(m.Split("<|x")), "#13|x");
}

TEST(SpecialTokenMatcherTest, LstripAndRstripAbsorbWhitespace) {
  const SpecialTokenMatcher m = Matcher({{"<|end|>", 7, false, true}, {"<mask>", 8, true, false}});
  EXPECT_EQ(Describe(m.Split("answer<|end|>\n  <|user|>")), "answer|#7|<|user|>");
  EXPECT_EQ(Describe(m.Split("fill  \t<mask> here")), "fill|#8| here");
  EXPECT_EQ(Describe(m.Split("   <mask>")), "#8");
}

TEST(SpecialTokenMatcherTest, RejectsBadPatterns) {
  EXPECT_EQ(SpecialTokenMatcher::Create({{"", 5}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SpecialTokenMatcher::Create({{"<s>", -1}}).status().code(), absl::StatusCode::kInvalidArgument);
  absl::Status two_ids = SpecialTokenMatcher::Create({{"<s>", 1}, {"<s>", 2}}).status();
  EXPECT_EQ(two_ids.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(two_ids.message()).find("\"<s>\" has two ids: 1 and 2"), std::string::npos) << two_ids;
  absl::StatusOr<SpecialTokenMatcher> same = SpecialTokenMatcher::Create({{"<s>", 1}, {"<s>", 1}});
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->size(), 1u);
}

// A stand-in tokenizer: one id per byte, 1000 + byte.
absl::StatusOr<std::vector<int32_t>> ByteIds(std::string_view text) {
  std::vector<int32_t> ids;
  for (unsigned char c : text) ids.push_back(1000 + c);
  return ids;
}

TEST(EncodeWithSpecialTokensTest, SpecialsAsIdsTextThroughTheTokenizer) {
  const SpecialTokenMatcher m = Matcher({{"<s>", 1}, {"</s>", 2}});
  absl::StatusOr<std::vector<int32_t>> ids = EncodeWithSpecialTokens("<s>ab</s>", m, ByteIds);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, std::vector<int32_t>({1, 1000 + 'a', 1000 + 'b', 2}));

  int calls = 0;
  absl::StatusOr<std::vector<int32_t>> failed =
      EncodeWithSpecialTokens("x<s>y", m, [&](std::string_view) -> absl::StatusOr<std::vector<int32_t>> {
        ++calls;
        return absl::InvalidArgumentError("tokenizer broke");
      });
  EXPECT_EQ(failed.status().message(), "tokenizer broke");
  EXPECT_EQ(calls, 1);
}

TEST(EncodeWithSpecialTokensTest, ARenderedChatPromptEndToEnd) {
  absl::StatusOr<std::unique_ptr<ChatTemplate>> tmpl = ChatTemplate::Create(
      "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]"
      "{% else %}{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  ChatTemplateInputs inputs;
  inputs.messages = nlohmann::ordered_json::parse(
      R"([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "</s>"}])");
  inputs.extra_context = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  absl::StatusOr<std::string> prompt = (*tmpl)->Render(inputs);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(*prompt, "<s>[INST] a [/INST]b</s>[INST] </s> [/INST]");
  const SpecialTokenMatcher m = Matcher({{"<s>", 1}, {"</s>", 2}, {"[INST]", 3}, {"[/INST]", 4}});
  EXPECT_EQ(Describe(m.Split(*prompt)), "#1|#3| a |#4|b|#2|#3| |#2| |#4");
  absl::StatusOr<std::vector<int32_t>> ids = EncodeWithSpecialTokens(*prompt, m, ByteIds);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->size(), 13u);
}

TEST(SpecialTokenMatcherTest, LongTextIsLinearInItsLength) {
  // Many tokens sharing a long prefix and a text that keeps almost matching
  // them: the trie walk stops at the first byte that matches nothing.
  std::vector<SpecialTokenPattern> patterns;
  for (int i = 0; i < 256; ++i) patterns.push_back({absl::StrCat("<|reserved_special_token_", i, "|>"), 128000 + i});
  const SpecialTokenMatcher m = Matcher(patterns);
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "<|reserved_special_token_x";
  text += "<|reserved_special_token_7|>";
  const std::vector<PromptPiece> pieces = m.Split(text);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[1].special_id, 128007);
}

}  // namespace
}  // namespace tandem
