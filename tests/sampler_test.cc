// The sampler's filters and penalties on hand-made logits: draws follow
// softmax(logits / T) unfiltered and renormalised under top-k and top-p
// (frequencies over 40000 draws), at a real vocabulary's size the filters
// keep exactly the prefix a full sort gives, min-p never picks
// a token below its floor, presence/frequency penalties lower what was
// generated (by once / by count), the repetition penalty divides positive
// and multiplies negative logits of prompt and output tokens, logit_bias
// moves greedy and sampled choices and the logprobs reported with them,
// and every out-of-range parameter is refused naming its field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "coordinator/generation/sampler.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

TEST(SamplerTest, GreedyWithoutPenaltiesRepeatsTheArgmax) {
  Sampler sampler({.temperature = 0});
  const std::vector<float> logits = {0.1f, 2.0f, 1.0f};
  for (int i = 0; i < 3; ++i) EXPECT_EQ(sampler.Sample(logits), 1);
}

// Frequencies of `draws` samples against `expected` probabilities (4 sigma
// of a binomial, so a correct sampler fails about once in 16000 runs per token).
void ExpectFrequencies(Sampler& sampler, const std::vector<float>& logits, const std::vector<double>& expected) {
  constexpr int kDraws = 40000;
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < kDraws; ++i) ++counts[static_cast<size_t>(sampler.Sample(logits))];
  for (size_t t = 0; t < logits.size(); ++t) {
    const double p = expected[t], sigma = std::sqrt(p * (1 - p) / kDraws);
    EXPECT_NEAR(counts[t] / static_cast<double>(kDraws), p, 4 * sigma + 1e-9) << "token " << t;
  }
}

std::vector<double> Softmax(const std::vector<float>& logits, float temperature) {
  std::vector<double> p(logits.size());
  const double max = *std::max_element(logits.begin(), logits.end());
  for (size_t i = 0; i < p.size(); ++i) p[i] = std::exp((logits[i] - max) / temperature);
  const double sum = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& x : p) x /= sum;
  return p;
}

TEST(SamplerTest, TemperatureDrawsFollowTheSoftmax) {
  const std::vector<float> logits = {0.3f, 1.5f, -0.7f, 1.0f, 0.0f, -2.0f, 0.9f, 0.1f, 0.5f, -0.2f};
  for (float temperature : {1.0f, 0.5f, 2.0f}) {
    Sampler sampler({.temperature = temperature, .seed = 17});
    ExpectFrequencies(sampler, logits, Softmax(logits, temperature));
  }
}

TEST(SamplerTest, TopKAndTopPRenormaliseWhatTheyKeep) {
  // Probabilities 0.50, 0.30, 0.15, 0.05.
  const std::vector<float> logits = {std::log(0.30f), std::log(0.50f), std::log(0.05f), std::log(0.15f)};
  Sampler top_k({.temperature = 1.0f, .top_k = 2, .seed = 5});
  ExpectFrequencies(top_k, logits, {0.375, 0.625, 0.0, 0.0});
  // Top-p 0.7: 0.50 then 0.80 reaches it; the two kept renormalised.
  Sampler top_p({.temperature = 1.0f, .top_p = 0.7f, .seed = 5});
  ExpectFrequencies(top_p, logits, {0.375, 0.625, 0.0, 0.0});
  // Top-p 0.9 keeps three; top-k 3 with top-p 0.9 over the three's own
  // mass (0.95) keeps the same three (0.50 / 0.95 + 0.30 / 0.95 < 0.9).
  Sampler both({.temperature = 1.0f, .top_k = 3, .top_p = 0.9f, .seed = 5});
  ExpectFrequencies(both, logits, {0.30 / 0.95, 0.50 / 0.95, 0.0, 0.15 / 0.95});
}

TEST(SamplerTest, TopKBreaksTiesTowardTheLowerId) {
  const std::vector<float> logits = {1.0f, 2.0f, 2.0f, 2.0f, 0.0f};
  Sampler sampler({.temperature = 1.0f, .top_k = 2, .seed = 1});
  std::set<int32_t> seen;
  for (int i = 0; i < 500; ++i) seen.insert(sampler.Sample(logits));
  EXPECT_EQ(seen, (std::set<int32_t>{1, 2}));
}

// At 32000 tokens the filters keep what sorting the whole vocabulary keeps:
// every draw lies in that prefix, and a draw reaches its last token.
TEST(SamplerTest, FiltersAtVocabularySizeKeepTheSortedPrefix) {
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.0f, 2.5f);
  std::vector<float> logits(32000);
  for (float& l : logits) l = normal(rng);
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  const std::vector<double> p = Softmax(logits, 1.0f);
  struct Case {
    SamplingParams params;
    size_t prefix;
  };
  std::vector<Case> cases;
  cases.push_back({{.temperature = 1.0f, .top_k = 40, .seed = 2}, 40});
  for (float top_p : {0.5f, 0.9f}) {
    double cumulative = 0.0;
    size_t prefix = 0;
    while (cumulative < top_p) cumulative += p[static_cast<size_t>(order[prefix++])];
    cases.push_back({{.temperature = 1.0f, .top_p = top_p, .seed = 2}, prefix});
  }
  const double top = p[static_cast<size_t>(order[0])];
  size_t min_p_prefix = 0;
  while (p[static_cast<size_t>(order[min_p_prefix])] >= 0.05 * top) ++min_p_prefix;
  cases.push_back({{.temperature = 1.0f, .min_p = 0.05f, .seed = 2}, min_p_prefix});
  for (const Case& c : cases) {
    const std::set<int32_t> allowed(order.begin(), order.begin() + static_cast<ptrdiff_t>(c.prefix));
    Sampler sampler(c.params);
    std::set<int32_t> seen;
    for (int i = 0; i < 4000; ++i) {
      const int32_t id = sampler.Sample(logits);
      ASSERT_TRUE(allowed.contains(id)) << "token " << id << " outside the prefix of " << c.prefix;
      seen.insert(id);
    }
    EXPECT_GT(seen.size(), std::min<size_t>(c.prefix, 4000) / 4) << c.prefix;
  }
}

TEST(SamplerTest, TopLogprobsAreTheLargestLogSoftmaxEntriesTiesToTheLowerId) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, 0.5f};
  double lse = 0.0;
  for (float l : logits) lse += std::exp(static_cast<double>(l));
  lse = std::log(lse);
  const auto top = TopLogprobs(logits, 4);
  ASSERT_EQ(top.size(), 4u);
  const int32_t ids[] = {1, 3, 4, 0};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(top[i].first, ids[i]);
    EXPECT_NEAR(top[i].second, logits[static_cast<size_t>(ids[i])] - lse, 1e-6);
  }
  EXPECT_EQ(TopLogprobs(logits, 10).size(), logits.size());
  EXPECT_TRUE(TopLogprobs(logits, 0).empty());
}

TEST(SamplerTest, MinPNeverPicksATokenBelowItsFloor) {
  // Probabilities ~ 0.50, 0.30, 0.15, 0.05 at temperature 1.
  const std::vector<float> logits = {std::log(0.50f), std::log(0.30f), std::log(0.15f), std::log(0.05f)};
  Sampler sampler({.temperature = 1.0f, .min_p = 0.5f, .seed = 3});
  std::set<int32_t> seen;
  for (int i = 0; i < 2000; ++i) seen.insert(sampler.Sample(logits));
  // Floor 0.25: tokens 0 and 1 stay, 2 and 3 go.
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1}));
  Sampler open({.temperature = 1.0f, .seed = 3});
  seen.clear();
  for (int i = 0; i < 2000; ++i) seen.insert(open.Sample(logits));
  EXPECT_EQ(seen.size(), 4u);
}

TEST(SamplerTest, PresencePenaltyLowersAGeneratedTokenOnce) {
  const std::vector<float> logits = {1.0f, 0.9f, 0.0f};
  Sampler sampler({.temperature = 0, .presence_penalty = 0.5f});
  EXPECT_EQ(sampler.Sample(logits), 0);  // 1.0 > 0.9
  EXPECT_EQ(sampler.Sample(logits), 1);  // 0.5 < 0.9
  EXPECT_EQ(sampler.Sample(logits), 0);  // both penalized once: 0.5 vs 0.4
}

TEST(SamplerTest, FrequencyPenaltyGrowsWithTheCount) {
  const std::vector<float> logits = {2.0f, 1.0f};
  Sampler sampler({.temperature = 0, .frequency_penalty = 0.4f});
  std::vector<int32_t> out;
  for (int i = 0; i < 4; ++i) out.push_back(sampler.Sample(logits));
  // Token 0: 2.0, 1.6, 1.2, then 0.8 < 1.0.
  EXPECT_EQ(out, (std::vector<int32_t>{0, 0, 0, 1}));
}

TEST(SamplerTest, RepetitionPenaltyCountsThePromptAndBothSigns) {
  const std::vector<int32_t> prompt = {0};
  Sampler positive({.temperature = 0, .repetition_penalty = 2.0f}, prompt);
  EXPECT_EQ(positive.Sample(std::vector<float>{2.0f, 1.5f}), 1);  // 2.0 / 2 = 1.0 < 1.5
  Sampler negative({.temperature = 0, .repetition_penalty = 2.0f}, prompt);
  EXPECT_EQ(negative.Sample(std::vector<float>{-1.0f, -1.5f}), 1);  // -1.0 * 2 = -2.0 < -1.5
  Sampler off({.temperature = 0}, prompt);
  EXPECT_EQ(off.Sample(std::vector<float>{2.0f, 1.5f}), 0);
  // A generated token is penalized too, once, however often it came.
  Sampler output({.temperature = 0, .repetition_penalty = 1.5f});
  EXPECT_EQ(output.Sample(std::vector<float>{3.0f, 2.5f}), 0);
  EXPECT_EQ(output.Sample(std::vector<float>{3.0f, 2.5f}), 1);  // 2.0 < 2.5
  EXPECT_EQ(output.Sample(std::vector<float>{3.0f, 2.5f}), 0);  // 2.0 vs 2.5/1.5
}

TEST(SamplerTest, PenaltiesApplyBeforeSampling) {
  // Token 0 has ~99% of the mass; frequency and presence penalties pull
  // every sampled token down by its count, so the counts even out: token 0
  // stays about 2.5 samples ahead of the others (5 - 2 c0 = 0 - 2 c1).
  const std::vector<float> logits = {5.0f, 0.0f, 0.0f};
  auto zeros = [&](const SamplingParams& params) {
    Sampler sampler(params);
    int n = 0;
    for (int i = 0; i < 300; ++i) n += sampler.Sample(logits) == 0;
    return n;
  };
  EXPECT_GT(zeros({.temperature = 1.0f, .seed = 1}), 280);
  const int penalized = zeros({.temperature = 1.0f, .presence_penalty = 2.0f, .frequency_penalty = 2.0f, .seed = 1});
  EXPECT_GT(penalized, 80);
  EXPECT_LT(penalized, 125);
}

TEST(SamplerTest, LogitBiasMovesGreedyChoicesAndTheReportedDistribution) {
  const std::vector<float> logits = {0.1f, 2.0f, 1.0f, -0.5f};
  // -100 on the argmax: the next best; +100 on a poor token: that one.
  Sampler banned({.temperature = 0, .logit_bias = {{1, -100.0f}}});
  EXPECT_EQ(banned.Sample(logits), 2);
  Sampler forced({.temperature = 0, .logit_bias = {{3, 100.0f}}});
  EXPECT_EQ(forced.Sample(logits), 3);
  // What logprobs are reported of: the biased logits; without a bias, the
  // caller's own span (no copy).
  ASSERT_EQ(forced.biased().size(), logits.size());
  EXPECT_FLOAT_EQ(forced.biased()[3], 99.5f);
  EXPECT_FLOAT_EQ(forced.biased()[1], 2.0f);
  EXPECT_GT(LogProbability(forced.biased(), 3), -1e-6);
  Sampler plain({.temperature = 0});
  plain.Sample(logits);
  EXPECT_EQ(plain.biased().data(), logits.data());
  // Sampling draws from softmax(logits + bias).
  const std::vector<float> flat = {0.0f, 0.0f, 0.0f, 0.0f};
  Sampler sampled({.temperature = 1.0f, .seed = 3, .logit_bias = {{0, std::log(3.0f)}, {2, -100.0f}}});
  ExpectFrequencies(sampled, flat, {0.6, 0.2, 0.0, 0.2});
  // Applied before the penalties: a banned token stays banned when the
  // repetition penalty multiplies its negative logit.
  Sampler penalized({.temperature = 0, .repetition_penalty = 1.3f, .logit_bias = {{1, -100.0f}}},
                    std::vector<int32_t>{1});
  EXPECT_EQ(penalized.Sample(logits), 2);
}

TEST(SamplerTest, InvalidParametersNameTheirField) {
  struct Case {
    SamplingParams params;
    const char* field;
  };
  const std::vector<Case> cases = {
      {{.min_p = -0.1f}, "min_p"},
      {{.min_p = 1.5f}, "min_p"},
      {{.presence_penalty = 2.5f}, "presence_penalty"},
      {{.frequency_penalty = -3.0f}, "frequency_penalty"},
      {{.repetition_penalty = 0.0f}, "repetition_penalty"},
      {{.repetition_penalty = NAN}, "repetition_penalty"},
      {{.logit_bias = {{100, 1.0f}}}, "logit_bias: key \"100\""},
      {{.logit_bias = {{-1, 1.0f}}}, "logit_bias: key \"-1\""},
      {{.logit_bias = {{5, 100.5f}}}, "logit_bias: key \"5\""},
      {{.logit_bias = {{5, NAN}}}, "logit_bias: key \"5\""},
      {{.logit_bias = {{5, 1.0f}, {5, 2.0f}}}, "logit_bias: key \"5\""},
      {{.logit_bias = std::vector<LogitBias>(kMaxLogitBiasTokens + 1)}, "logit_bias: at most"},
  };
  for (const Case& c : cases) {
    const absl::Status status = c.params.Validate(/*vocab_size=*/100);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(status.message().find(c.field), std::string_view::npos) << status;
  }
  EXPECT_OK(
      (SamplingParams{.min_p = 0.05f, .presence_penalty = -2.0f, .frequency_penalty = 2.0f, .repetition_penalty = 1.1f})
          .Validate(/*vocab_size=*/100));
}

}  // namespace
}  // namespace tandem
