#include "tests/node_testlib.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/sdk_testlib.h"

namespace tandem {

namespace fs = std::filesystem;

std::string FindOnPath(const std::string& program) {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "", ':', absl::SkipEmpty())) {
    const fs::path candidate = fs::path(std::string(dir)) / program;
    if (access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return "";
}

absl::StatusOr<fs::path> InstallNodePackages(const std::string& module, const fs::path& work_dir) {
  const std::string node = FindOnPath("node"), npm = FindOnPath("npm");
  if (node.empty() || npm.empty()) return absl::FailedPreconditionError("node or npm is not on PATH");
  const fs::path prefix = fs::path(TANDEM_BINARY_DIR) / "node";
  const fs::path sources = fs::path(TANDEM_SOURCE_DIR) / "tests" / "node";
  fs::create_directories(prefix);
  for (const fs::directory_entry& entry : fs::directory_iterator(sources)) {
    const std::string name = entry.path().filename().string();
    if (name == "package.json" || name == "package-lock.json" || entry.path().extension() == ".mjs") {
      fs::copy_file(entry.path(), prefix / name, fs::copy_options::overwrite_existing);
    }
  }
  if (!fs::exists(prefix / "node_modules" / module / "package.json")) {
    absl::StatusOr<ProcessResult> install =
        RunProcess({npm, "ci", "--prefix", prefix.string(), "--ignore-scripts", "--no-audit", "--no-fund"}, {},
                   work_dir, absl::Seconds(300));
    if (!install.ok()) return install.status();
    if (install->exit_code != 0) {
      return absl::UnavailableError(absl::StrCat("npm ci could not install ", module, ": ", install->err));
    }
  }
  return prefix;
}

}  // namespace tandem
