// The engine against the float64 reference (tests/reference_model_testlib.h),
// first op by op on random inputs, then the whole forward pass of the two
// tiny presets intermediate by intermediate, by normalised MSE
//   nmse = Σ(a - b)² / Σ b²,   b the reference.
//
// Why the thresholds are what they are: weights are bf16 but both sides read
// the same bf16 values exactly, so every difference is f32 rounding in the
// engine (unit roundoff u = 2^-24 ≈ 6e-8). An f32 result with relative error
// c·u per element has nmse ≈ (c·u)² ≈ c²·3.6e-15.
//   Elementwise ops (norms, RoPE, router weights): c of one or two, observed
//   nmse 1e-15 .. 3e-15; bound 1e-12 (300x margin).
//   Matmul-based ops (attention, linear, expert FFN): dot products of length
//   K accumulate ~sqrt(K)·u, more where terms cancel; observed 5e-15 .. 1e-13;
//   bound 1e-11 (100x margin, room for another kernel's summation order).
//   The whole forward compounds that through two layers: observed 5e-14 ..
//   7e-13 (moe_out of the last layer is the largest); bound 1e-10 (150x).
// Every bound is orders of magnitude below what a real bug gives (a norm
// without mean subtraction, the wrong rope pairing or factors, an off-by-one
// window, renormalised sparsemixer weights: nmse 1e-4 .. 1).
//
// Legend: T tokens, D hidden, E experts, K num_experts_per_tok, H heads,
// Hkv kv heads, hd head_dim, V vocab.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kernels/linear.h"
#include "common/model/model.h"
#include "common/model/routing.h"
#include "coordinator/engine/cpu_ops.h"
#include "coordinator/runtime/local_runtime.h"
#include "cpu_worker/expert_ffn.h"
#include "gtest/gtest.h"
#include "tests/exact_kernels_testlib.h"
#include "tests/reference_model_testlib.h"
#include "tests/status_testlib.h"
#include "tests/tokens_testlib.h"

namespace tandem {
namespace {

const bool kExactKernels = test::UseExactKernels();

constexpr uint64_t kSeed = 7;

// Pure f32-vs-f64 elementwise work (norms, RoPE, router weights).
constexpr double kElementwiseNmse = 1e-12;
// Matmul-based ops (expert FFN, linear, attention) with bf16 weights read exactly.
constexpr double kMatmulNmse = 1e-11;
// A whole forward (every intermediate of every layer, and the logits).
constexpr double kForwardNmse = 1e-10;

std::vector<float> RandomFloats(int64_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Prints the observed value next to the bound so threshold choices can be
// revisited from the test log.
void ExpectNmseBelow(double nmse, double bound, const std::string& what) {
  std::cout << "[ nmse     ] " << what << ": " << nmse << " (bound " << bound << ")\n";
  EXPECT_LT(nmse, bound) << what;
}

class ForwardParityTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    SyntheticModelSpec spec{.preset = GetParam(), .seed = kSeed, .dtype = DType::kBF16};
    auto model = LoadSyntheticModel(spec);
    ASSERT_OK(model);
    model_ = std::move(*model);
    auto reference = ReferenceModel::Create(*model_->weights);
    ASSERT_OK(reference);
    reference_ = std::move(*reference);
  }
  const ModelConfig& config() const { return model_->config; }

  std::unique_ptr<Model> model_;
  std::unique_ptr<ReferenceModel> reference_;
};

// ------------------------------------------------------------------ the oracle itself

// Properties the reference must have by construction, so that agreement with
// the engine is not agreement between two copies of one mistake.
TEST_P(ForwardParityTest, ReferenceOpsHaveTheirDefiningProperties) {
  const int64_t heads = config().num_attention_heads, hd = config().head_dim, d = config().hidden_size;
  // LayerNorm with unit weight and zero bias: zero mean, unit (biased) variance.
  std::vector<float> x = RandomFloats(3 * d, 1, -1.0f, 3.0f);
  const RefTensor ln = ReferenceModel::LayerNorm(RefTensor::FromF32(x.data(), 3, d), std::vector<double>(d, 1.0),
                                                 std::vector<double>(d, 0.0), 0.0);
  for (int64_t t = 0; t < 3; ++t) {
    double mean = 0, sq = 0;
    for (int64_t i = 0; i < d; ++i) mean += ln.at(t, i) / d, sq += ln.at(t, i) * ln.at(t, i) / d;
    EXPECT_NEAR(mean, 0.0, 1e-12);
    EXPECT_NEAR(sq, 1.0, 1e-12);
  }
  // RoPE: a rotation scaled by mscale, and q(m)·k(n) depends on m - n only.
  const bool longrope = config().rope_scaling.type == "longrope";
  // YaRN scales by its attention factor and leaves the fastest pair (i = 0)
  // unscaled (it lies below the ramp).
  const bool yarn = config().rope_scaling.type == "yarn";
  const double mscale =
      longrope ? config().rope_scaling.short_mscale : yarn ? config().rope_scaling.attention_factor : 1.0;
  const std::vector<float> q = RandomFloats(hd, 2, -1.0f, 1.0f), k = RandomFloats(hd, 3, -1.0f, 1.0f);
  auto rotated_dot = [&](int64_t m, int64_t n) {
    std::vector<double> qm(q.begin(), q.end()), kn(k.begin(), k.end());
    ReferenceModel::Rope(config(), qm.data(), 1, m, 40);
    ReferenceModel::Rope(config(), kn.data(), 1, n, 40);
    double dot = 0;
    for (int64_t i = 0; i < hd; ++i) dot += qm[static_cast<size_t>(i)] * kn[static_cast<size_t>(i)];
    return dot;
  };
  double plain = 0;
  for (int64_t i = 0; i < hd; ++i) plain += static_cast<double>(q[static_cast<size_t>(i)]) * k[static_cast<size_t>(i)];
  EXPECT_NEAR(rotated_dot(7, 7), plain * mscale * mscale, 1e-12);
  EXPECT_NEAR(rotated_dot(12, 5), rotated_dot(30, 23), 1e-12);
  EXPECT_GT(std::fabs(rotated_dot(12, 5) - rotated_dot(12, 6)), 1e-6);
  // Pairs are (i, i + r/2), r the rotated width: position 1 turns x = e_0
  // into cos·e_0 + sin·e_{r/2}; past r (GLM-4.5's partial RoPE) nothing moves.
  const int64_t rotated = config().rope_dim();
  std::vector<double> e0(static_cast<size_t>(heads * hd), 0.0);
  e0[0] = 1.0;
  if (rotated < hd) e0[static_cast<size_t>(hd - 1)] = 1.0;
  ReferenceModel::Rope(config(), e0.data(), heads, 1, 2);
  const double inv_freq0 = longrope ? 1.0 / config().rope_scaling.short_factor[0] : 1.0;
  EXPECT_NEAR(e0[0], std::cos(inv_freq0) * mscale, 1e-15);
  EXPECT_NEAR(e0[static_cast<size_t>(rotated / 2)], std::sin(inv_freq0) * mscale, 1e-15);
  if (rotated < hd) {
    EXPECT_EQ(e0[static_cast<size_t>(hd - 1)], 1.0);
  }
  // Attention with a window of 1 returns each position's own value.
  const int64_t kv_heads = config().num_key_value_heads, t_len = 5;
  const std::vector<float> qa = RandomFloats(t_len * heads * hd, 4, -1.0f, 1.0f);
  const std::vector<float> ka = RandomFloats(t_len * kv_heads * hd, 5, -1.0f, 1.0f);
  const std::vector<float> va = RandomFloats(t_len * kv_heads * hd, 6, -1.0f, 1.0f);
  const RefTensor out = ReferenceModel::Attention(
      RefTensor::FromF32(qa.data(), t_len, heads * hd), RefTensor::FromF32(ka.data(), t_len, kv_heads * hd),
      RefTensor::FromF32(va.data(), t_len, kv_heads * hd), heads, kv_heads, hd, /*sliding_window=*/1);
  for (int64_t t = 0; t < t_len; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t kvh = h / (heads / kv_heads);
      for (int64_t i = 0; i < hd; ++i) {
        EXPECT_DOUBLE_EQ(out.at(t, h * hd + i), va[static_cast<size_t>(t * kv_heads * hd + kvh * hd + i)]);
      }
    }
  }
}

// ------------------------------------------------------------------ ops alone

TEST_P(ForwardParityTest, NormsMatchReference) {
  const int64_t d = config().hidden_size, rows = 9;
  // A common offset makes the mean large: LayerNorm must subtract it, and an
  // RMSNorm-with-bias impostor would be far off.
  std::vector<float> x = RandomFloats(rows * d, 11, -2.0f, 2.0f);
  for (float& v : x) v += 1.5f;
  const std::vector<float> weight = RandomFloats(d, 12, 0.5f, 1.5f);
  const std::vector<float> bias = RandomFloats(d, 13, -0.5f, 0.5f);
  const double eps = config().rms_norm_eps;
  const RefTensor ref_x = RefTensor::FromF32(x.data(), rows, d);

  std::vector<float> y(x.size());
  RmsNorm(x.data(), rows, d, weight.data(), eps, y.data());
  ExpectNmseBelow(Nmse(y, ReferenceModel::RmsNorm(ref_x, ToDouble(weight), eps).data), kElementwiseNmse, "RmsNorm");

  LayerNorm(x.data(), rows, d, weight.data(), bias.data(), eps, y.data());
  const RefTensor ref_ln = ReferenceModel::LayerNorm(ref_x, ToDouble(weight), ToDouble(bias), eps);
  ExpectNmseBelow(Nmse(y, ref_ln.data), kElementwiseNmse, "LayerNorm");

  // The model's own norm through ApplyNorm: the config picks the kind.
  const NormWeights& norm = model_->weights->layers[0].post_attention_norm;
  ApplyNorm(config(), norm, x.data(), rows, y.data());
  RefNorm ref_norm{ToDouble(norm.weight), ToDouble(norm.bias)};
  ExpectNmseBelow(Nmse(y, ReferenceModel::Norm(config(), ref_norm, ref_x).data), kElementwiseNmse,
                  "ApplyNorm (config's norm)");
  // The reference's norm weights are the checkpoint's, read by name.
  EXPECT_EQ(reference_->layer(0).post_attention_norm.weight, ref_norm.weight);
  EXPECT_EQ(reference_->layer(0).post_attention_norm.bias, ref_norm.bias);
}

TEST_P(ForwardParityTest, RopeMatchesReferenceAtManyPositions) {
  const int64_t heads = config().num_attention_heads, hd = config().head_dim;
  const RotaryEmbedding rope(config());
  // 63 and 64 straddle tiny-phimoe's longrope switch (original_max 64:
  // a forward reaching position 64 has seq_len 65 > 64).
  for (int64_t position : {0, 1, 5, 47, 48, 63, 64, 65, 100, 200, 255}) {
    const std::vector<float> x = RandomFloats(heads * hd, 20 + static_cast<uint32_t>(position), -1.0f, 1.0f);
    std::vector<float> y = x;
    const bool long_factors = rope.UseLongFactors(position);
    EXPECT_EQ(long_factors, ReferenceModel::UseLongRope(config(), position + 1)) << "position " << position;
    rope.Apply(y.data(), heads, position, long_factors);
    std::vector<double> ref(x.begin(), x.end());
    ReferenceModel::Rope(config(), ref.data(), heads, position, position + 1);
    ExpectNmseBelow(Nmse(y, ref), kElementwiseNmse, absl::StrCat("RoPE at position ", position));
  }
  // An early position inside a long forward: the factors follow the forward's
  // length, not the position.
  const std::vector<float> x = RandomFloats(heads * hd, 99, -1.0f, 1.0f);
  std::vector<float> y = x;
  rope.Apply(y.data(), heads, 10, rope.UseLongFactors(99));
  std::vector<double> ref(x.begin(), x.end());
  ReferenceModel::Rope(config(), ref.data(), heads, 10, 100);
  ExpectNmseBelow(Nmse(y, ref), kElementwiseNmse, "RoPE at position 10 of a 100-position forward");
  if (config().rope_scaling.type == "longrope") {
    // The switch must matter, or the test above proves nothing.
    std::vector<double> short_ref(x.begin(), x.end());
    ReferenceModel::Rope(config(), short_ref.data(), heads, 10, 11);
    EXPECT_GT(Nmse(short_ref, ref), 1e-4) << "long and short factors should rotate position 10 differently";
  }
}

TEST_P(ForwardParityTest, AttentionMatchesReferenceWithAndWithoutWindow) {
  const int64_t heads = config().num_attention_heads, kv_heads = config().num_key_value_heads;
  const int64_t hd = config().head_dim, t_len = 80;  // past tiny-phimoe's window of 48
  const int64_t q_dim = heads * hd, kv_dim = kv_heads * hd;
  // Scale 2: scores spread over several units, so the softmax is far from uniform.
  const std::vector<float> q = RandomFloats(t_len * q_dim, 31, -2.0f, 2.0f);
  const std::vector<float> k = RandomFloats(t_len * kv_dim, 32, -2.0f, 2.0f);
  const std::vector<float> v = RandomFloats(t_len * kv_dim, 33, -1.0f, 1.0f);
  const RefTensor ref_q = RefTensor::FromF32(q.data(), t_len, q_dim);
  const RefTensor ref_k = RefTensor::FromF32(k.data(), t_len, kv_dim);
  const RefTensor ref_v = RefTensor::FromF32(v.data(), t_len, kv_dim);

  std::vector<std::optional<int64_t>> windows = {std::nullopt, config().sliding_window.value_or(48), 7};
  std::vector<double> full_ref;
  for (const std::optional<int64_t>& window : windows) {
    std::vector<float> out(static_cast<size_t>(t_len * q_dim));
    std::vector<float> scores(static_cast<size_t>(t_len));
    for (int64_t i = 0; i < t_len; ++i) {
      const int64_t first = window ? std::max<int64_t>(0, i - *window + 1) : 0;
      AttendOneRow(
          q.data() + i * q_dim, heads, kv_heads, hd, first, i - first + 1,
          [&](int64_t j) { return k.data() + j * kv_dim; }, [&](int64_t j) { return v.data() + j * kv_dim; },
          scores.data(), out.data() + i * q_dim);
    }
    const RefTensor ref = ReferenceModel::Attention(ref_q, ref_k, ref_v, heads, kv_heads, hd, window);
    const std::string label = window ? absl::StrCat("attention, window ", *window) : "attention, no window";
    ExpectNmseBelow(Nmse(out, ref.data), kMatmulNmse, label);
    if (!window) {
      full_ref = ref.data;
    } else {
      // The window must change rows past it, or it is not being exercised.
      EXPECT_GT(Nmse(full_ref, ref.data), 1e-4) << label;
    }
  }
}

TEST_P(ForwardParityTest, RouterMatchesReferenceOnRandomLogits) {
  const int64_t e = config().num_local_experts, k = config().num_experts_per_tok, tokens = 500;
  // Router logits of the synthetic models have std ≈ 2; ±4 covers that.
  const std::vector<float> logits = RandomFloats(tokens * e, 41, -4.0f, 4.0f);
  std::vector<int32_t> experts(static_cast<size_t>(tokens * k));
  std::vector<float> weights(static_cast<size_t>(tokens * k));
  // The sigmoid router's correction bias: one random [E] row for every token.
  const std::vector<float> bias =
      config().router_correction_bias() ? RandomFloats(e, 43, -0.2f, 0.2f) : std::vector<float>{};
  const std::vector<double> bias64(bias.begin(), bias.end());
  Route(config(), bias.empty() ? nullptr : bias.data(), logits.data(), tokens, experts.data(), weights.data());
  std::vector<double> ref_weights;
  int64_t near_edge = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    const std::vector<double> row(logits.begin() + t * e, logits.begin() + (t + 1) * e);
    const RefRouting r = ReferenceModel::Route(config(), row, bias64);
    // f32 rounding in the engine's band test is ~1e-7 of a logit; a token this
    // close to a discontinuity may legitimately go either way.
    if (r.margin < 1e-5) {
      ++near_edge;
      ref_weights.insert(ref_weights.end(), weights.begin() + t * k, weights.begin() + (t + 1) * k);
      continue;
    }
    for (int64_t s = 0; s < k; ++s) {
      EXPECT_EQ(experts[static_cast<size_t>(t * k + s)], r.experts[static_cast<size_t>(s)]) << "token " << t;
    }
    ref_weights.insert(ref_weights.end(), r.weights.begin(), r.weights.end());
  }
  std::cout << "[ routing  ] " << near_edge << " of " << tokens << " random tokens within 1e-5 of a discontinuity\n";
  EXPECT_LT(near_edge, 5);
  ExpectNmseBelow(Nmse(weights, ref_weights), kElementwiseNmse, "router weights");
}

TEST_P(ForwardParityTest, ExpertFfnMatchesReference) {
  ThreadPool pool(ThreadPoolOptions{.num_threads = 2, .name = "ffn-test"});
  ExpertFfn ffn(&pool);
  const int64_t d = config().hidden_size;
  // 1 and 5 rows take the AVX2 streaming path, 16 and 40 the oneDNN path.
  for (int64_t rows : {1, 5, 16, 40}) {
    for (int layer = 0; layer < config().num_hidden_layers; ++layer) {
      if (config().dense_layer(layer)) continue;  // no experts
      for (int expert : {0, static_cast<int>(config().num_local_experts) - 1}) {
        const std::vector<float> x = RandomFloats(rows * d, 50 + static_cast<uint32_t>(rows), -2.0f, 2.0f);
        std::vector<float> y(x.size());
        ASSERT_OK(ffn.Run(model_->weights->layers[static_cast<size_t>(layer)].experts[static_cast<size_t>(expert)],
                          x.data(), rows, y.data()));
        const RefTensor ref =
            ReferenceModel::ExpertFfn(RefTensor::FromF32(x.data(), rows, d), reference_->layer(layer).experts[expert]);
        ExpectNmseBelow(Nmse(y, ref.data), kMatmulNmse,
                        absl::StrCat("expert FFN layer ", layer, " expert ", expert, ", ", rows, " rows"));
      }
    }
  }
}

TEST_P(ForwardParityTest, LinearWithBiasMatchesReference) {
  // lm_head (+ its bias for PhiMoE): the largest matrix, both Linear paths.
  const int64_t d = config().hidden_size, v = config().vocab_size;
  const ModelWeights& w = *model_->weights;
  for (int64_t rows : {1, 3, 24}) {
    const std::vector<float> x = RandomFloats(rows * d, 60 + static_cast<uint32_t>(rows), -2.0f, 2.0f);
    std::vector<float> y(static_cast<size_t>(rows * v));
    ASSERT_OK(
        Linear(x.data(), rows, w.lm_head, w.lm_head_bias.empty() ? nullptr : w.lm_head_bias.data(), y.data(), nullptr));
    const RefTensor ref = ReferenceModel::Linear(RefTensor::FromF32(x.data(), rows, d), reference_->lm_head(),
                                                 reference_->lm_head_bias());
    ExpectNmseBelow(Nmse(y, ref.data), kMatmulNmse, absl::StrCat("lm_head linear, ", rows, " rows"));
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, ForwardParityTest,
                         ::testing::Values("tiny", "tiny-phimoe", "tiny-qwen3moe", "tiny-qwen2moe", "tiny-olmoe",
                                           "tiny-glm4moe"),
                         [](const auto& info) { return ArchTestName(info.param); });

// ------------------------------------------------------------------ whole forward

struct ForwardCase {
  std::string preset;
  int64_t length;  // prompt tokens, one prefill
  uint32_t prompt_seed;
};

void PrintTo(const ForwardCase& c, std::ostream* os) { *os << c.preset << " T=" << c.length; }

class WholeForwardTest : public ::testing::TestWithParam<ForwardCase> {};

// One prefill through LocalRuntime's engine (CPU backend, in-process expert
// executor, a SequenceKv from its pool) against one reference forward, every
// dumped intermediate of every layer and the all-position logits.
TEST_P(WholeForwardTest, EveryIntermediateMatchesReference) {
  const ForwardCase& c = GetParam();
  auto model = LoadSyntheticModel(SyntheticModelSpec{.preset = c.preset, .seed = kSeed, .dtype = DType::kBF16});
  ASSERT_OK(model);
  DumpRecorder dump;
  LocalRuntimeOptions options;
  options.num_threads = 2;
  options.engine.dump = dump.Hook();
  auto runtime = LocalRuntime::Create(std::move(*model), options);
  ASSERT_OK(runtime);
  const ModelConfig& config = (*runtime)->model().config;
  auto reference = ReferenceModel::Create(*(*runtime)->model().weights);
  ASSERT_OK(reference);

  const std::vector<int32_t> tokens = RandomTokens(c.length, config.vocab_size, c.prompt_seed);
  SequenceKv kv(&(*runtime)->kv_pool());
  const ForwardInput input{&kv, tokens, /*all_logits=*/true};
  std::vector<float> logits;
  ASSERT_OK((*runtime)->engine().Forward({&input, 1}, &logits));
  EXPECT_EQ(kv.length(), c.length);
  auto ref = (*reference)->Forward(tokens);
  ASSERT_OK(ref);
  if (config.rope_scaling.type == "longrope") {
    EXPECT_EQ(ref->long_rope, c.length > config.rope_scaling.original_max_position_embeddings);
  }

  // Routing first: the router is discontinuous, so if the engine's f32 logits
  // chose other experts than the reference's f64 ones, nothing downstream is
  // comparable. Route the engine's logits with the reference's router and
  // demand the same experts, and that no token sat within rounding of a
  // discontinuity (else this seed/prompt is a coin toss: pick another).
  double min_margin = std::numeric_limits<double>::infinity();
  for (int layer = 0; layer < config.num_hidden_layers; ++layer) {
    if (config.dense_layer(layer)) {
      EXPECT_TRUE(ref->routing[static_cast<size_t>(layer)].empty()) << "dense layer " << layer;
      continue;
    }
    const RefTensor& engine_logits = dump.Get("router_logits", layer);
    ASSERT_EQ(engine_logits.rows, c.length);
    for (int64_t t = 0; t < c.length; ++t) {
      const RefRouting& want = ref->routing[static_cast<size_t>(layer)][static_cast<size_t>(t)];
      const std::vector<float>& bias =
          (*runtime)->model().weights->layers[static_cast<size_t>(layer)].router_correction_bias;
      RefRouting got = ReferenceModel::Route(
          config, std::span<const double>(engine_logits.row(t), static_cast<size_t>(engine_logits.cols)),
          std::vector<double>(bias.begin(), bias.end()));
      std::vector<int32_t> want_experts = want.experts;
      if (config.router_kind() != RouterKind::kSparseMixer) {
        // Mixtral renormalises over the chosen set: only the set matters.
        std::sort(want_experts.begin(), want_experts.end());
        std::sort(got.experts.begin(), got.experts.end());
      }
      EXPECT_EQ(got.experts, want_experts) << "layer " << layer << " token " << t;
      min_margin = std::min(min_margin, want.margin);
    }
  }
  std::cout << "[ routing  ] smallest distance to a routing discontinuity: " << min_margin << " logits\n";
  EXPECT_GT(min_margin, 1e-4) << "a token's routing is within rounding of a discontinuity: choose another prompt";

  auto compare = [&](const char* name, int layer) {
    const RefTensor& got = dump.Get(name, layer);
    const RefTensor& want = ref->Get(name, layer);
    ASSERT_EQ(got.rows, want.rows) << name << " layer " << layer;
    ASSERT_EQ(got.cols, want.cols) << name << " layer " << layer;
    ExpectNmseBelow(Nmse(got.data, want.data), kForwardNmse,
                    absl::StrCat(c.preset, " T=", c.length, " ", name, " layer ", layer));
  };
  compare("embedding", -1);
  for (int layer = 0; layer < config.num_hidden_layers; ++layer) {
    if (config.dense_layer(layer)) {
      // No router, experts or shared expert: the MLP's sum is the layer's output.
      for (const char* name : {"attention_out", "moe_input", "layer_out"}) compare(name, layer);
      continue;
    }
    for (const char* name : {"attention_out", "moe_input", "router_logits", "moe_out", "layer_out"}) {
      compare(name, layer);
    }
    if (config.shared_expert()) compare("shared_expert_out", layer);
  }
  compare("logits", -1);
  ExpectNmseBelow(Nmse(logits, ref->logits.data), kForwardNmse, absl::StrCat(c.preset, " T=", c.length, " logits"));
}

// tiny-phimoe: 40 positions fit in the sliding window (48) and the short
// longrope factors; 60 reach past the window; 64 is the last length with the
// short factors and 65 the first with the long ones (seq_len > 64); 100 is
// well past both.
INSTANTIATE_TEST_SUITE_P(
    Prompts, WholeForwardTest,
    ::testing::Values(ForwardCase{"tiny", 24, 101}, ForwardCase{"tiny", 100, 102}, ForwardCase{"tiny-phimoe", 40, 103},
                      ForwardCase{"tiny-phimoe", 60, 104}, ForwardCase{"tiny-phimoe", 64, 106},
                      ForwardCase{"tiny-phimoe", 65, 107}, ForwardCase{"tiny-phimoe", 100, 105},
                      ForwardCase{"tiny-qwen3moe", 24, 108}, ForwardCase{"tiny-qwen3moe", 100, 109},
                      ForwardCase{"tiny-qwen2moe", 24, 110}, ForwardCase{"tiny-qwen2moe", 100, 111},
                      ForwardCase{"tiny-olmoe", 24, 112}, ForwardCase{"tiny-olmoe", 100, 113},
                      ForwardCase{"tiny-qwen3moe-dense", 24, 114}, ForwardCase{"tiny-qwen3moe-dense", 100, 115},
                      ForwardCase{"tiny-qwen2moe-dense", 24, 116}, ForwardCase{"tiny-qwen2moe-dense", 100, 117},
                      ForwardCase{"tiny-glm4moe", 24, 118}, ForwardCase{"tiny-glm4moe", 100, 119},
                      ForwardCase{"tiny-deepseek-v2", 24, 120}, ForwardCase{"tiny-deepseek-v2", 100, 121},
                      ForwardCase{"tiny-deepseek-v3", 24, 122}, ForwardCase{"tiny-deepseek-v3", 100, 123}),
    [](const auto& info) { return absl::StrCat(ArchTestName(info.param.preset), "_T", info.param.length); });

}  // namespace
}  // namespace tandem
