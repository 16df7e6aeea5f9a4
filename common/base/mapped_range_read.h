// Copying part of a file that is also mapped read-only, with pread rather
// than through the mapping: a load that copies GBs of weights out of the
// page cache then fills and drops no page-table entries (populate + memcpy
// + MADV_DONTNEED ran at 0.4-1.1 GB/s on the test VM, two threads of pread
// at 1.3-7 GB/s), and the page cache keeps the file for the next process.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/base/thread_pool.h"

namespace tandem {

// Reads `range`, which must lie inside `mapping` (the file open as `fd`
// mapped from offset 0), from the file into `out`, in 16 MiB pieces over
// `pool` (null: on this thread). InvalidArgument for a range outside the
// mapping; DataLoss when the file ends first (it shrank since it was
// mapped); the errno status otherwise: each naming `path` and the offset.
// Any thread; several at once (pread keeps no file position).
absl::Status ReadMappedRange(int fd, const std::string& path, absl::Span<const uint8_t> mapping,
                             absl::Span<const uint8_t> range, uint8_t* out, ThreadPool* pool = nullptr);

}  // namespace tandem
