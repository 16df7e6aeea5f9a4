#include "coordinator/generation/stop_strings.h"

#include <gtest/gtest.h>

namespace tandem {
namespace {

TEST(StopStringsTest, WithoutStopsEverythingStreamsAtOnce) {
  StopStringMatcher m({});
  EXPECT_EQ(m.Push("Hello").emit, "Hello");
  EXPECT_EQ(m.Push(" world").emit, " world");
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopStringsTest, HoldsBackAPossibleStartAndDropsTheStop) {
  StopStringMatcher m({"\n\n"});
  auto r = m.Push("Hi");
  EXPECT_EQ(r.emit, "Hi");
  r = m.Push("\n");
  EXPECT_EQ(r.emit, "") << "may begin the stop";
  EXPECT_FALSE(r.stopped);
  r = m.Push("\n");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.emit, "");
}

TEST(StopStringsTest, ReleasesHeldTextWhenTheStopIsRuledOut) {
  StopStringMatcher m({"END"});
  EXPECT_EQ(m.Push("the E").emit, "the ");
  EXPECT_EQ(m.Push("N").emit, "");
  const auto r = m.Push("d");
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(r.emit, "ENd");
}

TEST(StopStringsTest, StopInsideOneTokenKeepsTheTextBeforeIt) {
  StopStringMatcher m({"stop", "halt"});
  const auto r = m.Push("go halt now");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.emit, "go ");
}

TEST(StopStringsTest, EarliestStopWins) {
  StopStringMatcher m({"bc", "ab"});
  const auto r = m.Push("xabc");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.emit, "x");
}

TEST(StopStringsTest, FlushReturnsHeldText) {
  StopStringMatcher m({"###"});
  EXPECT_EQ(m.Push("a#").emit, "a");
  EXPECT_EQ(m.Push("#").emit, "");
  EXPECT_EQ(m.Flush(), "##");
}

}  // namespace
}  // namespace tandem
