// --help for tandem's programs: the flags a user sets first, by what they are
// for (the model, where to listen, threads and memory, ...), instead of
// absl's listing by source file path. --helpfull keeps absl's complete
// listing (absl's own flags included) for whoever needs where a flag lives.
//
// Called from main() only, before any other thread exists.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tandem {

// A titled list of flag names, printed in this order. A name no linked
// library defines is skipped (a program may share another's groups).
struct FlagGroup {
  std::string title;
  std::vector<std::string> flags;
};

// Call once, before ParseProgramFlags, instead of absl::SetProgramUsageMessage.
// `groups` come first in --help; every other tandem flag follows under
// "Other flags", so none is hidden.
void SetProgramUsage(absl::string_view message, std::vector<FlagGroup> groups = {});

// absl::ParseCommandLine, except that --help, -h and --helpshort print the
// grouped listing (FlagsHelpText) and exit 0.
std::vector<char*> ParseProgramFlags(int argc, char** argv);

// The grouped listing --help prints: the usage message, then each group.
std::string FlagsHelpText();

}  // namespace tandem
