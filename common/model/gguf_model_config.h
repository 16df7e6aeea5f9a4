// ModelConfig <-> GGUF metadata, in llama.cpp's converter's keys
// (gguf_names.h): {arch}.context_length, embedding_length, block_count,
// feed_forward_length, attention.head_count(_kv), attention.key_length,
// attention.layer_norm_rms_epsilon, attention.sliding_window,
// rope.freq_base, rope.dimension_count, expert_count, expert_used_count,
// rope.scaling.original_context_length / attn_factor (PhiMoE), and the
// tokenizer's bos/eos ids.
//
// Hugging Face settings the converter does not keep are written under
// tandem.* keys (which llama.cpp ignores) so a file tandem wrote loads to
// exactly the config it came from (float64 values where config.json's
// doubles matter); a file without them gets the values
// llama.cpp itself would use:
//   tandem.rope.short_mscale / long_mscale  else {arch}.rope.scaling.attn_factor
//                                           (the converter's own formula), else 1
//   tandem.rope.short_factor / long_factor  (float64) else the f32 tensors
//                                           rope_factors_short/long
//   tandem.router_jitter_noise              else 0.01 (Phi-3.5-MoE's; llama.cpp
//                                           routes PhiMoE by plain softmax top-k)
// Errors name the file and the key (or tensor).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/gguf/gguf_checkpoint.h"
#include "common/gguf/gguf_metadata.h"
#include "common/model/model_config.h"

namespace tandem {

inline constexpr char kGgufFileTypeKey[] = "general.file_type";
inline constexpr char kGgufQuantizationVersionKey[] = "general.quantization_version";
inline constexpr uint32_t kGgufQuantizationVersion = 2;  // ggml's GGML_QNT_VERSION

// The config a checkpoint describes: its metadata, plus what its tensors
// say (vocab size from token_embd, tied embeddings when output.weight is
// absent, biases when present, PhiMoE's rope_factors_long/short).
// InvalidArgument / NotFound naming the file and key or tensor, and
// ModelConfig::Validate's errors.
absl::StatusOr<ModelConfig> ModelConfigFromGguf(const GgufCheckpoint& checkpoint);

// Adds general.architecture, general.type, general.name and the
// architecture's hyperparameter keys for `config` (not general.file_type,
// which depends on the tensor types). InvalidArgument for a config GGUF
// cannot express (PhiMoE longrope with short_mscale != long_mscale under
// one llama.cpp attn_factor is kept exactly via the tandem.* keys).
absl::Status AddModelConfigToGguf(const ModelConfig& config, const std::string& model_name, GgufMetadata* metadata);

// Tensors the converter writes from config.json rather than the checkpoint:
// PhiMoE's longrope factors (F32, [head_dim / 2] each). Empty otherwise.
std::vector<std::pair<std::string, std::vector<float>>> GgufConfigTensors(const ModelConfig& config);

}  // namespace tandem
