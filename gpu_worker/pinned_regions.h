// Which host memory to page-lock (cudaHostRegister) so that expert
// migrations DMA straight from where the weights already lie — the mapped
// safetensors, the synthetic model's buffers, a worker's shared-memory store
// — with no second, pinned host copy; and how each region can be locked.
//
// cudaHostRegister works on whole pages and refuses a range that overlaps
// one already registered, so the expert matrices' ranges are widened to page
// boundaries and merged where they touch or overlap: a checkpoint whose
// experts lie back to back becomes one region per file, and a page shared by
// two tensors is registered once. Every byte of a merged region lies on a
// page that holds expert bytes, so it is mapped memory.
//
// How to lock a region depends on the device and on the mapping:
// cudaHostRegisterReadOnly (the GPU only reads) pins any mapping, PROT_READ
// included, but only where cudaDevAttrHostRegisterReadOnlySupported is 1
// (not on discrete GPUs in x86 hosts, where the call fails with
// cudaErrorNotSupported); a plain registration pins with write access, so
// it needs a writable mapping (and must not be a private file mapping,
// whose pages it would copy). A region that can be locked neither way stays
// pageable: the pool still copies from it (the driver stages the bytes),
// slower, and counts those copies (ExpertPoolStats::pageable_copies).
//
// Host C++ only (no CUDA): the CUDA pool takes the results, and the no-CUDA
// build tests them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu_worker/expert_source.h"

namespace tandem {

// A host range holding expert weights, to page-lock in place.
struct PinnedHostRegion {
  const void* data = nullptr;
  size_t bytes = 0;
};

// The page-aligned, disjoint, sorted regions covering every piece of every
// matrix (w1, w3, w2) of `experts` ([layer][expert]); `page_bytes` is the
// host page size (a power of two).
std::vector<PinnedHostRegion> ExpertHostRegions(const ExpertSources& experts, size_t page_bytes);

// How one region is page-locked.
enum class HostPinMode : uint8_t {
  kReadOnly,   // cudaHostRegisterReadOnly: any mapping; needs the device's support
  kReadWrite,  // plain cudaHostRegister: pins with write access; needs a writable mapping
  kPageable,   // not locked: copies from it are staged by the driver (slower, counted)
};
const char* HostPinModeName(HostPinMode mode);

// The registration for a region: read-only wherever the device supports it
// (the GPU never writes expert weights), else a plain one when the mapping
// is writable in place (RangeWritableInPlace), else none.
HostPinMode ChooseHostPinMode(bool read_only_register_supported, bool mapping_writable_in_place);

// This process's memory map (/proc/self/maps), read once for several
// lookups. Internal naming the file when it cannot be read.
absl::StatusOr<std::string> ReadSelfMemoryMap();

// Whether every byte of [data, data + bytes) lies in a mapping that a plain
// registration can pin in place: writable, and shared or anonymous (pinning
// a private file mapping for write would copy each page). `memory_map` is
// the text of a /proc/<pid>/maps file. InvalidArgument naming the range when
// part of it is not mapped (or `bytes` is 0); DataLoss naming the line when
// the text does not parse.
absl::StatusOr<bool> RangeWritableInPlace(std::string_view memory_map, const void* data, size_t bytes);

}  // namespace tandem
