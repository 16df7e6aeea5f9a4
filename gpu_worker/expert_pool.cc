#include "gpu_worker/expert_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

int64_t AlignUp(int64_t bytes, int64_t alignment) { return (bytes + alignment - 1) / alignment * alignment; }

}  // namespace

absl::StatusOr<ExpertLayout> ExpertLayout::ForModel(const ModelConfig& config, DType dtype) {
  if (config.hidden_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("hidden_size must be >= 1, got ", config.hidden_size));
  }
  if (config.intermediate_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("intermediate_size must be >= 1, got ", config.intermediate_size));
  }
  TANDEM_RETURN_IF_ERROR(RequireFloatDType(dtype, "the experts", "the GPU expert pool"));
  ExpertLayout layout;
  layout.dtype = dtype;
  layout.hidden_size = config.hidden_size;
  layout.intermediate_size = config.intermediate_size;
  layout.matrix_bytes = config.hidden_size * config.intermediate_size * static_cast<int64_t>(DTypeSize(dtype));
  const int64_t stride = AlignUp(layout.matrix_bytes, kExpertBufferAlignment);
  layout.w1_offset = 0;
  layout.w3_offset = stride;
  layout.w2_offset = 2 * stride;
  layout.copy_bytes = 3 * layout.matrix_bytes;
  layout.buffer_bytes = 3 * stride;
  return layout;
}

absl::StatusOr<int> ExpertPoolOptions::SlotCount(const ExpertLayout& layout) const {
  if (num_staging_buffers < 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_staging_buffers must be >= 0, got ", num_staging_buffers));
  }
  if (num_slots >= 0) return num_slots;
  if (memory_bytes < 0)
    return absl::InvalidArgumentError(absl::StrCat("memory_bytes must be >= 0, got ", memory_bytes));
  if (layout.buffer_bytes <= 0) return absl::InvalidArgumentError("expert layout has no bytes");
  const int64_t buffers = memory_bytes / layout.buffer_bytes;
  if (buffers < num_staging_buffers) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory_bytes ", memory_bytes, " holds ", buffers, " expert buffers of ", layout.buffer_bytes,
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
