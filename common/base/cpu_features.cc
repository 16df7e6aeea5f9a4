#include "common/base/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "common/base/log.h"

namespace tandem {
namespace {

struct CpuidRegs {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
};

CpuidRegs Cpuid(unsigned leaf, unsigned subleaf) {
  CpuidRegs r;
  if (__get_cpuid_count(leaf, subleaf, &r.eax, &r.ebx, &r.ecx, &r.edx) == 0) return CpuidRegs{};
  return r;
}

bool Bit(unsigned value, int bit) { return ((value >> bit) & 1u) != 0; }

// XCR0: which register state the OS saves (needs OSXSAVE).
uint64_t Xcr0() {
  uint32_t eax = 0, edx = 0;
  asm volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

// Linux (5.16+) hands out AMX tile data state per process on request; without
// it the first tile instruction faults.
bool RequestAmxPermission() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr unsigned long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

CpuFeatures Probe() {
  CpuFeatures f;
  const CpuidRegs leaf0 = Cpuid(0, 0);
  const unsigned max_leaf = leaf0.eax;
  char vendor[13] = {};
  std::memcpy(vendor, &leaf0.ebx, 4);
  std::memcpy(vendor + 4, &leaf0.edx, 4);
  std::memcpy(vendor + 8, &leaf0.ecx, 4);
  f.vendor = vendor;

  const CpuidRegs leaf1 = Cpuid(1, 0);
  const unsigned base_family = (leaf1.eax >> 8) & 0xf, base_model = (leaf1.eax >> 4) & 0xf;
  f.family = static_cast<int>(base_family == 0xf ? base_family + ((leaf1.eax >> 20) & 0xff) : base_family);
  f.model = static_cast<int>(base_family == 0xf || base_family == 0x6 ? (((leaf1.eax >> 16) & 0xf) << 4) | base_model
                                                                      : base_model);
  f.stepping = static_cast<int>(leaf1.eax & 0xf);
  f.fma = Bit(leaf1.ecx, 12);
  f.f16c = Bit(leaf1.ecx, 29);
  const bool osxsave = Bit(leaf1.ecx, 27);
  const bool avx = Bit(leaf1.ecx, 28);
  const uint64_t xcr0 = osxsave ? Xcr0() : 0;
  // SSE (1) and AVX (2) state; opmask (5), zmm0-15 upper (6), zmm16-31 (7);
  // tile config (17) and tile data (18).
  f.os_avx = avx && (xcr0 & 0x6) == 0x6;
  f.os_avx512 = f.os_avx && (xcr0 & 0xe0) == 0xe0;

  if (max_leaf >= 7) {
    const CpuidRegs leaf7 = Cpuid(7, 0);
    f.avx2 = Bit(leaf7.ebx, 5);
    f.avx512f = Bit(leaf7.ebx, 16);
    f.avx512dq = Bit(leaf7.ebx, 17);
    f.avx512bw = Bit(leaf7.ebx, 30);
    f.avx512vl = Bit(leaf7.ebx, 31);
    f.avx512_vnni = Bit(leaf7.ecx, 11);
    f.amx_bf16 = Bit(leaf7.edx, 22);
    f.amx_tile = Bit(leaf7.edx, 24);
    f.amx_int8 = Bit(leaf7.edx, 25);
    if (leaf7.eax >= 1) f.avx512_bf16 = Bit(Cpuid(7, 1).eax, 5);
  }
  const bool xcr0_amx = (xcr0 & 0x60000) == 0x60000;
  f.os_amx = f.amx_tile && xcr0_amx && RequestAmxPermission();

  if (Cpuid(0x80000000, 0).eax >= 0x80000004) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      const CpuidRegs r = Cpuid(0x80000002 + i, 0);
      std::memcpy(brand + 16 * i, &r.eax, 4);
      std::memcpy(brand + 16 * i + 4, &r.ebx, 4);
      std::memcpy(brand + 16 * i + 8, &r.ecx, 4);
      std::memcpy(brand + 16 * i + 12, &r.edx, 4);
    }
    f.brand = std::string(absl::StripAsciiWhitespace(brand));
  }
  if (f.brand.empty()) f.brand = "unknown CPU";

  f.baseline_ok = f.avx2 && f.fma && f.f16c && f.os_avx;
  f.level = IsaLevel::kAvx2;
  for (IsaLevel level : kAllIsaLevels) {
    if (f.MissingFor(level).empty()) f.level = level;
  }
  return f;
}

struct IsaState {
  std::atomic<int> active{0};
  absl::Mutex mutex;
  std::string cap_source ABSL_GUARDED_BY(mutex);
};

IsaState& State() {
  static IsaState* state = [] {
    auto* s = new IsaState;
    IsaLevel level = HostCpu().level;
    if (const char* env = std::getenv("TANDEM_MAX_ISA"); env != nullptr && *env != '\0') {
      absl::StatusOr<IsaLevel> cap = ParseIsaLevel(env);
      if (!cap.ok()) {
        LOG_WARNING("TANDEM_MAX_ISA: ", cap.status().message(), "; ignored");
      } else {
        if (*cap < level) level = *cap;
        absl::MutexLock lock(&s->mutex);  // not shared yet: uncontended, for the analysis
        s->cap_source = absl::StrCat("TANDEM_MAX_ISA=", env);
      }
    }
    s->active.store(static_cast<int>(level));
    return s;
  }();
  return *state;
}

}  // namespace

const char* IsaLevelName(IsaLevel level) {
  switch (level) {
    case IsaLevel::kAvx2: return "avx2";
    case IsaLevel::kAvx512: return "avx512";
    case IsaLevel::kAvx512Vnni: return "avx512_vnni";
    case IsaLevel::kAvx512Bf16: return "avx512_bf16";
    case IsaLevel::kAmx: return "amx";
  }
  return "?";
}

absl::StatusOr<IsaLevel> ParseIsaLevel(std::string_view name) {
  std::vector<std::string> names;
  for (IsaLevel level : kAllIsaLevels) {
    if (name == IsaLevelName(level)) return level;
    names.push_back(IsaLevelName(level));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown ISA level \"", std::string(name), "\"; expected one of ", absl::StrJoin(names, ", ")));
}

std::string CpuFeatures::Description() const {
  return absl::StrFormat("%s (%s family 0x%x model 0x%x stepping %d)", brand, vendor, family, model, stepping);
}

std::string CpuFeatures::Flags() const {
  std::vector<std::string> out;
  const std::pair<bool, const char*> flags[] = {{avx2, "avx2"},
                                                {fma, "fma"},
                                                {f16c, "f16c"},
                                                {avx512f, "avx512f"},
                                                {avx512bw, "avx512bw"},
                                                {avx512vl, "avx512vl"},
                                                {avx512dq, "avx512dq"},
                                                {avx512_vnni, "avx512_vnni"},
                                                {avx512_bf16, "avx512_bf16"},
                                                {amx_tile, "amx_tile"},
                                                {amx_bf16, "amx_bf16"},
                                                {amx_int8, "amx_int8"}};
  for (const auto& [present, name] : flags)
    if (present) out.push_back(name);
  if (avx512f && !os_avx512) out.push_back("(os: no avx512 state)");
  if (amx_tile && !os_amx) out.push_back("(os: no amx tile state)");
  return absl::StrJoin(out, " ");
}

std::string CpuFeatures::MissingFor(IsaLevel level) const {
  std::vector<std::string> missing;
  auto need = [&](bool present, const char* name) {
    if (!present) missing.push_back(name);
  };
  need(avx2, "avx2");
  need(fma, "fma");
  need(f16c, "f16c");
  need(os_avx, "os-avx-state");
  if (level >= IsaLevel::kAvx512) {
    need(avx512f, "avx512f");
    need(avx512bw, "avx512bw");
    need(avx512vl, "avx512vl");
    need(avx512dq, "avx512dq");
    need(os_avx512, "os-avx512-state");
  }
  if (level >= IsaLevel::kAvx512Vnni) need(avx512_vnni, "avx512_vnni");
  if (level >= IsaLevel::kAvx512Bf16) need(avx512_bf16, "avx512_bf16");
  if (level >= IsaLevel::kAmx) {
    need(amx_tile, "amx_tile");
    need(amx_bf16, "amx_bf16");
    need(amx_int8, "amx_int8");
    need(os_amx, "os-amx-tile-permission");
  }
  return absl::StrJoin(missing, " ");
}

const CpuFeatures& HostCpu() {
  static const CpuFeatures* features = new CpuFeatures(Probe());
  return *features;
}

IsaLevel ActiveIsa() { return static_cast<IsaLevel>(State().active.load(std::memory_order_relaxed)); }

void SetMaxIsa(IsaLevel cap, std::string_view source) {
  IsaState& state = State();
  absl::MutexLock lock(&state.mutex);
  const IsaLevel host = HostCpu().level;
  state.active.store(static_cast<int>(cap < host ? cap : host));
  state.cap_source = absl::StrCat(std::string(source), "=", IsaLevelName(cap));
}

std::string IsaCapSource() {
  IsaState& state = State();
  absl::MutexLock lock(&state.mutex);
  return state.cap_source;
}

std::string IsaUnavailableReason(IsaLevel level) {
  if (level <= ActiveIsa()) return "";
  const std::string missing = HostCpu().MissingFor(level);
  if (!missing.empty())
    return absl::StrCat(IsaLevelName(level), " needs what this CPU (", HostCpu().brand, ") lacks: ", missing);
  return absl::StrCat(IsaLevelName(level), " is above what this process runs: ", ActiveIsaDescription());
}

std::string ActiveIsaDescription() {
  const std::string cap = IsaCapSource();
  return absl::StrCat(IsaLevelName(ActiveIsa()), " (host ", IsaLevelName(HostCpu().level),
                      cap.empty() ? "" : absl::StrCat(", capped by ", cap), ")");
}

}  // namespace tandem
