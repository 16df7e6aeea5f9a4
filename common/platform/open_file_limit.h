// The open-file limit (RLIMIT_NOFILE): servers raise their soft limit to the
// hard one at start-up, so a burst of clients meets the connection caps
// (which refuse cleanly) long before it meets EMFILE.
#pragma once

#include <cstdint>
#include <string>

namespace tandem {

struct OpenFileLimit {
  uint64_t before = 0;  // the soft limit found
  uint64_t after = 0;   // the soft limit now (the hard limit, unless raising failed)
  uint64_t hard = 0;
};

// Raises the soft RLIMIT_NOFILE to the hard limit; what it was and is.
OpenFileLimit RaiseOpenFileLimit();

// "open files: soft limit 1024 raised to 524288 (hard)", for the start-up log.
std::string DescribeOpenFileLimit(const OpenFileLimit& limit);

}  // namespace tandem
