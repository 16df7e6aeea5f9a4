// Linear layer on the CPU: y[M,N] = x[M,K] . W[N,K]^T (+ bias[N]).
//
// Legend: M rows (tokens), K input features, N output features.
// x: [M, K] f32, row stride K.   W: [N, K] in F32, F16 or BF16, row-major as
// Hugging Face stores nn.Linear weights (a quantized W is refused, naming
// its type).   y: [M, N] f32, row stride N.
// bias: [N] f32 or nullptr.  Accumulation is f32.
// Supported: any M >= 0, N >= 1, K >= 1 (no multiple-of-8 requirement; tails
// are handled), x/W/y need no particular alignment. Needs AVX2 + FMA + F16C.
//
// Paths, chosen per call by M (see LinearOptions); all split N across the
// pool's threads (dynamic scheduling):
//  - avx2_stream (M < prefill_min_rows, decode: memory-bound): AVX2/FMA dot
//    products that read each weight once for up to 16 rows of x.
//  - avx2_packed (prefill: compute-bound): W widened to f32 and transposed
//    into 16-feature panels per task, 6x16 register-tile FMA micro-kernel.
//  - onednn (opt-in): W tile widened to f32, oneDNN 2.6 f32 matmul on one
//    thread. oneDNN 2.6 has no bf16 matmul on AVX2-only CPUs, and measured
//    at Mixtral width it is no faster than avx2_packed (ties at 512 rows,
//    10-20% slower at 64-256), so it is kept as a reference and fallback.
// tandem-expert-ffn-bench prints the numbers behind these choices.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "common/base/dtype.h"
#include "common/base/thread_pool.h"

namespace tandem {

struct LinearWeight {
  const void* data = nullptr;  // [N, K]
  DType dtype = DType::kBF16;  // a quantized type packs each row in blocks (dtype.h)
  int64_t n = 0;  // output features
  int64_t k = 0;  // input features

  int64_t row_bytes() const { return DTypeRowBytes(dtype, k); }
  int64_t bytes() const { return n * row_bytes(); }
};

// The compute-bound kernel used from LinearOptions::prefill_min_rows rows on.
enum class PrefillKernel : uint8_t {
  kAvx2Packed,  // W widened + transposed into f32 panels, 6x16 AVX2 FMA tile
  kOneDnn,      // W tile widened to f32, oneDNN f32 matmul (single-threaded)
};

struct LinearOptions {
  // The prefill kernel runs when M >= this, the stream kernel below it. On
  // the 2-core Zen 3 VM at Mixtral width (bf16) the expert FFN crosses over
  // between 8 and 12 rows: stream faster at 8 in 4 of 5 runs, packed faster
  // at 12 in 5 of 5 (10: a tie within the noise). Below the crossover DRAM
  // bounds both and the stream kernel skips the f32 panel copy.
  int64_t prefill_min_rows = 12;
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
// amortise the task counter, small enough to balance), the prefill paths at
// one converted W tile. Always in [1, w.n].
int64_t LinearTaskFeatures(int64_t m, const LinearWeight& w, int num_threads, const LinearOptions& options);

// One task's share of a Linear: rows x[r, :k] (row stride ldx) times W's
// features [n_begin, n_end), written to y[r * ldy + j] for n_begin <= j < n_end.
struct LinearSliceArgs {
  const float* x = nullptr;  // [m, ldx] f32, ldx >= w.k
  int64_t ldx = 0;
  int64_t m = 0;
  const float* bias = nullptr;  // [w.n] f32 or nullptr
  int64_t n_begin = 0;
  int64_t n_end = 0;   // <= w.n
  float* y = nullptr;  // [m, ldy] f32, ldy >= n_end
  int64_t ldy = 0;
};

// Computes one slice on the calling thread, by the path ChooseLinearPath(m)
// picks. Arguments must be valid (see ValidateLinear); fails only on oneDNN
// errors (Internal) or memory exhaustion.
absl::Status LinearSlice(const LinearWeight& w, const LinearSliceArgs& args, const LinearOptions& options);

// The row stride to give f32 activations of k features that the stream kernel
// reads: k, or k + 16 when k floats are a multiple of 4 KB, where rows would
// alias in the L1 cache's sets (Mixtral: 4096 and 14336 both are).
int64_t ActivationRowStride(int64_t k);

}  // namespace tandem
