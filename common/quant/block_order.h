// K-quant blocks with their level bits in the order the AVX512-VNNI decode
// GEMV reads them ("group-major"), converted once when the weights are
// copied into memory, instead of shuffled into that order on every call.
//
// Why: the fused VNNI GEMV (linear_avx512_vnni_fused.cc) feeds vpdpbusd
// 64 levels at a time, lane l of step s holding values 16l + 4s .. 16l +
// 4s + 3 of the 256-value block, so that every int32 lane of a block's 4
// steps stays in one 16-value scale group. ggml's order puts those values
// in other bytes and nibbles: each step cost a cross-lane permute or two
// (Q4_K 12 and Q6_K 24 vector instructions a block and W row just to
// place the levels). Group-major, a step is one AND or a shift and an AND
// (Q6_K: three instructions more for the two high bits). Measured with both
// orders alternating in one process: faster at one row from DRAM once the
// decode streams stopped stalling on memory (docs/BENCHMARKS.md, Decode
// GEMV).
//
// Only the level bits move: the scale fields, d and dmin stay where ggml
// has them, and the block size is unchanged.
//   Q4_K  qs[128]: value 16l + 4s + j (l group 0..15, s step 0..3, j 0..3)
//         in byte 64 (s / 2) + 4l + j, low nibble for even s, high for odd.
//   Q6_K  ql[128] as Q4_K's qs for the four low bits; qh[64]: the two high
//         bits of value 16l + 4s + j in byte 4l + j, bits 2s and 2s + 1.
// Other types have one order (HasGroupMajorOrder false).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/quant/ggml_type.h"

namespace tandem {

// Whether `type` has a group-major order (Q4_K, Q6_K).
bool HasGroupMajorOrder(GgmlType type);

// Rewrites whole blocks of `type` in place, ggml -> group-major (AVX2, a
// small fraction of the load's copy; logged) or back (scalar, much slower:
// for the rare readers of a converted copy that need ggml's order). InvalidArgument for a type
// without the order or a size that is not whole blocks.
absl::Status ToGroupMajorOrder(GgmlType type, absl::Span<uint8_t> blocks);
absl::Status ToGgmlOrder(GgmlType type, absl::Span<uint8_t> blocks);

// One group-major block of `type` (HasGroupMajorOrder) into `out` in ggml's
// order, for the decoders that read ggml's layout (the prefill tile paths,
// the AVX2 GEMV): `out` holds the block's size and does not overlap `in`.
void GroupMajorBlockToGgml(GgmlType type, const uint8_t* in, uint8_t* out);

}  // namespace tandem
