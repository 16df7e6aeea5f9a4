// Where an expert's weights lie in host memory, for the pools' copies: each
// of w1, w3, w2 as one or more rectangular pieces of the full matrix. A
// model's own weights are one piece per matrix (ExpertSource::Whole); the CPU
// workers' shared-memory stores hold, with the split division, each expert
// in slices of its intermediate dimension — w1/w3 rows [b, e) and w2
// columns [b, e) per worker — so a pool that copies from the stores (and
// not from a second host copy of the model) gathers the pieces: row blocks
// with one memcpy each, column blocks with a strided 2D copy.
//
// A block-quantized matrix (a GGUF's experts kept as blocks) is described in
// values all the same: columns, col0 and pitch are counts of values and must
// be whole blocks (the workers' splits cut on block boundaries, checked when
// they are made), so a piece's row is DTypeRowBytes(dtype, cols) bytes.
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

  // Bytes from the first element to one past the last, for elements (or
  // blocks) of `dtype`.
  size_t SpanBytes(DType dtype) const {
    return rows <= 0 ? 0 : static_cast<size_t>((rows - 1) * DTypeRowBytes(dtype, pitch) + DTypeRowBytes(dtype, cols));
  }
};

struct ExpertSource {
  DType w1_dtype = DType::kBF16;  // each matrix's stored type
  DType w3_dtype = DType::kBF16;
  DType w2_dtype = DType::kBF16;
  // Each matrix's block order (dtype.h): a copy in a pool keeps its
  // source's, and the pool's kernels read it so. It may differ between
  // experts of a layer (a load whose copy budget ran out leaves the rest
  // mapped, in ggml's order), never between the pieces of one matrix.
  BlockOrder w1_order = BlockOrder::kGgml;
  BlockOrder w3_order = BlockOrder::kGgml;
  BlockOrder w2_order = BlockOrder::kGgml;
  std::vector<MatrixPiece> w1, w3, w2;  // each tiles its whole matrix

  // One piece per matrix (null data: no pieces, which CheckExpertSource refuses).
  static ExpertSource Whole(const ExpertWeights& weights);
};
using ExpertSources = std::vector<std::vector<ExpertSource>>;  // [layer][expert]

ExpertSources WholeExperts(const std::vector<std::vector<ExpertWeights>>& experts);

// OK when `pieces` tile an [n, k] matrix of `dtype` exactly: each inside
// it, pitch >= cols, data set, no two overlapping, the areas adding up to
// n·k, and for a block type col0, cols and pitch whole blocks.
// InvalidArgument naming `name` and the piece otherwise.
absl::Status CheckMatrixPieces(std::span<const MatrixPiece> pieces, DType dtype, int64_t n, int64_t k,
                               const std::string& name);

// Copies `pieces` into the row-major [n, k] matrix of `dtype` at `dst`
// (host memory), blocks as stored.
void GatherMatrixPieces(std::span<const MatrixPiece> pieces, DType dtype, int64_t k, uint8_t* dst);

// Where piece `p` starts inside a row-major [*, k] matrix of `dtype`, in bytes.
inline size_t PieceOffsetBytes(const MatrixPiece& p, DType dtype, int64_t k) {
  return static_cast<size_t>(p.row0 * DTypeRowBytes(dtype, k) + DTypeRowBytes(dtype, p.col0));
}

}  // namespace tandem
