// A private temporary folder per process for fuzz inputs that the real API
// reads from a path. Created on first use (mkdtemp under $TMPDIR or /tmp,
// 0700), removed with its contents at exit.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>

#include "absl/status/status.h"

namespace tandem::fuzz {

const std::filesystem::path& FuzzScratchDir();
// Replaces `path` with exactly `bytes`.
absl::Status WriteFuzzFile(const std::filesystem::path& path, std::span<const uint8_t> bytes);

}  // namespace tandem::fuzz
