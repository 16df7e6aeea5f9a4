#include "fuzz/fuzz_scratch.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace tandem::fuzz {
namespace {

namespace fs = std::filesystem;

struct ScratchDir {
  fs::path path;
  ScratchDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/tandem-fuzz-XXXXXX");
    if (::mkdtemp(pattern.data()) == nullptr) {
      // Nothing can be fuzzed without it; say why and stop at once.
      std::fprintf(stderr, "tandem fuzz: mkdtemp %s: %s\n", pattern.c_str(), std::strerror(errno));
      std::abort();
    }
    path = pattern;
  }
  ~ScratchDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

}  // namespace

const fs::path& FuzzScratchDir() {
  static const ScratchDir dir;
  return dir.path;
}

absl::Status WriteFuzzFile(const fs::path& path, std::span<const uint8_t> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return absl::ErrnoToStatus(errno, absl::StrCat("cannot write ", path.string()));
  return absl::OkStatus();
}

}  // namespace tandem::fuzz
