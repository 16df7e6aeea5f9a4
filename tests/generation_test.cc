// Generation end to end on the tiny models: greedy decoding is deterministic
// and equals the float64 reference's greedy tokens; seeded sampling is
// reproducible; max_tokens, EOS and stop ids stop where they should; bad
// requests are InvalidArgument naming the field.
//
// Legend: P prompt tokens, V vocab.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/model/model.h"
#include "coordinator/generation/generator.h"
#include "coordinator/runtime/local_runtime.h"
#include "gtest/gtest.h"
#include "tests/exact_kernels_testlib.h"
#include "tests/reference_model_testlib.h"
#include "tests/status_testlib.h"
#include "tests/tokens_testlib.h"

namespace tandem {
namespace {

const bool kExactKernels = test::UseExactKernels();

constexpr uint64_t kSeed = 7;

// `edit` may change the model's config (e.g. its EOS ids) before the runtime
// is built around it.
std::unique_ptr<LocalRuntime> MakeRuntime(const std::string& preset, const std::function<void(Model&)>& edit = {}) {
  auto model = LoadSyntheticModel(SyntheticModelSpec{.preset = preset, .seed = kSeed, .dtype = DType::kBF16});
  EXPECT_OK(model);
  if (!model.ok()) return nullptr;
  if (edit) edit(**model);
  LocalRuntimeOptions options;
  options.num_threads = 2;
  auto runtime = LocalRuntime::Create(std::move(*model), options);
  EXPECT_OK(runtime);
  return runtime.ok() ? std::move(*runtime) : nullptr;
}

class GenerationTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    rt_ = MakeRuntime(GetParam());
    ASSERT_NE(rt_, nullptr);
    // 20 + 16 = 36 positions: below tiny-phimoe's longrope switch (64), where
    // a cached decode and the reference's full recompute choose the same
    // factors (see decode_parity_test.cc).
    prompt_ = RandomTokens(20, rt_->model().config.vocab_size, 500);
  }
  GenerationRequest Greedy(int32_t max_tokens) const {
    GenerationRequest request;
    request.prompt_ids = prompt_;
    request.max_tokens = max_tokens;
    request.ignore_eos = true;
    return request;
  }
  GenerationResult Generate(const GenerationRequest& request) {
    auto result = rt_->generator().Generate(request);
    EXPECT_OK(result);
    return result.ok() ? *result : GenerationResult{};
  }

  std::unique_ptr<LocalRuntime> rt_;
  std::vector<int32_t> prompt_;
};

TEST_P(GenerationTest, GreedyIsDeterministicAndEqualsTheReference) {
  const GenerationResult first = Generate(Greedy(16));
  const GenerationResult second = Generate(Greedy(16));
  ASSERT_EQ(first.tokens.size(), 16u);
  EXPECT_EQ(Ids(first), Ids(second));
  EXPECT_EQ(first.finish_reason, FinishReason::kMaxTokens);

  auto reference = ReferenceModel::Create(*rt_->model().weights);
  ASSERT_OK(reference);
  auto want = (*reference)->GreedyGenerate(prompt_, 16);
  ASSERT_OK(want);
  EXPECT_EQ(Ids(first), *want);
  // Not a degenerate model: greedy text is not one token repeated.
  const std::vector<int32_t> ids = Ids(first);
  EXPECT_GT(std::set<int32_t>(ids.begin(), ids.end()).size(), 1u);
}

TEST_P(GenerationTest, SeededSamplingIsReproducibleAndSeedsDiffer) {
  auto sampled = [&](uint64_t seed) {
    GenerationRequest request = Greedy(16);
    request.sampling.temperature = 1.5f;
    request.sampling.top_p = 0.95f;
    request.sampling.seed = seed;
    return Ids(Generate(request));
  };
  const std::vector<int32_t> a = sampled(1);
  EXPECT_EQ(a, sampled(1));
  EXPECT_NE(a, sampled(2));
  EXPECT_NE(a, sampled(3));
  EXPECT_NE(a, Ids(Generate(Greedy(16))));
}

TEST_P(GenerationTest, MaxTokensStops) {
  const GenerationResult result = Generate(Greedy(5));
  EXPECT_EQ(result.tokens.size(), 5u);
  EXPECT_EQ(result.finish_reason, FinishReason::kMaxTokens);
  const std::vector<int32_t> longer = Ids(Generate(Greedy(12)));
  EXPECT_EQ(Ids(result), std::vector<int32_t>(longer.begin(), longer.begin() + 5));
}

TEST_P(GenerationTest, StopIdStopsAfterEmittingIt) {
  const std::vector<int32_t> full = Ids(Generate(Greedy(16)));
  // The first occurrence of the token generated at step 6 is where it stops.
  const int32_t stop = full[6];
  const size_t first = static_cast<size_t>(std::find(full.begin(), full.end(), stop) - full.begin());
  GenerationRequest request = Greedy(16);
  request.stop_ids = {stop};
  const GenerationResult result = Generate(request);
  EXPECT_EQ(result.finish_reason, FinishReason::kStopId);
  EXPECT_EQ(Ids(result), std::vector<int32_t>(full.begin(), full.begin() + static_cast<ptrdiff_t>(first) + 1));
}

TEST_P(GenerationTest, EosStopsUnlessIgnored) {
  const std::vector<int32_t> full = Ids(Generate(Greedy(16)));
  const int32_t eos = full[4];
  const size_t first = static_cast<size_t>(std::find(full.begin(), full.end(), eos) - full.begin());
  // A runtime whose model names that token as its EOS.
  std::unique_ptr<LocalRuntime> rt = MakeRuntime(GetParam(), [&](Model& m) { m.config.eos_token_ids = {eos}; });
  ASSERT_NE(rt, nullptr);
  GenerationRequest request = Greedy(16);
  request.ignore_eos = false;
  auto stopped = rt->generator().Generate(request);
  ASSERT_OK(stopped);
  EXPECT_EQ(stopped->finish_reason, FinishReason::kEos);
  EXPECT_EQ(Ids(*stopped), std::vector<int32_t>(full.begin(), full.begin() + static_cast<ptrdiff_t>(first) + 1));
  request.ignore_eos = true;
  auto ignored = rt->generator().Generate(request);
  ASSERT_OK(ignored);
  EXPECT_EQ(ignored->finish_reason, FinishReason::kMaxTokens);
  EXPECT_EQ(Ids(*ignored), full);
}

TEST_P(GenerationTest, BadRequestsAreInvalidArgumentNamingTheField) {
  const ModelConfig& config = rt_->model().config;
  struct Case {
    std::string field;  // must appear in the message
    std::function<void(GenerationRequest&)> spoil;
  };
  const int32_t vocab = static_cast<int32_t>(config.vocab_size);
  const int32_t context = static_cast<int32_t>(config.max_position_embeddings);
  const std::vector<Case> cases = {
      {"prompt", [](GenerationRequest& r) { r.prompt_ids.clear(); }},
      {"prompt_ids", [&](GenerationRequest& r) { r.prompt_ids[3] = vocab; }},
      {"prompt_ids", [](GenerationRequest& r) { r.prompt_ids[0] = -1; }},
      {"max_tokens", [](GenerationRequest& r) { r.max_tokens = 0; }},
      {"max_tokens", [&](GenerationRequest& r) { r.max_tokens = context - 19; }},  // 20 + 237 > 256
      {"temperature", [](GenerationRequest& r) { r.sampling.temperature = -1.0f; }},
      {"temperature", [](GenerationRequest& r) { r.sampling.temperature = NAN; }},
      {"top_p", [](GenerationRequest& r) { r.sampling.top_p = 0.0f; }},
      {"top_p", [](GenerationRequest& r) { r.sampling.top_p = 1.5f; }},
      {"top_k", [](GenerationRequest& r) { r.sampling.top_k = -1; }},
      {"stop_ids", [&](GenerationRequest& r) { r.stop_ids = {vocab + 5}; }},
  };
  for (const Case& c : cases) {
    GenerationRequest request = Greedy(4);
    c.spoil(request);
    auto result = rt_->generator().Generate(request);
    ASSERT_FALSE(result.ok()) << c.field;
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
    EXPECT_NE(result.status().message().find(c.field), std::string::npos)
        << "message should name " << c.field << ": " << result.status();
  }
  // The last valid length: prompt + max_tokens == context.
  GenerationRequest edge = Greedy(context - 20);
  EXPECT_OK(rt_->generator().Validate(edge));
}

// A prompt longer than two prefill chunks goes through the engine in
// chunks (Generator::kPrefillChunkTokens) and still gives the reference's
// greedy tokens (the tiny presets' context stretched to fit it).
TEST(GenerationChunksTest, PromptsLongerThanAChunkGiveTheReferenceTokens) {
  for (const std::string preset : {"tiny", "tiny-qwen3moe"}) {
    SCOPED_TRACE(preset);
    std::unique_ptr<LocalRuntime> rt = MakeRuntime(preset, [](Model& m) {
      m.config.max_position_embeddings = 2048;
      m.weights->config.max_position_embeddings = 2048;
    });
    ASSERT_NE(rt, nullptr);
    const int64_t length = 2 * static_cast<int64_t>(Generator::kPrefillChunkTokens) + 37;
    GenerationRequest request;
    request.prompt_ids = RandomTokens(length, rt->model().config.vocab_size, 501);
    request.max_tokens = 6;
    request.ignore_eos = true;
    auto result = rt->generator().Generate(request);
    ASSERT_OK(result);
    auto reference = ReferenceModel::Create(*rt->model().weights);
    ASSERT_OK(reference);
    auto want = (*reference)->GreedyGenerate(request.prompt_ids, 6);
    ASSERT_OK(want);
    EXPECT_EQ(Ids(*result), *want);
    EXPECT_EQ(result->timing.prompt_tokens, length);
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, GenerationTest,
                         ::testing::Values("tiny", "tiny-phimoe", "tiny-qwen3moe", "tiny-qwen2moe", "tiny-olmoe",
                                           "tiny-qwen2moe-dense", "tiny-glm4moe", "tiny-deepseek-v2",
                                           "tiny-deepseek-v3"),
                         [](const auto& info) { return ArchTestName(info.param); });

}  // namespace
}  // namespace tandem
