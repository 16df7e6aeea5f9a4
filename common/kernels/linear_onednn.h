// oneDNN path of the linear layer: the W tile widened to f32 in a thread-local
// buffer, then oneDNN 2.x's f32 matmul on one thread. Internal to
// common/kernels/ (the dispatch table's "onednn" entry).
#pragma once

#include "absl/status/status.h"
#include "common/kernels/linear_types.h"

namespace tandem {

// One slice (see LinearSliceArgs) on the calling thread. Internal when
// oneDNN fails, ResourceExhausted when the tile buffer cannot grow. oneDNN
// is capped at ActiveIsa() (dnnl::set_max_cpu_isa) before its first use.
absl::Status OneDnnSlice(const LinearWeight& w, const LinearSliceArgs& a);

}  // namespace tandem
