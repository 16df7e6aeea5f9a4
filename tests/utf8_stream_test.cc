#include "coordinator/generation/utf8_stream.h"

#include <gtest/gtest.h>

namespace tandem {
namespace {

TEST(Utf8StreamTest, AsciiAndWholeCharactersPassThrough) {
  EXPECT_EQ(SanitizeUtf8("plain"), "plain");
  EXPECT_EQ(SanitizeUtf8("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"), "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");
}

TEST(Utf8StreamTest, InvalidBytesBecomeReplacementCharacters) {
  EXPECT_EQ(SanitizeUtf8("a\xFF"
                         "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(SanitizeUtf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD") << "overlong";
  EXPECT_EQ(SanitizeUtf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD") << "surrogate";
  EXPECT_EQ(SanitizeUtf8("x\xE2\x82"), "x\xEF\xBF\xBD") << "truncated at the end";
}

TEST(Utf8StreamTest, HoldsBackAnIncompleteSequenceUntilItCompletes) {
  Utf8Stream s;
  EXPECT_EQ(s.Push("a\xE2"), "a");
  EXPECT_EQ(s.Push("\x82"), "");
  EXPECT_EQ(s.Push("\xAC!"), "\xE2\x82\xAC!");
  EXPECT_EQ(s.Flush(), "");
}

TEST(Utf8StreamTest, FlushReplacesWhatNeverCompleted) {
  Utf8Stream s;
  EXPECT_EQ(s.Push("\xF0\x9F"), "");
  EXPECT_EQ(s.Flush(), "\xEF\xBF\xBD");
}

TEST(Utf8StreamTest, ABrokenSequenceIsReplacedAndTheRestKept) {
  Utf8Stream s;
  EXPECT_EQ(s.Push("\xE2\x82"), "");
  EXPECT_EQ(s.Push("z"), "\xEF\xBF\xBD\xEF\xBF\xBDz");
}

}  // namespace
}  // namespace tandem
