#include "common/kernels/logit_reductions.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/kernels/vector_exp.h"

namespace tandem {
namespace {

float HorizontalMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

double HorizontalSum(__m256d a, __m256d b) {
  const __m256d s = _mm256_add_pd(a, b);
  const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
  return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}

// 8 f32 lanes summed into two double accumulators (exact widening).
void AddWidened(__m256 v, __m256d& lo, __m256d& hi) {
  lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
  hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

}  // namespace

float MaxValue(std::span<const float> values) {
  const float* v = values.data();
  const size_t n = values.size();
  size_t i = 0;
  float best = -std::numeric_limits<float>::infinity();
  if (n >= 16) {
    // Two chains: max has a latency of a few cycles. The running max is
    // max's second operand, the one it returns when either is NaN, so NaN
    // entries are skipped.
    __m256 m0 = _mm256_set1_ps(best), m1 = m0;
    for (; i + 16 <= n; i += 16) {
      m0 = _mm256_max_ps(_mm256_loadu_ps(v + i), m0);
      m1 = _mm256_max_ps(_mm256_loadu_ps(v + i + 8), m1);
    }
    best = HorizontalMax(_mm256_max_ps(m0, m1));
  }
  for (; i < n; ++i)
    if (v[i] > best) best = v[i];
  return best;
}

int32_t FirstArgmax(std::span<const float> values) {
  const float best = MaxValue(values);
  const float* v = values.data();
  const size_t n = values.size();
  size_t i = 0;
  const __m256 target = _mm256_set1_ps(best);
  for (; i + 8 <= n; i += 8) {
    const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(v + i), target, _CMP_EQ_OQ));
    if (mask != 0) return static_cast<int32_t>(i + static_cast<size_t>(__builtin_ctz(static_cast<unsigned>(mask))));
  }
  for (; i < n; ++i)
    if (v[i] == best) return static_cast<int32_t>(i);
  return 0;  // every entry NaN (callers check AllFinite first)
}

bool AllFinite(std::span<const float> values) {
  const float* v = values.data();
  const size_t n = values.size();
  size_t i = 0;
  // An entry is NaN or Inf exactly when its exponent bits are all ones.
  const __m256i exponent = _mm256_set1_epi32(0x7f800000);
  __m256i seen = _mm256_setzero_si256();
  for (; i + 8 <= n; i += 8) {
    const __m256i bits = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + i)), exponent);
    seen = _mm256_or_si256(seen, _mm256_cmpeq_epi32(bits, exponent));
  }
  if (!_mm256_testz_si256(seen, seen)) return false;
  for (; i < n; ++i)
    if (!std::isfinite(v[i])) return false;
  return true;
}

double ExpWeights(std::span<const float> values, float max, float inv_temperature, float* weights) {
  const float* v = values.data();
  const size_t n = values.size();
  size_t i = 0;
  const __m256 m = _mm256_set1_ps(max), t = _mm256_set1_ps(inv_temperature);
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  for (; i + 8 <= n; i += 8) {
    const __m256 e = ExpAvx2(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(v + i), m), t));
    _mm256_storeu_ps(weights + i, e);
    AddWidened(e, lo, hi);
  }
  double sum = HorizontalSum(lo, hi);
  if (i < n) {
    // The tail through the same polynomial, so a weight never depends on
    // where the vector loop ended.
    alignas(32) float tail[8] = {};
    const size_t rest = n - i;
    for (size_t j = 0; j < 8; ++j) tail[j] = j < rest ? v[i + j] : max;
    _mm256_store_ps(tail, ExpAvx2(_mm256_mul_ps(_mm256_sub_ps(_mm256_load_ps(tail), m), t)));
    for (size_t j = 0; j < rest; ++j) {
      weights[i + j] = tail[j];
      sum += tail[j];
    }
  }
  return sum;
}

CountAndSum CountAndSumAtLeast(std::span<const float> keys, float threshold, const float* weights) {
  const float* v = keys.data();
  const size_t n = keys.size();
  size_t i = 0, count = 0;
  const __m256 t = _mm256_set1_ps(threshold);
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  for (; i + 8 <= n; i += 8) {
    const __m256 at_least = _mm256_cmp_ps(_mm256_loadu_ps(v + i), t, _CMP_GE_OQ);
    count += static_cast<size_t>(__builtin_popcount(static_cast<unsigned>(_mm256_movemask_ps(at_least))));
    AddWidened(_mm256_and_ps(_mm256_loadu_ps(weights + i), at_least), lo, hi);
  }
  double sum = HorizontalSum(lo, hi);
  for (; i < n; ++i) {
    if (v[i] < threshold) continue;
    ++count;
    sum += weights[i];
  }
  return {count, sum};
}

size_t CountAtLeast(std::span<const float> values, float threshold) {
  const float* v = values.data();
  const size_t n = values.size();
  size_t i = 0, count = 0;
  const __m256 t = _mm256_set1_ps(threshold);
  for (; i + 8 <= n; i += 8)
    count += static_cast<size_t>(__builtin_popcount(
        static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(v + i), t, _CMP_GE_OQ)))));
  for (; i < n; ++i) count += v[i] >= threshold ? 1 : 0;
  return count;
}

void IndicesAtLeast(std::span<const float> values, float threshold, std::vector<int32_t>& out) {
  const float* v = values.data();
  const size_t n = values.size();
  size_t i = 0;
  out.clear();
  const __m256 t = _mm256_set1_ps(threshold);
  for (; i + 8 <= n; i += 8) {
    unsigned mask =
        static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(v + i), t, _CMP_GE_OQ)));
    for (; mask != 0; mask &= mask - 1) out.push_back(static_cast<int32_t>(i + static_cast<size_t>(__builtin_ctz(mask))));
  }
  for (; i < n; ++i)
    if (v[i] >= threshold) out.push_back(static_cast<int32_t>(i));
}

void TopIndices(std::span<const float> values, size_t k, std::vector<int32_t>& out) {
  out.clear();
  if (k == 0 || values.empty()) return;
  k = std::min(k, values.size());
  // A threshold with >= k values at or above it, narrowed by bisection
  // between the max (hi: fewer than k above it) and a value that has k.
  const float max = MaxValue(values);
  float hi = std::nextafter(max, std::numeric_limits<float>::infinity()), lo = max;
  for (float step = 1.0f; CountAtLeast(values, lo) < k; step *= 2) {
    hi = lo;
    lo = max - step;
    if (!std::isfinite(lo)) {
      lo = -std::numeric_limits<float>::infinity();
      break;
    }
  }
  for (int i = 0; i < 32; ++i) {
    const float mid = lo + (hi - lo) / 2;
    if (!(mid > lo && mid < hi)) break;
    const size_t count = CountAtLeast(values, mid);
    if (count < k) {
      hi = mid;
    } else {
      lo = mid;
      if (count <= k + 32) break;
    }
  }
  IndicesAtLeast(values, lo, out);
  const float* v = values.data();
  auto larger = [v](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); };
  if (out.size() > k) {
    std::nth_element(out.begin(), out.begin() + static_cast<ptrdiff_t>(k), out.end(), larger);
    out.resize(k);
  }
  std::sort(out.begin(), out.end(), larger);
}

size_t FirstCumulativeAbove(std::span<const float> weights, double target) {
  const float* w = weights.data();
  const size_t n = weights.size();
  constexpr size_t kBlock = 64;
  double cumulative = 0.0;
  size_t i = 0;
  // Whole blocks are skipped on their vector sum; the block that crosses
  // the target is walked one weight at a time.
  for (; i + kBlock <= n; i += kBlock) {
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    for (size_t j = 0; j < kBlock; j += 8) AddWidened(_mm256_loadu_ps(w + i + j), lo, hi);
    const double block = HorizontalSum(lo, hi);
    if (cumulative + block > target) break;
    cumulative += block;
  }
  size_t last_positive = n;
  for (; i < n; ++i) {
    if (w[i] <= 0.0f) continue;
    last_positive = i;
    cumulative += w[i];
    if (cumulative > target) return i;
  }
  if (last_positive != n) return last_positive;
  for (size_t j = n; j-- > 0;)  // rounding left the target just past the end: the last positive weight
    if (w[j] > 0.0f) return j;
  return n;
}

double LogSumExp(std::span<const float> values) {
  const float max = MaxValue(values);
  const float* v = values.data();
  const size_t n = values.size();
  size_t i = 0;
  const __m256 m = _mm256_set1_ps(max);
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  for (; i + 8 <= n; i += 8) AddWidened(ExpAvx2(_mm256_sub_ps(_mm256_loadu_ps(v + i), m)), lo, hi);
  double sum = HorizontalSum(lo, hi);
  for (; i < n; ++i) sum += std::exp(static_cast<double>(v[i]) - max);
  return max + std::log(sum);
}

}  // namespace tandem
