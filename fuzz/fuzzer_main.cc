// libFuzzer's entry for one target of fuzz_targets.h, chosen at build time
// (TANDEM_FUZZ_TARGET, the target's name): fuzz/CMakeLists.txt builds this
// file once per target.
#include <cstdio>
#include <cstdlib>

#include "fuzz/fuzz_targets.h"

#ifndef TANDEM_FUZZ_TARGET
#error "TANDEM_FUZZ_TARGET must name the target (fuzz/CMakeLists.txt sets it)"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tandem::fuzz::FuzzTarget target = [] {
    absl::StatusOr<tandem::fuzz::FuzzTarget> found = tandem::fuzz::FindFuzzTarget(TANDEM_FUZZ_TARGET);
    if (!found.ok()) {
      std::fprintf(stderr, "%s\n", found.status().ToString().c_str());
      std::abort();
    }
    return *found;
  }();
  // A refusal is the expected outcome for most inputs; only a crash, a
  // sanitizer report, a leak or a hang is a finding.
  (void)target.run({data, size});
  return 0;
}
