#include "common/base/flags_usage.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <utility>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem {
namespace {

// Written once by SetProgramUsage from main() before ParseProgramFlags reads
// it on the same thread; no other thread exists yet, so no guard.
std::vector<FlagGroup>& Groups() {
  static auto* groups = new std::vector<FlagGroup>();
  return *groups;
}

bool IsTandemFlag(const absl::CommandLineFlag& flag) {
  return !flag.IsRetired() && !absl::StrContains(flag.Filename(), "absl/");
}

// `text` wrapped at `width` columns, each line indented by `indent`.
std::string Wrap(absl::string_view text, size_t indent, size_t width) {
  std::string out, line;
  for (absl::string_view word : absl::StrSplit(text, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
    if (!line.empty() && indent + line.size() + 1 + word.size() > width) {
      absl::StrAppend(&out, std::string(indent, ' '), line, "\n");
      line.clear();
    }
    absl::StrAppend(&line, line.empty() ? "" : " ", word);
  }
  if (!line.empty()) absl::StrAppend(&out, std::string(indent, ' '), line, "\n");
  return out;
}

std::string DescribeFlag(const absl::CommandLineFlag& flag) {
  std::string value = flag.DefaultValue();
  if (value.empty()) value = "\"\"";
  return absl::StrCat("  --", flag.Name(), "  (default ", value, ")\n", Wrap(flag.Help(), 6, 80));
}

bool IsHelpArgument(absl::string_view arg) {
  return arg == "--help" || arg == "-help" || arg == "-h" || arg == "--helpshort" || arg == "-helpshort";
}

}  // namespace

void SetProgramUsage(absl::string_view message, std::vector<FlagGroup> groups) {
  absl::FlagsUsageConfig config;
  // --helpfull (absl's listing) shows tandem's flags beside absl's.
  config.contains_help_flags = [](absl::string_view file) { return !absl::StrContains(file, "absl/"); };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(message);
  Groups() = std::move(groups);
}

std::string FlagsHelpText() {
  std::map<std::string, const absl::CommandLineFlag*> remaining;  // by name
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (IsTandemFlag(*flag)) remaining.emplace(std::string(name), flag);
  }
  std::string out = absl::StrCat(absl::ProgramUsageMessage(), "\n");
  for (const FlagGroup& group : Groups()) {
    std::string listed;
    for (const std::string& name : group.flags) {
      auto it = remaining.find(name);
      if (it == remaining.end()) continue;
      absl::StrAppend(&listed, DescribeFlag(*it->second));
      remaining.erase(it);
    }
    if (!listed.empty()) absl::StrAppend(&out, "\n", group.title, ":\n", listed);
  }
  if (!remaining.empty()) {
    absl::StrAppend(&out, "\n", Groups().empty() ? "Flags" : "Other flags", ":\n");
    for (const auto& [name, flag] : remaining) absl::StrAppend(&out, DescribeFlag(*flag));
  }
  absl::StrAppend(&out, "\n--helpfull lists every flag by source file, absl's own (logging, --flagfile) included.\n");
  return out;
}

std::vector<char*> ParseProgramFlags(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (IsHelpArgument(arg)) {
      const std::string text = FlagsHelpText();
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::exit(0);
    }
  }
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace tandem
