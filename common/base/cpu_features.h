// What the CPU this process runs on can execute, read once from cpuid and
// xgetbv (and, for AMX, granted by the kernel), and the instruction-set level
// the CPU kernels may use: that, capped by TANDEM_MAX_ISA or --max_isa.
//
// Why common/base/: the kernel dispatch (common/kernels/) needs it and may not
// include common/platform/ (sibling layers), and every benchmark — also
// those that link only the planner — stamps its JSON lines with the CPU.
//
// The build's baseline is x86-64 with AVX2 + FMA + F16C (CMakeLists.txt);
// everything above it is reached only through ActiveIsa().
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem {

// Ordered: each level includes every one below it.
//   avx2         AVX2 + FMA + F16C (the build's baseline)
//   avx512       + AVX-512 F, BW, VL, DQ with the OS saving zmm/opmask state
//   avx512_vnni  + AVX512-VNNI (int8 dot products: for quantized weights)
//   avx512_bf16  + AVX512-BF16 (vdpbf16ps, vcvtne2ps2bf16)
//   amx          + AMX-TILE, AMX-BF16, AMX-INT8, tile state granted by Linux
enum class IsaLevel : uint8_t { kAvx2 = 0, kAvx512, kAvx512Vnni, kAvx512Bf16, kAmx };
inline constexpr IsaLevel kAllIsaLevels[] = {IsaLevel::kAvx2, IsaLevel::kAvx512, IsaLevel::kAvx512Vnni,
                                             IsaLevel::kAvx512Bf16, IsaLevel::kAmx};

const char* IsaLevelName(IsaLevel level);  // "avx2", "avx512", "avx512_vnni", "avx512_bf16", "amx"
// Accepts the names above; InvalidArgument listing them otherwise.
absl::StatusOr<IsaLevel> ParseIsaLevel(std::string_view name);

struct CpuFeatures {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD"
  std::string brand;   // cpuid's brand string, e.g. "AMD EPYC 9B45"
  int family = 0, model = 0, stepping = 0;
  // Reported by cpuid.
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_vnni = false, avx512_bf16 = false;
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;
  // Register state the OS saves on context switches (XCR0): ymm; zmm and
  // opmasks; AMX tiles, which Linux also grants per process (arch_prctl).
  bool os_avx = false, os_avx512 = false, os_amx = false;
  // The highest level whose flags are all present and enabled.
  IsaLevel level = IsaLevel::kAvx2;
  bool baseline_ok = false;  // AVX2 + FMA + F16C + OS ymm state

  // "AMD EPYC 9B45 (AuthenticAMD family 0x1a model 0x2)".
  std::string Description() const;
  // The flags above that are present, space-separated ("avx2 fma f16c avx512f ...").
  std::string Flags() const;
  // The flags `level` needs that this CPU or OS lacks ("" when it has them).
  std::string MissingFor(IsaLevel level) const;
};

// Probed on first call; thread-safe.
const CpuFeatures& HostCpu();

// The level the kernels may use now: HostCpu().level, capped by
// TANDEM_MAX_ISA (read on first call) and by SetMaxIsa. Cheap (an atomic load).
IsaLevel ActiveIsa();
// Caps ActiveIsa() at `cap` (a cap above the host's level leaves the host's
// level). Call at start-up, before kernels run; `source` names the setting
// for logs ("--max_isa"). The env variable TANDEM_MAX_ISA does the same
// before any flag is read (so tests and benches can cap it too); an unknown
// value there is logged as a warning and ignored.
void SetMaxIsa(IsaLevel cap, std::string_view source);
// What capped the level: "" (nothing), "TANDEM_MAX_ISA=avx2", "--max_isa=avx512".
std::string IsaCapSource();
// Why kernels of `level` may not run here: "" when they may, else e.g.
// "avx512_bf16 needs avx512_bf16; this CPU lacks: avx512_bf16" or "... is
// capped by TANDEM_MAX_ISA=avx2" (test skips and FailedPrecondition errors).
std::string IsaUnavailableReason(IsaLevel level);
// "avx512_bf16 (host avx512_bf16)" or "avx2 (host avx512_bf16, capped by --max_isa=avx2)".
std::string ActiveIsaDescription();

}  // namespace tandem
