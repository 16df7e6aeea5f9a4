// The dispatch table of the linear-layer kernels, keyed by (weight dtype,
// path, ISA level):
//
//   path       ISA           dtypes          name              what
//   stream     avx2          f32 f16 bf16    avx2_stream       decode GEMV, f32 FMA
//   stream     avx512        f32 f16 bf16    avx512_stream     same, 16 lanes
//   stream     avx512_bf16   bf16            avx512_bf16_stream  vdpbf16ps one W row at a time, x split
//                                                              into bf16 hi + lo (x to 2^-16), 1 row
//   packed     avx2          f32 f16 bf16    avx2_packed       W widened to f32 panels, 6x16 FMA tile
//   packed     avx512        f32 f16 bf16    avx512_packed     W widened to f32 panels, 14x32 FMA tile
//   bf16_dot   avx512_bf16   bf16            avx512_bf16_dot   vdpbf16ps on the stored weights, x in bf16
//   bf16_dot   amx           bf16            amx_bf16_dot      tdpbf16ps tiles, W packed per call into
//                                                              panels of 16 rows of bf16 pairs
//                                                              (linear_amx.cc), x in bf16
//   onednn     avx2          f32 f16 bf16    onednn            W tile widened, oneDNN f32 matmul
//   stream     avx2          q8_0 q4_0 q4_1  q_stream          W rows decoded block by block in L1
//                            q5_0 q4_K q5_K                    (linear_quantized.h), f32 FMA
//                            q6_K
//   packed     avx2, avx512  the same        avx2_q_packed,    W slice decoded once into the f32
//                                            avx512_q_packed   panels of that ISA's packed GEMM
//   int8_dot   avx2          the same        avx2_int8_dot     x quantized to int8 per 32 values,
//              avx512_vnni                   avx512_vnni_int8_dot  integer dot products on W blocks
//                                                              unpacked in registers (Q8_0 Q4_0 Q4_K
//                                                              Q5_K Q6_K; the tile below for Q4_1,
//                                                              Q5_0) (linear_int8_dot.h); from 32
//                                                              rows: the int8 GEMMs below
//   int8_dot   avx2          the same        avx2_int8_gemm    W decoded once into panels of 8 rows
//                                                              side by side, 4 x levels broadcast
//                                                              against 8 rows per instruction
//                                                              (linear_int8_gemm.cc); in a plan only
//                                                              through avx2_int8_dot
//   int8_dot   avx512_vnni   the same        avx512_vnni_int8_gemm  the same with panels of 16 rows,
//                                                              vpdpbusd zmm, scaled per 32 values
//                                                              (linear_avx512_vnni_gemm.cc); in a
//                                                              plan only through avx512_vnni_int8_dot
//   int8_dot   avx2          the same        avx2_int8_tile,   the same on W rows decoded 4 at a time
//              avx512_vnni                   avx512_vnni_int8_tile  into a tile in memory: the fused
//                                                              kernels' reference, never in a plan
//   bf16_dot   avx512_bf16   the same        avx512_bf16_q_dot the slice's W rows dequantized to bf16,
//                                                              then the bf16 dot-product GEMM
//   bf16_dot   amx           the same        amx_q_dot         the same rows, K block by K block,
//                                                              into the AMX GEMM's panels
//
// A call takes the best entry for its (dtype, path) whose ISA the CPU has
// (ActiveIsa(), capped by LinearOptions::max_isa); which path runs at which
// row count is the KernelPlan's (kernel_plan.h). A path a dtype lacks
// resolves to its nearest one: int8_dot for float weights (or with f32
// activations) to stream; bf16_dot below avx512_bf16 and onednn for
// quantized weights to int8_dot (they round x too; with f32 activations to
// packed).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/cpu_features.h"
#include "common/kernels/linear_types.h"

namespace tandem {

enum class KernelPath : uint8_t {
  kStream,   // memory-bound: reads each weight once per call for up to 16 rows
  kPacked,   // compute-bound f32 FMA GEMM on f32 panels of W
  kBf16Dot,  // compute-bound bf16 dot products; rounds x to bf16
  kOneDnn,   // oneDNN's f32 matmul on widened W tiles
  kInt8Dot,  // quantized weights: int8 dot products; rounds x to int8 per 32 (or 256) values
};
inline constexpr KernelPath kAllKernelPaths[] = {KernelPath::kStream, KernelPath::kPacked, KernelPath::kBf16Dot,
                                                 KernelPath::kOneDnn, KernelPath::kInt8Dot};
const char* KernelPathName(KernelPath path);  // "stream", "packed", "bf16_dot", "onednn", "int8_dot"
absl::StatusOr<KernelPath> ParseKernelPath(std::string_view name);

struct LinearKernel {
  KernelPath path;
  IsaLevel isa;             // the instruction-set level it needs
  DType dtype;              // the weight dtype it reads
  const char* name;         // static
  // x is rounded (to bf16, split into bf16 halves, or to int8 blocks)
  // before the products: never with LinearOptions::f32_activations.
  bool rounds_activations;
  // Kernels that read x in a layout of their own prepare it once per call,
  // split into row blocks; all three null otherwise (x read as f32 rows).
  // prepared_bytes 0: at this shape the kernel reads x as f32 rows too.
  int64_t (*prepared_bytes)(int64_t m, int64_t k);
  int64_t (*prepare_blocks)(int64_t m);
  void (*prepare)(const float* x, int64_t ldx, int64_t m, int64_t k, int64_t block_begin, int64_t block_end,
                  void* prepared);
  // Per-task scratch for a slice of `features` output features (0: none).
  int64_t (*scratch_bytes)(const LinearWeight& w, int64_t m, int64_t features);
  // Computes one slice (args.prepared set when the kernel prepares x);
  // `scratch` holds scratch_bytes, 64-byte aligned.
  absl::Status (*slice)(const LinearWeight& w, const LinearSliceArgs& args, void* scratch);
  // For float weights: the most each x value changes, relative to itself,
  // before its products (0: x used as f32; 2^-16: bf16 hi + lo; 2^-8:
  // rounded to bf16). The int8_dot kernels' rounding is per block
  // (linear_int8_dot.h), not a relative bound, and is not counted here.
  double x_relative_error = 0.0;
  // Each output's arithmetic the same at every M (linear.h): false for
  // onednn (it picks its own kernels by M) and the bf16 stream (one row
  // differs from several).
  bool same_at_every_m = true;
  // int8_dot: how many x values share one int8 scale (linear_int8_dot.h):
  // 32, or 256 for the AVX2 K-quant pass.
  int x_block = 32;
};

// Whether the kernel reads x as f32 rows (a.x, a.ldx) for [m, k]: no layout
// of its own, or none at this shape.
inline bool ReadsF32Rows(const LinearKernel& kernel, int64_t m, int64_t k) {
  return kernel.prepare == nullptr || kernel.prepared_bytes(m, k) == 0;
}

// Every entry, in the order of the table above.
std::span<const LinearKernel> AllLinearKernels();
// The entry for (dtype, path) with the highest ISA level <= max_isa (the
// first in table order among entries of that level); null
// when there is none (bf16_dot for f32 weights, or below avx512_bf16).
const LinearKernel* FindLinearKernel(DType dtype, KernelPath path, IsaLevel max_isa);
// The same among the entries that keep x f32 (not rounds_activations): what
// layers with f32 activations run on that path (the AVX-512 stream where
// the bf16 stream is best); null when every entry rounds.
const LinearKernel* FindExactLinearKernel(DType dtype, KernelPath path, IsaLevel max_isa);
// The entry with this name and dtype; null when there is none.
const LinearKernel* FindLinearKernelByName(std::string_view name, DType dtype);

}  // namespace tandem
