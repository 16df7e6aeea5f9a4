// Attention of a block of query rows of one head (or a decode row's query
// heads that share a kv head) as small GEMMs (attention_block_body.h):
// Q.K^T with the queries in vector lanes for prefill blocks, with the keys
// in lanes for a few rows, the softmax in vectors, P.V in register tiles.
// The coordinator's CPU backend runs every attention row through it.
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

// Floats of scratch one call needs for blocks of up to
// kAttentionBlockMaxRows rows whose keys span at most `max_keys`.
int64_t AttentionBlockScratchFloats(int64_t max_keys, int64_t head_dim);

// Runs the kernel of the highest level ActiveIsa() allows (AVX-512F, else
// AVX2). `scratch`: AttentionBlockScratchFloats floats. Arguments are the
// caller's to bound (rows 1..kAttentionBlockMaxRows, num_keys >= 1).
void AttendBlock(const AttentionBlockArgs& a, float* scratch);

// The same with `isa`'s kernel and `shape` (tests and benches run every
// path the host has): FailedPrecondition naming the reason when ActiveIsa()
// does not allow it; InvalidArgument for rows outside
// 1..kAttentionBlockMaxRows.
absl::Status AttendBlockWithIsa(IsaLevel isa, const AttentionBlockArgs& a, float* scratch,
                                AttentionBlockShape shape = AttentionBlockShape::kAuto);

// "avx512" or "avx2": the kernel AttendBlock runs now.
const char* AttentionBlockKernelName();
// For start-up logs, stats and bench stamps: "attention:
// attention_block_avx512, keys in lanes up to 8 rows (a decode row's GQA
// group), queries in lanes above".
std::string DescribeAttentionKernels();

}  // namespace tandem
