#include "common/platform/open_file_limit.h"

#include <sys/resource.h>

#include "absl/strings/str_cat.h"

namespace tandem {

OpenFileLimit RaiseOpenFileLimit() {
  OpenFileLimit out;
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return out;
  out.before = out.after = limit.rlim_cur;
  out.hard = limit.rlim_max;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &limit) == 0) out.after = limit.rlim_max;
  }
  return out;
}

std::string DescribeOpenFileLimit(const OpenFileLimit& limit) {
  if (limit.after == limit.before)
    return absl::StrCat("open files: soft limit ", limit.after, " (hard ", limit.hard, ")");
  return absl::StrCat("open files: soft limit ", limit.before, " raised to ", limit.after, " (hard ", limit.hard, ")");
}

}  // namespace tandem
