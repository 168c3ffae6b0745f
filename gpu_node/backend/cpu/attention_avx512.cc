// AVX-512 build of the attention tile kernel (compiled with AVX-512 flags only here).
#include <immintrin.h>

#include <cstdint>

namespace magicpig::backend::cpu_internal::avx512 {
constexpr int64_t kLanes = 16;
using V = __m512;
inline V Zero() { return _mm512_setzero_ps(); }
inline V Set1(float a) { return _mm512_set1_ps(a); }
inline V LoadF32(const float* p) { return _mm512_loadu_ps(p); }
inline V LoadF16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline void Store(float* p, V v) { _mm512_storeu_ps(p, v); }
inline V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
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
}  // namespace magicpig::backend::cpu_internal::avx512

#define MAGICPIG_ATTN_NS avx512
#include "gpu_node/backend/cpu/attention_kernel-inl.h"

namespace magicpig::backend::cpu_internal {
void AttentionTileAvx512(const AttentionTile& tile) { avx512::RunTile(tile); }
}  // namespace magicpig::backend::cpu_internal
