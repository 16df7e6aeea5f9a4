// The sampler's filters and penalties on hand-made logits: min-p never picks
// a token below its floor, presence/frequency penalties lower what was
// generated (by once / by count), the repetition penalty divides positive
// and multiplies negative logits of prompt and output tokens, and every
// out-of-range parameter is refused naming its field.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include "coordinator/sampler.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

TEST(SamplerTest, GreedyWithoutPenaltiesRepeatsTheArgmax) {
  Sampler sampler({.temperature = 0});
  const std::vector<float> logits = {0.1f, 2.0f, 1.0f};
  for (int i = 0; i < 3; ++i) EXPECT_EQ(sampler.Sample(logits), 1);
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
  };
  for (const Case& c : cases) {
    const absl::Status status = c.params.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(status.message().find(c.field), std::string_view::npos) << status;
  }
  EXPECT_OK(
      (SamplingParams{.min_p = 0.05f, .presence_penalty = -2.0f, .frequency_penalty = 2.0f, .repetition_penalty = 1.1f})
          .Validate());
}

}  // namespace
}  // namespace tandem
