// AVX-512 build (compiled with those flags only here) of the sketch score kernels.
//
// SketchAvx512 (F/BW, no VNNI instruction), codes of 16 words (32 coordinates): each key's 32 bytes
// are widened to 32 int16 (vpmovsxbw) and multiplied with the query's (vpmaddwd), leaving 16 int32
// partial sums per key; sixteen keys' partials are reduced together by a transposing tree (32-bit
// and 64-bit unpacks within 128-bit lanes, then two rounds of lane shuffles), 45 instructions per
// 16 keys instead of a horizontal sum per key. The last n % 16 keys run one by one.
//
// SketchGroupAvx512Vnni, codes of 8 or 16 words, a group of heads: vpdpbusd multiplies unsigned
// by signed bytes and sums four products per 32-bit lane, so each key byte is offset by 128
// (XOR 0x80, once per key for the whole group) and the score is the lane sums less
// 128 * sum_j q_j, a constant per head. A 64-byte load holds 64 / (2 words) keys; 16 keys take
// 2 * words / 4 vpdpbusd per head, then the same transposing tree as above reduces their lanes
// (in a key order one vpermd puts back). About 2 instructions per key and head instead of 5.
//
// The collecting pass: sixteen scores compared per step into a mask, the indices at or above the
// threshold compressed to the front of a register (vpcompressd; its memory form is microcoded and
// slow on Zen 4) and stored whole (out + c stays inside n entries: c <= i and i + 16 <= n).
// SketchCollectGroupAvx512Vnni does the same on the scores as they are made, for every head.
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

int64_t CollectAtLeastAvx512(const int32_t* scores, int64_t n, int32_t t, int32_t* out) {
  const __m512i threshold = _mm512_set1_epi32(t);
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  int64_t c = 0;
  int64_t i = 0;
  // No branch on the mask: at a few percent of keys kept, a third of the steps keep one, and a
  // branch on it mispredicted about as often.
  for (; i + 16 <= n; i += 16) {
    const __mmask16 ge = _mm512_cmpge_epi32_mask(_mm512_loadu_si512(scores + i), threshold);
    const __m512i index = _mm512_add_epi32(iota, _mm512_set1_epi32(static_cast<int32_t>(i)));
    _mm512_storeu_si512(out + c, _mm512_maskz_compress_epi32(ge, index));
    c += __builtin_popcount(static_cast<unsigned>(ge));
  }
  for (; i < n; ++i) {
    out[c] = static_cast<int32_t>(i);
    c += scores[i] >= t ? 1 : 0;
  }
  return c;
}

namespace {

// Scores of 16 keys for one head from kLoads = words / 2 registers of offset key bytes, in key
// order. q: the head's code repeated in every 2 * words bytes.
template <int kLoads>
inline __m512i SixteenScores(const __m512i* keys, __m512i q, __m512i bias, __m512i order) {
  __m512i p[kLoads];
  for (int r = 0; r < kLoads; ++r) p[r] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), keys[r], q);
  __m512i sums;
  if constexpr (kLoads == 8) {
    // p[r]: keys 2r (128-bit lanes 0, 1) and 2r + 1 (lanes 2, 3), four partials per lane.
    const __m512i s0 = Pair64(Pair32(p[0], p[1]), Pair32(p[2], p[3]));
    const __m512i s1 = Pair64(Pair32(p[4], p[5]), Pair32(p[6], p[7]));
    // Lanes: [k0 k2 k4 k6], [k1 k3 k5 k7], [k8 k10 k12 k14], [k9 k11 k13 k15].
    sums = PairLanes(s0, s1);
  } else {
    // p[r]: keys 4r .. 4r + 3, one per 128-bit lane. Lane j: [kj, k4+j, k8+j, k12+j].
    sums = Pair64(Pair32(p[0], p[1]), Pair32(p[2], p[3]));
  }
  return _mm512_sub_epi32(_mm512_permutexvar_epi32(order, sums), bias);
}

// Heads [0, g), g <= kMaxHeads: each block of 16 keys is loaded and offset once and scored for
// every head, so the codes are read from memory once per group. sink(h, i, scores) takes head h's
// scores of keys i .. i + 15; tail(h, i, score) a score of the last n % 16 keys.
constexpr int kMaxHeads = 32;

template <int kWords, class Sink, class Tail>
void GroupVnni(const uint16_t* query_codes, int g, const uint16_t* key_codes, int64_t n, Sink sink,
               Tail tail) {
  constexpr int kLoads = kWords / 2;  // 64-byte registers per 16 keys
  // order[k] = the position of key k in SixteenScores' sums.
  const __m512i order =
      kLoads == 8 ? _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15)
                  : _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i q[kMaxHeads], bias[kMaxHeads];
  for (int h = 0; h < g; ++h) {
    const uint16_t* code = query_codes + static_cast<int64_t>(h) * kWords;
    int32_t sum = 0;
    for (int w = 0; w < kWords; ++w) {
      sum += static_cast<int8_t>(code[w] & 0xFF) + static_cast<int8_t>(code[w] >> 8);
    }
    bias[h] = _mm512_set1_epi32(128 * sum);
    if constexpr (kWords == 16) {
      q[h] = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(code)));
    } else {
      q[h] = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(code)));
    }
  }
  const int64_t full = n - n % 16;
  for (int64_t i = 0; i < full; i += 16) {
    __m512i keys[kLoads];
    const uint16_t* k = key_codes + i * kWords;
    for (int r = 0; r < kLoads; ++r) {
      keys[r] = _mm512_xor_si512(_mm512_loadu_si512(k + 32 * r), offset);
    }
    for (int h = 0; h < g; ++h) sink(h, i, SixteenScores<kLoads>(keys, q[h], bias[h], order));
  }
  for (int64_t i = full; i < n; ++i) {
    for (int h = 0; h < g; ++h) {
      int32_t score;
      SketchScalar(query_codes + static_cast<int64_t>(h) * kWords, key_codes + i * kWords, 1,
                   kWords, &score);
      tail(h, i, score);
    }
  }
}

template <int kWords>
void StoreGroup(const uint16_t* query_codes, int g, const uint16_t* key_codes, int64_t n,
                int32_t* out) {
  GroupVnni<kWords>(
      query_codes, g, key_codes, n,
      [out, n](int h, int64_t i, __m512i scores) { _mm512_storeu_si512(out + h * n + i, scores); },
      [out, n](int h, int64_t i, int32_t score) { out[h * n + i] = score; });
}

template <int kWords>
void CollectGroup(const uint16_t* query_codes, int g, const uint16_t* key_codes, int64_t n,
                  const int32_t* thresholds, int64_t stride, int32_t* idx, int32_t* val,
                  int64_t* counts) {
  __m512i t[kMaxHeads];
  for (int h = 0; h < g; ++h) t[h] = _mm512_set1_epi32(thresholds[h]);
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  GroupVnni<kWords>(
      query_codes, g, key_codes, n,
      [&](int h, int64_t i, __m512i scores) {
        // Whole stores: counts[h] <= i, so counts[h] + 16 <= n <= stride.
        const __mmask16 ge = _mm512_cmpge_epi32_mask(scores, t[h]);
        const int64_t c = counts[h];
        const __m512i index = _mm512_add_epi32(iota, _mm512_set1_epi32(static_cast<int32_t>(i)));
        _mm512_storeu_si512(idx + h * stride + c, _mm512_maskz_compress_epi32(ge, index));
        _mm512_storeu_si512(val + h * stride + c, _mm512_maskz_compress_epi32(ge, scores));
        counts[h] = c + __builtin_popcount(static_cast<unsigned>(ge));
      },
      [&](int h, int64_t i, int32_t score) {
        if (score < thresholds[h]) return;
        idx[h * stride + counts[h]] = static_cast<int32_t>(i);
        val[h * stride + counts[h]++] = score;
      });
}

}  // namespace

void SketchGroupAvx512Vnni(const uint16_t* query_codes, int g, const uint16_t* key_codes, int64_t n,
                           int words, int32_t* out) {
  for (int h = 0; h < g; h += kMaxHeads) {
    const int hc = g - h < kMaxHeads ? g - h : kMaxHeads;
    const uint16_t* qc = query_codes + static_cast<int64_t>(h) * words;
    if (words == 16) {
      StoreGroup<16>(qc, hc, key_codes, n, out + h * n);
    } else {
      StoreGroup<8>(qc, hc, key_codes, n, out + h * n);
    }
  }
}

void SketchCollectGroupAvx512Vnni(const uint16_t* query_codes, int g, const uint16_t* key_codes,
                                  int64_t n, int words, const int32_t* thresholds, int64_t stride,
                                  int32_t* idx, int32_t* val, int64_t* counts) {
  for (int h = 0; h < g; h += kMaxHeads) {
    const int hc = g - h < kMaxHeads ? g - h : kMaxHeads;
    const uint16_t* qc = query_codes + static_cast<int64_t>(h) * words;
    if (words == 16) {
      CollectGroup<16>(qc, hc, key_codes, n, thresholds + h, stride, idx + h * stride,
                       val + h * stride, counts + h);
    } else {
      CollectGroup<8>(qc, hc, key_codes, n, thresholds + h, stride, idx + h * stride,
                      val + h * stride, counts + h);
    }
  }
}

}  // namespace magicpig::attention::internal
