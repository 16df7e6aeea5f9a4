// Which host memory to page-lock (cudaHostRegister) so that expert
// migrations DMA straight from where the weights already lie — the mapped
// safetensors, the synthetic model's buffers, a worker's shared-memory store
// — with no second, pinned host copy.
//
// cudaHostRegister works on whole pages and refuses a range that overlaps
// one already registered, so the expert matrices' ranges are widened to page
// boundaries and merged where they touch or overlap: a checkpoint whose
// experts lie back to back becomes one region per file, and a page shared by
// two tensors is registered once. Every byte of a merged region lies on a
// page that holds expert bytes, so it is mapped memory.
//
// Host C++ only (no CUDA): the CUDA pool takes the result, and the no-CUDA
// build tests the arithmetic.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpu_worker/expert_source.h"

namespace tandem {

// A host range holding expert weights, to page-lock in place.
struct PinnedHostRegion {
  const void* data = nullptr;
  size_t bytes = 0;
  bool read_only = true;  // the GPU never writes it (and the mapping may be PROT_READ)
};

// The page-aligned, disjoint, sorted regions covering every piece of every
// matrix (w1, w3, w2) of `experts` ([layer][expert]); `page_bytes` is the
// host page size (a power of two).
std::vector<PinnedHostRegion> ExpertHostRegions(const ExpertSources& experts, size_t page_bytes);

}  // namespace tandem
