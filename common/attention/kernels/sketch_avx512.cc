// AVX-512 build (compiled with those flags only here; AVX-512 F/BW, no VNNI instruction) of the
// sketch score kernel for codes of 16 words (32 coordinates): each key's 32 bytes are widened to
// 32 int16 (vpmovsxbw) and multiplied with the query's (vpmaddwd), leaving 16 int32 partial sums
// per key; sixteen keys' partials are reduced together by a transposing tree (32-bit and 64-bit
// unpacks within 128-bit lanes, then two rounds of lane shuffles), 45 instructions per 16 keys
// instead of a horizontal sum per key. The last n % 16 keys run one by one.
#include <immintrin.h>

#include <cstdint>

#include "common/attention/kernels/sketch_kernel.h"

namespace magicpig::attention::internal {
namespace {

inline __m512i KeyPartials(const uint16_t* key, __m512i q) {
  const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(key));
  return _mm512_madd_epi16(_mm512_cvtepi8_epi16(bytes), q);
}

// Per 128-bit lane j: [a_j0 + a_j2, b_j0 + b_j2, a_j1 + a_j3, b_j1 + b_j3].
inline __m512i Pair32(__m512i a, __m512i b) {
  return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}

// From Pair32(a, b) and Pair32(c, d): per 128-bit lane j, the lane's sums [a_j, b_j, c_j, d_j].
inline __m512i Pair64(__m512i ab, __m512i cd) {
  return _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
}

// Lanes [x0, x1, x2, x3] and [y0, y1, y2, y3] -> [x0 + x1, x2 + x3, y0 + y1, y2 + y3].
inline __m512i PairLanes(__m512i x, __m512i y) {
  return _mm512_add_epi32(_mm512_shuffle_i32x4(x, y, 0x88), _mm512_shuffle_i32x4(x, y, 0xDD));
}

}  // namespace

void SketchAvx512(const uint16_t* query_code, const uint16_t* key_codes, int64_t n, int32_t* out) {
  const __m512i q =
      _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(query_code)));
  constexpr int kWords = 16;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512i s[4];
    for (int quad = 0; quad < 4; ++quad) {
      const uint16_t* k = key_codes + (i + 4 * quad) * kWords;
      s[quad] = Pair64(Pair32(KeyPartials(k, q), KeyPartials(k + kWords, q)),
                       Pair32(KeyPartials(k + 2 * kWords, q), KeyPartials(k + 3 * kWords, q)));
    }
    // s[quad]: lane j holds keys 4 quad .. 4 quad + 3's sums over the lane's partials; adding the
    // four lanes: [keys 0-3, 4-7] pairs, then [0-3, 4-7, 8-11, 12-15].
    const __m512i sums = PairLanes(PairLanes(s[0], s[1]), PairLanes(s[2], s[3]));
    _mm512_storeu_si512(out + i, sums);
  }
  for (; i < n; ++i) out[i] = _mm512_reduce_add_epi32(KeyPartials(key_codes + i * kWords, q));
}

}  // namespace magicpig::attention::internal
