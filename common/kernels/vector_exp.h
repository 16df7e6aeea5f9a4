// e^x on 8 f32 lanes with the build's baseline (AVX2 + FMA), for the
// baseline code that needs it (the expert FFN's SiLU, the AVX2 attention
// kernel). Not for the AVX-512 units, which include no shared inline
// function (common/CMakeLists.txt) and keep their own 16-lane copy of the
// same polynomial (attention_block_avx512.cc).
#pragma once

#include <immintrin.h>

namespace tandem {

// Cephes' expf: 2^n times a degree-6 polynomial of the remainder, about 1
// ulp. x is clamped to [-87.33654, 88], where 2^n stays a normal float:
// below, the result is e^-87.34 (1.2e-38), not 0; callers that need exact
// zeros (masked attention scores) mask them. NaN gives NaN.
inline __m256 ExpAvx2(__m256 x) {
  // x second: max/min return their second operand when either is NaN, so
  // a NaN stays NaN (a silent finite result would hide a poisoned model).
  x = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(_mm256_set1_ps(-87.33654f), x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(exponent));
}

}  // namespace tandem
