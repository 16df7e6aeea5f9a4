#include "gpu_worker/expert_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

int64_t AlignUp(int64_t bytes, int64_t alignment) { return (bytes + alignment - 1) / alignment * alignment; }

// InvalidArgument unless a row of `row_length` values of `dtype` is a whole
// number of blocks.
absl::Status CheckWholeBlocks(DType dtype, int64_t row_length, const char* matrix, const char* dim) {
  const int64_t block = DTypeBlockSize(dtype);
  if (row_length % block == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("experts' ", matrix, " is ", std::string(DTypeName(dtype)),
                                                 ", whose blocks hold ", block, " values, but its rows have ", dim,
                                                 " = ", row_length, " values: not a whole number of blocks"));
}

}  // namespace

std::string ExpertLayout::DTypeNames() const {
  if (w1_dtype == w3_dtype && w3_dtype == w2_dtype) return std::string(DTypeName(w1_dtype));
  return absl::StrCat(std::string(DTypeName(w1_dtype)), "/", std::string(DTypeName(w3_dtype)), "/",
                      std::string(DTypeName(w2_dtype)));
}

absl::StatusOr<ExpertLayout> ExpertLayout::ForModel(const ModelConfig& config, DType dtype) {
  return ForMatrices(config, dtype, dtype, dtype);
}

absl::StatusOr<ExpertLayout> ExpertLayout::ForMatrices(const ModelConfig& config, DType w1, DType w3, DType w2) {
  if (config.hidden_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("hidden_size must be >= 1, got ", config.hidden_size));
  }
  if (config.intermediate_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("intermediate_size must be >= 1, got ", config.intermediate_size));
  }
  const int64_t d = config.hidden_size, i = config.intermediate_size;
  TANDEM_RETURN_IF_ERROR(CheckWholeBlocks(w1, d, "w1 (gate)", "hidden_size"));
  TANDEM_RETURN_IF_ERROR(CheckWholeBlocks(w3, d, "w3 (up)", "hidden_size"));
  TANDEM_RETURN_IF_ERROR(CheckWholeBlocks(w2, i, "w2 (down)", "intermediate_size"));
  ExpertLayout layout;
  layout.w1_dtype = w1;
  layout.w3_dtype = w3;
  layout.w2_dtype = w2;
  layout.hidden_size = d;
  layout.intermediate_size = i;
  // Quantized or not, a matrix's bytes are its rows' (DTypeRowBytes is
  // DTypeSize * length for a float type).
  layout.w1_bytes = i * DTypeRowBytes(w1, d);
  layout.w3_bytes = i * DTypeRowBytes(w3, d);
  layout.w2_bytes = d * DTypeRowBytes(w2, i);
  layout.w1_offset = 0;
  layout.w3_offset = AlignUp(layout.w1_bytes, kExpertBufferAlignment);
  layout.w2_offset = layout.w3_offset + AlignUp(layout.w3_bytes, kExpertBufferAlignment);
  layout.copy_bytes = layout.w1_bytes + layout.w3_bytes + layout.w2_bytes;
  layout.buffer_bytes = layout.w2_offset + AlignUp(layout.w2_bytes, kExpertBufferAlignment);
  return layout;
}

int64_t MaxBufferBytes(const ExpertLayouts& layouts) {
  int64_t bytes = 0;
  for (const ExpertLayout& l : layouts) bytes = std::max(bytes, l.buffer_bytes);
  return bytes;
}

int64_t MeanCopyBytes(const ExpertLayouts& layouts) {
  int64_t sum = 0, n = 0;
  for (const ExpertLayout& l : layouts) {
    if (l.dense_layer) continue;
    sum += l.copy_bytes;
    ++n;
  }
  return n == 0 ? 0 : (sum + n / 2) / n;
}

absl::StatusOr<int> ExpertPoolOptions::SlotCount(int64_t buffer_bytes) const {
  if (num_staging_buffers < 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_staging_buffers must be >= 0, got ", num_staging_buffers));
  }
  if (num_slots >= 0) return num_slots;
  if (memory_bytes < 0)
    return absl::InvalidArgumentError(absl::StrCat("memory_bytes must be >= 0, got ", memory_bytes));
  if (buffer_bytes <= 0) return absl::InvalidArgumentError("expert layout has no bytes");
  const int64_t buffers = memory_bytes / buffer_bytes;
  if (buffers < num_staging_buffers) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory_bytes ", memory_bytes, " holds ", buffers, " expert buffers of ", buffer_bytes,
                     " bytes, fewer than num_staging_buffers (", num_staging_buffers, ")"));
  }
  const int64_t slots = buffers - num_staging_buffers;
  return static_cast<int>(std::min<int64_t>(slots, 1 << 30));
}

const char* BufferStateName(BufferState state) {
  switch (state) {
    case BufferState::kFree: return "free";
    case BufferState::kCopying: return "copying";
    case BufferState::kReady: return "ready";
  }
  return "unknown";
}

}  // namespace tandem
