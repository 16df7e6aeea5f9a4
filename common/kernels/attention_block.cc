#include "common/kernels/attention_block.h"

#include "absl/strings/str_cat.h"

namespace tandem {

int64_t AttentionBlockScratchFloats(int64_t max_keys, int64_t head_dim) {
  // Qt [head_dim][32], first/end/inv_sum [32] each, O [32][head_dim
  // rounded up to 16], St [max_keys][32] or S [32][max_keys rounded up to
  // 16], and rounding (attention_block_body.h, MakePlan).
  return (head_dim + 3 + (head_dim + 15) / 16 * 16 + max_keys + 16) * kAttentionBlockMaxRows + 16;
}

namespace {
// The kernel compiled for `isa`'s vector width (AVX-512F, else AVX2).
void RunFor(IsaLevel isa, const AttentionBlockArgs& a, AttentionBlockShape shape, float* scratch) {
  if (isa >= IsaLevel::kAvx512) {
    isa::AttendBlockAvx512(a, shape, scratch);
  } else {
    isa::AttendBlockAvx2(a, shape, scratch);
  }
}
}  // namespace

void AttendBlock(const AttentionBlockArgs& a, float* scratch) {
  RunFor(ActiveIsa(), a, AttentionBlockShape::kAuto, scratch);
}

absl::Status AttendBlockWithIsa(IsaLevel isa, const AttentionBlockArgs& a, float* scratch, AttentionBlockShape shape) {
  if (a.rows < 1 || a.rows > kAttentionBlockMaxRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention block: rows must be 1..", kAttentionBlockMaxRows, ", got ", a.rows));
  }
  if (a.value_dim < 0 || a.value_dim > a.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention block: value_dim must be 0..head_dim (", a.head_dim, "), got ", a.value_dim));
  }
  if (const std::string why = IsaUnavailableReason(isa); !why.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("attention block: ", why));
  }
  RunFor(isa, a, shape, scratch);
  return absl::OkStatus();
}

const char* AttentionBlockKernelName() { return ActiveIsa() >= IsaLevel::kAvx512 ? "avx512" : "avx2"; }

std::string DescribeAttentionKernels() {
  return absl::StrCat("attention: attention_block_", AttentionBlockKernelName(), ", keys in lanes up to ",
                      ActiveIsa() >= IsaLevel::kAvx512 ? kKeysInLanesMaxRowsAvx512 : kKeysInLanesMaxRowsAvx2,
                      " rows (a decode row's GQA group), queries in lanes above");
}

}  // namespace tandem
