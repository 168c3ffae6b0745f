// A 16-float vector for AVX-512 kernel units (see vec16_math-inl.h for the operations every ISA
// provides). Include only from translation units compiled with the AVX-512 flags.
#ifndef MAGICPIG_COMMON_SIMD_VEC16_AVX512_INL_H_
#define MAGICPIG_COMMON_SIMD_VEC16_AVX512_INL_H_

#include <immintrin.h>

#include <cstdint>

namespace magicpig::simd16::avx512 {
constexpr int64_t kLanes = 16;
using V = __m512;
inline V Zero() { return _mm512_setzero_ps(); }
inline V Set1(float a) { return _mm512_set1_ps(a); }
inline V LoadF32(const float* p) { return _mm512_loadu_ps(p); }
inline V LoadF16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// bf16 -> f32 is exact: the 16 bits become the high half of the float.
inline V LoadBf16(const uint16_t* p) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
inline void Store(float* p, V v) { _mm512_storeu_ps(p, v); }
inline V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
inline V Add(V a, V b) { return _mm512_add_ps(a, b); }
inline V Max(V a, V b) { return _mm512_max_ps(a, b); }
inline V Sub(V a, V b) { return _mm512_sub_ps(a, b); }
inline V Floor(V a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
inline V ScaleByPow2(V p, V e) {
  return _mm512_castsi512_ps(
      _mm512_add_epi32(_mm512_castps_si512(p), _mm512_slli_epi32(_mm512_cvtps_epi32(e), 23)));
}
inline float ReduceMax(V v) {
  __m256 s = _mm256_max_ps(_mm512_castps512_ps256(v),
                           _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}
inline float ReduceAdd(V v) {
  __m256 s = _mm256_add_ps(_mm512_castps512_ps256(v),
                           _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}
// out[0..4) = the lane sums of a, b, c, d: the halves added, then one horizontal-add tree for
// all four (a third of the instructions of four separate reductions).
inline void ReduceAdd4(V a, V b, V c, V d, float* out) {
  auto fold = [](V v) {
    return _mm256_add_ps(_mm512_castps512_ps256(v),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  };
  const __m256 ab = _mm256_hadd_ps(fold(a), fold(b));
  const __m256 cd = _mm256_hadd_ps(fold(c), fold(d));
  const __m256 abcd = _mm256_hadd_ps(ab, cd);
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
}
// 16 bf16 values in the order of Bf16ShuffledSource (here the natural order).
inline V LoadBf16Shuffled(const uint16_t* p) { return LoadBf16(p); }
inline int Bf16ShuffledSource(int lane) { return lane; }
inline void Prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
inline void PrefetchL2(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1); }
// Bit i = lane i > 0 (strict; NaN gives 0).
inline uint32_t PositiveMask(V v) {
  return static_cast<uint32_t>(_mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ));
}
}  // namespace magicpig::simd16::avx512

#define MAGICPIG_SIMD16_NS avx512
#define MAGICPIG_SIMD16_HAS_REDUCE_ADD4
#include "common/simd/vec16_math-inl.h"
#undef MAGICPIG_SIMD16_HAS_REDUCE_ADD4
#undef MAGICPIG_SIMD16_NS

#endif  // MAGICPIG_COMMON_SIMD_VEC16_AVX512_INL_H_
