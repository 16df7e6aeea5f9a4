#include "common/base/mapped_range_read.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/base/parallel_status.h"

namespace tandem {
namespace {

// Exactly `bytes` from `offset`, through short reads and EINTR.
absl::Status ReadAt(int fd, const std::string& path, int64_t offset, int64_t bytes, uint8_t* out) {
  int64_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd, out + done, static_cast<size_t>(bytes - done), static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", path, " at byte ", offset + done));
    if (n == 0) {
      return absl::DataLossError(absl::StrCat(path, " ends at byte ", offset + done, ", before the ", bytes,
                                              " bytes read from byte ", offset,
                                              " (did it shrink since it was opened?)"));
    }
    done += n;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadMappedRange(int fd, const std::string& path, absl::Span<const uint8_t> mapping,
                             absl::Span<const uint8_t> range, uint8_t* out, ThreadPool* pool) {
  if (range.empty()) return absl::OkStatus();
  if (mapping.empty() || range.data() < mapping.data() ||
      range.data() + range.size() > mapping.data() + mapping.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": a read of ", range.size(), " bytes outside the file's ", mapping.size(), " bytes"));
  }
  constexpr int64_t kPiece = int64_t{16} << 20;
  const int64_t offset = range.data() - mapping.data(), bytes = static_cast<int64_t>(range.size());
  return ParallelTasks(pool, (bytes + kPiece - 1) / kPiece, [&](int64_t piece) {
    const int64_t at = piece * kPiece;
    return ReadAt(fd, path, offset + at, std::min(kPiece, bytes - at), out + at);
  });
}

}  // namespace tandem
