#include "common/base/dtype.h"

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

struct DTypeInfo {
  std::string_view name;
  int64_t block_size;
  int64_t block_bytes;
};

// Block geometry as ggml-common.h defines it (common/quant checks the same
// numbers against ggml; gguf_model_test checks these against common/quant).
DTypeInfo Info(DType dtype) {
  switch (dtype) {
    case DType::kF32: return {"F32", 1, 4};
    case DType::kF16: return {"F16", 1, 2};
    case DType::kBF16: return {"BF16", 1, 2};
    case DType::kQ8_0: return {"Q8_0", 32, 34};
    case DType::kQ4_0: return {"Q4_0", 32, 18};
    case DType::kQ4_1: return {"Q4_1", 32, 20};
    case DType::kQ5_0: return {"Q5_0", 32, 22};
    case DType::kQ4_K: return {"Q4_K", 256, 144};
    case DType::kQ5_K: return {"Q5_K", 256, 176};
    case DType::kQ6_K: return {"Q6_K", 256, 210};
    case DType::kQ5_1: return {"Q5_1", 32, 24};
    case DType::kQ3_K: return {"Q3_K", 256, 110};
    case DType::kQ2_K: return {"Q2_K", 256, 84};
    case DType::kIQ4_NL: return {"IQ4_NL", 32, 18};
    case DType::kIQ4_XS: return {"IQ4_XS", 256, 136};
  }
  return {"?", 1, 0};
}

}  // namespace

size_t DTypeSize(DType dtype) { return IsQuantized(dtype) ? 0 : static_cast<size_t>(Info(dtype).block_bytes); }
int64_t DTypeBlockSize(DType dtype) { return Info(dtype).block_size; }
int64_t DTypeBlockBytes(DType dtype) { return Info(dtype).block_bytes; }
std::string_view DTypeName(DType dtype) { return Info(dtype).name; }

absl::StatusOr<DType> ParseDType(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported dtype \"", std::string(name), "\" (tandem reads F32, F16 and BF16)"));
}

absl::Status RequireFloatDType(DType dtype, std::string_view what, std::string_view consumer) {
  if (!IsQuantized(dtype)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(std::string(what), " is ", std::string(DTypeName(dtype)), ": ",
                                                 std::string(consumer),
                                                 " takes only F32, F16 and BF16 weights (no quantized "
                                                 "kernels there yet)"));
}

}  // namespace tandem
