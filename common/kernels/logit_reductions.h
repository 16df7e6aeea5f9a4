// Passes over one row of vocabulary logits (32-256K floats) that every
// decode step makes after the lm_head: the largest logit and its first
// index, whether all are finite, log-sum-exp, and the unnormalised
// probabilities e^((l - max) / T), and thresholded counts and sums for the
// sampler's cuts. Vectorised with the build's baseline (AVX2 + FMA,
// vector_exp.h): with them the sampler no longer sorts the vocabulary or
// calls a double exp per token, which at temperature 1 had cost a small
// model about as much as its whole forward pass (docs/BENCHMARKS.md,
// Sampling).
// Pure functions of their arguments; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace tandem {

// The largest value and the lowest index holding it (std::max_element's
// answer). NaN entries are skipped: callers check AllFinite first.
// `values` must not be empty.
float MaxValue(std::span<const float> values);
int32_t FirstArgmax(std::span<const float> values);

// True when no entry is NaN or +-Inf.
bool AllFinite(std::span<const float> values);

// log(sum_i e^values[i]), computed as max + log(sum e^(v - max)) with f32
// exponentials (about 1 ulp each) summed in double. Finite input, not empty.
double LogSumExp(std::span<const float> values);

// weights[i] = e^((values[i] - max) * inv_temperature), f32, where max is
// MaxValue(values) passed in; returns their sum in double. The largest
// weight is 1; ones below e^-87.3 come out as about 1.2e-38, not 0.
double ExpWeights(std::span<const float> values, float max, float inv_temperature, float* weights);

// How many keys are >= threshold, and the sum (in double) of the weights
// at their indices.
struct CountAndSum {
  size_t count = 0;
  double sum = 0.0;
};
CountAndSum CountAndSumAtLeast(std::span<const float> keys, float threshold, const float* weights);

// How many entries are >= threshold, and their indices in order (`out`
// is cleared first).
size_t CountAtLeast(std::span<const float> values, float threshold);
void IndicesAtLeast(std::span<const float> values, float threshold, std::vector<int32_t>& out);

// The indices of the k largest values (all when k >= size), largest first,
// ties to the lower index: by a threshold that holds them (a few counting
// passes), never a sort of the whole row. Finite values.
void TopIndices(std::span<const float> values, size_t k, std::vector<int32_t>& out);

// The first index i whose running sum weights[0] + ... + weights[i] exceeds
// `target` (inverse-CDF sampling with target uniform in [0, total)); when
// rounding leaves the target at or past the total, the last positive
// weight's index; weights.size() when none is positive. Weights >= 0.
size_t FirstCumulativeAbove(std::span<const float> weights, double target);

}  // namespace tandem
