#include "tests/temp_dir_testlib.h"

#include <stdlib.h>

#include <string>

#include <gtest/gtest.h>

namespace tandem {

ScopedTempDir::ScopedTempDir() {
  std::string pattern = (std::filesystem::path(::testing::TempDir()) / "tandem-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed for " << pattern;
  path_ = pattern;
}

ScopedTempDir::~ScopedTempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace tandem
