// JSON from untrusted peers under limits checked while parsing
// (coordinator/http/bounded_json.h): what nlohmann parses, it parses the
// same; nesting, value counts and object widths past the limits are refused
// at once, in our words, whatever the input's size.
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "coordinator/serving/http/bounded_json.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

TEST(BoundedJsonTest, ParsesWhatNlohmannParses) {
  for (const char* text : {R"({"a":[1,2.5,-3,true,false,null,"x"],"b":{"c":{}}})", "[]", "3", R"("s")",
                           R"({"dup":1,"dup":2})", R"({"u":18446744073709551615,"e":1e308})"}) {
    absl::StatusOr<ParsedJson> parsed = ParseBoundedJson(text, {}, "the body");
    ASSERT_OK(parsed) << text;
    EXPECT_EQ(parsed->value, Json::parse(text)) << text;
  }
}

TEST(BoundedJsonTest, CountsValuesAndBytes) {
  absl::StatusOr<ParsedJson> parsed = ParseBoundedJson(R"({"key":["abcd",1,{}]})", {}, "the body");
  ASSERT_OK(parsed);
  EXPECT_EQ(parsed->values, 5);  // the object, the array, "abcd", 1, {}
  EXPECT_EQ(parsed->estimated_bytes, 5 * kJsonBytesPerValue + 3 + 4);
}

TEST(BoundedJsonTest, NestingPastTheLimitIsRefusedAtOnce) {
  JsonLimits limits;
  limits.max_depth = 64;
  EXPECT_OK(ParseBoundedJson(std::string(64, '[') + std::string(64, ']'), limits, "the body"));
  absl::StatusOr<ParsedJson> deep = ParseBoundedJson(std::string(65, '[') + std::string(65, ']'), limits, "the body");
  ASSERT_FALSE(deep.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(deep.status())) << deep.status();
  EXPECT_EQ(deep.status().message(), "the body nests arrays and objects deeper than 64 levels");
  // A body of eight million brackets: refused at the 65th, in no time and
  // without building (or destroying) a deep tree.
  const std::string brackets(8 << 20, '[');
  const absl::Time start = absl::Now();
  EXPECT_FALSE(ParseBoundedJson(brackets, limits, "the body").ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_FALSE(ParseBoundedJson(R"({"a":)" + std::string(100000, '{'), limits, "the body").ok());
}

TEST(BoundedJsonTest, TooManyValuesIsOutOfRange) {
  JsonLimits limits;
  limits.max_values = 1000;
  std::string text = "[";
  for (int i = 0; i < 2000; ++i) text += i ? ",0" : "0";
  text += "]";
  absl::StatusOr<ParsedJson> parsed = ParseBoundedJson(text, limits, "the body");
  ASSERT_FALSE(parsed.ok());
  EXPECT_TRUE(absl::IsOutOfRange(parsed.status())) << parsed.status();
  EXPECT_TRUE(absl::StrContains(parsed.status().message(), "more than 1000 JSON values")) << parsed.status();
}

TEST(BoundedJsonTest, WideObjectsAreRefused) {
  JsonLimits limits;
  limits.max_object_keys = 100;
  std::string text = "{";
  for (int i = 0; i < 101; ++i) text += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":0";
  text += "}";
  absl::StatusOr<ParsedJson> parsed = ParseBoundedJson(text, limits, "the body");
  ASSERT_FALSE(parsed.ok());
  EXPECT_TRUE(absl::StrContains(parsed.status().message(), "more than 100 keys")) << parsed.status();
}

TEST(BoundedJsonTest, SyntaxErrorsSayWhereInOurWords) {
  for (const char* text : {"", "{", "[1,]", "{\"a\" 1}", "nul", "[1] x", "\"\\uZZZZ\""}) {
    absl::StatusOr<ParsedJson> parsed = ParseBoundedJson(text, {}, "the body");
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_TRUE(absl::IsInvalidArgument(parsed.status())) << text;
    EXPECT_TRUE(absl::StartsWith(parsed.status().message(), "the body is not valid JSON")) << parsed.status();
    EXPECT_FALSE(absl::StrContains(parsed.status().message(), "json.exception")) << parsed.status();
  }
}

}  // namespace
}  // namespace tandem
