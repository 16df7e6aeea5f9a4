#include "common/kernels/linear_amx_gemm.h"

#include <algorithm>
#include <cstring>

#include "common/kernels/linear_isa.h"

namespace tandem {
namespace {

int64_t RoundUp(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

// A task's bf16 W rows and the x rows that meet them in one pass stay in L2
// (2 MB a core on the AMX CPUs), each within about a quarter of it.
constexpr int64_t kTaskRowsBytes = 512 << 10;
constexpr int64_t kXPassBytes = 512 << 10;
constexpr int64_t kPairRows = 2 * isa::kAmxRows;

// Values between the task's bf16 rows: K padded to whole tiles, plus one
// cache line so that rows are never a multiple of 4 KB apart (16 tile rows
// at such a stride would share one L1 set).
int64_t RowStride(int64_t k) { return isa::AmxPaddedK(k) + isa::kAmxChunk; }
int64_t RowsBytes(int64_t k, int64_t features) {
  return RoundUp(RoundUp(features, kPairRows) * RowStride(k) * static_cast<int64_t>(sizeof(uint16_t)), 64);
}

}  // namespace

int64_t AmxTaskFeatures(int64_t k) {
  const int64_t fit = kTaskRowsBytes / (RowStride(k) * static_cast<int64_t>(sizeof(uint16_t)));
  return std::clamp<int64_t>(fit / kPairRows * kPairRows, kPairRows, 4 * kPairRows);
}

int64_t AmxGemmScratchBytes(const LinearWeight& w, int64_t features, int64_t source_bytes) {
  return RowsBytes(w.k, features) + RoundUp(source_bytes, 64);
}

absl::Status AmxGemmSlice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch, AmxRowSource source) {
  if (a.prepared == nullptr) return absl::InvalidArgumentError("amx kernel: x was not prepared");
  const int64_t k = w.k, kp = isa::AmxPaddedK(k), features = a.n_end - a.n_begin, ld = RowStride(k);
  auto* rows = static_cast<uint16_t*>(scratch);
  source(a.n_begin, features, rows, ld, static_cast<uint8_t*>(scratch) + RowsBytes(k, features));
  // The tiles read whole 32-value chunks of whole pairs of 16 rows: zeros
  // past k and past the last row (x is zero there too, but W's stale
  // scratch could hold NaN bits).
  for (int64_t r = 0; r < RoundUp(features, kPairRows); ++r) {
    const int64_t from = r < features ? k : 0;
    std::memset(rows + r * ld + from, 0, static_cast<size_t>(kp - from) * sizeof(uint16_t));
  }
  const int64_t blocks = isa::AmxRowBlocks(a.m);
  const int64_t block_bytes = isa::kAmxRows * kp * static_cast<int64_t>(sizeof(uint16_t));
  const int64_t pass_blocks = std::max<int64_t>(2, kXPassBytes / block_bytes / 2 * 2);
  for (int64_t b = 0; b < blocks; b += pass_blocks) {
    isa::AmxMultiply({.w = rows,
                      .ldw = ld,
                      .w_rows = features,
                      .x = a.prepared,
                      .k = k,
                      .block_begin = b,
                      .block_end = std::min(blocks, b + pass_blocks),
                      .m = a.m,
                      .bias = a.bias != nullptr ? a.bias + a.n_begin : nullptr,
                      .y = a.y + a.n_begin,
                      .ldy = a.ldy});
  }
  isa::AmxRelease();
  return absl::OkStatus();
}

int64_t AmxBf16ScratchBytes(const LinearWeight& w, int64_t, int64_t features) {
  return AmxGemmScratchBytes(w, features, 0);
}

absl::Status AmxBf16Slice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch) {
  const auto* weights = static_cast<const uint16_t*>(w.data);
  return AmxGemmSlice(w, a, scratch, [&](int64_t row0, int64_t rows, uint16_t* out, int64_t ldo, void*) {
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(out + r * ldo, weights + (row0 + r) * w.k, static_cast<size_t>(w.k) * sizeof(uint16_t));
  });
}

}  // namespace tandem
