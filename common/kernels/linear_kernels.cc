#include "common/kernels/linear_kernels.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/kernels/linear_amx_gemm.h"
#include "common/kernels/linear_int8_dot.h"
#include "common/kernels/linear_isa.h"
#include "common/kernels/linear_onednn.h"
#include "common/kernels/linear_quantized.h"

namespace tandem {
namespace {

using SliceFn = absl::Status (*)(const LinearWeight&, const LinearSliceArgs&, void*);
using ScratchFn = int64_t (*)(const LinearWeight&, int64_t, int64_t);

// Adapters from the ISA translation units' plain functions to the table's
// signatures; they live here, in baseline code.
template <void (*kFn)(const LinearWeight&, const LinearSliceArgs&)>
absl::Status NoScratch(const LinearWeight& w, const LinearSliceArgs& a, void*) {
  kFn(w, a);
  return absl::OkStatus();
}
template <void (*kFn)(const LinearWeight&, const LinearSliceArgs&, void*)>
absl::Status WithScratch(const LinearWeight& w, const LinearSliceArgs& a, void* scratch) {
  kFn(w, a, scratch);
  return absl::OkStatus();
}
absl::Status OneDnn(const LinearWeight& w, const LinearSliceArgs& a, void*) { return OneDnnSlice(w, a); }

int64_t NoScratchBytes(const LinearWeight&, int64_t, int64_t) { return 0; }
int64_t Avx2PackedBytes(const LinearWeight& w, int64_t, int64_t features) {
  return isa::Avx2PackedScratchBytes(w.k, features);
}
int64_t Avx512PackedBytes(const LinearWeight& w, int64_t, int64_t features) {
  return isa::Avx512PackedScratchBytes(w.k, features);
}
int64_t Bf16DotBytes(const LinearWeight&, int64_t m, int64_t features) { return isa::Bf16DotScratchBytes(m, features); }

constexpr LinearKernel Plain(KernelPath path, IsaLevel isa, DType dtype, const char* name, ScratchFn scratch,
                             SliceFn slice) {
  return LinearKernel{path,    isa,     dtype,   name,  false, nullptr,
                      nullptr, nullptr, scratch, slice, 0.0,   path != KernelPath::kOneDnn};
}

std::vector<LinearKernel> FloatEntries() {
  using P = KernelPath;
  using I = IsaLevel;
  using D = DType;
  return {
      Plain(P::kStream, I::kAvx2, D::kF32, "avx2_stream", NoScratchBytes, NoScratch<isa::Avx2StreamF32>),
      Plain(P::kStream, I::kAvx2, D::kF16, "avx2_stream", NoScratchBytes, NoScratch<isa::Avx2StreamF16>),
      Plain(P::kStream, I::kAvx2, D::kBF16, "avx2_stream", NoScratchBytes, NoScratch<isa::Avx2StreamBf16>),
      Plain(P::kStream, I::kAvx512, D::kF32, "avx512_stream", NoScratchBytes, NoScratch<isa::Avx512StreamF32>),
      Plain(P::kStream, I::kAvx512, D::kF16, "avx512_stream", NoScratchBytes, NoScratch<isa::Avx512StreamF16>),
      Plain(P::kStream, I::kAvx512, D::kBF16, "avx512_stream", NoScratchBytes, NoScratch<isa::Avx512StreamBf16>),
      LinearKernel{P::kStream, I::kAvx512Bf16, D::kBF16, "avx512_bf16_stream", true, isa::Bf16StreamPreparedBytes,
                   isa::Bf16StreamRowBlocks, isa::Bf16StreamPrepare, NoScratchBytes, NoScratch<isa::Bf16StreamBf16>,
                   0x1p-16, false},
      Plain(P::kPacked, I::kAvx2, D::kF32, "avx2_packed", Avx2PackedBytes, WithScratch<isa::Avx2PackedF32>),
      Plain(P::kPacked, I::kAvx2, D::kF16, "avx2_packed", Avx2PackedBytes, WithScratch<isa::Avx2PackedF16>),
      Plain(P::kPacked, I::kAvx2, D::kBF16, "avx2_packed", Avx2PackedBytes, WithScratch<isa::Avx2PackedBf16>),
      Plain(P::kPacked, I::kAvx512, D::kF32, "avx512_packed", Avx512PackedBytes, WithScratch<isa::Avx512PackedF32>),
      Plain(P::kPacked, I::kAvx512, D::kF16, "avx512_packed", Avx512PackedBytes, WithScratch<isa::Avx512PackedF16>),
      Plain(P::kPacked, I::kAvx512, D::kBF16, "avx512_packed", Avx512PackedBytes, WithScratch<isa::Avx512PackedBf16>),
      LinearKernel{P::kBf16Dot, I::kAvx512Bf16, D::kBF16, "avx512_bf16_dot", true, isa::Bf16DotPreparedBytes,
                   isa::Bf16DotRowBlocks, isa::Bf16DotPrepare, Bf16DotBytes, WithScratch<isa::Bf16DotBf16>, 0x1p-8},
      LinearKernel{P::kBf16Dot, I::kAmx, D::kBF16, "amx_bf16_dot", true, isa::AmxPreparedBytes, isa::AmxRowBlocks,
                   isa::AmxPrepare, AmxBf16ScratchBytes, AmxBf16Slice, 0x1p-8},
      Plain(P::kOneDnn, I::kAvx2, D::kF32, "onednn", NoScratchBytes, OneDnn),
      Plain(P::kOneDnn, I::kAvx2, D::kF16, "onednn", NoScratchBytes, OneDnn),
      Plain(P::kOneDnn, I::kAvx2, D::kBF16, "onednn", NoScratchBytes, OneDnn),
  };
}

// Block-quantized weights (linear_quantized.h, linear_int8_dot.h): stream,
// packed at AVX2 and AVX-512, int8_dot at AVX2 and AVX512-VNNI.
std::vector<LinearKernel> QuantizedEntries() {
  std::vector<LinearKernel> entries;
  for (DType dtype : kQuantizedDTypes) {
    entries.push_back(
        Plain(KernelPath::kStream, IsaLevel::kAvx2, dtype, "q_stream", NoScratchBytes, QuantizedStreamSlice));
    entries.push_back(Plain(KernelPath::kPacked, IsaLevel::kAvx2, dtype, "avx2_q_packed",
                            QuantizedAvx2PackedScratchBytes, QuantizedAvx2PackedSlice));
    entries.push_back(Plain(KernelPath::kPacked, IsaLevel::kAvx512, dtype, "avx512_q_packed",
                            QuantizedAvx512PackedScratchBytes, QuantizedAvx512PackedSlice));
    // The 256-value types' x: for the AVX2 pass one scale per block (it sums
    // a block in int32), for the fused VNNI pass group-major (linear_isa.h;
    // Q3_K, Q2_K and IQ4_XS, which the VNNI entry runs on the AVX2 pass,
    // keep one scale per block there too).
    const bool k_quant = dtype == DType::kQ4_K || dtype == DType::kQ5_K || dtype == DType::kQ6_K;
    const bool super_block = k_quant || dtype == DType::kQ3_K || dtype == DType::kQ2_K || dtype == DType::kIQ4_XS;
    LinearKernel avx2{KernelPath::kInt8Dot,
                      IsaLevel::kAvx2,
                      dtype,
                      "avx2_int8_dot",
                      true,
                      Int8DotPreparedBytes,
                      Int8DotPrepareBlocks,
                      super_block ? Int8DotPrepareSuperBlocks : Int8DotPrepare,
                      Avx2Int8DotScratchBytes,
                      Avx2Int8DotSlice};
    avx2.x_block = super_block ? 256 : 32;
    avx2.same_at_every_m = false;  // the int8 GEMM from kInt8GemmMinRows rows sums in another order
    entries.push_back(avx2);
    LinearKernel vnni{KernelPath::kInt8Dot,
                      IsaLevel::kAvx512Vnni,
                      dtype,
                      "avx512_vnni_int8_dot",
                      true,
                      Int8DotPreparedBytes,
                      Int8DotPrepareBlocks,
                      k_quant       ? Int8DotPrepareGroupMajor
                      : super_block ? Int8DotPrepareSuperBlocks
                                    : Int8DotPrepare,
                      Avx512VnniInt8DotScratchBytes,
                      Avx512VnniInt8DotSlice};
    vnni.x_block = super_block && !k_quant ? 256 : 32;
    vnni.same_at_every_m = false;  // the VNNI GEMM from kInt8GemmMinRows rows sums in another order
    entries.push_back(vnni);
    // The tile path alone, after the fused entries of the same level so a
    // plan never picks it; tests and tandem-expert-ffn-bench's compare pass
    // run it beside them.
    entries.push_back(LinearKernel{KernelPath::kInt8Dot, IsaLevel::kAvx2, dtype, "avx2_int8_tile", true,
                                   Int8DotPreparedBytes, Int8DotPrepareBlocks, Int8DotPrepare, Int8DotScratchBytes,
                                   Avx2Int8TileSlice});
    entries.push_back(LinearKernel{KernelPath::kInt8Dot, IsaLevel::kAvx2, dtype, "avx2_int8_gemm", true,
                                   Int8DotPreparedBytes, Int8DotPrepareBlocks, Int8DotPrepare, Int8GemmScratchBytes,
                                   Avx2Int8GemmSlice});
    entries.push_back(LinearKernel{KernelPath::kInt8Dot, IsaLevel::kAvx512Vnni, dtype, "avx512_vnni_int8_gemm", true,
                                   Int8DotPreparedBytes, Int8DotPrepareBlocks,
                                   k_quant ? Int8DotPrepareGroupMajor : Int8DotPrepare, VnniInt8GemmScratchBytes,
                                   Avx512VnniInt8GemmSlice});
    entries.push_back(LinearKernel{KernelPath::kInt8Dot, IsaLevel::kAvx512Vnni, dtype, "avx512_vnni_int8_tile", true,
                                   Int8DotPreparedBytes, Int8DotPrepareBlocks, Int8DotPrepare, Int8DotScratchBytes,
                                   Avx512VnniInt8TileSlice});
    entries.push_back(LinearKernel{KernelPath::kBf16Dot, IsaLevel::kAvx512Bf16, dtype, "avx512_bf16_q_dot", true,
                                   isa::Bf16DotPreparedBytes, isa::Bf16DotRowBlocks, isa::Bf16DotPrepare,
                                   QuantizedBf16DotScratchBytes, QuantizedBf16DotSlice, 0x1p-8});
    entries.push_back(LinearKernel{KernelPath::kBf16Dot, IsaLevel::kAmx, dtype, "amx_q_dot", true,
                                   isa::AmxPreparedBytes, isa::AmxRowBlocks, isa::AmxPrepare, QuantizedAmxScratchBytes,
                                   QuantizedAmxSlice, 0x1p-8});
  }
  return entries;
}

const std::vector<LinearKernel>& Table() {
  static const std::vector<LinearKernel> table = [] {
    std::vector<LinearKernel> all = FloatEntries();
    for (const LinearKernel& kernel : QuantizedEntries()) all.push_back(kernel);
    return all;
  }();
  return table;
}

}  // namespace

const char* KernelPathName(KernelPath path) {
  switch (path) {
    case KernelPath::kStream: return "stream";
    case KernelPath::kPacked: return "packed";
    case KernelPath::kBf16Dot: return "bf16_dot";
    case KernelPath::kOneDnn: return "onednn";
    case KernelPath::kInt8Dot: return "int8_dot";
  }
  return "?";
}

absl::StatusOr<KernelPath> ParseKernelPath(std::string_view name) {
  std::vector<std::string> names;
  for (KernelPath path : kAllKernelPaths) {
    if (name == KernelPathName(path)) return path;
    names.push_back(KernelPathName(path));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown kernel path \"", std::string(name), "\"; expected one of ", absl::StrJoin(names, ", ")));
}

std::span<const LinearKernel> AllLinearKernels() { return Table(); }

namespace {

const LinearKernel* FindBest(DType dtype, KernelPath path, IsaLevel max_isa, bool exact) {
  const LinearKernel* best = nullptr;
  for (const LinearKernel& kernel : Table()) {
    if (kernel.dtype != dtype || kernel.path != path || kernel.isa > max_isa) continue;
    if (exact && kernel.rounds_activations) continue;
    if (best == nullptr || kernel.isa > best->isa) best = &kernel;
  }
  return best;
}

}  // namespace

const LinearKernel* FindLinearKernel(DType dtype, KernelPath path, IsaLevel max_isa) {
  return FindBest(dtype, path, max_isa, /*exact=*/false);
}

const LinearKernel* FindExactLinearKernel(DType dtype, KernelPath path, IsaLevel max_isa) {
  return FindBest(dtype, path, max_isa, /*exact=*/true);
}

const LinearKernel* FindLinearKernelByName(std::string_view name, DType dtype) {
  for (const LinearKernel& kernel : Table())
    if (std::string_view(kernel.name) == name && kernel.dtype == dtype) return &kernel;
  return nullptr;
}

}  // namespace tandem
