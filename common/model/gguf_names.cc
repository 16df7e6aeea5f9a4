#include "common/model/gguf_names.h"

#include "absl/strings/str_cat.h"

namespace tandem {

std::string_view GgufArchitecture(Architecture architecture) {
  switch (architecture) {
    case Architecture::kPhiMoE: return kGgufArchPhiMoE;
    case Architecture::kQwen3Moe: return kGgufArchQwen3Moe;
    case Architecture::kQwen2Moe: return kGgufArchQwen2Moe;
    case Architecture::kOlmoe: return kGgufArchOlmoe;
    case Architecture::kGlm4Moe: return kGgufArchGlm4Moe;
    case Architecture::kDeepseekV2:
    case Architecture::kDeepseekV3: return kGgufArchDeepseek2;
    case Architecture::kMixtral: break;
  }
  return kGgufArchLlama;
}

absl::StatusOr<Architecture> ArchitectureFromGguf(std::string_view name, const std::string& source) {
  if (name == kGgufArchLlama) return Architecture::kMixtral;
  if (name == kGgufArchPhiMoE) return Architecture::kPhiMoE;
  if (name == kGgufArchQwen3Moe) return Architecture::kQwen3Moe;
  if (name == kGgufArchQwen2Moe) return Architecture::kQwen2Moe;
  if (name == kGgufArchOlmoe) return Architecture::kOlmoe;
  if (name == kGgufArchGlm4Moe) return Architecture::kGlm4Moe;
  if (name == kGgufArchDeepseek2) return Architecture::kDeepseekV2;  // V3 by its gating function
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", kGgufArchitectureKey, " is \"", std::string(name),
                                                 "\"; tandem runs \"llama\" with experts (Mixtral), \"phimoe\", "
                                                 "\"qwen3moe\", \"qwen2moe\", \"olmoe\", \"glm4moe\" and "
                                                 "\"deepseek2\""));
}

std::string GgufKey(std::string_view arch, std::string_view suffix) {
  return absl::StrCat(std::string(arch), ".", std::string(suffix));
}

std::string GgufTensorName(WeightRole role, int layer) {
  const std::string b = absl::StrCat("blk.", layer, ".");
  switch (role) {
    case WeightRole::kEmbedTokens: return "token_embd.weight";
    case WeightRole::kInputNorm: return b + "attn_norm.weight";
    case WeightRole::kInputNormBias: return b + "attn_norm.bias";
    case WeightRole::kQProj: return b + "attn_q.weight";
    case WeightRole::kKProj: return b + "attn_k.weight";
    case WeightRole::kVProj: return b + "attn_v.weight";
    case WeightRole::kQBias: return b + "attn_q.bias";
    case WeightRole::kKBias: return b + "attn_k.bias";
    case WeightRole::kVBias: return b + "attn_v.bias";
    case WeightRole::kOProj: return b + "attn_output.weight";
    case WeightRole::kOBias: return b + "attn_output.bias";
    case WeightRole::kQNorm: return b + "attn_q_norm.weight";
    case WeightRole::kKNorm: return b + "attn_k_norm.weight";
    case WeightRole::kPostAttentionNorm: return b + "ffn_norm.weight";
    case WeightRole::kPostAttentionNormBias: return b + "ffn_norm.bias";
    case WeightRole::kRouter: return b + "ffn_gate_inp.weight";
    case WeightRole::kRouterCorrectionBias: return b + "exp_probs_b.bias";
    case WeightRole::kExpertW1: return b + "ffn_gate_exps.weight";
    case WeightRole::kExpertW2: return b + "ffn_down_exps.weight";
    case WeightRole::kExpertW3: return b + "ffn_up_exps.weight";
    case WeightRole::kSharedExpertGate: return b + "ffn_gate_inp_shexp.weight";
    case WeightRole::kSharedW1: return b + "ffn_gate_shexp.weight";
    case WeightRole::kSharedW2: return b + "ffn_down_shexp.weight";
    case WeightRole::kSharedW3: return b + "ffn_up_shexp.weight";
    case WeightRole::kDenseW1: return b + "ffn_gate.weight";
    case WeightRole::kDenseW2: return b + "ffn_down.weight";
    case WeightRole::kDenseW3: return b + "ffn_up.weight";
    case WeightRole::kFinalNorm: return "output_norm.weight";
    case WeightRole::kFinalNormBias: return "output_norm.bias";
    case WeightRole::kLmHead: return "output.weight";
    case WeightRole::kLmHeadBias: return "output.bias";
    case WeightRole::kQAProj: return b + "attn_q_a.weight";
    case WeightRole::kQANorm: return b + "attn_q_a_norm.weight";
    case WeightRole::kQBProj: return b + "attn_q_b.weight";
    case WeightRole::kKvAProj: return b + "attn_kv_a_mqa.weight";
    case WeightRole::kKvANorm: return b + "attn_kv_a_norm.weight";
    case WeightRole::kKvBProj: return b + "attn_kv_b.weight";
    case WeightRole::kKBProj: return b + "attn_k_b.weight";
    case WeightRole::kVBProj: return b + "attn_v_b.weight";
  }
  return "";
}

std::string GgufTensorName(Architecture architecture, WeightRole role, int layer) {
  if (architecture == Architecture::kGlm4Moe && role == WeightRole::kPostAttentionNorm)
    return absl::StrCat("blk.", layer, ".post_attention_norm.weight");
  return GgufTensorName(role, layer);
}

std::vector<int64_t> GgufDims(const WeightSpec& w) {
  std::vector<int64_t> dims(w.shape.rbegin(), w.shape.rend());
  while (dims.size() > 1 && dims.back() == 1) dims.pop_back();
  return dims;
}

std::string GgufPerExpertTensorName(WeightRole role, int layer, int expert) {
  const char* matrix = role == WeightRole::kExpertW1   ? "ffn_gate"
                       : role == WeightRole::kExpertW2 ? "ffn_down"
                                                       : "ffn_up";
  return absl::StrCat("blk.", layer, ".", matrix, ".", expert, ".weight");
}

bool GgufPermutesRows(Architecture architecture, WeightRole role) {
  if (architecture != Architecture::kMixtral) return false;
  return role == WeightRole::kQProj || role == WeightRole::kKProj || role == WeightRole::kQBias ||
         role == WeightRole::kKBias;
}

}  // namespace tandem
