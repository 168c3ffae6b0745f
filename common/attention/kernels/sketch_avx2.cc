// AVX2 build (compiled with those flags only here) of the sketch score kernel for codes of a
// multiple of 8 words: each key's 16-byte chunks are widened to int16 (vpmovsxbw) and multiplied
// with the query's (vpmaddwd), leaving eight int32 partial sums per key; eight keys' partials are
// reduced together with three rounds of vphaddd and one lane swap. Loads never pass the end of
// key_codes (a key is a whole number of 16-byte chunks); the last n % 8 keys run one by one.
//
// The collecting pass: eight scores compared per step; their indices at or above the threshold
// moved to the front with a vpermd looked up from the 8-bit mask, and the register stored whole
// (out + c stays inside n entries: c <= i and i + 8 <= n).
#include <immintrin.h>

#include <cstdint>

#include "common/attention/kernels/compact_table.h"
#include "common/attention/kernels/sketch_kernel.h"

namespace magicpig::attention::internal {
namespace {

// The eight int32 partial sums of one key's code (chunks of 8 words) against the query's chunks.
inline __m256i KeyPartials(const uint16_t* key, const __m256i* q, int chunks) {
  __m256i acc = _mm256_setzero_si256();
  for (int c = 0; c < chunks; ++c) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(key + 8 * c));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_cvtepi8_epi16(bytes), q[c]));
  }
  return acc;
}

inline int32_t Sum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_hadd_epi32(s, s);
  s = _mm_hadd_epi32(s, s);
  return _mm_cvtsi128_si32(s);
}

}  // namespace

void SketchAvx2(const uint16_t* query_code, const uint16_t* key_codes, int64_t n, int words,
                int32_t* out) {
  const int chunks = words / 8;
  __m256i q[2];
  for (int c = 0; c < chunks; ++c) {
    q[c] =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(query_code + 8 * c)));
  }
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i p[8];
    for (int k = 0; k < 8; ++k) p[k] = KeyPartials(key_codes + (i + k) * words, q, chunks);
    // [k0 k1 k0 k1 | ...] pairs, then quads: u0 = [k0 k1 k2 k3 | k0 k1 k2 k3] (low / high lanes).
    const __m256i t0 = _mm256_hadd_epi32(p[0], p[1]);
    const __m256i t1 = _mm256_hadd_epi32(p[2], p[3]);
    const __m256i t2 = _mm256_hadd_epi32(p[4], p[5]);
    const __m256i t3 = _mm256_hadd_epi32(p[6], p[7]);
    const __m256i u0 = _mm256_hadd_epi32(t0, t1);
    const __m256i u1 = _mm256_hadd_epi32(t2, t3);
    const __m256i lo = _mm256_permute2x128_si256(u0, u1, 0x20);
    const __m256i hi = _mm256_permute2x128_si256(u0, u1, 0x31);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_add_epi32(lo, hi));
  }
  for (; i < n; ++i) out[i] = Sum(KeyPartials(key_codes + i * words, q, chunks));
}

int64_t CollectAtLeastAvx2(const int32_t* scores, int64_t n, int32_t t, int32_t* out) {
  // score >= t  <=>  score > t - 1 (t > INT32_MIN: scores lie within kSketchMaxScore).
  const __m256i below = _mm256_set1_epi32(t - 1);
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  int64_t c = 0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i s = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scores + i));
    // No branch on the mask (at a few percent kept it would mispredict often).
    const int mask = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(s, below)));
    const __m256i perm =
        _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(kCompact.entry[mask])));
    const __m256i index = _mm256_add_epi32(iota, _mm256_set1_epi32(static_cast<int32_t>(i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c),
                        _mm256_permutevar8x32_epi32(index, perm));
    c += __builtin_popcount(static_cast<unsigned>(mask));
  }
  for (; i < n; ++i) {
    out[c] = static_cast<int32_t>(i);
    c += scores[i] >= t ? 1 : 0;
  }
  return c;
}

}  // namespace magicpig::attention::internal
