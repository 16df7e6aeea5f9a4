// The fuzz targets' inputs kept in the repository, replayed through the same
// entry points the libFuzzer binaries drive (fuzz/fuzz_targets.h):
//   fuzz/corpus/<target>/       the seeds: valid files, each must be accepted
//                               (so the fuzzers start past the first checks);
//   fuzz/regressions/<target>/  inputs that once crashed a parser (or tripped
//                               a sanitizer): each must now be refused with a
//                               clean error naming what is wrong.
// Under the ASan build (build-asan) this also re-checks them for memory errors.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz/fuzz_targets.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"

namespace tandem::fuzz {
namespace {

namespace fs = std::filesystem;

const fs::path kFuzzDir = fs::path(TANDEM_SOURCE_DIR) / "fuzz";

std::vector<fs::path> FilesIn(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file()) files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<uint8_t> ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class FuzzInputsTest : public ::testing::TestWithParam<FuzzTarget> {};

TEST_P(FuzzInputsTest, EverySeedIsAccepted) {
  const std::vector<fs::path> seeds = FilesIn(kFuzzDir / "corpus" / GetParam().name);
  ASSERT_FALSE(seeds.empty()) << "no seeds in fuzz/corpus/" << GetParam().name << " (tandem-fuzz-seeds writes them)";
  for (const fs::path& seed : seeds) {
    EXPECT_OK(GetParam().run(ReadAll(seed))) << seed;
  }
}

TEST_P(FuzzInputsTest, EveryRegressionIsRefusedCleanly) {
  for (const fs::path& input : FilesIn(kFuzzDir / "regressions" / GetParam().name)) {
    const absl::Status status = GetParam().run(ReadAll(input));
    EXPECT_FALSE(status.ok()) << input << " was accepted";
    EXPECT_FALSE(status.message().empty()) << input;
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzInputsTest, ::testing::ValuesIn(FuzzTargets().begin(), FuzzTargets().end()),
                         [](const auto& info) { return std::string(info.param.name); });

// A misspelt folder would silently replay nothing.
TEST(FuzzInputsLayoutTest, EveryFolderNamesATarget) {
  for (const char* kind : {"corpus", "regressions"}) {
    std::error_code ec;
    for (fs::directory_iterator it(kFuzzDir / kind, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
      EXPECT_OK(FindFuzzTarget(it->path().filename().string())) << it->path();
    }
  }
}

}  // namespace
}  // namespace tandem::fuzz
