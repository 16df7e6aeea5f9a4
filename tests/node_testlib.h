// The node side of the HTTP end-to-end tests: tests/node/'s npm packages
// (the openai client, puppeteer-core), installed once per build folder from
// the committed package-lock.json, and the programs they need.
#pragma once

#include <filesystem>
#include <string>

#include "absl/status/statusor.h"

namespace tandem {

// The first executable `program` in $PATH, or "" when there is none.
std::string FindOnPath(const std::string& program);

// TANDEM_BINARY_DIR/node with tests/node/'s packages installed (npm ci, only
// while node_modules/<module> is missing) and its *.mjs scripts copied in.
// FailedPrecondition when node or npm is not on PATH, Unavailable when npm
// ci fails (no registry): the message says which, for GTEST_SKIP.
absl::StatusOr<std::filesystem::path> InstallNodePackages(const std::string& module,
                                                          const std::filesystem::path& work_dir);

}  // namespace tandem
