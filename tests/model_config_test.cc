// config.json parsing: the real fields of each architecture, defaults as
// Hugging Face has them, and a clear error for every missing or inconsistent field.
#include "common/model/model_config.h"

#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/model/synthetic_model.h"
#include "common/model/tensor_names.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"

namespace tandem {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

json MixtralJson() {  // mistralai/Mixtral-8x7B-v0.1's config.json
  return json::parse(R"({
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32,
    "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "output_router_logits": false, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.36.0.dev0", "use_cache": true, "vocab_size": 32000})");
}

json PhiMoEJson() {  // microsoft/Phi-3.5-MoE-instruct's config.json, factors shortened to their length
  json j = json::parse(R"({
    "architectures": ["PhiMoEForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
    "bos_token_id": 1, "eos_token_id": 32000, "hidden_act": "silu", "hidden_dropout": 0.0, "hidden_size": 4096,
    "initializer_range": 0.02, "input_jitter_noise": 0.01, "intermediate_size": 6400, "lm_head_bias": true,
    "max_position_embeddings": 131072, "model_type": "phimoe", "num_attention_heads": 32,
    "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 16,
    "original_max_position_embeddings": 4096, "output_router_logits": false, "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0, "router_aux_loss_coef": 0.0, "router_jitter_noise": 0.01, "sliding_window": 131072,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 32064,
    "auto_map": {"AutoConfig": "configuration_phimoe.PhiMoEConfig"}})");
  std::vector<double> short_factor(64, 1.0), long_factor(64, 1.5);
  j["rope_scaling"] = {{"type", "longrope"},
                       {"short_factor", short_factor},
                       {"long_factor", long_factor},
                       {"short_mscale", 1.243163121016122},
                       {"long_mscale", 1.243163121016122},
                       {"original_max_position_embeddings", 4096}};
  return j;
}

json Qwen3MoeJson() {  // Qwen/Qwen3-30B-A3B's config.json
  return json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
    "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
    "moe_intermediate_size": 768, "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": false,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
}

json Qwen2MoeJson() {  // Qwen/Qwen1.5-MoE-A2.7B's config.json
  return json::parse(R"({
    "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21, "model_type": "qwen2_moe",
    "num_attention_heads": 16, "num_hidden_layers": 24, "num_key_value_heads": 16, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.36.0.dev0", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936,
    "decoder_sparse_step": 1, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
    "num_experts_per_tok": 4, "num_experts": 60, "norm_topk_prob": false, "output_router_logits": false,
    "router_aux_loss_coef": 0.001})");
}

json OlmoeJson() {  // allenai/OLMoE-1B-7B-0924's config.json
  return json::parse(R"({
    "architectures": ["OlmoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": null,
    "clip_qkv": null, "eos_token_id": 50279, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 1024, "max_position_embeddings": 4096, "model_type": "olmoe", "norm_topk_prob": false,
    "num_attention_heads": 16, "num_experts": 64, "num_experts_per_tok": 8, "num_hidden_layers": 16,
    "num_key_value_heads": 16, "output_router_logits": false, "pad_token_id": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": null, "rope_theta": 10000.0, "router_aux_loss_coef": 0.01, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 50304})");
}

absl::StatusOr<ModelConfig> Parse(const json& j) { return ParseModelConfig(j.dump(), "/models/x/config.json"); }

TEST(ModelConfigTest, ReadsQwen3Moe) {
  auto c = Parse(Qwen3MoeJson());
  ASSERT_OK(c);
  EXPECT_EQ(c->architecture, Architecture::kQwen3Moe);
  EXPECT_EQ(c->norm_kind(), NormKind::kRmsNorm);
  EXPECT_EQ(c->router_kind(), RouterKind::kSoftmaxTopK);
  EXPECT_TRUE(c->qk_norm());
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_EQ(c->intermediate_size, 768);  // the experts', not the dense MLP's 6144
  EXPECT_EQ(c->num_local_experts, 128);
  EXPECT_EQ(c->num_experts_per_tok, 8);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->q_dim(), 4096);  // wider than hidden_size
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>{151645});
  EXPECT_FALSE(c->sliding_window.has_value());
  // HF's default when the key is absent: no renormalisation.
  json j = Qwen3MoeJson();
  j.erase("norm_topk_prob");
  ASSERT_OK_AND_ASSIGN(ModelConfig plain, Parse(j));
  EXPECT_FALSE(plain.norm_topk_prob);
}

// Qwen's documented long-context setting: YaRN, factor 4 over 32768.
TEST(ModelConfigTest, ReadsYarnAndServesTheStretchedContext) {
  json j = Qwen3MoeJson();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  ASSERT_OK_AND_ASSIGN(ModelConfig c, Parse(j));
  EXPECT_EQ(c.rope_scaling.type, "yarn");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 32768);
  EXPECT_DOUBLE_EQ(c.rope_scaling.attention_factor, 0.1 * std::log(4.0) + 1.0);
  EXPECT_EQ(c.max_position_embeddings, 131072);  // not config.json's 40960
  // DeepSeek's spelling: mscale / mscale_all_dim give the attention factor.
  j["rope_scaling"] = {{"type", "yarn"},         {"factor", 40.0},         {"original_max_position_embeddings", 4096},
                       {"mscale", 1.0},          {"mscale_all_dim", 1.0},  {"beta_fast", 32},
                       {"beta_slow", 1}};
  ASSERT_OK_AND_ASSIGN(ModelConfig d, Parse(j));
  EXPECT_DOUBLE_EQ(d.rope_scaling.attention_factor, 1.0);
  auto back = ParseModelConfig(ModelConfigToJson(c), "written");
  ASSERT_OK(back);
  EXPECT_EQ(ModelConfigToJson(*back), ModelConfigToJson(c));
}

TEST(ModelConfigTest, Qwen3MoeLayoutsTandemDoesNotRunAreRefusedByKey) {
  const struct {
    const char* key;
    json value;
    const char* says;
  } cases[] = {
      {"mlp_only_layers", json::array({0, 48}), "mlp_only_layers"},
      {"mlp_only_layers", json::array({-1}), "mlp_only_layers"},
      {"mlp_only_layers", json::array({"0"}), "mlp_only_layers"},
      {"mlp_only_layers", 3, "mlp_only_layers"},
      {"decoder_sparse_step", 0, "decoder_sparse_step"},
      {"decoder_sparse_step", 49, "mlp_only_layers"},  // no MoE layer left
      {"use_sliding_window", true, "use_sliding_window"},
      {"rope_scaling", {{"rope_type", "dynamic"}, {"factor", 4.0}}, "rope_scaling"},
      {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 0.5}}, "factor"},
      {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}, {"beta_fast", -1}}, "beta_fast"},
      {"attention_bias", true, "attention_bias"},
      {"moe_intermediate_size", nullptr, "moe_intermediate_size"},
      {"num_experts", nullptr, "num_experts"},
      {"model_type", "qwen2_moe", "model_type"},
  };
  for (const auto& c : cases) {
    json j = Qwen3MoeJson();
    j[c.key] = c.value;
    auto parsed = Parse(j);
    ASSERT_FALSE(parsed.ok()) << c.key;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(c.says)) << parsed.status();
  }
}

// modeling_qwen2_moe.py's rule: layer l is a dense MLP when mlp_only_layers
// lists it or (l + 1) % decoder_sparse_step != 0; intermediate_size wide.
TEST(ModelConfigTest, ReadsQwenDenseLayers) {
  json j = Qwen3MoeJson();
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = json::array({1, 47});
  ASSERT_OK_AND_ASSIGN(ModelConfig c, Parse(j));
  std::vector<int64_t> want;
  for (int64_t l = 0; l < 48; ++l) {
    if (l % 2 == 0 || l == 1 || l == 47) want.push_back(l);
  }
  EXPECT_EQ(c.dense_layers, want);
  EXPECT_EQ(c.dense_intermediate_size, 6144);
  EXPECT_EQ(c.num_moe_layers(), 48 - static_cast<int64_t>(want.size()));
  EXPECT_EQ(c.first_moe_layer(), 3);
  EXPECT_TRUE(c.dense_layer(0));
  EXPECT_TRUE(c.moe_layer(45));
  // A dense layer's tensors are its MLP's; it has no router and no experts.
  int dense = 0, routers = 0;
  for (const WeightSpec& w : ExpectedWeights(c)) {
    if (w.role == WeightRole::kDenseW2) {
      EXPECT_EQ(w.shape, (std::vector<int64_t>{2048, 6144}));
    }
    dense += w.role == WeightRole::kDenseW1 || w.role == WeightRole::kDenseW2 || w.role == WeightRole::kDenseW3;
    routers += w.role == WeightRole::kRouter;
    if (w.layer == 0) {
      EXPECT_NE(w.role, WeightRole::kExpertW1) << w.name;
    }
  }
  EXPECT_EQ(dense, 3 * static_cast<int>(want.size()));
  EXPECT_EQ(routers, c.num_moe_layers());
  EXPECT_EQ(WeightName(c, WeightRole::kDenseW1, 0), "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(WeightName(c, WeightRole::kDenseW2, 0), "model.layers.0.mlp.down_proj.weight");
  // Written back, the same layers (as mlp_only_layers).
  ASSERT_OK_AND_ASSIGN(ModelConfig back, ParseModelConfig(ModelConfigToJson(c), "written"));
  EXPECT_EQ(back.dense_layers, c.dense_layers);
  EXPECT_EQ(back.dense_intermediate_size, 6144);
  // Without intermediate_size the dense layers have no width.
  j.erase("intermediate_size");
  auto missing = Parse(j);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("intermediate_size"));
  // Qwen2-MoE: a dense layer between MoE ones.
  json q2 = Qwen2MoeJson();
  q2["mlp_only_layers"] = json::array({5});
  ASSERT_OK_AND_ASSIGN(ModelConfig c2, Parse(q2));
  EXPECT_EQ(c2.dense_layers, std::vector<int64_t>{5});
  EXPECT_EQ(c2.dense_intermediate_size, 5632);
  // Every released config: none.
  ASSERT_OK_AND_ASSIGN(ModelConfig released, Parse(Qwen3MoeJson()));
  EXPECT_TRUE(released.dense_layers.empty());
  EXPECT_EQ(released.num_moe_layers(), 48);
}

TEST(ModelConfigTest, ReadsQwen2Moe) {
  ASSERT_OK_AND_ASSIGN(ModelConfig c, Parse(Qwen2MoeJson()));
  EXPECT_EQ(c.architecture, Architecture::kQwen2Moe);
  EXPECT_EQ(c.router_kind(), RouterKind::kSoftmaxTopK);
  EXPECT_FALSE(c.qk_norm());
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.intermediate_size, 1408);  // the routed experts'
  EXPECT_TRUE(c.shared_expert());
  EXPECT_EQ(c.shared_expert_intermediate_size, 5632);
  EXPECT_TRUE(c.attention_bias);  // q, k and v
  EXPECT_FALSE(c.o_proj_bias());
  EXPECT_EQ(c.num_local_experts, 60);
  EXPECT_EQ(c.num_experts_per_tok, 4);
  EXPECT_FALSE(c.sliding_window.has_value());  // use_sliding_window false
  // The shared expert and its gate are tensors the model must have.
  int shared = 0;
  for (const WeightSpec& w : ExpectedWeights(c)) {
    if (w.role == WeightRole::kSharedExpertGate) {
      EXPECT_EQ(w.shape, (std::vector<int64_t>{1, 2048}));
    }
    if (w.role == WeightRole::kSharedW2) {
      EXPECT_EQ(w.shape, (std::vector<int64_t>{2048, 5632}));
    }
    shared += w.role == WeightRole::kSharedW1 || w.role == WeightRole::kSharedW2 || w.role == WeightRole::kSharedW3 ||
              w.role == WeightRole::kSharedExpertGate;
    EXPECT_NE(w.role, WeightRole::kOBias) << w.name;
  }
  EXPECT_EQ(shared, 4 * 24);
  EXPECT_EQ(WeightName(c, WeightRole::kSharedW1, 3), "model.layers.3.mlp.shared_expert.gate_proj.weight");
  EXPECT_EQ(WeightName(c, WeightRole::kSharedExpertGate, 3), "model.layers.3.mlp.shared_expert_gate.weight");
  EXPECT_EQ(WeightName(c, WeightRole::kExpertW2, 3, 59), "model.layers.3.mlp.experts.59.down_proj.weight");
}

TEST(ModelConfigTest, Qwen2MoeBadSharedExpertAndLayoutsAreRefusedByKey) {
  const struct {
    const char* key;
    json value;
    const char* says;
  } cases[] = {
      {"shared_expert_intermediate_size", 0, "shared_expert_intermediate_size"},
      {"shared_expert_intermediate_size", -5, "shared_expert_intermediate_size"},
      {"shared_expert_intermediate_size", int64_t{1} << 40, "shared_expert_intermediate_size"},
      {"shared_expert_intermediate_size", "big", "shared_expert_intermediate_size"},
      {"mlp_only_layers", json::array({24}), "mlp_only_layers"},
      {"decoder_sparse_step", -2, "decoder_sparse_step"},
      {"use_sliding_window", true, "use_sliding_window"},
      {"num_experts", 2000, "num_local_experts"},
      {"num_experts_per_tok", 61, "num_experts_per_tok"},
  };
  for (const auto& c : cases) {
    json j = Qwen2MoeJson();
    j[c.key] = c.value;
    auto parsed = Parse(j);
    ASSERT_FALSE(parsed.ok()) << c.key;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(c.says)) << parsed.status();
  }
}

TEST(ModelConfigTest, ReadsOlmoe) {
  ASSERT_OK_AND_ASSIGN(ModelConfig c, Parse(OlmoeJson()));
  EXPECT_EQ(c.architecture, Architecture::kOlmoe);
  EXPECT_TRUE(c.qk_norm());
  EXPECT_FALSE(c.qk_norm_per_head());
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_FALSE(c.shared_expert());
  EXPECT_EQ(c.intermediate_size, 1024);
  EXPECT_EQ(c.num_local_experts, 64);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.bos_token_id, 1);  // null: the default
  EXPECT_EQ(WeightShape(c, WeightRole::kQNorm), (std::vector<int64_t>{2048}));  // the whole projection
  EXPECT_EQ(WeightShape(c, WeightRole::kKNorm), (std::vector<int64_t>{2048}));
  EXPECT_EQ(WeightName(c, WeightRole::kRouter, 0), "model.layers.0.mlp.gate.weight");
  json j = OlmoeJson();
  j["clip_qkv"] = 8.0;
  auto clipped = Parse(j);
  ASSERT_FALSE(clipped.ok());
  EXPECT_THAT(std::string(clipped.status().message()), HasSubstr("clip_qkv"));
  j = OlmoeJson();
  j["lm_head_bias"] = true;
  EXPECT_FALSE(Parse(j).ok());
}

json Glm45Json() {  // zai-org/GLM-4.5's config.json
  return json::parse(R"({
    "architectures": ["Glm4MoeForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
    "pad_token_id": 151329, "eos_token_id": [151329, 151336, 151338], "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 5120, "partial_rotary_factor": 0.5, "initializer_range": 0.02, "intermediate_size": 12288,
    "max_position_embeddings": 131072, "model_type": "glm4_moe", "moe_intermediate_size": 1536,
    "norm_topk_prob": true, "num_attention_heads": 96, "n_group": 1, "topk_group": 1, "n_routed_experts": 160,
    "n_shared_experts": 1, "routed_scaling_factor": 2.5, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
    "num_hidden_layers": 92, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_scaling": null,
    "rope_theta": 1000000, "num_nextn_predict_layers": 1, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "use_cache": true, "use_qk_norm": true, "vocab_size": 151552})");
}

TEST(ModelConfigTest, ReadsGlm4Moe) {
  ASSERT_OK_AND_ASSIGN(ModelConfig c, Parse(Glm45Json()));
  EXPECT_EQ(c.architecture, Architecture::kGlm4Moe);
  EXPECT_EQ(c.router_kind(), RouterKind::kSigmoidGroupedTopK);
  EXPECT_TRUE(c.router_correction_bias());
  EXPECT_EQ(c.num_hidden_layers, 92);  // the MTP layer is not run
  EXPECT_EQ(c.num_local_experts, 160);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.shared_expert_intermediate_size, 1536);
  EXPECT_FALSE(c.shared_expert_gated());
  EXPECT_EQ(c.dense_layers, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(c.dense_intermediate_size, 12288);
  EXPECT_EQ(c.rope_dim(), 64);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_TRUE(c.qk_norm());
  EXPECT_TRUE(c.qk_norm_per_head());
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.o_proj_bias());
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{151329, 151336, 151338}));
  EXPECT_EQ(WeightName(c, WeightRole::kRouterCorrectionBias, 3), "model.layers.3.mlp.gate.e_score_correction_bias");
  EXPECT_EQ(WeightName(c, WeightRole::kSharedW2, 3), "model.layers.3.mlp.shared_experts.down_proj.weight");
  EXPECT_EQ(WeightShape(c, WeightRole::kRouterCorrectionBias), (std::vector<int64_t>{160}));
  EXPECT_EQ(WeightShape(c, WeightRole::kQNorm), (std::vector<int64_t>{128}));
  // No shared-expert gate, no o_proj bias among the expected tensors.
  for (const WeightSpec& w : ExpectedWeights(c)) {
    EXPECT_NE(w.role, WeightRole::kSharedExpertGate) << w.name;
    EXPECT_NE(w.role, WeightRole::kOBias) << w.name;
  }
  // GLM-4.5-Air: no QK norm.
  json j = Glm45Json();
  j["use_qk_norm"] = false;
  ASSERT_OK_AND_ASSIGN(ModelConfig air, Parse(j));
  EXPECT_FALSE(air.qk_norm());
}

TEST(ModelConfigTest, Glm4MoeBadGroupsAndLayoutsAreRefusedByKey) {
  const std::vector<std::pair<std::string, json>> cases = {
      {"n_group", 3},  // 160 experts do not split into 3 groups
      {"n_group", 0},
      {"topk_group", 2},  // more groups kept than n_group = 1
      {"routed_scaling_factor", -1.0},
      {"partial_rotary_factor", 0.0},
      {"partial_rotary_factor", 1.5},
      {"first_k_dense_replace", 92},  // no MoE layer left
      {"first_k_dense_replace", 93},
      {"n_shared_experts", -1},
      {"num_nextn_predict_layers", -1},
  };
  for (const auto& [key, value] : cases) {
    json j = Glm45Json();
    j[key] = value;
    auto c = Parse(j);
    ASSERT_FALSE(c.ok()) << key << " = " << value.dump();
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(key)) << value.dump();
  }
  json j = Glm45Json();
  j["n_group"] = 8, j["topk_group"] = 1, j["num_experts_per_tok"] = 24;  // 20 experts per group < 24
  auto c = Parse(j);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("num_experts_per_tok"));
}

json DeepseekV2LiteJson() {  // deepseek-ai/DeepSeek-V2-Lite's config.json
  return json::parse(R"({
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001, "bos_token_id": 100000, "eos_token_id": 100001, "first_k_dense_replace": 1,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 10944,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v2",
    "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
    "n_shared_experts": 2, "norm_topk_prob": false, "num_attention_heads": 16, "num_experts_per_tok": 6,
    "num_hidden_layers": 27, "num_key_value_heads": 16, "pretraining_tp": 1, "q_lora_rank": null,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": true,
    "tie_word_embeddings": false, "topk_group": 1, "topk_method": "greedy", "torch_dtype": "bfloat16",
    "use_cache": true, "v_head_dim": 128, "vocab_size": 102400})");
}

json DeepseekV3Json() {  // deepseek-ai/DeepSeek-V3's config.json (R1's is the same shape)
  return json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3, "hidden_act": "silu",
    "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
    "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": false,
    "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "use_cache": true,
    "v_head_dim": 128, "vocab_size": 129280})");
}

TEST(ModelConfigTest, ReadsDeepseekV2Lite) {
  ASSERT_OK_AND_ASSIGN(ModelConfig c, Parse(DeepseekV2LiteJson()));
  EXPECT_EQ(c.architecture, Architecture::kDeepseekV2);
  EXPECT_TRUE(c.mla());
  EXPECT_EQ(c.router_kind(), RouterKind::kSoftmaxGroupedTopK);
  EXPECT_FALSE(c.router_correction_bias());
  EXPECT_EQ(c.q_lora_rank, 0);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.head_dim, 192);
  EXPECT_EQ(c.rope_dim(), 64);
  EXPECT_EQ(c.attention_out_dim(), 16 * 128);
  EXPECT_EQ(c.cache_key_dim(), 576);  // the latent and the rope key, per position and layer
  EXPECT_EQ(c.cache_value_dim(), 0);
  EXPECT_EQ(c.n_group, 1);  // greedy
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.shared_expert_intermediate_size, 2 * 1408);
  EXPECT_EQ(c.dense_layers, (std::vector<int64_t>{0}));
  EXPECT_EQ(c.dense_intermediate_size, 10944);
  // softmax_scale = 192^-0.5 x (0.1 x 0.707 x ln 40 + 1)^2; cos/sin unscaled (mscale = mscale_all_dim).
  const double m = 0.1 * 0.707 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c.attention_scale(), m * m / std::sqrt(192.0), 1e-12);
  EXPECT_DOUBLE_EQ(c.rope_scaling.attention_factor, 1.0);
  EXPECT_EQ(WeightName(c, WeightRole::kKvAProj, 2), "model.layers.2.self_attn.kv_a_proj_with_mqa.weight");
  EXPECT_EQ(WeightShape(c, WeightRole::kKvBProj), (std::vector<int64_t>{16 * 256, 512}));
  EXPECT_EQ(WeightShape(c, WeightRole::kOProj), (std::vector<int64_t>{2048, 2048}));
  for (const WeightSpec& w : ExpectedWeights(c)) {
    EXPECT_NE(w.role, WeightRole::kKProj) << w.name;
    EXPECT_NE(w.role, WeightRole::kQAProj) << w.name;
  }
  // Written and read back, the same config.
  ASSERT_OK_AND_ASSIGN(ModelConfig again, ParseModelConfig(ModelConfigToJson(c), "round trip"));
  EXPECT_EQ(ModelConfigToJson(again), ModelConfigToJson(c));
  EXPECT_NEAR(again.attention_scale(), c.attention_scale(), 1e-15);
}

TEST(ModelConfigTest, ReadsDeepseekV3) {
  ASSERT_OK_AND_ASSIGN(ModelConfig c, Parse(DeepseekV3Json()));
  EXPECT_EQ(c.architecture, Architecture::kDeepseekV3);
  EXPECT_EQ(c.router_kind(), RouterKind::kSigmoidGroupedTopK);
  EXPECT_TRUE(c.router_correction_bias());
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  EXPECT_EQ(c.num_hidden_layers, 61);  // the MTP layer is not run
  EXPECT_EQ(c.dense_layers, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(c.shared_expert_intermediate_size, 2048);
  EXPECT_EQ(WeightShape(c, WeightRole::kQBProj), (std::vector<int64_t>{128 * 192, 1536}));
  // V2's group-limited softmax router.
  json j = DeepseekV2LiteJson();
  j["topk_method"] = "group_limited_greedy", j["n_group"] = 8, j["topk_group"] = 3;
  ASSERT_OK_AND_ASSIGN(ModelConfig v2, Parse(j));
  EXPECT_EQ(v2.n_group, 8);
  EXPECT_EQ(v2.topk_group, 3);
}

TEST(ModelConfigTest, DeepseekBadRanksRoutersAndLayoutsAreRefusedByKey) {
  const std::vector<std::pair<std::string, json>> cases = {
      {"kv_lora_rank", 0},   {"kv_lora_rank", nullptr},     {"qk_rope_head_dim", 63},    {"qk_nope_head_dim", 0},
      {"v_head_dim", -1},    {"q_lora_rank", -5},           {"scoring_func", "sigmoid"}, {"topk_method", "noaux_tc"},
      {"moe_layer_freq", 2}, {"first_k_dense_replace", 27}, {"n_shared_experts", -1},
  };
  for (const auto& [key, value] : cases) {
    json j = DeepseekV2LiteJson();
    j[key] = value;
    auto c = Parse(j);
    ASSERT_FALSE(c.ok()) << key << " = " << value.dump();
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(key)) << value.dump();
  }
  json j = DeepseekV2LiteJson();
  j["topk_method"] = "group_limited_greedy", j["n_group"] = 5;  // 64 experts in 5 groups
  auto c = Parse(j);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("n_group"));
  j = DeepseekV3Json();
  j["scoring_func"] = "softmax";
  c = Parse(j);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("scoring_func"));
}

TEST(ModelConfigTest, ReadsMixtral) {
  auto c = Parse(MixtralJson());
  ASSERT_OK(c);
  EXPECT_EQ(c->architecture, Architecture::kMixtral);
  EXPECT_EQ(c->norm_kind(), NormKind::kRmsNorm);
  EXPECT_EQ(c->router_kind(), RouterKind::kSoftmaxTopK);
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->kv_dim(), 1024);
  EXPECT_EQ(c->num_local_experts, 8);
  EXPECT_EQ(c->num_experts_per_tok, 2);
  EXPECT_EQ(c->rope_theta, 1e6);
  EXPECT_FALSE(c->sliding_window.has_value());
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>{2});
  EXPECT_FALSE(c->attention_bias);
}

TEST(ModelConfigTest, ReadsPhiMoE) {
  auto c = Parse(PhiMoEJson());
  ASSERT_OK(c);
  EXPECT_EQ(c->architecture, Architecture::kPhiMoE);
  EXPECT_EQ(c->norm_kind(), NormKind::kLayerNorm);
  EXPECT_EQ(c->router_kind(), RouterKind::kSparseMixer);
  EXPECT_TRUE(c->attention_bias);
  EXPECT_TRUE(c->lm_head_bias);
  EXPECT_DOUBLE_EQ(c->router_jitter_noise, 0.01);
  EXPECT_EQ(c->sliding_window, 131072);
  EXPECT_EQ(c->rope_scaling.type, "longrope");
  EXPECT_EQ(c->rope_scaling.short_factor.size(), 64u);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>{32000});
}

TEST(ModelConfigTest, AcceptsRopeTypeSpellingAndEosList) {
  json j = PhiMoEJson();
  j["rope_scaling"].erase("type");
  j["rope_scaling"]["rope_type"] = "longrope";
  j["eos_token_id"] = {32000, 32007};
  auto c = Parse(j);
  ASSERT_OK(c);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{32000, 32007}));
}

TEST(ModelConfigTest, HeadDimDefaultsToHiddenOverHeads) {
  json j = MixtralJson();
  j["head_dim"] = 64;  // explicit head_dim wins (as in newer Mistral configs)
  auto c = Parse(j);
  ASSERT_OK(c);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->q_dim(), 2048);
}

struct BadCase {
  std::string name;
  std::function<void(json&)> edit;
  std::string field;  // the message must name it
};

class BadConfigTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadConfigTest, NamesTheFieldAndFile) {
  json j = GetParam().name.rfind("phi", 0) == 0 ? PhiMoEJson() : MixtralJson();
  GetParam().edit(j);
  auto c = Parse(j);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr(GetParam().field));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("/models/x/config.json"));
}

INSTANTIATE_TEST_SUITE_P(
    Fields, BadConfigTest,
    ::testing::Values(
        BadCase{"unknown_architecture", [](json& j) { j["architectures"] = {"LlamaForCausalLM"}; }, "LlamaForCausalLM"},
        BadCase{"no_architectures", [](json& j) { j.erase("architectures"); }, "architectures"},
        BadCase{"model_type_mismatch", [](json& j) { j["model_type"] = "phimoe"; }, "model_type"},
        BadCase{"missing_hidden_size", [](json& j) { j.erase("hidden_size"); }, "hidden_size"},
        BadCase{"missing_vocab", [](json& j) { j.erase("vocab_size"); }, "vocab_size"},
        BadCase{"missing_layers", [](json& j) { j.erase("num_hidden_layers"); }, "num_hidden_layers"},
        BadCase{"missing_experts", [](json& j) { j.erase("num_local_experts"); }, "num_local_experts"},
        BadCase{"missing_topk", [](json& j) { j.erase("num_experts_per_tok"); }, "num_experts_per_tok"},
        BadCase{"missing_intermediate", [](json& j) { j.erase("intermediate_size"); }, "intermediate_size"},
        BadCase{"missing_max_positions", [](json& j) { j.erase("max_position_embeddings"); }, "max_position_embeddings"},
        BadCase{"string_hidden", [](json& j) { j["hidden_size"] = "4096"; }, "hidden_size"},
        BadCase{"negative_layers", [](json& j) { j["num_hidden_layers"] = -1; }, "num_hidden_layers"},
        BadCase{"kv_heads_not_dividing", [](json& j) { j["num_key_value_heads"] = 7; }, "num_key_value_heads"},
        BadCase{"hidden_not_divisible", [](json& j) { j["hidden_size"] = 4095; }, "hidden_size"},
        BadCase{"topk_above_experts", [](json& j) { j["num_experts_per_tok"] = 9; }, "num_experts_per_tok"},
        BadCase{"zero_eps", [](json& j) { j["rms_norm_eps"] = 0; }, "rms_norm_eps"},
        BadCase{"negative_theta", [](json& j) { j["rope_theta"] = -1.0; }, "rope_theta"},
        BadCase{"zero_window", [](json& j) { j["sliding_window"] = 0; }, "sliding_window"},
        BadCase{"eos_outside_vocab", [](json& j) { j["eos_token_id"] = 32000; }, "eos_token_id"},
        BadCase{"mixtral_with_bias", [](json& j) { j["attention_bias"] = true; }, "attention_bias"},
        BadCase{"mixtral_with_rope_scaling", [](json& j) { j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}}; },
                "rope_scaling"},
        BadCase{"phi_topk_3", [](json& j) { j["num_experts_per_tok"] = 3; }, "num_experts_per_tok"},
        BadCase{"phi_short_factor_length", [](json& j) { j["rope_scaling"]["short_factor"] = {1.0, 1.0}; },
                "short_factor"},
        BadCase{"phi_missing_mscale", [](json& j) { j["rope_scaling"].erase("long_mscale"); }, "mscale"},
        BadCase{"phi_missing_original_max",
                [](json& j) { j["rope_scaling"].erase("original_max_position_embeddings"); },
                "original_max_position_embeddings"},
        BadCase{"phi_unknown_rope_type", [](json& j) { j["rope_scaling"]["type"] = "yarn"; }, "yarn"},
        // Sizes nothing could hold are refused before anything is allocated
        // (2^31 - 1 layers once aborted every process with std::bad_alloc).
        BadCase{"layers_2_31", [](json& j) { j["num_hidden_layers"] = 2147483647; },
                "\"num_hidden_layers\" is 2147483647, more than tandem accepts (1024)"},
        BadCase{"huge_hidden", [](json& j) { j["hidden_size"] = int64_t{1} << 40; j["head_dim"] = 128; }, "hidden_size"},
        BadCase{"huge_intermediate", [](json& j) { j["intermediate_size"] = int64_t{1} << 40; }, "intermediate_size"},
        BadCase{"huge_vocab", [](json& j) { j["vocab_size"] = int64_t{1} << 40; }, "vocab_size"},
        BadCase{"huge_experts", [](json& j) { j["num_local_experts"] = 100000; }, "num_local_experts"},
        BadCase{"experts_times_layers",
                [](json& j) { j["num_local_experts"] = 1024; j["num_hidden_layers"] = 1024; }, "num_local_experts"},
        BadCase{"huge_heads", [](json& j) { j["num_attention_heads"] = 1 << 20; j["head_dim"] = 128; },
                "num_attention_heads"},
        BadCase{"huge_positions", [](json& j) { j["max_position_embeddings"] = int64_t{1} << 40; },
                "max_position_embeddings"},
        BadCase{"eos_wrapping_into_vocab", [](json& j) { j["eos_token_id"] = (int64_t{1} << 32) + 2; },
                "eos_token_id"},
        BadCase{"bos_wrapping_into_vocab", [](json& j) { j["bos_token_id"] = (int64_t{1} << 32) + 1; },
                "bos_token_id"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

TEST(ModelConfigTest, NotJsonNamesTheFile) {
  auto c = ParseModelConfig("{ not json", "/models/x/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("/models/x/config.json"));
}

TEST(ModelConfigTest, MissingFileIsNotFound) {
  auto c = LoadModelConfig("/nonexistent/dir/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("/nonexistent/dir/config.json"));
}

TEST(ModelConfigTest, AConfigThatIsNotASmallRegularFileIsRefused) {
  ScopedTempDir dir;
  const std::filesystem::path fifo = dir.path() / "config.json";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);  // reading it would block for ever
  auto c = LoadModelConfig(fifo);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("not a regular file"));
  std::filesystem::remove(fifo);
  {
    std::ofstream big(fifo);
    big << std::string(static_cast<size_t>(kMaxConfigFileBytes) + 1, ' ');
  }
  c = LoadModelConfig(fifo);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("more than a config.json"));
}

TEST(ModelConfigTest, WrittenConfigReadsBackIdentically) {
  for (const std::string& preset : SyntheticPresets()) {
    auto c = SyntheticConfig({.preset = preset});
    ASSERT_OK(c);
    auto back = ParseModelConfig(ModelConfigToJson(*c), preset);
    ASSERT_OK(back);
    EXPECT_EQ(ModelConfigToJson(*back), ModelConfigToJson(*c)) << preset;
  }
}

}  // namespace
}  // namespace tandem
