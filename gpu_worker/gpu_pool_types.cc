#include "gpu_worker/gpu_pool_types.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace tandem {

bool GpuDecodesBlocks(DType dtype) {
  switch (dtype) {
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K: return true;
    default: return false;
  }
}

absl::Status CheckGpuPoolLayouts(const ExpertLayouts& layouts) {
  if (layouts.empty()) return absl::InvalidArgumentError("the GPU expert pool needs at least one layer of experts");
  const bool quantized = layouts[0].quantized();
  const DType float_dtype = layouts[0].w1_dtype;
  for (size_t l = 0; l < layouts.size(); ++l) {
    const ExpertLayout& layout = layouts[l];
    const std::string what = absl::StrCat("layer ", l, "'s experts (", layout.DTypeNames(), ")");
    for (DType dtype : {layout.w1_dtype, layout.w3_dtype, layout.w2_dtype}) {
      if (quantized && !IsQuantized(dtype)) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, " mix float and block-quantized matrices (layer 0's are ", layouts[0].DTypeNames(),
                         "): the GPU expert pool computes experts either all of one float type or all block-quantized; "
                         "load the file with --gguf_experts bf16"));
      }
      if (quantized && !GpuDecodesBlocks(dtype)) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": the GPU expert pool has no kernel for ", std::string(DTypeName(dtype)),
            " blocks (it decodes Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K); load the file with --gguf_experts bf16"));
      }
      if (!quantized && dtype != float_dtype) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": the GPU expert pool computes float experts of one type throughout (layer 0's are ",
            layouts[0].DTypeNames(), ")", IsQuantized(dtype) ? "; block-quantized matrices need every matrix so" : ""));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem
