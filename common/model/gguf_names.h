// GGUF's vocabulary for the architectures tandem runs, as llama.cpp's
// converter (convert_hf_to_gguf.py) writes them: the architecture names,
// the hyperparameter keys and the tensor names, next to tensor_names.h's
// Hugging Face names, so the loader (gguf_tensor_source.h) and the writer
// (gguf_quantize.h) speak the same mapping.
//
//   Mixtral  general.architecture "llama" with llama.expert_count; q/k rows
//            permuted into llama.cpp's interleaved RoPE order (below)
//   PhiMoE   general.architecture "phimoe"; no permutation (NeoX RoPE, as
//            Hugging Face), longrope factors as the rope_factors_long/short
//            tensors
//   Qwen3MoE general.architecture "qwen3moe"; no permutation; the experts'
//            width in qwen3moe.expert_feed_forward_length; q_norm / k_norm
//            as blk.l.attn_{q,k}_norm.weight; top-k weights renormalised
//   Qwen2MoE general.architecture "qwen2moe"; no permutation; q/k/v biases;
//            expert_feed_forward_length and expert_shared_feed_forward_length;
//            the shared expert as blk.l.ffn_{gate,down,up}_shexp.weight and
//            its gate as blk.l.ffn_gate_inp_shexp.weight, squeezed to {D};
//            top-k weights not renormalised
//   OLMoE    general.architecture "olmoe"; no permutation; q_norm / k_norm
//            over the whole projections; top-k weights not renormalised
//   DeepSeek general.architecture "deepseek2" (V2 and V3); no permutation
//            (llama.cpp rotates adjacent pairs, as DeepSeek does); MLA as
//            blk.l.attn_{q_a,q_a_norm,q_b,kv_a_mqa,kv_a_norm,kv_b}.weight,
//            kv_b split by newer converters into attn_k_b ({nope, R, H} or
//            {nope, H R}: each head's key rows transposed) and attn_v_b
//
//   HF name (layer l, expert e)                          GGUF name
//   model.embed_tokens.weight                            token_embd.weight
//   model.layers.l.input_layernorm.{weight,bias}         blk.l.attn_norm.{weight,bias}
//   model.layers.l.self_attn.{q,k,v}_proj.{weight,bias}  blk.l.attn_{q,k,v}.{weight,bias}
//   model.layers.l.self_attn.o_proj.{weight,bias}        blk.l.attn_output.{weight,bias}
//   model.layers.l.post_attention_layernorm.*            blk.l.ffn_norm.*
//   model.layers.l.self_attn.{q,k}_norm.weight           blk.l.attn_{q,k}_norm.weight
//   model.layers.l.block_sparse_moe.gate.weight          blk.l.ffn_gate_inp.weight
//     (Qwen3: model.layers.l.mlp.gate.weight)
//   ...experts.e.w1/w2/w3.weight (stacked over e)        blk.l.ffn_{gate,down,up}_exps.weight
//     (Qwen3: mlp.experts.e.{gate,down,up}_proj.weight)
//        or, in older files, one tensor per expert       blk.l.ffn_{gate,down,up}.e.weight
//   model.norm.{weight,bias}                             output_norm.{weight,bias}
//   lm_head.{weight,bias}                                output.{weight,bias}
//
// GGUF dims are in ggml order (dims[0] the row length): an HF [N, K] matrix
// is {K, N}; a stacked expert tensor of E [N, K] matrices is {K, N, E}.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "common/model/tensor_names.h"

namespace tandem {

inline constexpr char kGgufArchitectureKey[] = "general.architecture";
inline constexpr char kGgufArchLlama[] = "llama";
inline constexpr char kGgufArchPhiMoE[] = "phimoe";
inline constexpr char kGgufArchQwen3Moe[] = "qwen3moe";
inline constexpr char kGgufArchQwen2Moe[] = "qwen2moe";
inline constexpr char kGgufArchOlmoe[] = "olmoe";
inline constexpr char kGgufArchGlm4Moe[] = "glm4moe";
// DeepSeek-V2 and V3 (R1, Kimi K2): one GGUF architecture, told apart by
// deepseek2.expert_gating_func (sigmoid: V3).
inline constexpr char kGgufArchDeepseek2[] = "deepseek2";
// {arch}.expert_gating_func: llama.cpp's LLM_EXPERT_GATING_FUNC_TYPE_SIGMOID.
inline constexpr int64_t kGgufExpertGatingSoftmax = 1;
inline constexpr int64_t kGgufExpertGatingSigmoid = 2;

// "llama" for Mixtral, "phimoe" for PhiMoE, "qwen3moe", "qwen2moe", "olmoe".
std::string_view GgufArchitecture(Architecture architecture);
// The architecture a general.architecture names; InvalidArgument naming
// `source` and the value for any other (a dense "llama" without experts is
// caught later, by the missing expert_count).
absl::StatusOr<Architecture> ArchitectureFromGguf(std::string_view name, const std::string& source);

// "{arch}.{suffix}", e.g. GgufKey("llama", "attention.head_count").
std::string GgufKey(std::string_view arch, std::string_view suffix);

// The GGUF tensor holding `role` of `layer`. Expert roles name the stacked
// tensor (blk.l.ffn_gate_exps.weight); the expert is its index along dims[2].
std::string GgufTensorName(WeightRole role, int layer = -1);
// The name in `architecture`'s files: glm4moe calls the pre-FFN norm
// post_attention_norm (HF's post_attention_layernorm), the others ffn_norm.
std::string GgufTensorName(Architecture architecture, WeightRole role, int layer);
// The GGUF dims of `w` (ggml order): its HF shape reversed, squeezed as the
// converter squeezes ([1, D] -> {D}).
std::vector<int64_t> GgufDims(const WeightSpec& w);
// The per-expert tensor older converters wrote: blk.l.ffn_gate.e.weight.
std::string GgufPerExpertTensorName(WeightRole role, int layer, int expert);
inline bool IsExpertRole(WeightRole role) {
  return role == WeightRole::kExpertW1 || role == WeightRole::kExpertW2 || role == WeightRole::kExpertW3;
}

// PhiMoE's longrope factors, one F32 vector of head_dim / 2 each.
inline constexpr char kGgufRopeFactorsLong[] = "rope_factors_long.weight";
inline constexpr char kGgufRopeFactorsShort[] = "rope_factors_short.weight";

// Whether llama.cpp's converter permutes this role's rows for `architecture`:
// the llama converter does for q_proj and k_proj (weights and biases) so that
// llama.cpp can rotate adjacent pairs; Hugging Face rotates (i, i + hd/2).
bool GgufPermutesRows(Architecture architecture, WeightRole role);
// The converter's permutation, head by head (hd = head_dim): HF row
// h*hd + s*hd/2 + j is GGUF row h*hd + 2*j + s (s in {0, 1}, j < hd/2).
inline int64_t GgufRowOfHfRow(int64_t hf_row, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  const int64_t head = hf_row / head_dim, within = hf_row % head_dim;
  return head * head_dim + 2 * (within % half) + within / half;
}
// Its inverse: the HF row that GGUF row `gguf_row` holds.
inline int64_t HfRowOfGgufRow(int64_t gguf_row, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  const int64_t head = gguf_row / head_dim, within = gguf_row % head_dim;
  return head * head_dim + (within % 2) * half + within / 2;
}

}  // namespace tandem
