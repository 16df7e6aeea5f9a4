// A read-only view of one stored tensor: the bytes belong to whoever produced
// the view (an mmap'd safetensors file, or an in-memory synthetic model) and
// stay valid as long as that owner lives.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/dtype.h"

namespace tandem {

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // row-major, as stored
  const void* data = nullptr;
  size_t size_bytes = 0;
  // A block type's level order (dtype.h): ggml's unless the source put a
  // copy it owns in the VNNI GEMV's group-major order.
  BlockOrder order = BlockOrder::kGgml;

  int64_t num_elements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t dim(int i) const { return shape[static_cast<size_t>(i)]; }
};

std::string ShapeString(const std::vector<int64_t>& shape);  // "[4096, 14336]"

}  // namespace tandem
