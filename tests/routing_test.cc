// Router properties and cases: Mixtral's softmax top-K (a property that costs
// nothing: renormalised top-K of the softmax = softmax of the top-K logits),
// PhiMoE's sparsemixer on hand-worked logits, each against the engine's
// common/routing.h and the float64 reference; and the engine's dispatch: an
// expert no token chose is never called, and one with zero rows changes
// nothing.
//
// Legend: E experts, K num_experts_per_tok, T tokens, D hidden.
#include "common/model/routing.h"
#include "common/model/synthetic_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "common/base/thread_pool.h"
#include "common/model/model.h"
#include "coordinator/engine/cpu_backend.h"
#include "coordinator/engine/engine.h"
#include "coordinator/engine/kv_cache.h"
#include "cpu_worker/local_expert_executor.h"
#include "gtest/gtest.h"
#include "tests/exact_kernels_testlib.h"
#include "tests/reference_model_testlib.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

const bool kExactKernels = test::UseExactKernels();

// ------------------------------------------------------------------ softmax top-K

TEST(SoftmaxTopKTest, RenormalisedTopKOfSoftmaxEqualsSoftmaxOfTopK) {
  std::mt19937 rng(1234);
  const std::vector<int64_t> expert_counts = {2, 3, 4, 8, 16, 60, 64, 128};
  const std::vector<double> scales = {0.1, 1.0, 3.0, 10.0};
  for (int trial = 0; trial < 4000; ++trial) {
    const int64_t e = expert_counts[static_cast<size_t>(trial) % expert_counts.size()];
    const int64_t k = 1 + (trial / static_cast<int>(expert_counts.size())) % std::min<int64_t>(4, e);
    std::normal_distribution<float> dist(0.0f,
                                         static_cast<float>(scales[static_cast<size_t>(trial / 7) % scales.size()]));
    std::vector<float> logits(static_cast<size_t>(e));
    for (float& l : logits) l = dist(rng);
    const std::vector<double> logits64(logits.begin(), logits.end());

    // Hugging Face's order: softmax over all E, top-K, renormalise.
    const RefRouting full = ReferenceModel::SoftmaxTopK(logits64, k);
    // The other order: softmax over the K chosen logits alone.
    double max_chosen = -INFINITY, sum = 0.0;
    for (int32_t x : full.experts) max_chosen = std::max(max_chosen, logits64[static_cast<size_t>(x)]);
    std::vector<double> direct;
    for (int32_t x : full.experts) direct.push_back(std::exp(logits64[static_cast<size_t>(x)] - max_chosen));
    for (double w : direct) sum += w;
    for (double& w : direct) w /= sum;
    // The engine: top-K then softmax over them, in f32.
    std::vector<int32_t> experts(static_cast<size_t>(k));
    std::vector<float> weights(static_cast<size_t>(k));
    RouteSoftmaxTopK(logits.data(), e, k, experts.data(), weights.data());

    ASSERT_EQ(experts, full.experts) << "trial " << trial << ", E=" << e << ", K=" << k;
    double engine_sum = 0.0;
    for (int64_t s = 0; s < k; ++s) {
      EXPECT_NEAR(full.weights[static_cast<size_t>(s)], direct[static_cast<size_t>(s)], 1e-12) << "trial " << trial;
      // f32 weights: a few ulp of a number in (0, 1].
      EXPECT_NEAR(weights[static_cast<size_t>(s)], direct[static_cast<size_t>(s)], 1e-6) << "trial " << trial;
      engine_sum += weights[static_cast<size_t>(s)];
    }
    EXPECT_NEAR(engine_sum, 1.0, 1e-6);
  }
}

// Qwen3 without norm_topk_prob (and Qwen2-MoE, OLMoE): the full softmax's
// values at the top K, as modeling_qwen3_moe.py leaves them.
TEST(SoftmaxTopKTest, WithoutNormTopKProbTheWeightsAreTheFullSoftmaxs) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 500; ++trial) {
    const int64_t e = 128, k = 8;
    std::normal_distribution<float> dist(0.0f, trial % 2 == 0 ? 1.0f : 4.0f);
    std::vector<float> logits(static_cast<size_t>(e));
    for (float& l : logits) l = dist(rng);
    const std::vector<double> logits64(logits.begin(), logits.end());
    const RefRouting ref = ReferenceModel::SoftmaxTopK(logits64, k, /*normalize=*/false);
    std::vector<int32_t> experts(static_cast<size_t>(k));
    std::vector<float> weights(static_cast<size_t>(k));
    RouteSoftmaxTopK(logits.data(), e, k, experts.data(), weights.data(), /*normalize=*/false);
    ASSERT_EQ(experts, ref.experts) << "trial " << trial;
    double sum = 0.0;
    for (int64_t s = 0; s < k; ++s) {
      EXPECT_NEAR(weights[static_cast<size_t>(s)], ref.weights[static_cast<size_t>(s)], 1e-6) << "trial " << trial;
      sum += weights[static_cast<size_t>(s)];
    }
    EXPECT_LT(sum, 1.0);  // the rest of the mass is on the experts not chosen
  }
  ModelConfig c = *SyntheticConfig({.preset = "tiny-qwen3moe"});
  c.norm_topk_prob = false;
  std::vector<float> logits(static_cast<size_t>(c.num_local_experts));
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = 0.1f * static_cast<float>(i);
  std::vector<int32_t> experts(static_cast<size_t>(c.num_experts_per_tok));
  std::vector<float> weights(experts.size()), want(experts.size());
  Route(c, /*correction_bias=*/nullptr, logits.data(), 1, experts.data(), weights.data());
  RouteSoftmaxTopK(logits.data(), c.num_local_experts, c.num_experts_per_tok, experts.data(), want.data(), false);
  EXPECT_EQ(weights, want);
}

TEST(SoftmaxTopKTest, TiesGoToTheLowerIndex) {
  const std::vector<float> logits = {1.0f, 2.0f, 2.0f, 2.0f, 0.0f};
  std::vector<int32_t> experts(2);
  std::vector<float> weights(2);
  RouteSoftmaxTopK(logits.data(), 5, 2, experts.data(), weights.data());
  EXPECT_EQ(experts, (std::vector<int32_t>{1, 2}));
  EXPECT_FLOAT_EQ(weights[0], 0.5f);
  EXPECT_FLOAT_EQ(weights[1], 0.5f);
  const RefRouting ref = ReferenceModel::SoftmaxTopK(std::vector<double>(logits.begin(), logits.end()), 2);
  EXPECT_EQ(ref.experts, experts);
  EXPECT_DOUBLE_EQ(ref.weights[0], 0.5);
}

// ------------------------------------------------------------------ sparsemixer

// Checks the engine's and the reference's sparsemixer against hand-worked values.
void ExpectSparseMixer(const std::vector<float>& logits, double jitter_eps, const std::vector<int32_t>& want_experts,
                       const std::vector<double>& want_weights) {
  std::vector<int32_t> experts(2);
  std::vector<float> weights(2);
  RouteSparseMixer(logits.data(), static_cast<int64_t>(logits.size()), jitter_eps, experts.data(), weights.data());
  EXPECT_EQ(experts, want_experts) << "engine";
  EXPECT_NEAR(weights[0], want_weights[0], 1e-6) << "engine, first expert";
  EXPECT_NEAR(weights[1], want_weights[1], 1e-6) << "engine, second expert";
  const RefRouting ref = ReferenceModel::SparseMixer(std::vector<double>(logits.begin(), logits.end()), jitter_eps);
  EXPECT_EQ(ref.experts, want_experts) << "reference";
  // The reference sees the f32 logits exactly; hand values are computed from
  // the decimal ones, so allow the f32 representation error (~1e-7).
  EXPECT_NEAR(ref.weights[0], want_weights[0], 1e-6) << "reference, first expert";
  EXPECT_NEAR(ref.weights[1], want_weights[1], 1e-6) << "reference, second expert";
}

// Band: expert e counts in the softmax for threshold m when
// (m - s_e) / max(|s_e|, m) <= 2 · jitter_eps (0.02 here).
constexpr double kJitter = 0.01;

TEST(SparseMixerTest, ClearWinnerGetsWeightOne) {
  // 0.5 vs 3.0 is far outside the band, so the first expert's softmax has one
  // term; the second (0.5) is alone in its band too (0.2: 0.3 / 0.5 = 0.6).
  ExpectSparseMixer({3.0f, 0.5f, -1.0f, -2.0f, 0.2f, -0.5f}, kJitter, {0, 1}, {1.0, 1.0});
}

TEST(SparseMixerTest, LogitsWithinTheBandShareTheWeight) {
  // 1.99 is within 0.5% of 2.0: the first weight is 1 / (1 + e^-0.01) < 1;
  // with the first masked out, 1.99 stands alone: weight 1.
  const double pair = 1.0 / (1.0 + std::exp(-0.01));
  ExpectSparseMixer({2.0f, 1.99f, -1.0f, 0.0f}, kJitter, {0, 1}, {pair, 1.0});
  // Three within the band: both weights below 1 (0.337 and 0.502), and not
  // renormalised over the pair (that would give 0.40 and 0.60).
  const double triple = 1.0 / (1.0 + std::exp(-0.01) + std::exp(-0.02));
  ExpectSparseMixer({2.0f, 1.99f, 1.98f, 0.0f}, kJitter, {0, 1}, {triple, pair});
}

TEST(SparseMixerTest, NegativeLogits) {
  // Threshold -1: clamp(min=-1) leaves |s| as the factor, so the band is
  // relative to each |s|: -1.01 is in it (0.01 / 1.01), -2 is not.
  const double pair = 1.0 / (1.0 + std::exp(-0.01));
  ExpectSparseMixer({-2.0f, -1.0f, -1.01f, -3.0f}, kJitter, {1, 2}, {pair, 1.0});
  // 0.0203 / 1.0203 = 0.0199 <= 0.02: inside (a factor of |threshold| = 1
  // would give 0.0203 and wrongly mask it).
  ExpectSparseMixer({-1.0f, -1.0203f, -5.0f}, kJitter, {0, 1}, {1.0 / (1.0 + std::exp(-0.0203)), 1.0});
  // 0.025 / 1.025 = 0.0244 > 0.02: outside.
  ExpectSparseMixer({-1.0f, -1.025f, -5.0f}, kJitter, {0, 1}, {1.0, 1.0});
}

TEST(SparseMixerTest, Ties) {
  // Equal maxima: the first is the lower index (torch.max), the two share the
  // first softmax; with it masked the other one is alone.
  ExpectSparseMixer({1.0f, 1.0f, 0.0f, -1.0f}, kJitter, {0, 1}, {0.5, 1.0});
  ExpectSparseMixer({0.0f, 3.0f, 3.0f, 3.0f}, kJitter, {1, 2}, {1.0 / 3.0, 0.5});
  // All zero: (0 - 0) / max(0, 0) is NaN, and NaN > 2·eps is false, so in
  // torch nothing is masked: 1/4, then 1/3 over the remaining three.
  ExpectSparseMixer({0.0f, 0.0f, 0.0f, 0.0f}, kJitter, {0, 1}, {0.25, 1.0 / 3.0});
}

// modeling_glm4_moe.py's noaux_tc, computed by hand on 8 experts in 4 groups.
TEST(SigmoidGroupedTopKTest, ChoosesByBiasedScoreWithinTheBestGroupsAndWeighsByScore) {
  // Logits whose sigmoids are easy to order; the bias lifts expert 7.
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, 0.4f, -1.0f, -2.0f, 0.0f, -0.5f};
  std::vector<float> bias(8, 0.0f);
  bias[7] = 1.0f;  // sigmoid(-0.5) + 1 = 1.38: chosen first, weighted by its score 0.378
  auto sigmoid = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  // Groups {0,1} {2,3} {4,5} {6,7}: choice sums 0.88+0.73, 0.62+0.60, 0.27+0.12, 0.5+1.38.
  // topk_group 2 keeps groups 3 and 0; K = 3: experts 7, 0, 1.
  int32_t experts[3];
  float weights[3];
  RouteSigmoidGroupedTopK(logits.data(), bias.data(), 8, 3, /*n_group=*/4, /*topk_group=*/2, /*normalize=*/true,
                          /*scale=*/2.5, experts, weights);
  EXPECT_EQ(std::vector<int32_t>(experts, experts + 3), (std::vector<int32_t>{7, 0, 1}));
  const double s7 = sigmoid(-0.5), s0 = sigmoid(2.0), s1 = sigmoid(1.0), sum = s7 + s0 + s1;
  EXPECT_NEAR(weights[0], 2.5 * s7 / sum, 1e-6);
  EXPECT_NEAR(weights[1], 2.5 * s0 / sum, 1e-6);
  EXPECT_NEAR(weights[2], 2.5 * s1 / sum, 1e-6);
  // One group kept (group 3 by 1.88): its two experts, then a masked one at choice 0.
  RouteSigmoidGroupedTopK(logits.data(), bias.data(), 8, 3, 4, 1, /*normalize=*/false, 1.0, experts, weights);
  EXPECT_EQ(experts[0], 7);
  EXPECT_EQ(experts[1], 6);
  EXPECT_EQ(experts[2], 0);           // every other expert masked to 0: the lowest index wins the tie
  EXPECT_NEAR(weights[0], s7, 1e-6);  // not renormalised, scale 1
  EXPECT_NEAR(weights[2], s0, 1e-6);  // a masked expert still weighs by its own score
  // No grouping, no bias: plain top-K of the sigmoid scores.
  RouteSigmoidGroupedTopK(logits.data(), nullptr, 8, 3, 1, 1, true, 1.0, experts, weights);
  EXPECT_EQ(std::vector<int32_t>(experts, experts + 3), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_NEAR(weights[0] + weights[1] + weights[2], 1.0, 1e-6);
}

TEST(SigmoidGroupedTopKTest, RouteTakesTheLayersBias) {
  auto c = SyntheticConfig({.preset = "tiny-glm4moe"});
  ASSERT_OK(c);
  const int64_t e = c->num_local_experts, k = c->num_experts_per_tok;
  std::vector<float> logits(static_cast<size_t>(e), 0.0f), bias(static_cast<size_t>(e), 0.0f);
  bias[static_cast<size_t>(e - 1)] = 1.0f;  // equal scores: the bias decides
  std::vector<int32_t> experts(static_cast<size_t>(k));
  std::vector<float> weights(static_cast<size_t>(k));
  Route(*c, bias.data(), logits.data(), 1, experts.data(), weights.data());
  EXPECT_EQ(experts[0], e - 1);
  for (float w : weights) EXPECT_NEAR(w, c->routed_scaling_factor / static_cast<double>(k), 1e-6);
}

// DeepSeek-V2's router, by hand: 8 experts in 4 groups of 2.
TEST(SoftmaxGroupedTopKTest, GroupsByTheirBestScoreAndScalesUnlessNormalising) {
  const std::vector<float> logits = {2.0f, -3.0f, 1.5f, 1.4f, 0.0f, 1.9f, -1.0f, -2.0f};
  std::vector<double> p(8);
  double total = 0.0;
  for (size_t e = 0; e < 8; ++e) total += p[e] = std::exp(static_cast<double>(logits[e]));
  for (double& v : p) v /= total;
  int32_t experts[3];
  float weights[3];
  // Groups' best: g0 2.0, g1 1.5, g2 1.9, g3 -1.0; the best 2 are g0 and g2:
  // experts 0, 5, then 4 (1.4 in g1 is masked).
  RouteSoftmaxGroupedTopK(logits.data(), 8, 3, 4, 2, /*normalize=*/false, 16.0, experts, weights);
  EXPECT_EQ(std::vector<int32_t>(experts, experts + 3), (std::vector<int32_t>{0, 5, 4}));
  EXPECT_NEAR(weights[0], 16.0 * p[0], 1e-6);
  EXPECT_NEAR(weights[1], 16.0 * p[5], 1e-6);
  EXPECT_NEAR(weights[2], 16.0 * p[4], 1e-6);
  // norm_topk_prob: renormalised over the three, no scale.
  RouteSoftmaxGroupedTopK(logits.data(), 8, 3, 4, 2, /*normalize=*/true, 16.0, experts, weights);
  EXPECT_NEAR(weights[0] + weights[1] + weights[2], 1.0, 1e-6);
  // One group ("greedy"): the plain top 3 (0, 5, 2), the full softmax's values.
  RouteSoftmaxGroupedTopK(logits.data(), 8, 3, 1, 1, false, 1.0, experts, weights);
  EXPECT_EQ(std::vector<int32_t>(experts, experts + 3), (std::vector<int32_t>{0, 5, 2}));
  EXPECT_NEAR(weights[2], p[2], 1e-6);
  // The weights DAOP re-weights a chosen set with are the router's own.
  float again[3];
  SoftmaxGroupedRouterWeights(logits.data(), 8, experts, 3, false, 1.0, again);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(again[i], weights[i]);
}

TEST(SparseMixerTest, RouteDispatchesByArchitecture) {
  ModelConfig config;
  config.architecture = Architecture::kPhiMoE;
  config.num_local_experts = 4;
  config.num_experts_per_tok = 2;
  config.router_jitter_noise = kJitter;
  const std::vector<float> logits = {2.0f, 1.99f, -1.0f, 0.0f, /*token 2*/ 0.0f, 0.0f, 5.0f, 0.0f};
  std::vector<int32_t> experts(4);
  std::vector<float> weights(4);
  Route(config, /*correction_bias=*/nullptr, logits.data(), 2, experts.data(), weights.data());
  EXPECT_EQ(experts, (std::vector<int32_t>{0, 1, 2, 0}));
  EXPECT_NEAR(weights[0], 1.0 / (1.0 + std::exp(-0.01)), 1e-6);
  EXPECT_NEAR(weights[1], 1.0, 1e-6);
  EXPECT_NEAR(weights[2], 1.0, 1e-6);
  EXPECT_NEAR(weights[3], 1.0 / 3.0, 1e-6);  // the three zeros share the second band
  config.architecture = Architecture::kMixtral;
  Route(config, /*correction_bias=*/nullptr, logits.data(), 2, experts.data(), weights.data());
  EXPECT_EQ(experts, (std::vector<int32_t>{0, 1, 2, 0}));
  EXPECT_NEAR(weights[0] + weights[1], 1.0, 1e-6);  // Mixtral renormalises
}

// ------------------------------------------------------------------ dispatch

// Forwards to the real executor and records what it was asked; optionally
// adds every expert that was not asked for with zero rows.
class RecordingExecutor final : public ExpertExecutor {
 public:
  struct Call {
    int layer;
    int expert;
    int64_t rows;
  };
  RecordingExecutor(ExpertExecutor* inner, int num_experts, int64_t hidden, bool add_empty_experts)
      : inner_(inner), num_experts_(num_experts), dummy_(static_cast<size_t>(hidden)), add_empty_(add_empty_experts) {}

  absl::Status RunExperts(int layer, std::span<const ExpertWork> work) override {
    std::vector<ExpertWork> all(work.begin(), work.end());
    std::set<int> asked;
    for (const ExpertWork& w : work) {
      calls_.push_back({layer, w.expert, w.num_rows});
      asked.insert(w.expert);
    }
    if (add_empty_) {
      for (int e = 0; e < num_experts_; ++e) {
        if (!asked.count(e)) all.push_back({e, 0, dummy_.data(), dummy_.data()});
      }
    }
    return inner_->RunExperts(layer, all);
  }
  const std::vector<Call>& calls() const { return calls_; }
  void Clear() { calls_.clear(); }

 private:
  ExpertExecutor* inner_;
  int num_experts_;
  std::vector<float> dummy_;
  bool add_empty_;
  std::vector<Call> calls_;
};

// An engine wired by hand (LocalRuntime's parts) around a RecordingExecutor.
struct RecordingEngine {
  RecordingEngine(const Model& model, bool add_empty_experts)
      : pool(ThreadPoolOptions{.num_threads = 2, .name = "route-test"}),
        backend(model.weights.get(), &pool),
        local(ExpertTable(model), &pool),
        recorder(&local, static_cast<int>(model.config.num_local_experts), model.config.hidden_size,
                 add_empty_experts) {
    kv_pool = std::move(*KvBlockPool::Create({.num_layers = model.config.num_hidden_layers,
                                              .kv_dim = model.config.cache_key_dim(),
                                              .value_dim = model.config.cache_value_dim(),
                                              .block_size = 16,
                                              .max_blocks = 32}));
    engine = std::make_unique<Engine>(model.config, &backend, &recorder, EngineOptions{dump.Hook()});
  }
  static std::vector<std::vector<ExpertFfnWeights>> ExpertTable(const Model& model) {
    std::vector<std::vector<ExpertFfnWeights>> table;
    for (const LayerWeights& layer : model.weights->layers) table.push_back(layer.experts);
    return table;
  }

  ThreadPool pool;
  CpuBackend backend;
  LocalExpertExecutor local;
  RecordingExecutor recorder;
  DumpRecorder dump;
  std::unique_ptr<KvBlockPool> kv_pool;
  std::unique_ptr<Engine> engine;
};

class ExpertDispatchTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto model = LoadSyntheticModel(SyntheticModelSpec{.preset = GetParam(), .seed = 7, .dtype = DType::kBF16});
    ASSERT_OK(model);
    model_ = std::move(*model);
  }
  std::unique_ptr<Model> model_;
};

TEST_P(ExpertDispatchTest, OnlyChosenExpertsAreCalledWithTheirRows) {
  const ModelConfig& config = model_->config;
  const int64_t e = config.num_local_experts, k = config.num_experts_per_tok;
  RecordingEngine rt(*model_, /*add_empty_experts=*/false);
  SequenceKv kv(rt.kv_pool.get());
  const std::vector<int32_t> prompt = {5, 77, 301, 12, 450, 9};
  const std::vector<int32_t> next = {123};
  std::vector<float> logits;
  for (const std::vector<int32_t>* tokens : {&prompt, &next}) {
    rt.recorder.Clear();
    const ForwardInput input{&kv, *tokens, false};
    ASSERT_OK(rt.engine->Forward({&input, 1}, &logits));
    for (int layer = 0; layer < config.num_hidden_layers; ++layer) {
      if (config.dense_layer(layer)) continue;  // no router, no experts
      // The last layer routes only the row whose logits are asked for.
      const int64_t rows = layer == config.num_hidden_layers - 1 ? 1 : static_cast<int64_t>(tokens->size());
      // What the router chose, from the logits the engine dumped.
      const RefTensor& router_logits = rt.dump.Get("router_logits", layer);
      ASSERT_EQ(router_logits.rows, rows);
      std::vector<float> logits32(router_logits.data.begin(), router_logits.data.end());
      std::vector<int32_t> chosen(static_cast<size_t>(rows * k));
      std::vector<float> weights(static_cast<size_t>(rows * k));
      const std::vector<float>& bias = model_->weights->layers[static_cast<size_t>(layer)].router_correction_bias;
      Route(config, bias.empty() ? nullptr : bias.data(), logits32.data(), rows, chosen.data(), weights.data());
      std::vector<int64_t> want_rows(static_cast<size_t>(e), 0);
      for (int32_t x : chosen) ++want_rows[static_cast<size_t>(x)];

      std::vector<int64_t> got_rows(static_cast<size_t>(e), 0);
      for (const RecordingExecutor::Call& call : rt.recorder.calls()) {
        if (call.layer != layer) continue;
        EXPECT_GT(call.rows, 0) << "expert " << call.expert << " called with no rows";
        EXPECT_EQ(got_rows[static_cast<size_t>(call.expert)], 0) << "expert " << call.expert << " called twice";
        got_rows[static_cast<size_t>(call.expert)] += call.rows;
      }
      EXPECT_EQ(got_rows, want_rows) << "layer " << layer << ", " << rows << " rows";
      if (rows == 1) {
        // One token visits exactly K experts; the other E - K are never called.
        EXPECT_EQ(std::count(got_rows.begin(), got_rows.end(), 0), e - k);
      }
    }
  }
}

TEST_P(ExpertDispatchTest, AnExpertWithZeroRowsChangesNothing) {
  const std::vector<int32_t> prompt = {5, 77, 301, 12, 450, 9, 33, 210};
  const std::vector<int32_t> next = {123};
  std::vector<std::vector<float>> results[2];
  for (bool add_empty : {false, true}) {
    RecordingEngine rt(*model_, add_empty);
    SequenceKv kv(rt.kv_pool.get());
    for (const std::vector<int32_t>* tokens : {&prompt, &next}) {
      const ForwardInput input{&kv, *tokens, true};
      std::vector<float> logits;
      ASSERT_OK(rt.engine->Forward({&input, 1}, &logits));
      results[add_empty].push_back(logits);
    }
  }
  // Bit for bit: a zero-row expert must neither write nor disturb anything.
  EXPECT_EQ(results[0], results[1]);
}

// After the last layer's attention only the rows whose logits are asked for
// go on (a prompt's last token; every row of an all_logits input): its
// experts see those rows alone, and the logits are those of the full pass.
TEST_P(ExpertDispatchTest, TheLastLayerRunsOnlyTheRowsWhoseLogitsAreAskedFor) {
  const ModelConfig& config = model_->config;
  const int64_t k = config.num_experts_per_tok, last = config.num_hidden_layers - 1;
  const std::vector<int32_t> prompt_a = {5, 77, 301, 12, 450, 9};
  const std::vector<int32_t> prompt_b = {8, 61, 222, 3};
  std::vector<float> logits[2];  // [0]: a's last row only, [1]: every row of a
  for (bool all_a : {false, true}) {
    RecordingEngine rt(*model_, /*add_empty_experts=*/false);
    SequenceKv kv_a(rt.kv_pool.get()), kv_b(rt.kv_pool.get());
    const ForwardInput inputs[] = {{&kv_a, prompt_a, all_a}, {&kv_b, prompt_b, true}};
    ASSERT_OK(rt.engine->Forward(inputs, &logits[all_a]));
    std::map<int, int64_t> rows_of_layer;
    for (const RecordingExecutor::Call& call : rt.recorder.calls()) rows_of_layer[call.layer] += call.rows;
    const int64_t a_rows = all_a ? 6 : 1;
    EXPECT_EQ(rows_of_layer[static_cast<int>(last)], k * (a_rows + 4)) << "all_a " << all_a;
    for (int layer = 0; layer < last; ++layer) {
      if (!config.dense_layer(layer)) {
        EXPECT_EQ(rows_of_layer[layer], k * 10) << "layer " << layer;
      }
    }
    EXPECT_EQ(rt.dump.Get("attention_out", static_cast<int>(last)).rows, a_rows + 4);
    EXPECT_EQ(rt.dump.Get("layer_out", static_cast<int>(last)).rows, a_rows + 4);
  }
  // a's last row and b's four rows agree (kernels may differ by row count).
  const int64_t v = config.vocab_size;
  ASSERT_EQ(static_cast<int64_t>(logits[0].size()), 5 * v);
  ASSERT_EQ(static_cast<int64_t>(logits[1].size()), 10 * v);
  float scale = 0;
  for (float x : logits[1]) scale = std::max(scale, std::abs(x));
  for (int64_t r = 0; r < 5; ++r) {
    for (int64_t i = 0; i < v; ++i) {
      ASSERT_NEAR(logits[0][r * v + i], logits[1][(r + 5) * v + i], 2e-3f * scale) << "row " << r << " id " << i;
    }
  }
}

// The last layer's attention asked for some rows only (queries, attention
// and output projection on those): their results are the full pass's, and
// every row's keys and values reach the cache as in the full pass. Slice a
// has a run of output rows longer than one attention block.
TEST_P(ExpertDispatchTest, AttentionForOutputRowsMatchesTheFullPassOnThem) {
  const ModelConfig& config = model_->config;
  const int64_t d = config.hidden_size, a_tokens = 40, b_tokens = 5, rows = a_tokens + b_tokens;
  std::vector<int64_t> output_rows;
  for (int64_t r = 2; r <= 37; ++r) output_rows.push_back(r);
  output_rows.insert(output_rows.end(), {39, 41, 44});
  std::vector<float> input(static_cast<size_t>(rows * d));
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  for (float& x : input) x = normal(rng);

  ThreadPool pool(ThreadPoolOptions{.num_threads = 2, .name = "attn-rows"});
  CpuBackend backend(model_->weights.get(), &pool);
  std::vector<float> hidden[2];
  std::vector<std::vector<float>> cache[2];  // every position's key row, then its value row
  for (bool only_output : {false, true}) {
    auto kv_pool = KvBlockPool::Create({.num_layers = config.num_hidden_layers,
                                        .kv_dim = config.cache_key_dim(),
                                        .value_dim = config.cache_value_dim(),
                                        .block_size = 16,
                                        .max_blocks = 8});
    ASSERT_OK(kv_pool);
    SequenceKv a(kv_pool->get()), b(kv_pool->get());
    ASSERT_OK(a.Reserve(a_tokens));
    ASSERT_OK(b.Reserve(b_tokens));
    const SequenceSlice slices[] = {{&a, 0, a_tokens, 0}, {&b, 0, b_tokens, a_tokens}};
    hidden[only_output] = input;
    float* h = hidden[only_output].data();
    ASSERT_OK(only_output ? backend.AttentionForOutputRows(0, slices, rows, output_rows, h)
                          : backend.Attention(0, slices, rows, h));
    for (const SequenceSlice& s : slices) {
      for (int64_t p = 0; p < s.num_tokens; ++p) {
        cache[only_output].emplace_back(s.kv->KeyRow(0, p), s.kv->KeyRow(0, p) + config.cache_key_dim());
        cache[only_output].emplace_back(s.kv->ValueRow(0, p), s.kv->ValueRow(0, p) + config.cache_value_dim());
      }
    }
  }
  EXPECT_EQ(cache[0], cache[1]);
  float scale = 0;
  for (float x : hidden[0]) scale = std::max(scale, std::abs(x));
  for (int64_t r : output_rows) {
    for (int64_t i = 0; i < d; ++i) {
      ASSERT_NEAR(hidden[1][r * d + i], hidden[0][r * d + i], 1e-3f * scale) << "row " << r << " column " << i;
    }
  }
  EXPECT_EQ(backend.AttentionForOutputRows(0, {}, rows, std::vector<int64_t>{5, 5}, hidden[1].data()).code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Presets, ExpertDispatchTest,
                         ::testing::Values("tiny", "tiny-phimoe", "tiny-qwen3moe", "tiny-qwen2moe", "tiny-olmoe",
                                           "tiny-glm4moe", "tiny-deepseek-v2", "tiny-deepseek-v3"),
                         [](const auto& info) { return ArchTestName(info.param); });

}  // namespace
}  // namespace tandem
