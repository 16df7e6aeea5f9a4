#include "common/model/synthetic_model.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/log.h"
#include "common/base/progress.h"
#include "common/base/status_macros.h"
#include "common/base/thread_pool.h"
#include "common/model/sentencepiece_tokenizer.h"

namespace tandem {
namespace {

// Counter-based generator: element i of a tensor is SplitMix64(key + i), so
// any slice can be generated independently and in parallel.
inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1): std 1/sqrt(3).
inline float Uniform(uint64_t key, uint64_t i) {
  return static_cast<float>(static_cast<double>(SplitMix64(key + i) >> 11) * 0x1.0p-52 - 1.0);
}

uint64_t NameKey(uint64_t seed, std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull ^ SplitMix64(seed);  // FNV-1a over the name
  for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return SplitMix64(h);
}

constexpr float kSqrt3 = 1.7320508f;

struct Preset {
  ModelConfig config;
  int64_t tokenizer_vocab;
};

// What every preset shares; the Hugging Face names follow the architecture.
ModelConfig BaseConfig(Architecture architecture) {
  ModelConfig c;
  c.architecture = architecture;
  c.architecture_name = std::string(ArchitectureClassName(architecture));
  c.model_type = std::string(ArchitectureModelType(architecture));
  c.rope_theta = 1e6;
  c.rms_norm_eps = 1e-5;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  c.torch_dtype = "bfloat16";
  c.num_experts_per_tok = 2;
  return c;
}

ModelConfig MixtralBase() { return BaseConfig(Architecture::kMixtral); }

// Phi-3.5-MoE's longrope factors have this shape: short ≈ 1, long growing
// with the frequency index. These are made-up values of that shape.
void SetLongRope(ModelConfig& c, int64_t original_max) {
  c.rope_scaling.type = "longrope";
  const int64_t half = c.head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double t = static_cast<double>(i) / static_cast<double>(half);
    c.rope_scaling.short_factor.push_back(1.0 + 0.1 * t * t);
    c.rope_scaling.long_factor.push_back(1.0 + 30.0 * t * t);
  }
  c.rope_scaling.short_mscale = 1.243163121016122;
  c.rope_scaling.long_mscale = 1.243163121016122;
  c.rope_scaling.original_max_position_embeddings = original_max;
}

// Qwen3-MoE: QK norm, head_dim apart from hidden / heads, top-8 of 128
// small experts renormalised (norm_topk_prob), Qwen's ids.
ModelConfig Qwen3MoeBase() {
  ModelConfig c = BaseConfig(Architecture::kQwen3Moe);
  c.rms_norm_eps = 1e-6;
  c.norm_topk_prob = true;
  c.num_experts_per_tok = 8;
  return c;
}

// Qwen2-MoE (Qwen1.5-MoE): Qwen's router unnormalised, q/k/v biases, a
// gated shared expert; no QK norm.
ModelConfig Qwen2MoeBase() {
  ModelConfig c = BaseConfig(Architecture::kQwen2Moe);
  c.rms_norm_eps = 1e-6;
  c.norm_topk_prob = false;
  c.attention_bias = true;
  c.num_experts_per_tok = 4;
  return c;
}

// OLMoE: QK norm over the whole projections, top-8 of 64 unnormalised.
ModelConfig OlmoeBase() {
  ModelConfig c = BaseConfig(Architecture::kOlmoe);
  c.rope_theta = 10000.0;
  c.norm_topk_prob = false;
  c.num_experts_per_tok = 8;
  return c;
}

// GLM-4.5: q/k/v biases, top-8 of the sigmoid router renormalised (the
// presets add its partial RoPE, shared expert and leading dense layers).
ModelConfig Glm4MoeBase() {
  ModelConfig c = BaseConfig(Architecture::kGlm4Moe);
  c.attention_bias = true;
  c.norm_topk_prob = true;
  c.num_experts_per_tok = 8;
  return c;
}

// DeepSeek-V2/V3: latent attention (the presets set its ranks and head
// split), shared experts, leading dense layers, DeepSeek's YaRN (mscale and
// mscale_all_dim 0.707 as V2's config: a softmax scale off 1/sqrt(head)).
ModelConfig DeepseekBase(Architecture architecture, int64_t heads, int64_t nope, int64_t rope, int64_t v,
                         int64_t kv_lora_rank, int64_t q_lora_rank) {
  ModelConfig c = BaseConfig(architecture);
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-6;
  c.num_attention_heads = c.num_key_value_heads = heads;
  c.qk_nope_head_dim = nope, c.qk_rope_head_dim = rope, c.v_head_dim = v, c.head_dim = nope + rope;
  c.kv_lora_rank = kv_lora_rank, c.q_lora_rank = q_lora_rank;
  const bool v3 = architecture == Architecture::kDeepseekV3;
  c.norm_topk_prob = v3;
  c.rope_scaling.type = "yarn";
  c.rope_scaling.factor = 40.0;
  c.rope_scaling.original_max_position_embeddings = 4096;
  c.rope_scaling.mscale_all_dim = v3 ? 1.0 : 0.707;
  c.rope_scaling.attention_factor = 1.0;  // YarnMscale(factor, mscale) / YarnMscale(factor, mscale_all_dim)
  return c;
}

ModelConfig PhiMoEBase() {
  ModelConfig c = BaseConfig(Architecture::kPhiMoE);
  c.attention_bias = true;
  c.lm_head_bias = true;
  c.router_jitter_noise = 0.01;
  return c;
}

absl::StatusOr<Preset> FindPreset(const std::string& name) {
  if (name == "tiny") {
    ModelConfig c = MixtralBase();
    c.vocab_size = 512, c.hidden_size = 64, c.intermediate_size = 96, c.num_hidden_layers = 2;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 16;
    c.num_local_experts = 4, c.max_position_embeddings = 256;
    return Preset{c, 512};
  }
  if (name == "tiny-phimoe") {
    ModelConfig c = PhiMoEBase();
    c.vocab_size = 520, c.hidden_size = 64, c.intermediate_size = 80, c.num_hidden_layers = 2;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 16;
    c.num_local_experts = 6, c.max_position_embeddings = 256, c.rope_theta = 10000.0;
    c.sliding_window = 48;  // exercised by tests: shorter than the prompts they use
    SetLongRope(c, 64);     // and the long factors kick in past 64 positions
    return Preset{c, 512};
  }
  if (name == "tiny-qwen3moe") {
    ModelConfig c = Qwen3MoeBase();
    c.vocab_size = 512, c.hidden_size = 64, c.intermediate_size = 32, c.num_hidden_layers = 2;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 32;  // q: 128 wide, not hidden's 64
    c.num_local_experts = 16, c.num_experts_per_tok = 4, c.max_position_embeddings = 256;
    return Preset{c, 512};
  }
  if (name == "tiny-qwen3moe-128") {  // Qwen3-235B's 128 experts top-8, tiny: workers' per-expert costs
    ModelConfig c = Qwen3MoeBase();
    c.vocab_size = 512, c.hidden_size = 64, c.intermediate_size = 32, c.num_hidden_layers = 2;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 16;
    c.num_local_experts = 128, c.num_experts_per_tok = 8, c.max_position_embeddings = 256;
    return Preset{c, 512};
  }
  if (name == "tiny-qwen2moe") {
    ModelConfig c = Qwen2MoeBase();
    c.vocab_size = 512, c.hidden_size = 64, c.intermediate_size = 24, c.num_hidden_layers = 2;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 16;
    c.num_local_experts = 12, c.num_experts_per_tok = 4, c.max_position_embeddings = 256;
    c.shared_expert_intermediate_size = 96;
    // YaRN as Qwen's docs set it for long prompts (factor 4), over a short
    // original context so tests' prompts span the ramp.
    c.rope_scaling.type = "yarn";
    c.rope_scaling.factor = 4.0;
    c.rope_scaling.original_max_position_embeddings = 64;
    c.rope_scaling.attention_factor = 0.1 * std::log(4.0) + 1.0;
    return Preset{c, 512};
  }
  if (name == "tiny-qwen3moe-dense") {  // decoder_sparse_step 2: layers 0 and 2 dense MLPs, 1 and 3 MoE
    ModelConfig c = Qwen3MoeBase();
    c.vocab_size = 512, c.hidden_size = 64, c.intermediate_size = 32, c.num_hidden_layers = 4;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 16;
    c.num_local_experts = 16, c.num_experts_per_tok = 4, c.max_position_embeddings = 256;
    c.dense_layers = {0, 2};
    c.dense_intermediate_size = 112;
    return Preset{c, 512};
  }
  if (name == "tiny-qwen2moe-dense") {  // mlp_only_layers [1]: a dense MLP between MoE layers with a shared expert
    ModelConfig c = Qwen2MoeBase();
    c.vocab_size = 512, c.hidden_size = 64, c.intermediate_size = 24, c.num_hidden_layers = 3;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 16;
    c.num_local_experts = 12, c.num_experts_per_tok = 4, c.max_position_embeddings = 256;
    c.shared_expert_intermediate_size = 96;
    c.dense_layers = {1};
    c.dense_intermediate_size = 128;
    return Preset{c, 512};
  }
  if (name == "tiny-olmoe") {
    ModelConfig c = OlmoeBase();
    c.vocab_size = 512, c.hidden_size = 64, c.intermediate_size = 32, c.num_hidden_layers = 2;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 16;
    c.num_local_experts = 16, c.num_experts_per_tok = 4, c.max_position_embeddings = 256;
    return Preset{c, 512};
  }
  if (name == "tiny-glm4moe") {  // layer 0 dense; groups (4, best 2) as DeepSeek-V3 routes, QK norm, partial RoPE
    ModelConfig c = Glm4MoeBase();
    c.vocab_size = 512, c.hidden_size = 64, c.intermediate_size = 32, c.num_hidden_layers = 3;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 32, c.rotary_dim = 16;
    c.num_local_experts = 16, c.num_experts_per_tok = 4, c.max_position_embeddings = 256;
    c.n_group = 4, c.topk_group = 2, c.routed_scaling_factor = 2.5, c.use_qk_norm = true;
    c.shared_expert_intermediate_size = 64;  // two shared experts' width
    c.dense_layers = {0};
    c.dense_intermediate_size = 96;
    return Preset{c, 512};
  }
  if (name ==
      "tiny-deepseek-v2") {  // V2's group-limited softmax router (4 groups, best 2, x 2), no q_lora, layer 0 dense
    ModelConfig c = DeepseekBase(Architecture::kDeepseekV2, 4, 16, 8, 12, 32, 0);
    c.vocab_size = 512, c.hidden_size = 64, c.intermediate_size = 32, c.num_hidden_layers = 3;
    c.num_local_experts = 16, c.num_experts_per_tok = 4, c.max_position_embeddings = 256;
    c.n_group = 4, c.topk_group = 2, c.routed_scaling_factor = 2.0;
    c.rope_scaling.original_max_position_embeddings = 64;  // tests' prompts span YaRN's ramp
    c.rope_scaling.factor = 4.0;
    c.shared_expert_intermediate_size = 64;  // two shared experts
    c.dense_layers = {0};
    c.dense_intermediate_size = 96;
    return Preset{c, 512};
  }
  if (name == "tiny-deepseek-v3") {  // V3's sigmoid noaux_tc router (4 groups, best 2, x 2.5), q through q_lora
    ModelConfig c = DeepseekBase(Architecture::kDeepseekV3, 4, 16, 8, 16, 32, 24);
    c.vocab_size = 512, c.hidden_size = 64, c.intermediate_size = 32, c.num_hidden_layers = 3;
    c.num_local_experts = 16, c.num_experts_per_tok = 4, c.max_position_embeddings = 256;
    c.n_group = 4, c.topk_group = 2, c.routed_scaling_factor = 2.5;
    c.rope_scaling.original_max_position_embeddings = 64;
    c.rope_scaling.factor = 4.0;
    c.shared_expert_intermediate_size = 32;
    c.dense_layers = {0};
    c.dense_intermediate_size = 96;
    return Preset{c, 512};
  }
  if (name == "tiny-deepseek-v3-256") {  // V3's 256 routed experts top-8 in 8 groups (best 4), tiny: workers
    ModelConfig c = DeepseekBase(Architecture::kDeepseekV3, 4, 16, 8, 16, 32, 24);
    c.vocab_size = 512, c.hidden_size = 64, c.intermediate_size = 16, c.num_hidden_layers = 3;
    c.num_local_experts = 256, c.num_experts_per_tok = 8, c.max_position_embeddings = 256;
    c.n_group = 8, c.topk_group = 4, c.routed_scaling_factor = 2.5;
    c.rope_scaling.original_max_position_embeddings = 64;
    c.rope_scaling.factor = 4.0;
    c.shared_expert_intermediate_size = 16;
    c.dense_layers = {0};
    c.dense_intermediate_size = 96;
    return Preset{c, 512};
  }
  if (name == "demo") {
    ModelConfig c = MixtralBase();
    c.vocab_size = 2000, c.hidden_size = 512, c.intermediate_size = 1024, c.num_hidden_layers = 4;
    c.num_attention_heads = 8, c.num_key_value_heads = 4, c.head_dim = 64;
    c.num_local_experts = 8, c.max_position_embeddings = 4096;
    return Preset{c, 2000};
  }
  if (name == "small-mixtral") {  // issue 13's "small model": per-layer overheads, not bytes, bound its decode
    ModelConfig c = MixtralBase();
    c.vocab_size = 32000, c.hidden_size = 1024, c.intermediate_size = 3584, c.num_hidden_layers = 8;
    c.num_attention_heads = 16, c.num_key_value_heads = 4, c.head_dim = 64;
    c.num_local_experts = 8, c.max_position_embeddings = 32768;
    return Preset{c, 32000};
  }
  if (name == "mixtral-8x7b") {  // mistralai/Mixtral-8x7B-v0.1 config.json
    ModelConfig c = MixtralBase();
    c.vocab_size = 32000, c.hidden_size = 4096, c.intermediate_size = 14336, c.num_hidden_layers = 32;
    c.num_attention_heads = 32, c.num_key_value_heads = 8, c.head_dim = 128;
    c.num_local_experts = 8, c.max_position_embeddings = 32768;
    return Preset{c, 32000};
  }
  if (name == "qwen3-30b-a3b") {  // Qwen/Qwen3-30B-A3B config.json
    ModelConfig c = Qwen3MoeBase();
    c.vocab_size = 151936, c.hidden_size = 2048, c.intermediate_size = 768, c.num_hidden_layers = 48;
    c.num_attention_heads = 32, c.num_key_value_heads = 4, c.head_dim = 128;
    c.num_local_experts = 128, c.max_position_embeddings = 40960;
    return Preset{c, 32000};  // bos/eos: the synthetic tokenizer's (Qwen's 151643/151645 are past it)
  }
  if (name == "qwen1.5-moe-a2.7b") {  // Qwen/Qwen1.5-MoE-A2.7B config.json
    ModelConfig c = Qwen2MoeBase();
    c.vocab_size = 151936, c.hidden_size = 2048, c.intermediate_size = 1408, c.num_hidden_layers = 24;
    c.num_attention_heads = 16, c.num_key_value_heads = 16, c.head_dim = 128;
    c.num_local_experts = 60, c.num_experts_per_tok = 4, c.max_position_embeddings = 8192;
    c.shared_expert_intermediate_size = 5632;
    return Preset{c, 32000};  // bos/eos: the synthetic tokenizer's
  }
  if (name == "qwen2-57b-a14b") {  // Qwen/Qwen2-57B-A14B config.json
    ModelConfig c = Qwen2MoeBase();
    c.vocab_size = 151936, c.hidden_size = 3584, c.intermediate_size = 2560, c.num_hidden_layers = 28;
    c.num_attention_heads = 28, c.num_key_value_heads = 4, c.head_dim = 128;
    c.num_local_experts = 64, c.num_experts_per_tok = 8, c.max_position_embeddings = 32768;
    c.shared_expert_intermediate_size = 20480;
    return Preset{c, 32000};
  }
  if (name == "olmoe-1b-7b") {  // allenai/OLMoE-1B-7B-0924 config.json
    ModelConfig c = OlmoeBase();
    c.vocab_size = 50304, c.hidden_size = 2048, c.intermediate_size = 1024, c.num_hidden_layers = 16;
    c.num_attention_heads = 16, c.num_key_value_heads = 16, c.head_dim = 128;
    c.num_local_experts = 64, c.num_experts_per_tok = 8, c.max_position_embeddings = 4096;
    return Preset{c, 32000};
  }
  if (name == "glm-4.5-air") {  // zai-org/GLM-4.5-Air config.json
    ModelConfig c = Glm4MoeBase();
    c.vocab_size = 151552, c.hidden_size = 4096, c.intermediate_size = 1408, c.num_hidden_layers = 46;
    c.num_attention_heads = 96, c.num_key_value_heads = 8, c.head_dim = 128, c.rotary_dim = 64;
    c.num_local_experts = 128, c.max_position_embeddings = 131072;
    c.shared_expert_intermediate_size = 1408;
    c.dense_layers = {0};
    c.dense_intermediate_size = 10944;
    return Preset{c, 32000};
  }
  if (name == "glm-4.5") {  // zai-org/GLM-4.5 config.json
    ModelConfig c = Glm4MoeBase();
    c.vocab_size = 151552, c.hidden_size = 5120, c.intermediate_size = 1536, c.num_hidden_layers = 92;
    c.num_attention_heads = 96, c.num_key_value_heads = 8, c.head_dim = 128, c.rotary_dim = 64;
    c.num_local_experts = 160, c.max_position_embeddings = 131072;
    c.routed_scaling_factor = 2.5, c.use_qk_norm = true;
    c.shared_expert_intermediate_size = 1536;
    c.dense_layers = {0, 1, 2};
    c.dense_intermediate_size = 12288;
    return Preset{c, 32000};
  }
  if (name == "deepseek-v2-lite") {  // deepseek-ai/DeepSeek-V2-Lite config.json
    ModelConfig c = DeepseekBase(Architecture::kDeepseekV2, 16, 128, 64, 128, 512, 0);
    c.vocab_size = 102400, c.hidden_size = 2048, c.intermediate_size = 1408, c.num_hidden_layers = 27;
    c.num_local_experts = 64, c.num_experts_per_tok = 6, c.max_position_embeddings = 163840;
    c.shared_expert_intermediate_size = 2 * 1408;
    c.dense_layers = {0};
    c.dense_intermediate_size = 10944;
    return Preset{c, 32000};
  }
  if (name == "deepseek-v3") {  // deepseek-ai/DeepSeek-V3 config.json (R1's too)
    ModelConfig c = DeepseekBase(Architecture::kDeepseekV3, 128, 128, 64, 128, 512, 1536);
    c.vocab_size = 129280, c.hidden_size = 7168, c.intermediate_size = 2048, c.num_hidden_layers = 61;
    c.num_local_experts = 256, c.num_experts_per_tok = 8, c.max_position_embeddings = 163840;
    c.n_group = 8, c.topk_group = 4, c.routed_scaling_factor = 2.5;
    c.shared_expert_intermediate_size = 2048;
    c.dense_layers = {0, 1, 2};
    c.dense_intermediate_size = 18432;
    return Preset{c, 32000};
  }
  if (name == "phi-3.5-moe") {  // microsoft/Phi-3.5-MoE-instruct config.json
    ModelConfig c = PhiMoEBase();
    c.vocab_size = 32064, c.hidden_size = 4096, c.intermediate_size = 6400, c.num_hidden_layers = 32;
    c.num_attention_heads = 32, c.num_key_value_heads = 8, c.head_dim = 128;
    c.num_local_experts = 16, c.max_position_embeddings = 131072, c.rope_theta = 10000.0;
    c.sliding_window = 131072;
    c.eos_token_ids = {32000};
    SetLongRope(c, 4096);
    return Preset{c, 32000};
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown synthetic model preset \"", name,
                                                 "\" (known: ", absl::StrJoin(SyntheticPresets(), ", "), ")"));
}

// Standard deviation of each weight role's uniform distribution.
struct Scales {
  float embed, linear_in_d, linear_in_q, w2, router, lm_head;
};

Scales ScalesFor(const ModelConfig& c) {
  const float d = static_cast<float>(c.hidden_size);
  return Scales{
      .embed = 1.0f / std::sqrt(d),
      .linear_in_d = 1.0f / std::sqrt(d),
      .linear_in_q = 1.0f / std::sqrt(static_cast<float>(c.attention_out_dim())),
      .w2 = 1.0f / std::sqrt(static_cast<float>(c.intermediate_size)),
      .router = 2.0f / std::sqrt(d),   // logits with std ≈ 2: clear but not one-hot routing
      .lm_head = 3.0f / std::sqrt(d),  // peaked enough that greedy text is not noise
  };
}

void Store(void* out, DType dtype, size_t i, float v) {
  switch (dtype) {
    case DType::kF32: static_cast<float*>(out)[i] = v; break;
    case DType::kF16: static_cast<uint16_t*>(out)[i] = F32ToF16(v); break;
    case DType::kBF16: static_cast<uint16_t*>(out)[i] = F32ToBf16(v); break;
    default: break;  // quantized: refused by SyntheticConfig before any fill
  }
}

}  // namespace

std::vector<std::string> SyntheticPresets() {
  return {
      "tiny",
      "tiny-phimoe",
      "tiny-qwen3moe",
      "tiny-qwen3moe-128",
      "tiny-qwen2moe",
      "tiny-olmoe",
      "tiny-qwen3moe-dense",
      "tiny-qwen2moe-dense",
      "tiny-glm4moe",
      "tiny-deepseek-v2",
      "tiny-deepseek-v3",
      "tiny-deepseek-v3-256",
      "demo",
      "small-mixtral",
      "mixtral-8x7b",
      "phi-3.5-moe",
      "qwen3-30b-a3b",
      "qwen1.5-moe-a2.7b",
      "qwen2-57b-a14b",
      "olmoe-1b-7b",
      "glm-4.5-air",
      "glm-4.5",
      "deepseek-v2-lite",
      "deepseek-v3",
  };
}

absl::StatusOr<ModelConfig> SyntheticConfig(const SyntheticModelSpec& spec) {
  TANDEM_ASSIGN_OR_RETURN(Preset preset, FindPreset(spec.preset));
  if (spec.num_layers < 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_layers must be >= 0, got ", spec.num_layers));
  }
  if (spec.num_layers > 0) {
    ModelConfig& c = preset.config;
    c.num_hidden_layers = spec.num_layers;
    // Fewer layers keep the dense ones among them.
    std::erase_if(c.dense_layers, [&](int64_t l) { return l >= c.num_hidden_layers; });
  }
  if (spec.vocab_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat("vocab_size must be >= 0, got ", spec.vocab_size));
  }
  if (spec.vocab_size > 0) preset.config.vocab_size = spec.vocab_size;
  TANDEM_RETURN_IF_ERROR(RequireFloatDType(spec.dtype, "the synthetic model's dtype",
                                           "the synthetic generator (quantize its output with tandem-quantize)"));
  preset.config.torch_dtype = spec.dtype == DType::kF32   ? "float32"
                              : spec.dtype == DType::kF16 ? "float16"
                                                          : "bfloat16";
  TANDEM_RETURN_IF_ERROR(preset.config.Validate(absl::StrCat("preset ", spec.preset)));
  return preset.config;
}

int64_t SyntheticTokenizerVocab(const SyntheticModelSpec& spec) {
  auto preset = FindPreset(spec.preset);
  if (!preset.ok()) return 0;
  return spec.vocab_size > 0 ? std::min(preset->tokenizer_vocab, spec.vocab_size) : preset->tokenizer_vocab;
}

void FillSyntheticRange(const ModelConfig& c, const WeightSpec& w, uint64_t seed, DType dtype, void* out, int64_t begin,
                        int64_t end, int64_t out_first) {
  const Scales s = ScalesFor(c);
  const uint64_t key = NameKey(seed, w.name);
  auto fill = [&](float std_dev) {
    const float a = std_dev * kSqrt3;
    for (int64_t i = begin; i < end; ++i)
      Store(out, dtype, static_cast<size_t>(i - out_first), a * Uniform(key, static_cast<uint64_t>(i)));
  };
  // The shared direction u (entries ±1) that embeddings carry and routers lean on.
  const uint64_t u_key = NameKey(seed, "shared-direction");
  auto u = [&](int64_t j) { return (SplitMix64(u_key + static_cast<uint64_t>(j)) & 1) ? 1.0f : -1.0f; };
  const int64_t d = c.hidden_size;
  switch (w.role) {
    case WeightRole::kEmbedTokens:
      for (int64_t i = begin; i < end; ++i) {
        const float g = kSqrt3 * Uniform(key, static_cast<uint64_t>(i));
        Store(out, dtype, static_cast<size_t>(i - out_first), s.embed * (g + 0.5f * u(i % d)));
      }
      return;
    case WeightRole::kRouter: {
      // Per-expert lean on u in [-1.5, 1.5]: a popularity spread.
      const uint64_t lean_key = NameKey(seed, absl::StrCat(w.name, "#lean"));
      int64_t row = -1;
      float lean = 0;
      for (int64_t i = begin; i < end; ++i) {
        const int64_t e = i / d, j = i % d;
        if (e != row) row = e, lean = 1.5f * Uniform(lean_key, static_cast<uint64_t>(e));
        const float g = kSqrt3 * Uniform(key, static_cast<uint64_t>(i));
        Store(out, dtype, static_cast<size_t>(i - out_first), s.router * g + lean * u(j) / static_cast<float>(d));
      }
      return;
    }
    case WeightRole::kInputNorm:
    case WeightRole::kPostAttentionNorm:
    case WeightRole::kFinalNorm:
    case WeightRole::kQNorm:
    case WeightRole::kKNorm:
    case WeightRole::kQANorm:
    case WeightRole::kKvANorm:
      for (int64_t i = begin; i < end; ++i)
        Store(out, dtype, static_cast<size_t>(i - out_first), 1.0f + 0.1f * Uniform(key, static_cast<uint64_t>(i)));
      return;
    case WeightRole::kInputNormBias:
    case WeightRole::kPostAttentionNormBias:
    case WeightRole::kFinalNormBias:
    case WeightRole::kQBias:
    case WeightRole::kKBias:
    case WeightRole::kVBias:
    case WeightRole::kOBias:
    case WeightRole::kLmHeadBias: fill(0.02f); return;
    case WeightRole::kRouterCorrectionBias: fill(0.1f); return;  // sigmoid scores are in (0, 1)
    case WeightRole::kQProj:
    case WeightRole::kKProj:
    case WeightRole::kVProj:
    case WeightRole::kExpertW1:
    case WeightRole::kExpertW3:
    case WeightRole::kSharedW1:
    case WeightRole::kSharedW3:
    case WeightRole::kDenseW1:
    case WeightRole::kDenseW3:
    case WeightRole::kSharedExpertGate:
    case WeightRole::kQAProj:
    case WeightRole::kKvAProj: fill(s.linear_in_d); return;
    case WeightRole::kQBProj: fill(1.0f / std::sqrt(static_cast<float>(c.q_lora_rank))); return;
    case WeightRole::kKvBProj:
    case WeightRole::kVBProj: fill(1.0f / std::sqrt(static_cast<float>(c.kv_lora_rank))); return;
    case WeightRole::kKBProj: fill(1.0f / std::sqrt(static_cast<float>(c.qk_nope_head_dim))); return;
    case WeightRole::kOProj: fill(s.linear_in_q); return;
    case WeightRole::kExpertW2: fill(s.w2); return;
    case WeightRole::kSharedW2: fill(1.0f / std::sqrt(static_cast<float>(c.shared_expert_intermediate_size))); return;
    case WeightRole::kDenseW2: fill(1.0f / std::sqrt(static_cast<float>(c.dense_intermediate_size))); return;
    case WeightRole::kLmHead: fill(s.lm_head); return;
  }
}

void FillSyntheticTensor(const ModelConfig& c, const WeightSpec& w, uint64_t seed, DType dtype, void* out) {
  int64_t n = 1;
  for (int64_t dim : w.shape) n *= dim;
  FillSyntheticRange(c, w, seed, dtype, out, 0, n);
}

absl::StatusOr<SyntheticModelSpec> ParseSyntheticPreset(std::string_view text, uint64_t seed, std::string_view flag) {
  SyntheticModelSpec spec{.seed = seed};
  const size_t colon = text.find(':');
  spec.preset = std::string(text.substr(0, colon));
  if (colon != std::string_view::npos &&
      (!absl::SimpleAtoi(absl::string_view(text.data() + colon + 1, text.size() - colon - 1), &spec.num_layers) ||
       spec.num_layers < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(flag), ": layers after ':' must be a positive integer, got \"",
                                                   std::string(text.substr(colon + 1)), "\""));
  }
  return spec;
}

std::string SyntheticModelName(const SyntheticModelSpec& spec) {
  auto config = SyntheticConfig(spec);
  const int64_t layers = config.ok() ? config->num_hidden_layers : spec.num_layers;
  return absl::StrCat("synthetic:", spec.preset, ":", layers, " seed ", spec.seed);
}

absl::StatusOr<std::string> SyntheticTokenizerModel(const SyntheticModelSpec& spec) {
  TANDEM_RETURN_IF_ERROR(SyntheticConfig(spec).status());
  TokenizerTrainOptions train;
  train.input_files = DefaultTokenizerCorpus();
  train.vocab_size = static_cast<int>(SyntheticTokenizerVocab(spec));
  return TrainTokenizerInMemory(train);
}

namespace {

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::Status WriteTextFile(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(path.string(), ": cannot write"));
  return absl::OkStatus();
}

// Generates `specs` into TensorToWrite buffers, in parallel over tensors.
std::vector<TensorToWrite> Generate(const ModelConfig& c, const std::vector<WeightSpec>& specs, uint64_t seed,
                                    DType dtype, ThreadPool& pool) {
  std::vector<TensorToWrite> out(specs.size());
  pool.ParallelFor(static_cast<int64_t>(specs.size()), [&](int64_t i, int) {
    const WeightSpec& w = specs[static_cast<size_t>(i)];
    TensorToWrite& t = out[static_cast<size_t>(i)];
    t.name = w.name;
    t.dtype = dtype;
    t.shape = w.shape;
    t.data.resize(static_cast<size_t>(NumElements(w.shape)) * DTypeSize(dtype));
    FillSyntheticTensor(c, w, seed, dtype, t.data.data());
  });
  return out;
}

}  // namespace

absl::Status WriteSyntheticModel(const SyntheticModelSpec& spec, const std::filesystem::path& dir,
                                 const WriteSyntheticOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(ModelConfig config, SyntheticConfig(spec));
  if (options.num_shards < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_shards must be >= 1, got ", options.num_shards));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(dir.string(), ": cannot create directory: ", ec.message()));
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() == ".safetensors" || name == "model.safetensors.index.json") {
      std::filesystem::remove(entry.path(), ec);
    }
  }
  TANDEM_RETURN_IF_ERROR(WriteTextFile(dir / "config.json", ModelConfigToJson(config)));

  // Shards are generated and written one at a time so that memory holds one
  // shard, not the model (a 2-layer Mixtral is ~6 GB, a full one ~90 GB).
  const std::vector<WeightSpec> specs = ExpectedWeights(config);
  int64_t total_bytes = 0;
  for (const WeightSpec& w : specs) total_bytes += NumElements(w.shape) * static_cast<int64_t>(DTypeSize(spec.dtype));
  const int num_shards = options.num_shards;
  ThreadPool pool({.num_threads = options.num_threads, .name = "make-model"});
  nlohmann::json weight_map = nlohmann::json::object();
  size_t next = 0;
  int64_t written = 0;
  for (int shard = 0; shard < num_shards; ++shard) {
    const int64_t shard_end_bytes = total_bytes * (shard + 1) / num_shards;
    std::vector<WeightSpec> shard_specs;
    while (next < specs.size() && (written < shard_end_bytes || shard == num_shards - 1)) {
      written += NumElements(specs[next].shape) * static_cast<int64_t>(DTypeSize(spec.dtype));
      shard_specs.push_back(specs[next++]);
    }
    const std::string file = num_shards == 1 ? "model.safetensors"
                                             : absl::StrFormat("model-%05d-of-%05d.safetensors", shard + 1, num_shards);
    std::vector<TensorToWrite> tensors = Generate(config, shard_specs, spec.seed, spec.dtype, pool);
    std::vector<const TensorToWrite*> pointers;
    for (const TensorToWrite& t : tensors) {
      pointers.push_back(&t);
      weight_map[t.name] = file;
    }
    TANDEM_RETURN_IF_ERROR(WriteSafetensors(dir / file, pointers, {{"format", "pt"}}));
  }
  if (num_shards > 1) {
    nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
    TANDEM_RETURN_IF_ERROR(WriteTextFile(dir / "model.safetensors.index.json", index.dump(2) + "\n"));
  }
  if (options.with_tokenizer) {
    // The very bytes an in-memory model loads (LoadSyntheticModel), so a
    // written model and a generated one tokenize alike by construction.
    TANDEM_ASSIGN_OR_RETURN(std::string tokenizer, SyntheticTokenizerModel(spec));
    TANDEM_RETURN_IF_ERROR(WriteTextFile(dir / "tokenizer.model", tokenizer));
  }
  LOG_INFO("wrote synthetic ", spec.preset, " model (", config.num_hidden_layers, " layers, ",
           absl::StrFormat("%.1f", static_cast<double>(total_bytes) / 1e6), " MB, seed ", spec.seed, ") to ",
           dir.string());
  return absl::OkStatus();
}

namespace {

using Range = std::pair<int64_t, int64_t>;  // elements [first, second)

// The element ranges of `w` to generate: everything for dense tensors and
// kAll; nothing for experts under kNone or outside every slice; a slice's
// rows of w1/w3 [I, D] (one range) and its columns of w2 [D, I] (one range
// per row).
std::vector<Range> WantedRanges(const WeightSpec& w, const SyntheticSourceOptions& options,
                                const std::map<std::pair<int, int>, ExpertSlice>& slices) {
  const SyntheticExperts& experts = options.experts;
  const int64_t n = NumElements(w.shape);
  const bool expert =
      w.role == WeightRole::kExpertW1 || w.role == WeightRole::kExpertW2 || w.role == WeightRole::kExpertW3;
  const bool dense_matrix =
      w.role == WeightRole::kEmbedTokens || w.role == WeightRole::kQProj || w.role == WeightRole::kKProj ||
      w.role == WeightRole::kVProj || w.role == WeightRole::kOProj || w.role == WeightRole::kLmHead ||
      w.role == WeightRole::kSharedW1 || w.role == WeightRole::kSharedW2 || w.role == WeightRole::kSharedW3 ||
      w.role == WeightRole::kDenseW1 || w.role == WeightRole::kDenseW2 || w.role == WeightRole::kDenseW3;
  if (dense_matrix && !options.dense_matrices) return {};
  if (!expert || experts.mode == SyntheticExperts::Mode::kAll) return {{0, n}};
  if (experts.mode == SyntheticExperts::Mode::kNone) return {};
  auto it = slices.find({w.layer, w.expert});
  if (it == slices.end()) return {};
  const ExpertSlice& s = it->second;
  if (w.role != WeightRole::kExpertW2) {
    const int64_t row = w.shape[1];
    return {{s.intermediate_begin * row, s.intermediate_end * row}};
  }
  const int64_t rows = w.shape[0], cols = w.shape[1];
  std::vector<Range> out;
  out.reserve(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) out.push_back({r * cols + s.intermediate_begin, r * cols + s.intermediate_end});
  return out;
}

// One unit of generation work: ranges [begin, end) of ranges_[tensor].
struct Chunk {
  size_t tensor;
  size_t begin, end;
};

}  // namespace

bool SyntheticExperts::Includes(int layer, int expert) const {
  switch (mode) {
    case Mode::kAll: return true;
    case Mode::kNone: return false;
    case Mode::kSlices:
      return std::any_of(slices.begin(), slices.end(),
                         [&](const ExpertSlice& s) { return s.layer == layer && s.expert == expert; });
  }
  return true;
}

absl::StatusOr<std::unique_ptr<SyntheticTensorSource>> SyntheticTensorSource::Create(
    const SyntheticModelSpec& spec, const SyntheticSourceOptions& options) {
  auto source = std::unique_ptr<SyntheticTensorSource>(new SyntheticTensorSource());
  TANDEM_ASSIGN_OR_RETURN(source->config_, SyntheticConfig(spec));
  source->description_ = SyntheticModelName(spec);
  const ModelConfig& config = source->config_;
  std::map<std::pair<int, int>, ExpertSlice> slices;
  for (const ExpertSlice& s : options.experts.slices) {
    if (s.layer < 0 || s.layer >= config.num_hidden_layers || s.expert < 0 || s.expert >= config.num_local_experts ||
        s.intermediate_begin < 0 || s.intermediate_end > config.intermediate_size || s.size() < 1) {
      return absl::InvalidArgumentError(absl::StrCat(source->description_, ": expert slice (layer ", s.layer,
                                                     ", expert ", s.expert, ", rows [", s.intermediate_begin, ", ",
                                                     s.intermediate_end, ")) is outside the model"));
    }
    slices[{s.layer, s.expert}] = s;
  }

  const absl::Time start = absl::Now();
  const std::vector<WeightSpec> specs = ExpectedWeights(config);
  const size_t element = DTypeSize(spec.dtype);
  std::vector<std::vector<Range>> ranges(specs.size());
  std::vector<TensorView> views(specs.size());
  source->mappings_.reserve(specs.size());
  // Chunks of about 4 MB balance the threads whatever the tensor sizes
  // (a full Mixtral: 32000 x 4096 embeddings beside 4096-float norms).
  constexpr int64_t kChunkElements = int64_t{2} << 20;
  std::vector<Chunk> chunks;
  for (size_t t = 0; t < specs.size(); ++t) {
    const WeightSpec& w = specs[t];
    views[t] = TensorView{w.name, spec.dtype, w.shape, nullptr, 0};
    ranges[t] = WantedRanges(w, options, slices);
    if (ranges[t].empty() || NumElements(w.shape) == 0) continue;
    // A private anonymous mapping: pages never written (outside a worker's
    // slices) are never backed by memory.
    const size_t bytes = static_cast<size_t>(NumElements(w.shape)) * element;
    void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (data == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat(source->description_, ": cannot allocate ", bytes, " bytes for ",
                                                       w.name, ": ", std::strerror(errno)));
    }
    source->mappings_.push_back({data, bytes});
    views[t].data = data;
    views[t].size_bytes = bytes;
    // Split the ranges into chunks; a large range is cut, small ones grouped.
    std::vector<Range> split;
    for (const Range& r : ranges[t]) {
      for (int64_t b = r.first; b < r.second; b += kChunkElements)
        split.push_back({b, std::min(r.second, b + kChunkElements)});
    }
    ranges[t] = std::move(split);
    int64_t elements = 0;
    size_t first = 0;
    for (size_t i = 0; i < ranges[t].size(); ++i) {
      elements += ranges[t][i].second - ranges[t][i].first;
      source->generated_bytes_ += (ranges[t][i].second - ranges[t][i].first) * static_cast<int64_t>(element);
      if (elements >= kChunkElements || i + 1 == ranges[t].size()) {
        chunks.push_back({t, first, i + 1});
        first = i + 1;
        elements = 0;
      }
    }
  }
  ThreadPool pool({.num_threads = std::max(1, options.num_threads), .name = "synthetic"});
  ProgressReporter progress(absl::StrCat("generating ", source->description_), source->generated_bytes_);
  pool.ParallelFor(static_cast<int64_t>(chunks.size()), [&](int64_t i, int) {
    const Chunk& c = chunks[static_cast<size_t>(i)];
    for (size_t r = c.begin; r < c.end; ++r) {
      const Range& range = ranges[c.tensor][r];
      FillSyntheticRange(config, specs[c.tensor], spec.seed, spec.dtype, const_cast<void*>(views[c.tensor].data),
                         range.first, range.second);
      progress.Add((range.second - range.first) * static_cast<int64_t>(element));
    }
  });
  source->generate_seconds_ = absl::ToDoubleSeconds(absl::Now() - start);
  for (TensorView& v : views) source->views_.emplace(v.name, std::move(v));
  return source;
}

SyntheticTensorSource::~SyntheticTensorSource() {
  for (const Mapping& m : mappings_) munmap(m.data, m.bytes);
}

absl::StatusOr<TensorView> SyntheticTensorSource::Get(const std::string& name) const {
  auto it = views_.find(name);
  if (it == views_.end()) return absl::NotFoundError(absl::StrCat(description_, ": no tensor ", name));
  return it->second;
}

std::vector<std::string> SyntheticTensorSource::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, view] : views_) names.push_back(name);
  return names;
}

}  // namespace tandem
