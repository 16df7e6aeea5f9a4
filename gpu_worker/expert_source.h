// Where an expert's weights lie in host memory, for the pools' copies: each
// of w1, w3, w2 as one or more rectangular pieces of the full matrix. A
// model's own weights are one piece per matrix (ExpertSource::Whole); the CPU
// workers' shared-memory stores hold, with the split division, each expert
// in slices of its intermediate dimension — w1/w3 rows [b, e) and w2
// columns [b, e) per worker — so a pool that copies from the stores (and
// not from a second host copy of the model) gathers the pieces: row blocks
// with one memcpy each, column blocks with a strided 2D copy.
//
// Views only: the memory must outlive every pool built from them.
//
// Legend: D hidden size, I intermediate size; w1, w3 [I, D], w2 [D, I].
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/base/dtype.h"
#include "common/model/model_weights.h"

namespace tandem {

// Rows [row0, row0 + rows) × columns [col0, col0 + cols) of a row-major
// matrix, at `data` with `pitch` elements from one row's start to the next.
struct MatrixPiece {
  const void* data = nullptr;
  int64_t row0 = 0, col0 = 0;
  int64_t rows = 0, cols = 0;
  int64_t pitch = 0;

  // Bytes from the first element to one past the last, for `elt`-byte elements.
  size_t SpanBytes(size_t elt) const {
    return rows <= 0 ? 0
                     : (static_cast<size_t>(rows - 1) * static_cast<size_t>(pitch) + static_cast<size_t>(cols)) * elt;
  }
};

struct ExpertSource {
  DType dtype = DType::kBF16;
  std::vector<MatrixPiece> w1, w3, w2;  // each tiles its whole matrix

  // One piece per matrix (null data: no pieces, which CheckExpertSource refuses).
  static ExpertSource Whole(const ExpertWeights& weights);
};
using ExpertSources = std::vector<std::vector<ExpertSource>>;  // [layer][expert]

ExpertSources WholeExperts(const std::vector<std::vector<ExpertWeights>>& experts);

// OK when `pieces` tile an [n, k] matrix exactly: each inside it, pitch >=
// cols, data set, no two overlapping, the areas adding up to n·k.
// InvalidArgument naming `name` and the piece otherwise.
absl::Status CheckMatrixPieces(std::span<const MatrixPiece> pieces, int64_t n, int64_t k, const std::string& name);

// Copies `pieces` into the row-major [n, k] matrix at `dst` (host memory).
void GatherMatrixPieces(std::span<const MatrixPiece> pieces, size_t elt, int64_t k, uint8_t* dst);

}  // namespace tandem
