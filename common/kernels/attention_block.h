// Attention of a block of query rows as small GEMMs: Q.K^T with the queries
// transposed, the softmax across rows in vectors, P.V in register tiles
// (attention_block_body.h). The coordinator's CPU backend runs it for
// prefill blocks and for a decode row's query heads that share a kv head
// (4 for Mixtral and Phi-3.5-MoE: 1.3-1.8x the per-key dots at 64-4096
// keys); fewer rows keep the per-key dot products of AttendRowsOneHead
// (coordinator/cpu_ops.h), most of this kernel's lanes idling below 4.
//
// Thread-safety: stateless; each call uses only its arguments and scratch,
// so threads call it concurrently with scratch of their own.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/base/cpu_features.h"
#include "common/kernels/attention_block_types.h"

namespace tandem {

// Callers run blocks of fewer rows through per-key dot products: below 4
// rows most of this kernel's vector lanes idle (tandem-attention-bench:
// 1 row 8-11 GFLOP/s against 16-22; 4 rows 35-43 against 28).
inline constexpr int64_t kAttentionBlockMinRows = 4;

// Floats of scratch one call needs for blocks of up to
// kAttentionBlockMaxRows rows whose keys span at most `max_keys`.
int64_t AttentionBlockScratchFloats(int64_t max_keys, int64_t head_dim);

// Runs the kernel of the highest level ActiveIsa() allows (AVX-512F, else
// AVX2). `scratch`: AttentionBlockScratchFloats floats. Arguments are the
// caller's to bound (rows 1..kAttentionBlockMaxRows, num_keys >= 1).
void AttendBlock(const AttentionBlockArgs& a, float* scratch);

// The same with `isa`'s kernel (tests and benches run every path the host
// has): FailedPrecondition naming the reason when ActiveIsa() does not
// allow it; InvalidArgument for rows outside 1..kAttentionBlockMaxRows.
absl::Status AttendBlockWithIsa(IsaLevel isa, const AttentionBlockArgs& a, float* scratch);

// "avx512" or "avx2": the kernel AttendBlock runs now.
const char* AttentionBlockKernelName();
// For start-up logs, stats and bench stamps: "attention: blocks of 4+ rows
// (prefill, a decode row's GQA group) attention_block_avx512, fewer rows
// per-key dots".
std::string DescribeAttentionKernels();

}  // namespace tandem
