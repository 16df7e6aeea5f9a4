// The beam selection rule step by step on hand-made logits (the end-to-end
// comparison with the naive reference over a real model is in scheduler_test).
#include "coordinator/generation/beam_search.h"

#include <cmath>

#include <gtest/gtest.h>

#include "tests/status_testlib.h"

namespace tandem {
namespace {

constexpr int64_t kVocab = 5;
constexpr int32_t kEnd = 4;

// Logits whose log-softmax is log(probs).
std::vector<float> Row(std::vector<double> probs) {
  std::vector<float> row;
  for (double p : probs) row.push_back(static_cast<float>(std::log(p)));
  return row;
}

BeamSearchParams Params(int width, int max_tokens) {
  BeamSearchParams p;
  p.beam_width = width;
  p.max_tokens = max_tokens;
  p.num_return_sequences = width;
  p.end_ids = {kEnd};
  return p;
}

TEST(BeamSearchTest, ValidatesEveryField) {
  EXPECT_NE(Params(0, 4).Validate(kVocab).message().find("beam_width"), std::string::npos);
  EXPECT_NE(Params(2, 0).Validate(kVocab).message().find("max_tokens"), std::string::npos);
  BeamSearchParams p = Params(2, 4);
  p.num_return_sequences = 3;
  EXPECT_NE(p.Validate(kVocab).message().find("num_return_sequences"), std::string::npos);
  p = Params(2, 4);
  p.end_ids = {9};
  EXPECT_NE(p.Validate(kVocab).message().find("end_ids[0]"), std::string::npos);
  p = Params(2, 4);
  p.length_penalty = NAN;
  EXPECT_NE(p.Validate(kVocab).message().find("length_penalty"), std::string::npos);
  // Finite but extreme: every score would be -inf (the Python SDK's -1e30).
  for (float penalty : {-1e30f, 1e30f, -10.5f, 10.5f}) {
    p.length_penalty = penalty;
    EXPECT_NE(p.Validate(kVocab).message().find("length_penalty must be a number in [-10, 10]"), std::string::npos)
        << penalty;
  }
  for (float penalty : {-10.0f, -1.0f, 0.0f, 2.0f, 10.0f}) {
    p.length_penalty = penalty;
    EXPECT_OK(p.Validate(kVocab)) << penalty;
  }
}

TEST(BeamSearchTest, FirstStepTakesTheBestTokensOfThePrompt) {
  BeamSearchState s(Params(2, 4));
  const auto row = Row({0.1, 0.5, 0.3, 0.05, 0.05});
  const auto choices = s.Step(row, kVocab);
  ASSERT_EQ(choices.size(), 2u);
  EXPECT_EQ(choices[0].token, 1);
  EXPECT_EQ(choices[1].token, 2);
  EXPECT_EQ(choices[0].parent, 0);
  EXPECT_NEAR(s.live()[0].sum_logprob, std::log(0.5), 1e-6);
  EXPECT_FALSE(s.done());
}

TEST(BeamSearchTest, LogitBiasReordersTheOffersAndScoresTheBiasedDistribution) {
  BeamSearchParams p = Params(2, 4);
  // Probabilities 0.1, 0.5, 0.3, 0.05, 0.05; token 1 banned, token 3 x8.
  p.logit_bias = {{1, -100.0f}, {3, static_cast<float>(std::log(8.0))}};
  BeamSearchState s(p);
  const auto choices = s.Step(Row({0.1, 0.5, 0.3, 0.05, 0.05}), kVocab);
  ASSERT_EQ(choices.size(), 2u);
  EXPECT_EQ(choices[0].token, 3);
  EXPECT_EQ(choices[1].token, 2);
  // Of the biased distribution: masses 0.1, ~0, 0.3, 0.4, 0.05 (sum 0.85).
  EXPECT_NEAR(s.live()[0].sum_logprob, std::log(0.4 / 0.85), 1e-5);
  EXPECT_NEAR(s.live()[1].sum_logprob, std::log(0.3 / 0.85), 1e-5);
  p.logit_bias = {{7, 1.0f}};
  EXPECT_NE(p.Validate(kVocab).message().find("logit_bias: key \"7\""), std::string::npos);
}

TEST(BeamSearchTest, BeamsCompeteAcrossParents) {
  BeamSearchState s(Params(2, 4));
  s.Step(Row({0.1, 0.5, 0.3, 0.05, 0.05}), kVocab);
  // Beam 0 (p .5) is unsure, beam 1 (p .3) is certain: both survivors come
  // from the best products, whichever parent they have.
  std::vector<float> rows = Row({0.3, 0.3, 0.2, 0.1, 0.1});
  const auto second = Row({0.01, 0.01, 0.01, 0.96, 0.01});
  rows.insert(rows.end(), second.begin(), second.end());
  const auto choices = s.Step(rows, kVocab);
  ASSERT_EQ(choices.size(), 2u);
  // .3 × .96 = .288 > .5 × .3 = .15 (tie with token 1 at .15: lower id first).
  EXPECT_EQ(choices[0].parent, 1);
  EXPECT_EQ(choices[0].token, 3);
  EXPECT_EQ(choices[1].parent, 0);
  EXPECT_EQ(choices[1].token, 0);
  EXPECT_EQ(s.live()[0].ids, (std::vector<int32_t>{2, 3}));
}

TEST(BeamSearchTest, EndTokenFinishesAHypothesisOnlyWhenRankedInTheFirstW) {
  BeamSearchState s(Params(2, 4));
  s.Step(Row({0.1, 0.5, 0.3, 0.05, 0.05}), kVocab);
  // Offers: beam 0's end (.5 × .8 = .4) ranks 0: a hypothesis; beam 1's
  // token 0 (.15) ranks 1: live; beam 1's end (.078) ranks 2 >= W: skipped;
  // beam 1's token 1 (.06) ranks 3: live.
  std::vector<float> rows = Row({0.05, 0.05, 0.05, 0.05, 0.8});
  const auto second = Row({0.5, 0.2, 0.02, 0.02, 0.26});
  rows.insert(rows.end(), second.begin(), second.end());
  const auto choices = s.Step(rows, kVocab);
  EXPECT_EQ(s.num_finished(), 1);
  ASSERT_EQ(choices.size(), 2u);
  EXPECT_EQ(choices[0].parent, 1);
  EXPECT_EQ(choices[0].token, 0);
  EXPECT_EQ(choices[1].parent, 1);
  EXPECT_EQ(choices[1].token, 1);
  const auto results = s.Results();  // not done, but the finished one is there
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].ids, (std::vector<int32_t>{1, kEnd}));
  EXPECT_EQ(results[0].end, BeamEnd::kEndToken);
  EXPECT_NEAR(results[0].score, (std::log(0.5) + std::log(0.8)) / 2, 1e-6) << "length 2, penalty 1";
}

TEST(BeamSearchTest, EarlyStoppingEndsOnceWidthHypothesesFinish) {
  BeamSearchParams p = Params(1, 8);
  p.early_stopping = true;
  BeamSearchState s(p);
  s.Step(Row({0.1, 0.1, 0.1, 0.1, 0.6}), kVocab);
  EXPECT_TRUE(s.done());
  EXPECT_EQ(s.Results()[0].ids, (std::vector<int32_t>{kEnd}));
}

TEST(BeamSearchTest, MaxTokensTurnsLiveBeamsIntoHypotheses) {
  BeamSearchState s(Params(2, 2));
  s.Step(Row({0.1, 0.5, 0.3, 0.05, 0.05}), kVocab);
  std::vector<float> rows = Row({0.6, 0.1, 0.1, 0.1, 0.1});
  const auto second = Row({0.1, 0.6, 0.1, 0.1, 0.1});
  rows.insert(rows.end(), second.begin(), second.end());
  EXPECT_TRUE(s.Step(rows, kVocab).empty());
  EXPECT_TRUE(s.done());
  const auto results = s.Results();
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].ids, (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(results[1].ids, (std::vector<int32_t>{2, 1}));
  EXPECT_EQ(results[0].end, BeamEnd::kMaxTokens);
}

TEST(BeamSearchTest, LengthPenaltyFavoursLongerHypotheses) {
  // [4] finishes at step 1 with log .45; [1, 4] at step 2 with log .45 +
  // log .6. Penalty 0 ranks by the sum ([4] first); penalty 4 divides the
  // longer one's sum by 2^4 ([1, 4] first).
  for (float penalty : {0.0f, 4.0f}) {
    BeamSearchParams p = Params(2, 3);
    p.length_penalty = penalty;
    BeamSearchState s(p);
    s.Step(Row({0.04, 0.45, 0.03, 0.03, 0.45}), kVocab);
    ASSERT_EQ(s.num_finished(), 1);
    std::vector<float> rows = Row({0.1, 0.1, 0.1, 0.1, 0.6});
    const auto second = Row({0.2, 0.2, 0.2, 0.2, 0.2});
    rows.insert(rows.end(), second.begin(), second.end());
    s.Step(rows, kVocab);
    const auto results = s.Results();
    ASSERT_EQ(results.size(), 2u);
    const std::vector<int32_t> expected_best =
        penalty == 0.0f ? std::vector<int32_t>{kEnd} : std::vector<int32_t>{1, kEnd};
    EXPECT_EQ(results[0].ids, expected_best) << "length_penalty " << penalty;
  }
}

}  // namespace
}  // namespace tandem
