// Linear layer on the CPU: y[M,N] = x[M,K] . W[N,K]^T (+ bias[N]).
//
// Legend: M rows (tokens), K input features, N output features.
// x: [M, K] f32, row stride K.   W: [N, K] in F32, F16, BF16 or a ggml block
// type (Q8_0 ... Q6_K, K whole blocks), row-major as Hugging Face stores
// nn.Linear weights.   y: [M, N] f32, row stride N.
// bias: [N] f32 or nullptr.  Accumulation is f32.
// Supported: any M >= 0, N >= 1, K >= 1 (tails are handled), x/W/y need no
// particular alignment. Needs AVX2 + FMA + F16C (the build's baseline).
//
// Kernels (linear_kernels.h): per call, the process's KernelPlan (or the
// options') picks a path by M — stream (memory-bound decode), packed (f32
// FMA GEMM), bf16_dot (bf16 dot products) or onednn — and the dispatch
// table the fastest variant of that path the CPU supports (AVX2, AVX-512,
// AVX512-BF16). All split N across the pool's threads (dynamic scheduling).
//
// Numerics. stream, packed, onednn: products and sums in f32, weights
// widened exactly: |y - y_exact| <= (K + 2) 2^-24 sum_k |x_k w_k|. bf16_dot
// rounds x to bf16 (8 significant bits) first, as llama.cpp and GPU bf16
// GEMMs do: add 2^-8 sum_k |x_k w_k| to that bound; the bf16 stream
// (avx512_bf16_stream) splits x into bf16 hi + lo: add 2^-16. LinearOptions::
// f32_activations keeps a layer off both (the router: ARCHITECTURE.md,
// "Precision"). Quantized weights (linear_int8_dot.h): int8_dot rounds x to
// int8 per 32-value block (add sum_i |w_i| max_block|x| / 254), their
// bf16_dot rounds x and W to bf16 (add 2^-8 sum_k |x_k w_k|); stream and
// packed (the exact plan) compute with the dequantized W and f32 x.
// Each output's arithmetic depends only on its x row, its W row and the
// kernel (not on M, the split or the thread count), for every kernel but
// onednn, which picks its own kernels by M, and the bf16 stream, whose
// one-row calls take vdpbf16ps and others the f32 stream
// (LinearKernel::same_at_every_m); neither depends on the split.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/cpu_features.h"
#include "common/base/dtype.h"
#include "common/base/scratch_memory.h"
#include "common/base/thread_pool.h"
#include "common/kernels/kernel_plan.h"
#include "common/kernels/linear_kernels.h"
#include "common/kernels/linear_types.h"

namespace tandem {

struct LinearOptions {
  // Which path at which M; null: the process's plan (ProcessKernelPlan()).
  const KernelPlan* plan = nullptr;
  // Kernels of at most this level (and at most ActiveIsa()): tests and
  // benches run each ISA's variants on one machine.
  IsaLevel max_isa = IsaLevel::kAmx;
  // Never round x to bf16 (no bf16_dot): layers whose inputs must stay f32.
  bool f32_activations = false;
  // Forces this kernel when it reads the weight's dtype (tests, benches);
  // a kernel above ActiveIsa() makes Linear fail with FailedPrecondition.
  const LinearKernel* kernel = nullptr;
};

// Thread-safe for distinct outputs; uses `pool` (may be null: single thread).
absl::Status Linear(const float* x, int64_t m, const LinearWeight& w, const float* bias, float* y, ThreadPool* pool,
                    const LinearOptions& options = {});

// One W of a LinearShared call: y [m, w.n] = x W^T + bias.
struct LinearProduct {
  const LinearWeight* w = nullptr;
  const float* bias = nullptr;  // [w.n] or null
  float* y = nullptr;           // [m, w.n]
};

// Several W that read the same x [m, K] (attention's q, k and v) in one
// dispatch: x is put in each kernel's layout once, and the tasks of every W
// share one ParallelTasks, so the pool is waited on once, not once per W,
// and a small W's few tasks do not end in an idle tail of their own. At most
// kMaxSharedProducts, all with the same K. Linear is the one-W case.
// Thread-safe for distinct outputs; uses `pool` (may be null).
inline constexpr size_t kMaxSharedProducts = 4;
absl::Status LinearShared(const float* x, int64_t m, std::span<const LinearProduct> products, ThreadPool* pool,
                          const LinearOptions& options = {});

// ---- Building blocks for fused callers (the expert FFN) and benchmarks ----

// The kernel a call with M rows of `dtype` weights runs under `options`.
// `dtype` must be a float type (ValidateLinear checks it).
const LinearKernel& ChooseLinearKernel(int64_t m, DType dtype, const LinearOptions& options);

// Checks shapes and pointers of one Linear call (InvalidArgument otherwise),
// and that a forced kernel may run here (FailedPrecondition).
absl::Status ValidateLinear(const float* x, int64_t m, const LinearWeight& w, const float* y,
                            const LinearOptions& options = {});

// How many output features one parallel task should own: the stream paths
// aim at a few hundred KB (bf16) to ~1 MB (quantized) of weights per task
// (enough to amortise the task counter and each task's cold start, small
// enough to balance), the GEMM paths at one cache-sized tile
// of W. Always in [1, w.n].
int64_t LinearTaskFeatures(int64_t m, const LinearWeight& w, int num_threads, const LinearKernel& kernel);

// Bytes x [m, k] takes in `kernel`'s own layout: 0 when the kernel reads x
// as f32 rows (no prepare step, or none at this shape).
int64_t PreparedInputBytes(const LinearKernel& kernel, int64_t m, int64_t k);
// Puts x [m, k] (row stride ldx) in `kernel`'s layout at `out` (at least
// PreparedInputBytes, 64-byte aligned), split over `pool`; nothing when the
// kernel needs no preparation. For callers that keep several prepared
// inputs in one buffer of their own (ExpertFfn's batches).
absl::Status PrepareInputInto(const LinearKernel& kernel, const float* x, int64_t ldx, int64_t m, int64_t k,
                              ThreadPool* pool, void* out);

// x in a kernel's own layout (kernels with a prepare step); owns its bytes,
// reused across calls. Not thread-safe.
class PreparedInput {
 public:
  const void* data() const { return bytes_.data(); }
  // Prepares x [m, k] (row stride ldx) for `kernel`, split over `pool`; a
  // kernel without a prepare step leaves it empty. ResourceExhausted when
  // the buffer cannot grow.
  absl::Status Prepare(const LinearKernel& kernel, const float* x, int64_t ldx, int64_t m, int64_t k, ThreadPool* pool);

 private:
  ScratchMemory bytes_;
};

// Computes one slice on the calling thread with `kernel` (args.prepared set
// when the kernel prepares x). Arguments must be valid (see ValidateLinear);
// fails only on oneDNN errors (Internal) or memory exhaustion.
absl::Status LinearSlice(const LinearKernel& kernel, const LinearWeight& w, const LinearSliceArgs& args);

// What runs for `dtype` weights under the process plan and ActiveIsa(),
// e.g. "1-15 rows avx512_stream, 16+ avx512_bf16_dot" (for start-up logs,
// stats and bench output).
std::string DescribeKernelChoice(DType dtype, const LinearOptions& options = {});

// The order a process should put the Q4_K/Q6_K blocks it copies in
// (dtype.h, common/quant/block_order.h): group-major when its plan decodes
// one row of Q4_K with the AVX512-VNNI int8_dot GEMV, which reads that
// order without shuffles; ggml's otherwise (an AVX2 CPU, or a plan that
// sends one row elsewhere), where group-major would only cost decoding.
BlockOrder PreferredBlockOrder();
// The value of a --block_order flag: "auto" (PreferredBlockOrder), "ggml"
// or "group_major"; InvalidArgument naming `flag` otherwise. Call it after
// the ISA cap and the kernel plan are set (auto asks the plan).
absl::StatusOr<BlockOrder> BlockOrderFromFlag(std::string_view value, std::string_view flag);

// One line for start-up logs and stats: the CPU, the level the kernels run
// at, the plan and what it runs for `dtype` weights, e.g. "cpu Oxide ...;
// kernels at avx512_bf16 (host avx512_bf16); plan 1:stream,8:bf16_dot
// (built-in for avx512_bf16): BF16 1-7 rows avx512_stream, 8+ avx512_bf16_dot".
std::string KernelStartupSummary(DType dtype);

// The row stride to give f32 activations of k features that the stream and
// packed kernels read: k, or k + 16 when k floats are a multiple of 4 KB,
// where rows would alias in the L1 cache's sets (Mixtral: 4096 and 14336).
int64_t ActivationRowStride(int64_t k);

}  // namespace tandem
