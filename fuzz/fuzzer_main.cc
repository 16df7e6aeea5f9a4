// libFuzzer's entry for every target of fuzz/fuzz_targets.h in one binary
// (tandem-fuzz): `--target=NAME` picks the target at start-up. One binary
// rather than one per target: each would link the same parsers and
// sanitizer runtime, and CI's disk is bounded.
// libFuzzer ignores flags that start with "--" and hands the whole command
// line to the processes it forks (-fork, -jobs, -merge), so the flag stays in
// argv.
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "fuzz/fuzz_targets.h"

namespace {

constexpr std::string_view kTargetFlag = "--target=";

std::optional<tandem::fuzz::FuzzTarget>& ChosenTarget() {
  static std::optional<tandem::fuzz::FuzzTarget> target;
  return target;
}

[[noreturn]] void Refuse(const absl::Status& status) {
  std::fprintf(stderr, "tandem-fuzz: %s\n", status.ToString().c_str());
  std::exit(2);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  std::optional<std::string_view> name;
  for (int i = 1; i < *argc; ++i) {
    std::string_view arg = (*argv)[i];
    if (arg.substr(0, kTargetFlag.size()) == kTargetFlag) name = arg.substr(kTargetFlag.size());
  }
  if (!name.has_value()) {
    Refuse(absl::InvalidArgumentError("--target=NAME is required (NAME: a folder of fuzz/corpus/)"));
  }
  absl::StatusOr<tandem::fuzz::FuzzTarget> found = tandem::fuzz::FindFuzzTarget(*name);
  if (!found.ok()) Refuse(found.status());
  ChosenTarget() = *found;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A refusal is the expected outcome for most inputs; only a crash, a
  // sanitizer report, a leak or a hang is a finding.
  (void)ChosenTarget()->run({data, size});
  return 0;
}
