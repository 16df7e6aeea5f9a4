// Measured limits of the machine the CPU kernels run on: sustainable memory
// bandwidth (STREAM triad, and a read-only stream: the roofline of a GEMV).
// The benchmarks report their kernels as fractions of these; the compute
// peak of each instruction the kernels use is common/kernels/compute_peak.h.
// About a second; call once at start-up.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/base/thread_pool.h"

namespace tandem {

struct MemoryBandwidthOptions {
  // Bytes of each of the three arrays; 0 = max(4 x LLC, 256 MB) as STREAM
  // asks (each array >= 4x the last-level cache, so nothing is served from it).
  int64_t array_bytes = 0;
  int reps = 5;  // the best rep (of each read pattern) is reported, as STREAM does
};

struct MemoryBandwidth {
  // STREAM's count: 3 x sizeof(float) x n bytes per triad (2 reads, 1 write).
  double triad_gb_s = 0;
  // What DRAM actually moved with ordinary stores: the write-allocate read of
  // a[] makes it 4 x sizeof(float) x n. Read-only streams (a GEMV) can
  // therefore go above triad_gb_s.
  double triad_with_write_allocate_gb_s = 0;
  // Read-only (a sum over one array), the roofline of a GEMV, which only
  // reads its weights: the faster of one stream per thread and four side
  // by side per thread. Not a STREAM kernel; reported beside it.
  double read_gb_s = 0;
  double read_one_stream_gb_s = 0, read_four_streams_gb_s = 0;
  int threads = 0;
  int64_t array_bytes = 0;
  int64_t llc_bytes = 0;  // last-level cache as the kernel reports it (sysfs)
  int reps = 0;
};

// Triad a[i] = b[i] + s * c[i] with AVX2 and ordinary stores, and a read-only
// sum over b, split across all of `pool`'s threads (null: one thread).
absl::StatusOr<MemoryBandwidth> MeasureMemoryBandwidth(ThreadPool* pool, const MemoryBandwidthOptions& options = {});

// Last-level cache size in bytes (sysfs, else sysconf), 0 when unknown.
int64_t LastLevelCacheBytes();

// Memory the kernel could give this process without swapping (MemAvailable
// of /proc/meminfo, page cache it can drop included; without that line the
// free pages sysconf reports), -1 when neither is known.
int64_t AvailableMemoryBytes();

}  // namespace tandem
