#include "gpu_worker/expert_source.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

MatrixPiece WholePiece(const LinearWeight& m) {
  return MatrixPiece{.data = m.data, .row0 = 0, .col0 = 0, .rows = m.n, .cols = m.k, .pitch = m.k};
}

}  // namespace

ExpertSource ExpertSource::Whole(const ExpertWeights& weights) {
  ExpertSource source;
  source.w1_dtype = weights.w1.dtype;
  source.w3_dtype = weights.w3.dtype;
  source.w2_dtype = weights.w2.dtype;
  source.w1_order = weights.w1.order;
  source.w3_order = weights.w3.order;
  source.w2_order = weights.w2.order;
  if (weights.w1.data != nullptr) source.w1.push_back(WholePiece(weights.w1));
  if (weights.w3.data != nullptr) source.w3.push_back(WholePiece(weights.w3));
  if (weights.w2.data != nullptr) source.w2.push_back(WholePiece(weights.w2));
  return source;
}

ExpertSources WholeExperts(const std::vector<std::vector<ExpertWeights>>& experts) {
  ExpertSources sources;
  for (const std::vector<ExpertWeights>& layer : experts) {
    std::vector<ExpertSource>& out = sources.emplace_back();
    for (const ExpertWeights& expert : layer) out.push_back(ExpertSource::Whole(expert));
  }
  return sources;
}

absl::Status CheckMatrixPieces(std::span<const MatrixPiece> pieces, DType dtype, int64_t n, int64_t k,
                               const std::string& name) {
  if (pieces.empty()) return absl::InvalidArgumentError(absl::StrCat(name, ": no data"));
  const int64_t block = DTypeBlockSize(dtype);
  int64_t area = 0;
  for (size_t p = 0; p < pieces.size(); ++p) {
    const MatrixPiece& a = pieces[p];
    const std::string piece = absl::StrCat(name, " piece ", p, " (rows ", a.row0, "+", a.rows, ", cols ", a.col0, "+",
                                           a.cols, ", pitch ", a.pitch, ")");
    if (a.data == nullptr) return absl::InvalidArgumentError(absl::StrCat(piece, ": no data"));
    if (a.rows <= 0 || a.cols <= 0 || a.row0 < 0 || a.col0 < 0 || a.row0 + a.rows > n || a.col0 + a.cols > k) {
      return absl::InvalidArgumentError(absl::StrCat(piece, ": outside the [", n, ", ", k, "] matrix"));
    }
    if (a.pitch < a.cols) return absl::InvalidArgumentError(absl::StrCat(piece, ": pitch below its width"));
    if (a.col0 % block != 0 || a.cols % block != 0 || a.pitch % block != 0) {
      return absl::InvalidArgumentError(absl::StrCat(piece, ": ", std::string(DTypeName(dtype)), " blocks hold ", block,
                                                     " values; a piece must start and end on whole blocks"));
    }
    for (size_t q = 0; q < p; ++q) {
      const MatrixPiece& b = pieces[q];
      const bool apart = a.row0 + a.rows <= b.row0 || b.row0 + b.rows <= a.row0 || a.col0 + a.cols <= b.col0 ||
                         b.col0 + b.cols <= a.col0;
      if (!apart) return absl::InvalidArgumentError(absl::StrCat(piece, ": overlaps piece ", q));
    }
    area += a.rows * a.cols;
  }
  if (area != n * k) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": pieces cover ", area, " of the [", n, ", ", k, "] matrix's ", n * k, " elements"));
  }
  return absl::OkStatus();
}

void GatherMatrixPieces(std::span<const MatrixPiece> pieces, DType dtype, int64_t k, uint8_t* dst) {
  const size_t row_bytes = static_cast<size_t>(DTypeRowBytes(dtype, k));
  for (const MatrixPiece& p : pieces) {
    const auto* src = static_cast<const uint8_t*>(p.data);
    uint8_t* out = dst + PieceOffsetBytes(p, dtype, k);
    const size_t piece_row = static_cast<size_t>(DTypeRowBytes(dtype, p.cols));
    if (p.col0 == 0 && p.cols == k && p.pitch == k) {  // whole rows, contiguous: one copy
      std::memcpy(out, src, static_cast<size_t>(p.rows) * piece_row);
      continue;
    }
    const size_t pitch_bytes = static_cast<size_t>(DTypeRowBytes(dtype, p.pitch));
    for (int64_t r = 0; r < p.rows; ++r) {
      std::memcpy(out + static_cast<size_t>(r) * row_bytes, src + static_cast<size_t>(r) * pitch_bytes, piece_row);
    }
  }
}

}  // namespace tandem
