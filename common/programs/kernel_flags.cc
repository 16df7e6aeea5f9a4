#include "common/programs/kernel_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/base/cpu_features.h"
#include "common/base/status_macros.h"
#include "common/kernels/kernel_plan.h"

ABSL_FLAG(std::string, max_isa, "",
          "cap the CPU kernels' instruction set: avx2 | avx512 | avx512_vnni | avx512_bf16 | amx; empty = all the "
          "CPU has (the env variable TANDEM_MAX_ISA does the same; this flag wins)");
ABSL_FLAG(std::string, kernel_plan, "builtin",
          "CPU linear-layer kernel path per row count: builtin (measured for this CPU's ISA level; GEMMs round "
          "their input to bf16 where the CPU has fast bf16 dot products, to int8 where it has int8 ones) | exact (no "
          "kernel rounds its input: f32 "
          "throughout, as the float64 parity tests run) | measure (time every path on this model at start-up; cached "
          "in --calibration_profile with --execution_policy) | "
          "ROWS:PATH,... e.g. 1:stream,8:bf16_dot (paths stream, packed, bf16_dot, onednn, int8_dot: the "
          "last for quantized weights), optionally followed by lists for quantized types, all or one: "
          "...;quantized=1:int8_dot,128:bf16_dot;q8_0=1:int8_dot,32:bf16_dot. CPU workers need the same plan "
          "for bit-identical results");
ABSL_FLAG(std::string, block_order, "auto",
          "Q4_K/Q6_K blocks of the copied weights (--load_weights copy) and of a CPU worker's expert store: auto "
          "(group-major where the AVX512-VNNI GEMV decodes one row: no shuffles per call), ggml (as the file "
          "stores them) or group_major; every worker of a coordinator must hold the same order");

namespace tandem {

absl::StatusOr<KernelFlags> ApplyKernelFlags() {
  KernelFlags out;
  if (const std::string cap = absl::GetFlag(FLAGS_max_isa); !cap.empty()) {
    absl::StatusOr<IsaLevel> level = ParseIsaLevel(cap);
    if (!level.ok()) return absl::InvalidArgumentError(absl::StrCat("--max_isa: ", level.status().message()));
    SetMaxIsa(*level, "--max_isa");
  }
  const std::string plan = absl::GetFlag(FLAGS_kernel_plan);
  if (plan == "exact") {
    SetProcessKernelPlan(KernelPlan::Exact(ActiveIsa()));
  } else if (plan == "measure") {
    out.measure_kernel_plan = true;
  } else if (plan != "builtin") {
    absl::StatusOr<KernelPlan> parsed = KernelPlan::Parse(plan, "--kernel_plan");
    if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat("--kernel_plan: ", parsed.status().message()));
    SetProcessKernelPlan(*std::move(parsed));
  }
  // After the ISA cap: "auto" depends on the kernels the process may use.
  TANDEM_ASSIGN_OR_RETURN(out.block_order, BlockOrderFromFlag(absl::GetFlag(FLAGS_block_order), "--block_order"));
  return out;
}

}  // namespace tandem
