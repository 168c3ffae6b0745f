// A 16-float vector for AVX2 + FMA + F16C kernel units: two __m256 halves (see vec16_math-inl.h).
// Include only from translation units compiled with the AVX2 flags.
#ifndef MAGICPIG_COMMON_SIMD_VEC16_AVX2_INL_H_
#define MAGICPIG_COMMON_SIMD_VEC16_AVX2_INL_H_

#include <immintrin.h>

#include <cstdint>

namespace magicpig::simd16::avx2 {
constexpr int64_t kLanes = 16;
struct V {
  __m256 lo, hi;
};
inline V Zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline V Set1(float a) { return {_mm256_set1_ps(a), _mm256_set1_ps(a)}; }
inline V LoadF32(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline V LoadF16(const uint16_t* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
}
inline __m256 Bf16Half(const uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
inline V LoadBf16(const uint16_t* p) { return {Bf16Half(p), Bf16Half(p + 8)}; }
inline void Store(float* p, V v) {
  _mm256_storeu_ps(p, v.lo);
  _mm256_storeu_ps(p + 8, v.hi);
}
inline V Fma(V a, V b, V c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
inline V Mul(V a, V b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline V Add(V a, V b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline V Max(V a, V b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline V Sub(V a, V b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline V Floor(V a) { return {_mm256_floor_ps(a.lo), _mm256_floor_ps(a.hi)}; }
inline __m256 ScaleHalf(__m256 p, __m256 e) {
  return _mm256_castsi256_ps(
      _mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_cvtps_epi32(e), 23)));
}
inline V ScaleByPow2(V p, V e) { return {ScaleHalf(p.lo, e.lo), ScaleHalf(p.hi, e.hi)}; }
inline float ReduceMax(V v) {
  __m256 s = _mm256_max_ps(v.lo, v.hi);
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}
inline float ReduceAdd(V v) {
  __m256 s = _mm256_add_ps(v.lo, v.hi);
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}
// 16 bf16 values in the order of Bf16ShuffledSource (one load and two bit operations, no
// widening shuffle): lanes 0..7 are p[0], p[2], ..., p[14] and lanes 8..15 are p[1], ..., p[15].
inline V LoadBf16Shuffled(const uint16_t* p) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(x, 16)),
          _mm256_castsi256_ps(_mm256_blend_epi16(x, _mm256_setzero_si256(), 0x55))};
}
// The element of p that LoadBf16Shuffled puts in `lane`.
inline int Bf16ShuffledSource(int lane) { return lane < 8 ? 2 * lane : 2 * (lane - 8) + 1; }
// out[0..4) = the lane sums of a, b, c, d (one horizontal-add tree for all four).
inline void ReduceAdd4(V a, V b, V c, V d, float* out) {
  const __m256 ab = _mm256_hadd_ps(_mm256_add_ps(a.lo, a.hi), _mm256_add_ps(b.lo, b.hi));
  const __m256 cd = _mm256_hadd_ps(_mm256_add_ps(c.lo, c.hi), _mm256_add_ps(d.lo, d.hi));
  const __m256 abcd = _mm256_hadd_ps(ab, cd);
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
}
// A dot-product accumulator that folds V's two halves into one register (a.lo * b.lo + a.hi *
// b.hi): two rows x four heads of accumulators then fit AVX2's 16 registers with room for the
// operands.
using DotAcc = __m256;
inline DotAcc DotAccZero() { return _mm256_setzero_ps(); }
inline DotAcc DotAccFma(V a, V b, DotAcc c) {
  return _mm256_fmadd_ps(a.hi, b.hi, _mm256_fmadd_ps(a.lo, b.lo, c));
}
// out[0..8) = the lane sums of a[0..8) (one horizontal-add tree).
inline void DotAccReduce8(const DotAcc* a, float* out) {
  // hadd(hadd(a, b), hadd(c, d)) = [a, b, c, d sums over lanes 0-3 | the same over lanes 4-7].
  const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 efgh = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_permute2f128_ps(abcd, efgh, 0x20),
                                      _mm256_permute2f128_ps(abcd, efgh, 0x31)));
}
inline void Prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
inline void PrefetchL2(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1); }
// Bit i = lane i > 0 (strict; NaN gives 0).
inline uint32_t PositiveMask(V v) {
  const __m256 z = _mm256_setzero_ps();
  return static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(v.lo, z, _CMP_GT_OQ))) |
         static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(v.hi, z, _CMP_GT_OQ))) << 8;
}
}  // namespace magicpig::simd16::avx2

#define MAGICPIG_SIMD16_NS avx2
#define MAGICPIG_SIMD16_HAS_REDUCE_ADD4
#define MAGICPIG_SIMD16_HAS_DOT_ACC
#include "common/simd/vec16_math-inl.h"
#undef MAGICPIG_SIMD16_HAS_DOT_ACC
#undef MAGICPIG_SIMD16_HAS_REDUCE_ADD4
#undef MAGICPIG_SIMD16_NS

#endif  // MAGICPIG_COMMON_SIMD_VEC16_AVX2_INL_H_
