// The plain data of the attention kernel (attention_block.h) and
// its per-ISA entry points. Included by the ISA translation units, which are
// compiled with their own instruction-set flags: so this header holds no
// inline function (common/CMakeLists.txt explains why).
#pragma once

#include <cstdint>

namespace tandem {

// A block of query rows of one sequence and one query head against the key
// and value rows of its kv head (prefill). Shapes: head_dim floats per row;
// q row r at q + r * q_stride; key j at keys[j] + kv_offset (j absolute, as
// the cache numbers positions), value j at values[j] + kv_offset; output
// row r at out + r * out_stride. Row r attends keys
// [first_key[r], first_key[r] + num_keys[r]), num_keys[r] >= 1 (causal,
// sliding window).
struct AttentionBlockArgs {
  const float* q = nullptr;
  int64_t q_stride = 0;
  int64_t rows = 0;  // 1 .. kAttentionBlockMaxRows
  int64_t head_dim = 0;
  const int64_t* first_key = nullptr;
  const int64_t* num_keys = nullptr;
  const float* const* keys = nullptr;
  const float* const* values = nullptr;
  int64_t kv_offset = 0;
  // Floats of each value row (and output row) when fewer than head_dim: 0
  // means head_dim. DeepSeek's absorbed attention scores over the latent and
  // rope key (head_dim) and sums the latent alone (value_dim <= head_dim).
  int64_t value_dim = 0;
  float scale = 1.0f;  // applied to q.k before the softmax
  float* out = nullptr;
  int64_t out_stride = 0;
};

inline constexpr int64_t kAttentionBlockMaxRows = 32;

// Which way the kernel lays its vectors (attention_block_body.h): query
// rows in lanes (prefill blocks) or keys in lanes (few rows: a decode row's
// GQA group). Both give the same bits; kAuto picks by the block's rows.
enum class AttentionBlockShape { kAuto, kQueriesInLanes, kKeysInLanes };

// kAuto's keys in lanes up to this many rows, per vector width
// (tandem-attention-bench: see attention_block.h).
inline constexpr int64_t kKeysInLanesMaxRowsAvx512 = 8;
inline constexpr int64_t kKeysInLanesMaxRowsAvx2 = 4;

namespace isa {
// Scratch: AttentionBlockScratchFloats (attention_block.h) floats, 64-byte aligned.
void AttendBlockAvx2(const AttentionBlockArgs& a, AttentionBlockShape shape, float* scratch);
void AttendBlockAvx512(const AttentionBlockArgs& a, AttentionBlockShape shape, float* scratch);
}  // namespace isa

}  // namespace tandem
