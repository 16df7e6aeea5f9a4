#include "common/kernels/compute_peak.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/kernels/linear_isa.h"

namespace tandem {

const char* PeakInstructionName(PeakInstruction instruction) {
  switch (instruction) {
    case PeakInstruction::kAvx2Fma: return "avx2_fma";
    case PeakInstruction::kAvx512Fma: return "avx512_fma";
    case PeakInstruction::kBf16Dot: return "avx512_bf16_dot";
    case PeakInstruction::kVnniDot: return "avx512_vnni_dot";
    case PeakInstruction::kAmxBf16: return "amx_bf16";
  }
  return "?";
}

IsaLevel PeakInstructionIsa(PeakInstruction instruction) {
  switch (instruction) {
    case PeakInstruction::kAvx2Fma: return IsaLevel::kAvx2;
    case PeakInstruction::kAvx512Fma: return IsaLevel::kAvx512;
    case PeakInstruction::kBf16Dot: return IsaLevel::kAvx512Bf16;
    case PeakInstruction::kVnniDot: return IsaLevel::kAvx512Vnni;
    case PeakInstruction::kAmxBf16: return IsaLevel::kAmx;
  }
  return IsaLevel::kAmx;
}

PeakInstruction PeakInstructionOf(const LinearKernel& kernel) {
  if (kernel.path == KernelPath::kBf16Dot)
    return kernel.isa >= IsaLevel::kAmx ? PeakInstruction::kAmxBf16 : PeakInstruction::kBf16Dot;
  // The int8_dot kernels: vpdpbusd at VNNI; at AVX2 vpmaddubsw + vpmaddwd,
  // bounded here by the ymm FMA that scales every int32 lane.
  if (kernel.path == KernelPath::kInt8Dot && kernel.isa >= IsaLevel::kAvx512Vnni) return PeakInstruction::kVnniDot;
  const IsaLevel isa = kernel.path == KernelPath::kOneDnn ? ActiveIsa() : kernel.isa;
  return isa >= IsaLevel::kAvx512 ? PeakInstruction::kAvx512Fma : PeakInstruction::kAvx2Fma;
}

absl::StatusOr<ComputePeak> MeasureComputePeak(PeakInstruction instruction, ThreadPool* pool,
                                               const ComputePeakOptions& options) {
  const IsaLevel needs = PeakInstructionIsa(instruction);
  if (needs > ActiveIsa())
    return absl::FailedPreconditionError(
        absl::StrCat(PeakInstructionName(instruction), ": ", IsaUnavailableReason(needs)));
  void (*loop)(int64_t) = isa::Avx2FmaLoop;
  int64_t flops_per_iteration = isa::kAvx2FmaLoopFlops;
  if (instruction == PeakInstruction::kAvx512Fma) {
    loop = isa::Avx512FmaLoop;
    flops_per_iteration = isa::kAvx512FmaLoopFlops;
  } else if (instruction == PeakInstruction::kBf16Dot) {
    loop = isa::Bf16DotLoop;
    flops_per_iteration = isa::kBf16DotLoopFlops;
  } else if (instruction == PeakInstruction::kVnniDot) {
    loop = isa::Avx512VnniDotLoop;
    flops_per_iteration = isa::kVnniDotLoopOps;
  } else if (instruction == PeakInstruction::kAmxBf16) {
    loop = isa::AmxDotLoop;
    flops_per_iteration = isa::kAmxDotLoopFlops;
  }
  const int threads = pool == nullptr ? 1 : pool->num_threads();
  const int64_t iterations = std::max<int64_t>(options.flops_per_task / flops_per_iteration, 1);
  const int64_t tasks = static_cast<int64_t>(threads) * std::max(options.tasks_per_thread, 1);
  // Many short tasks rather than one per thread: a thread that is descheduled
  // or slow to wake cannot leave the others idle at the end.
  auto task = [&](int64_t, int) { loop(iterations); };
  double best_s = 1e30;
  for (int rep = 0; rep < std::max(options.reps, 1); ++rep) {
    const auto start = std::chrono::steady_clock::now();
    if (pool == nullptr) {
      for (int64_t t = 0; t < tasks; ++t) task(t, 0);
    } else {
      pool->ParallelFor(tasks, task);
    }
    best_s = std::min(best_s, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  ComputePeak peak;
  peak.instruction = instruction;
  peak.gflops = static_cast<double>(flops_per_iteration) * static_cast<double>(iterations) *
                static_cast<double>(tasks) / best_s / 1e9;
  peak.threads = threads;
  return peak;
}

}  // namespace tandem
