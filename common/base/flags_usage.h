// --help for tandem's programs. absl's default --help lists only flags
// defined in a file named like the program (prog.cc, prog_main.cc, ...),
// which matches none of tandem's mains, so it printed "No flags matched";
// tandem's flags live in the main and in the files it links (e.g.
// runtime/runtime_flags.cc), so --help lists every flag not defined inside
// absl itself. Header-only: each program links absl::flags_usage already.
#pragma once

#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace tandem {

// Call once, before absl::ParseCommandLine, instead of absl::SetProgramUsageMessage.
inline void SetProgramUsage(absl::string_view message) {
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [](absl::string_view file) { return !absl::StrContains(file, "absl/"); };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(message);
}

}  // namespace tandem
