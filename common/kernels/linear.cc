// Linear layer: kernel choice, validation, the split into tasks and the
// buffers the kernels use. Legend as in linear.h: M rows, K input features,
// N output features; a "slice" is a range of output features owned by one task.
#include "common/kernels/linear.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/parallel_status.h"
#include "common/base/status_macros.h"
#include "common/kernels/attention_block.h"
#include "common/kernels/linear_amx_gemm.h"

namespace tandem {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

// Each thread's scratch for the slices it computes, grown on demand; null
// when it cannot grow.
void* ThreadScratch(int64_t bytes) {
  thread_local ScratchMemory memory;
  return memory.Reserve(static_cast<size_t>(bytes));
}

IsaLevel UsableIsa(const LinearOptions& options) { return std::min(ActiveIsa(), options.max_isa); }

// The kernel for `path` at `isa`, or the nearest path that has one
// (linear_kernels.h): with f32 activations bf16_dot becomes packed,
// int8_dot stream (as int8_dot does for float weights) and the bf16 stream
// the AVX-512 one; a rounding path a
// quantized dtype lacks here (bf16_dot below avx512_bf16, onednn) becomes
// int8_dot, which rounds too; anything else missing (bf16_dot for f32
// weights or below avx512_bf16) becomes packed, which every dtype has at avx2.
const LinearKernel& ResolveKernel(KernelPath path, DType dtype, IsaLevel isa, bool f32_activations) {
  if (path == KernelPath::kBf16Dot && f32_activations) path = KernelPath::kPacked;
  if (path == KernelPath::kInt8Dot && (f32_activations || !IsQuantized(dtype))) path = KernelPath::kStream;
  const LinearKernel* kernel =
      f32_activations ? FindExactLinearKernel(dtype, path, isa) : FindLinearKernel(dtype, path, isa);
  if (kernel != nullptr) return *kernel;
  if (IsQuantized(dtype) && !f32_activations && (path == KernelPath::kBf16Dot || path == KernelPath::kOneDnn))
    return *FindLinearKernel(dtype, KernelPath::kInt8Dot, isa);
  return *FindLinearKernel(dtype, KernelPath::kPacked, isa);
}

}  // namespace

int64_t LinearWeight::row_bytes() const { return DTypeRowBytes(dtype, k); }
int64_t LinearWeight::bytes() const { return n * row_bytes(); }

const LinearKernel& ChooseLinearKernel(int64_t m, DType dtype, const LinearOptions& options) {
  if (options.kernel != nullptr && options.kernel->dtype == dtype && options.kernel->isa <= ActiveIsa() &&
      !(options.f32_activations && options.kernel->rounds_activations)) {
    return *options.kernel;
  }
  const KernelPlan& plan = options.plan != nullptr ? *options.plan : ProcessKernelPlan();
  return ResolveKernel(plan.PathFor(m, dtype), dtype, UsableIsa(options), options.f32_activations || plan.f32_inputs());
}

BlockOrder PreferredBlockOrder() {
  const LinearKernel& one_row = ChooseLinearKernel(1, DType::kQ4_K, LinearOptions{});
  return one_row.path == KernelPath::kInt8Dot && one_row.isa == IsaLevel::kAvx512Vnni ? BlockOrder::kGroupMajor
                                                                                      : BlockOrder::kGgml;
}

absl::StatusOr<BlockOrder> BlockOrderFromFlag(std::string_view value, std::string_view flag) {
  if (value == "auto") return PreferredBlockOrder();
  if (value == "ggml") return BlockOrder::kGgml;
  if (value == "group_major") return BlockOrder::kGroupMajor;
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(flag), " \"", std::string(value), "\": expected auto, ggml or group_major"));
}

absl::Status ValidateLinear(const float* x, int64_t m, const LinearWeight& w, const float* y,
                            const LinearOptions& options) {
  const std::string shape = absl::StrCat("x [", m, ", ", w.k, "] . W [", w.n, ", ", w.k, "]^T");
  if (m < 0) return absl::InvalidArgumentError(absl::StrCat("Linear: negative rows in ", shape));
  if (w.n < 1 || w.k < 1) return absl::InvalidArgumentError(absl::StrCat("Linear: empty weight in ", shape));
  if (w.data == nullptr) return absl::InvalidArgumentError(absl::StrCat("Linear: null weight data in ", shape));
  if (IsQuantized(w.dtype) && w.k % DTypeBlockSize(w.dtype) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("Linear: ", std::string(DTypeName(w.dtype)), " weight in ", shape,
                                                   ": K is not a whole number of ", DTypeBlockSize(w.dtype),
                                                   "-value blocks"));
  }
  if (FindLinearKernel(w.dtype, KernelPath::kPacked, IsaLevel::kAvx2) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("Linear: no kernel for ", std::string(DTypeName(w.dtype)), " weights in ", shape));
  }
  if (m > 0 && (x == nullptr || y == nullptr))
    return absl::InvalidArgumentError(absl::StrCat("Linear: null x or y in ", shape));
  if (options.kernel != nullptr && options.kernel->isa > ActiveIsa()) {
    return absl::FailedPreconditionError(
        absl::StrCat("Linear: kernel ", options.kernel->name, ": ", IsaUnavailableReason(options.kernel->isa)));
  }
  return absl::OkStatus();
}

// Stream path: ~256 KB of weights per task keeps the hardware prefetcher on
// long runs and makes the atomic task counter noise. int8_dot (quantized
// decode): ~1 MB, because its kernel prefetches one pass ahead within its
// slice, so each task starts cold and its last pass prefetches rows that
// are not its own (task sizes alternating call by call on one expert: 1 MB
// faster than 256 KB, 2 and 4 MB no faster and less even;
// docs/BENCHMARKS.md, Decode GEMV). Packed paths: up to
// 128 features whose f32 panels fit 4 MB. bf16_dot: 120 features (ten
// 12-feature register tiles), whose K block of W (120 x 512 B) and f32
// accumulators stay in L2; at amx as many as keep their bf16 rows in L2
// (AmxTaskFeatures). oneDNN: a W tile of 256 rows. All shrink so every
// thread gets >= 4 tasks, which lets dynamic scheduling even out a slow core.
int64_t LinearTaskFeatures(int64_t m, const LinearWeight& w, int num_threads, const LinearKernel& kernel) {
  constexpr int64_t kStreamTaskBytes = 256 << 10;
  constexpr int64_t kStreamBlock = 8;
  constexpr int64_t kOneDnnTileRows = 256;
  constexpr int64_t kPackedTaskFeatures = 128;
  constexpr int64_t kPackedSliceBytes = 4 << 20;
  constexpr int64_t kDotTile = 12;
  constexpr int64_t kDotTaskFeatures = 120;
  constexpr int64_t kAmxTile = 32;
  constexpr int64_t kInt8TaskBytes = 1 << 20;
  constexpr int64_t kInt8Tile = 4;
  const int64_t threads = std::max(num_threads, 1);
  const int64_t per_thread = 4 * threads;
  int64_t features = 1;
  switch (kernel.path) {
    case KernelPath::kStream: {
      features = RoundUp(CeilDiv(kStreamTaskBytes, w.row_bytes()), kStreamBlock);
      if (threads > 1) features = std::min(features, RoundUp(CeilDiv(w.n, per_thread), kStreamBlock));
      break;
    }
    case KernelPath::kPacked: {
      const int64_t panel = kernel.isa >= IsaLevel::kAvx512 ? 32 : 16;
      features = std::clamp<int64_t>((kPackedSliceBytes / (w.k * 4)) / panel * panel, panel, kPackedTaskFeatures);
      if (threads > 1) features = std::min(features, RoundUp(CeilDiv(w.n, per_thread), panel));
      break;
    }
    case KernelPath::kBf16Dot:
      if (kernel.isa >= IsaLevel::kAmx) {  // whole pairs of 16-row tiles
        features = AmxTaskFeatures(w.k);
        if (threads > 1) features = std::min(features, RoundUp(CeilDiv(w.n, per_thread), kAmxTile));
        break;
      }
      features = kDotTaskFeatures;
      if (threads > 1) features = std::min(features, RoundUp(CeilDiv(w.n, per_thread), kDotTile));
      break;
    case KernelPath::kInt8Dot:  // as stream, in whole 4-feature tiles of ~1 MB
      features = RoundUp(CeilDiv(kInt8TaskBytes, w.row_bytes()), kInt8Tile);
      if (threads > 1) features = std::min(features, RoundUp(CeilDiv(w.n, per_thread), kInt8Tile));
      break;
    case KernelPath::kOneDnn:
      features = kOneDnnTileRows;
      if (threads > 1) features = std::min(features, RoundUp(CeilDiv(w.n, per_thread), 16));
      break;
  }
  return std::clamp<int64_t>(features, 1, std::max<int64_t>(w.n, 1));
}

int64_t PreparedInputBytes(const LinearKernel& kernel, int64_t m, int64_t k) {
  return kernel.prepare == nullptr || m == 0 ? 0 : kernel.prepared_bytes(m, k);
}

absl::Status PrepareInputInto(const LinearKernel& kernel, const float* x, int64_t ldx, int64_t m, int64_t k,
                              ThreadPool* pool, void* out) {
  if (PreparedInputBytes(kernel, m, k) == 0) return absl::OkStatus();
  auto prepare = [&](int64_t block) {
    kernel.prepare(x, ldx, m, k, block, block + 1, out);
    return absl::OkStatus();
  };
  return ParallelTasks(pool, kernel.prepare_blocks(m), prepare);
}

absl::Status PreparedInput::Prepare(const LinearKernel& kernel, const float* x, int64_t ldx, int64_t m, int64_t k,
                                    ThreadPool* pool) {
  const int64_t bytes = PreparedInputBytes(kernel, m, k);
  if (bytes == 0) return absl::OkStatus();
  if (bytes_.Reserve(static_cast<size_t>(bytes)) == nullptr)
    return absl::ResourceExhaustedError(
        absl::StrCat("no memory for x [", m, ", ", k, "] in ", kernel.name, "'s layout (", bytes, " bytes)"));
  return PrepareInputInto(kernel, x, ldx, m, k, pool, bytes_.data());
}

absl::Status LinearSlice(const LinearKernel& kernel, const LinearWeight& w, const LinearSliceArgs& args) {
  if (args.m == 0 || args.n_begin >= args.n_end) return absl::OkStatus();
  const int64_t bytes = kernel.scratch_bytes(w, args.m, args.n_end - args.n_begin);
  void* scratch = nullptr;
  if (bytes > 0) {
    scratch = ThreadScratch(bytes);
    if (scratch == nullptr)
      return absl::ResourceExhaustedError(absl::StrCat("no memory for ", kernel.name, "'s scratch for W [",
                                                       args.n_end - args.n_begin, ", ", w.k, "] (", bytes, " bytes)"));
  }
  return kernel.slice(w, args, scratch);
}

int64_t ActivationRowStride(int64_t k) {
  // 4 KB is the L1 set period on x86 (64 sets x 64 B); one extra line per row.
  return (k * static_cast<int64_t>(sizeof(float))) % 4096 == 0 ? k + 16 : k;
}

std::string DescribeKernelChoice(DType dtype, const LinearOptions& options) {
  if (FindLinearKernel(dtype, KernelPath::kPacked, IsaLevel::kAvx2) == nullptr) {
    return absl::StrCat("none (", std::string(DTypeName(dtype)), " weights have no CPU kernel)");
  }
  const KernelPlan& plan = options.plan != nullptr ? *options.plan : ProcessKernelPlan();
  // The kernel at each step's first row count; steps that resolve to the
  // same kernel for this dtype (packed and bf16_dot for Q4_K below
  // avx512_bf16 are both int8_dot) read as one range.
  struct Range {
    int64_t first;
    const LinearKernel* kernel;
  };
  std::vector<Range> ranges;
  for (const KernelPlanStep& step : plan.StepsFor(dtype)) {
    const LinearKernel* kernel = &ChooseLinearKernel(step.min_rows, dtype, options);
    if (ranges.empty() || ranges.back().kernel != kernel) ranges.push_back({step.min_rows, kernel});
  }
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const int64_t first = ranges[i].first;
    const std::string range = i + 1 == ranges.size()             ? absl::StrCat(first, "+")
                              : ranges[i + 1].first - 1 == first ? absl::StrCat(first)
                                                                 : absl::StrCat(first, "-", ranges[i + 1].first - 1);
    parts.push_back(absl::StrCat(range, " rows ", ranges[i].kernel->name));
  }
  return absl::StrJoin(parts, ", ");
}

std::string KernelStartupSummary(DType dtype) {
  const KernelPlan& plan = ProcessKernelPlan();
  return absl::StrCat("cpu ", HostCpu().Description(), " [", HostCpu().Flags(), "]; kernels at ",
                      ActiveIsaDescription(), "; plan ", plan.Spec(), " (", plan.source(),
                      "): ", std::string(DTypeName(dtype)), " weights ", DescribeKernelChoice(dtype), "; ",
                      DescribeAttentionKernels());
}

absl::Status Linear(const float* x, int64_t m, const LinearWeight& w, const float* bias, float* y, ThreadPool* pool,
                    const LinearOptions& options) {
  const LinearProduct product{.w = &w, .bias = bias, .y = y};
  return LinearShared(x, m, std::span<const LinearProduct>(&product, 1), pool, options);
}

namespace {

absl::Status ValidateShared(const float* x, int64_t m, std::span<const LinearProduct> products,
                            const LinearOptions& options) {
  if (products.empty() || products.size() > kMaxSharedProducts) {
    return absl::InvalidArgumentError(
        absl::StrCat("LinearShared: ", products.size(), " weights; 1 to ", kMaxSharedProducts, " share one x"));
  }
  for (size_t i = 0; i < products.size(); ++i) {
    if (products[i].w == nullptr)
      return absl::InvalidArgumentError(absl::StrCat("LinearShared: weight ", i, " is null"));
    TANDEM_RETURN_IF_ERROR(ValidateLinear(x, m, *products[i].w, products[i].y, options));
    if (products[i].w->k != products[0].w->k) {
      return absl::InvalidArgumentError(absl::StrCat("LinearShared: weight ", i, " has K = ", products[i].w->k,
                                                     ", weight 0 K = ", products[0].w->k, "; they must read one x"));
    }
  }
  return absl::OkStatus();
}

// x [m, k] copied with rows ActivationRowStride(k) apart into `padded`.
absl::Status PadRows(const float* x, int64_t m, int64_t k, ScratchArray<float>& padded) {
  const int64_t ldx = ActivationRowStride(k);
  TANDEM_RETURN_IF_ERROR(padded.Grow(m * ldx, absl::StrCat("a copy of x [", m, ", ", k, "] with padded rows")));
  for (int64_t r = 0; r < m; ++r) std::memcpy(padded.data() + r * ldx, x + r * k, k * sizeof(float));
  return absl::OkStatus();
}

}  // namespace

absl::Status LinearShared(const float* x, int64_t m, std::span<const LinearProduct> products, ThreadPool* pool,
                          const LinearOptions& options) {
  TANDEM_RETURN_IF_ERROR(ValidateShared(x, m, products, options));
  if (m == 0) return absl::OkStatus();
  const int64_t k = products[0].w->k;
  const int threads = pool == nullptr ? 1 : pool->num_threads();
  // Per W: its kernel, its x, how many features a task owns, its first task.
  struct Part {
    const LinearKernel* kernel;
    LinearSliceArgs args;
    int64_t features, first_task;
  };
  std::array<Part, kMaxSharedProducts> parts;
  thread_local std::array<PreparedInput, kMaxSharedProducts> prepared;
  thread_local ScratchArray<float> padded_x;
  bool padded = false;
  int64_t tasks = 0, total_bytes = 0;
  for (const LinearProduct& p : products) total_bytes += p.w->bytes();
  for (size_t i = 0; i < products.size(); ++i) {
    const LinearWeight& w = *products[i].w;
    const LinearKernel& kernel = ChooseLinearKernel(m, w.dtype, options);
    LinearSliceArgs args{.x = x, .ldx = k, .m = m, .bias = products[i].bias, .y = products[i].y, .ldy = w.n};
    if (!ReadsF32Rows(kernel, m, k)) {
      // A layout an earlier W's kernel made is the same bytes: reuse it.
      for (size_t j = 0; j < i && args.prepared == nullptr; ++j)
        if (parts[j].kernel->prepare == kernel.prepare) args.prepared = parts[j].args.prepared;
      if (args.prepared == nullptr) {
        TANDEM_RETURN_IF_ERROR(prepared[i].Prepare(kernel, x, k, m, k, pool));
        args.prepared = prepared[i].data();
      }
    } else if (m > 1 && kernel.path != KernelPath::kOneDnn && ActivationRowStride(k) != k) {
      // Rows of x a multiple of 4 KB apart share L1 sets with each other and
      // with the W rows; the stream and packed kernels keep several rows of x
      // in flight, so they read a copy whose rows are one line apart in set terms.
      if (!padded) TANDEM_RETURN_IF_ERROR(PadRows(x, m, k, padded_x));
      padded = true;
      args.x = padded_x.data();
      args.ldx = ActivationRowStride(k);
    }
    // Each W is split for its share of the threads: the tasks of all of
    // them balance the threads together.
    const int share = static_cast<int>(std::max<int64_t>(1, threads * w.bytes() / total_bytes));
    parts[i] = {&kernel, args, LinearTaskFeatures(m, w, share, kernel), tasks};
    tasks += CeilDiv(w.n, parts[i].features);
  }
  return ParallelTasks(pool, tasks, [&](int64_t task) {
    size_t i = products.size() - 1;
    while (task < parts[i].first_task) --i;
    LinearSliceArgs args = parts[i].args;
    args.n_begin = (task - parts[i].first_task) * parts[i].features;
    args.n_end = std::min(args.n_begin + parts[i].features, products[i].w->n);
    return LinearSlice(*parts[i].kernel, *products[i].w, args);
  });
}

}  // namespace tandem
