// The arithmetic peak of the instructions the kernels use, measured: a
// register-only loop of independent FMA (or bf16 dot-product) chains on
// every thread of a pool. Benchmarks report GEMM efficiency against the peak
// of the instruction their kernel uses, measured in the same run.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/base/cpu_features.h"
#include "common/base/thread_pool.h"
#include "common/kernels/linear_kernels.h"

namespace tandem {

enum class PeakInstruction : uint8_t {
  kAvx2Fma,    // vfmadd231ps ymm: 16 flops
  kAvx512Fma,  // vfmadd231ps zmm: 32 flops
  kBf16Dot,    // vdpbf16ps zmm: 64 flops (32 bf16 products and their sums)
  kVnniDot,    // vpdpbusd zmm: 128 int8 ops (64 products and their sums)
  kAmxBf16,    // tdpbf16ps 16 x 16 x 32: 16384 flops
};
// "avx2_fma", "avx512_fma", "avx512_bf16_dot", "avx512_vnni_dot", "amx_bf16"
const char* PeakInstructionName(PeakInstruction instruction);
IsaLevel PeakInstructionIsa(PeakInstruction instruction);
// The instruction whose peak bounds `kernel` (oneDNN: the widest FMA it may
// use at ActiveIsa()).
PeakInstruction PeakInstructionOf(const LinearKernel& kernel);

struct ComputePeakOptions {
  int64_t flops_per_task = int64_t{1} << 28;  // ~1 ms per task on one core
  int tasks_per_thread = 16;
  int reps = 3;  // the best rep is reported
};

struct ComputePeak {
  PeakInstruction instruction = PeakInstruction::kAvx2Fma;
  double gflops = 0;
  int threads = 0;
};

// FailedPrecondition naming the missing flags when ActiveIsa() lacks the
// instruction. `pool` null: one thread.
absl::StatusOr<ComputePeak> MeasureComputePeak(PeakInstruction instruction, ThreadPool* pool,
                                               const ComputePeakOptions& options = {});

}  // namespace tandem
