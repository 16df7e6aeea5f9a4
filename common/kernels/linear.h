// Linear layer on the CPU: y[M,N] = x[M,K] . W[N,K]^T (+ bias[N]).
//
// Legend: M rows (tokens), K input features, N output features.
// x: [M, K] f32, row stride K.   W: [N, K] in F32, F16 or BF16, row-major as
// Hugging Face stores nn.Linear weights.   y: [M, N] f32, row stride N.
// bias: [N] f32 or nullptr.  Accumulation is f32.
// Supported: any M >= 0, N >= 1, K >= 1 (no multiple-of-8 requirement; tails
// are handled), x/W/y need no particular alignment. Needs AVX2 + FMA + F16C.
//
// Two paths, chosen per call by M (see LinearOptions): a hand-written AVX2/FMA
// kernel that streams W once for all M rows (decode: memory-bound), and oneDNN
// f32 matmul on W tiles converted to f32 (prefill: compute-bound). Both split
// N across the pool's threads.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "common/thread_pool.h"

namespace tandem {

struct LinearWeight {
  const void* data = nullptr;  // [N, K]
  DType dtype = DType::kBF16;
  int64_t n = 0;  // output features
  int64_t k = 0;  // input features
};

// The compute-bound kernel used from LinearOptions::onednn_min_rows rows on.
enum class PrefillKernel : uint8_t {
  kAvx2Packed,  // W widened + transposed into L1 panels, 6x16 AVX2 FMA tile
  kOneDnn,      // W tile widened to f32, oneDNN f32 matmul (single-threaded)
};

struct LinearOptions {
  // Use the tiled (prefill) path when M >= this; the streaming kernel below it.
  int64_t onednn_min_rows = 16;
  PrefillKernel prefill_kernel = PrefillKernel::kAvx2Packed;
};

// Thread-safe for distinct outputs; uses `pool` (may be null: single thread).
absl::Status Linear(const float* x, int64_t m, const LinearWeight& w, const float* bias, float* y,
                    ThreadPool* pool, const LinearOptions& options = {});

// ---- Building blocks for fused callers (the expert FFN) and benchmarks ----

enum class LinearPath { kAvx2Stream, kAvx2Packed, kOneDnn };
std::string_view LinearPathName(LinearPath path);  // "avx2_stream", "avx2_packed", "onednn"
LinearPath ChooseLinearPath(int64_t m, const LinearOptions& options);

// Checks shapes and pointers of one Linear call (InvalidArgument otherwise).
absl::Status ValidateLinear(const float* x, int64_t m, const LinearWeight& w, const float* y);

// How many output features one parallel task should own for this call:
// the stream path aims at a few hundred KB of weights per task (enough to
// amortise the task counter, small enough to balance), the oneDNN path at
// one converted W tile. Always in [1, w.n].
int64_t LinearTaskFeatures(int64_t m, const LinearWeight& w, int num_threads,
                           const LinearOptions& options);

// Computes output features [n_begin, n_end) on the calling thread:
// y[r * ldy + j] for r < m, n_begin <= j < n_end. Inputs must have passed
// ValidateLinear; 0 <= n_begin < n_end <= w.n, ldy >= n_end. Internal only
// fails on oneDNN errors.
absl::Status LinearSlice(const float* x, int64_t m, const LinearWeight& w, const float* bias,
                         int64_t n_begin, int64_t n_end, float* y, int64_t ldy,
                         const LinearOptions& options);

}  // namespace tandem
