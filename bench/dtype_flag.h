// A bench's --dtype flag: a float type by its lower-case name, or a ggml
// block type by ggml's name. Header-only; the benches that use it link the
// model library (DTypeFromGgml).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/base/dtype.h"
#include "common/model/gguf_tensor_source.h"
#include "common/quant/ggml_type.h"

namespace tandem {

inline absl::StatusOr<DType> ParseDtypeFlag(const std::string& flag) {
  if (flag == "bf16") return DType::kBF16;
  if (flag == "f16") return DType::kF16;
  if (flag == "f32") return DType::kF32;
  absl::StatusOr<GgmlType> type = GgmlTypeFromName(flag);
  if (type.ok()) {
    absl::StatusOr<DType> dtype = DTypeFromGgml(*type);
    if (dtype.ok() && IsQuantized(*dtype)) return *dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--dtype ", flag, ": expected bf16, f16, f32 or a ggml block type (q8_0, q4_K, q6_K, ...)"));
}

}  // namespace tandem
