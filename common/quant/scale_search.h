// The per-sub-block scale searches of ggml's K-quant reference quantizers
// (the algorithm of ggml-quants.c, written anew): try a few scales around the
// naive max-based one, fit scale (and min) by weighted least squares for the
// levels each gives, keep the fit with the least weighted squared error.
// Float operations are done in the same order as ggml's so that, built
// without FMA contraction, the chosen levels are bit-identical to its.
#pragma once

#include <cstdint>

#include "absl/types/span.h"

namespace tandem {

// Round to nearest, ties to even, for |value| < 2^22 (larger and non-finite
// values give an unspecified integer, never undefined behaviour). ggml's
// nearest_int: adding 1.5 * 2^23 leaves the rounded integer in the mantissa.
int NearestInt(float value);

// Asymmetric fit x[i] ~= scale * levels[i] - min with levels in [0, max_level]
// and min >= 0 (the zero point never lies above the smallest value): ggml's
// make_qkx2_quants with squared error. Tries `steps`+1 inverse scales
// (first_offset + step_offset*k + max_level) / (max - min), k = 0..steps.
struct AffineSearch {
  int max_level;       // 15 for Q4_K, 31 for Q5_K
  float first_offset;  // -1 for Q4_K, -0.5 for Q5_K
  float step_offset;   // 0.1
  int steps;           // 20 for Q4_K, 15 for Q5_K
};
struct AffineFit {
  float scale;
  float min;  // subtracted: value = scale * level - min
};
// `x`, `weights` and `levels` have the same length (at most 32).
AffineFit FitAffineLevels(absl::Span<const float> x, absl::Span<const float> weights, const AffineSearch& search,
                          absl::Span<uint8_t> levels);

// Symmetric fit x[i] ~= scale * (levels[i] - max_level), levels in
// [0, 2*max_level - 1], weighting each value by x^2: ggml's make_qx_quants
// with rmse_type 1 (Q6_K uses max_level 32). Tries the naive scale
// -max_level/max and 18 neighbours -(max_level + 0.1k)/max, k = +-1..9, where
// max is the value of largest magnitude. Returns 0 (all levels 0) for a group
// whose largest magnitude is under 1e-15.
float FitSymmetricLevels(absl::Span<const float> x, int max_level, absl::Span<int8_t> levels);

}  // namespace tandem
