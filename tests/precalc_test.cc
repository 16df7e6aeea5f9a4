// DAOP pre-calculation (coordinator/precalc.h), lossy and opt-in, on the
// tiny model (2 layers, 4 experts, 2 per token; start layer 1). Teacher-forced
// decode, one row per step, daop against the exact engine: the prefill is
// exact, and until the first step that differs, a step's logits equal the
// exact ones bit for bit exactly when every token used its true expert set
// and nothing was pre-computed (the only two ways daop changes anything).
// Pool sizes: every expert resident (only mispredictions change anything),
// half, none, and no orchestrator at all (every expert a CPU expert). Also:
// the stats count what they should, and bad options name their field.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/base/status_macros.h"
#include "common/model/model.h"
#include "coordinator/runtime/local_runtime.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"
#include "tests/test_cost_testlib.h"
#include "tests/tokens_testlib.h"

namespace tandem {
namespace {

constexpr uint64_t kSeed = 7;
constexpr int kPromptTokens = 12;
constexpr int kDecodeSteps = 16;

// slots < 0: no orchestrator.
absl::StatusOr<std::unique_ptr<LocalRuntime>> MakeRuntime(int slots, const PrecalcOptions& precalc,
                                                          const std::string& preset = "tiny") {
  TANDEM_ASSIGN_OR_RETURN(
      auto model, LoadSyntheticModel(SyntheticModelSpec{.preset = preset, .seed = kSeed, .dtype = DType::kBF16}));
  LocalRuntimeOptions options;
  options.num_threads = 2;
  options.precalc = precalc;
  if (slots >= 0) {
    options.orchestrator.enabled = true;
    options.orchestrator.execution = ExecutionPolicy::kCpuOnly;  // no copies: residency stays the placement
    options.orchestrator.cache = CachePolicyKind::kStatic;
    options.orchestrator.gpu_slots = slots;
    options.orchestrator.cost = PoolMattersCost(model->config);
  }
  return LocalRuntime::Create(std::move(model), options);
}

int32_t Argmax(const std::vector<float>& logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  }
  return best;
}

struct Outcome {
  int exact_steps = 0, lossy_steps = 0;
};

// Teacher-forced on the exact greedy sequence; checks every step up to and
// including the first one whose logits differ.
void CheckAgainstExact(int slots, Outcome* outcome, const std::string& preset = "tiny") {
  SCOPED_TRACE(slots < 0 ? std::string("no orchestrator") : "slots " + std::to_string(slots));
  auto exact = MakeRuntime(-1, {}, preset);
  ASSERT_OK(exact);
  auto daop = MakeRuntime(slots, PrecalcOptions{.policy = PrecalcPolicy::kDaop, .start_layer = 1}, preset);
  ASSERT_OK(daop);
  LocalRuntime& x = **exact;
  LocalRuntime& y = **daop;
  for (uint32_t prompt_seed : {600u, 601u, 602u}) {
    SequenceKv kv_x(&x.kv_pool()), kv_y(&y.kv_pool());
    std::vector<int32_t> tokens = RandomTokens(kPromptTokens, x.model().config.vocab_size, prompt_seed);
    std::vector<float> logits_x, logits_y;
    const PrecalcStats before_prefill = y.precalc_stats();
    ASSERT_OK(x.engine().Forward(std::vector<ForwardInput>{{&kv_x, tokens}}, &logits_x));
    ASSERT_OK(y.engine().Forward(std::vector<ForwardInput>{{&kv_y, tokens}}, &logits_y));
    ASSERT_EQ(logits_x, logits_y) << "the prefill is exact";
    EXPECT_EQ(y.precalc_stats().predictions, before_prefill.predictions) << "no predictions at prefill";
    for (int step = 0; step < kDecodeSteps; ++step) {
      const int32_t token = Argmax(logits_x);
      const PrecalcStats before = y.precalc_stats();
      ASSERT_OK(x.engine().Forward(std::vector<ForwardInput>{{&kv_x, std::span<const int32_t>(&token, 1)}}, &logits_x));
      auto status =
          y.engine().Forward(std::vector<ForwardInput>{{&kv_y, std::span<const int32_t>(&token, 1)}}, &logits_y);
      ASSERT_OK(status);
      const PrecalcStats after = y.precalc_stats();
      const int64_t predictions = after.predictions - before.predictions;
      ASSERT_EQ(predictions, 1) << "one row, one predicted layer";
      const bool lossless = after.used_true_routing - before.used_true_routing == predictions &&
                            after.precomputed_rows == before.precomputed_rows;
      const bool equal = logits_x == logits_y;
      EXPECT_EQ(equal, lossless) << "prompt " << prompt_seed << " step " << step;
      ++(lossless ? outcome->exact_steps : outcome->lossy_steps);
      if (!equal) break;  // the KV caches differ from here on
    }
  }
  const PrecalcStats s = y.precalc_stats();
  SCOPED_TRACE(s.ToJson());
  EXPECT_EQ(s.policy, "daop");
  EXPECT_EQ(s.start_layer, 1);
  EXPECT_GT(s.predictions, 0);
  EXPECT_LE(s.correct, s.predictions);
  EXPECT_NE(s.ToJson().find("\"lossy\":\"daop pre-calculation\""), std::string::npos);
  const int64_t k = x.model().config.num_experts_per_tok;
  if (slots < 0) {
    // No pool: every used expert is pre-computed, nothing can degrade.
    EXPECT_EQ(s.precomputed_rows, s.predictions * k);
    EXPECT_EQ(s.degradations + s.no_alternative, 0);
  } else if (slots == 8) {
    // Everything resident: nothing pre-computed, nothing to degrade.
    EXPECT_EQ(s.precomputed_rows, 0);
    EXPECT_EQ(s.degradations + s.no_alternative, 0);
    EXPECT_EQ(s.used_true_routing, s.correct);
  } else if (slots == 0) {
    EXPECT_EQ(s.precomputed_rows, s.predictions * k);
    EXPECT_EQ(s.no_alternative, s.predictions);
  }
  if (slots >= 0) {
    const OrchestratorStats o = y.orchestrator()->stats();
    EXPECT_EQ(o.precalc.predictions, s.predictions);
    EXPECT_NE(o.ToJson().find("\"lossy\":\"daop pre-calculation\""), std::string::npos);
  }
}

TEST(PrecalcTest, DiffersFromExactOnlyWhenAPredictionOrAPrecomputationDid) {
  Outcome outcome;
  for (int slots : {8, 4, 0, -1}) CheckAgainstExact(slots, &outcome);
  // Both kinds of step were seen, so the check above meant something.
  EXPECT_GT(outcome.exact_steps, 0);
  EXPECT_GT(outcome.lossy_steps, 0);
}

// GLM-4.5's sigmoid router (dense layer 0, layers 1-2 MoE): a pre-computed
// set is re-weighted by its own sigmoid scores, and the run still differs
// from the exact one only where a prediction or a pre-computation did.
TEST(PrecalcTest, SigmoidRouterDiffersFromExactOnlyWhenAPredictionOrAPrecomputationDid) {
  Outcome outcome;
  for (int slots : {0, -1}) CheckAgainstExact(slots, &outcome, "tiny-glm4moe");
  EXPECT_GT(outcome.exact_steps + outcome.lossy_steps, 0);
}

// DeepSeek-V2's grouped softmax router (re-weighting by the set's own full
// softmax scores, x routed_scaling_factor) over latent attention.
TEST(PrecalcTest, GroupedSoftmaxRouterDiffersFromExactOnlyWhenAPredictionOrAPrecomputationDid) {
  Outcome outcome;
  for (int slots : {0, -1}) CheckAgainstExact(slots, &outcome, "tiny-deepseek-v2");
  EXPECT_GT(outcome.exact_steps + outcome.lossy_steps, 0);
}

TEST(PrecalcTest, GeneratesEndToEndAndCounts) {
  auto rt = MakeRuntime(4, PrecalcOptions{.policy = PrecalcPolicy::kDaop, .start_layer = 4});  // clamped to 1
  ASSERT_OK(rt);
  GenerationRequest request;
  request.prompt_ids = RandomTokens(kPromptTokens, (*rt)->model().config.vocab_size, 700);
  request.max_tokens = 10;
  request.ignore_eos = true;
  auto result = (*rt)->generator().Generate(request);
  ASSERT_OK(result);
  EXPECT_EQ(result->tokens.size(), 10u);
  const PrecalcStats s = (*rt)->precalc_stats();
  SCOPED_TRACE(s.ToJson());
  EXPECT_EQ(s.start_layer, 1);
  EXPECT_EQ(s.predicted_steps, 9);  // the decode steps
  EXPECT_EQ(s.predictions, 9);      // one row, layer 1 only
  EXPECT_GT(s.precomputed_experts + s.degradations, 0);
}

TEST(PrecalcTest, OffIsTheDefaultAndExact) {
  LocalRuntimeOptions options;
  EXPECT_EQ(options.precalc.policy, PrecalcPolicy::kOff);
  EXPECT_EQ(PrecalcStats{}.ToJson().find("lossy"), std::string::npos);
}

TEST(PrecalcTest, BadOptionsNameTheirField) {
  auto rt = MakeRuntime(-1, PrecalcOptions{.policy = PrecalcPolicy::kDaop, .start_layer = 0});
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(rt.status().message()).find("precalc_start_layer"), std::string::npos) << rt.status();
  auto orchestrated = MakeRuntime(4, PrecalcOptions{.policy = PrecalcPolicy::kDaop, .start_layer = -2});
  ASSERT_FALSE(orchestrated.ok());
  EXPECT_EQ(orchestrated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(orchestrated.status().message()).find("precalc_start_layer"), std::string::npos);
  auto policy = ParsePrecalcPolicy("dapo", "--precalc");
  ASSERT_FALSE(policy.ok());
  EXPECT_EQ(policy.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(policy.status().message()).find("--precalc"), std::string::npos);
  auto daop = ParsePrecalcPolicy("daop");
  ASSERT_OK(daop);
  EXPECT_EQ(*daop, PrecalcPolicy::kDaop);
}

}  // namespace
}  // namespace tandem
