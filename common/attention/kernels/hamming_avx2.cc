// AVX2 build (compiled with those flags only here) of the Hamming distance kernel: bytes are
// counted with a 16-entry nibble table (two vpshufb per 32 bytes), then summed per key. Codes of
// 1, 2 and 4 words take 16 keys per step (vpmaddubsw / vpmaddwd / vpsadbw, then packs); 8 words two
// keys per vector; any other length one key per vector, masked to its words. The last keys of a
// fast path run from a zero-padded copy on the stack, so no load passes the end of key_codes.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "common/attention/kernels/hamming_kernel.h"

namespace magicpig::attention::internal {
namespace {

inline __m256i PopcountBytes(__m256i v) {
  const __m256i table = _mm256_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4, 0, 1, 1, 2,
                                         1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4);
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i lo = _mm256_and_si256(v, nibble);
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
  return _mm256_add_epi8(_mm256_shuffle_epi8(table, lo), _mm256_shuffle_epi8(table, hi));
}

inline __m256i Load(const uint16_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

inline __m256i CountXor(const uint16_t* p, __m256i q) {
  return PopcountBytes(_mm256_xor_si256(Load(p), q));
}

constexpr int kGroup = 16;  // keys per step of the 1-, 2- and 4-word paths

// 16 keys of kWords words at keys -> out[0 .. 16).
template <int kWords>
inline void Group(const uint16_t* keys, __m256i q, uint16_t* out) {
  const __m256i ones8 = _mm256_set1_epi8(1);
  if constexpr (kWords == 1) {
    // Byte pairs -> 16-bit counts, one per key, already in order.
    const __m256i c = _mm256_maddubs_epi16(CountXor(keys, q), ones8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), c);
  } else if constexpr (kWords == 2) {
    const __m256i ones16 = _mm256_set1_epi16(1);
    const __m256i c0 = _mm256_madd_epi16(_mm256_maddubs_epi16(CountXor(keys, q), ones8), ones16);
    const __m256i c1 =
        _mm256_madd_epi16(_mm256_maddubs_epi16(CountXor(keys + 16, q), ones8), ones16);
    // [k0..3, k8..11 | k4..7, k12..15] -> key order.
    const __m256i p = _mm256_packus_epi32(c0, c1);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permute4x64_epi64(p, 0xD8));
  } else {
    static_assert(kWords == 4);
    const __m256i zero = _mm256_setzero_si256();
    __m256i s[4];
    for (int v = 0; v < 4; ++v) s[v] = _mm256_sad_epu8(CountXor(keys + 16 * v, q), zero);
    // 64-bit counts [k0 k1 | k2 k3] ... -> 32-bit pairs [k0 k1, k4 k5 | k2 k3, k6 k7] -> 16-bit
    // [k0 k1 k4 k5 k8 k9 k12 k13 | k2 k3 k6 k7 k10 k11 k14 k15] -> key order by 32-bit pairs.
    const __m256i p01 = _mm256_packus_epi32(s[0], s[1]);
    const __m256i p23 = _mm256_packus_epi32(s[2], s[3]);
    const __m256i p = _mm256_packus_epi32(p01, p23);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permutevar8x32_epi32(p, order));
  }
}

template <int kWords>
void Grouped(const uint16_t* query_code, const uint16_t* key_codes, int64_t n, uint16_t* out) {
  __m256i q;
  if constexpr (kWords == 1) {
    q = _mm256_set1_epi16(static_cast<int16_t>(query_code[0]));
  } else if constexpr (kWords == 2) {
    uint32_t w;
    std::memcpy(&w, query_code, sizeof(w));
    q = _mm256_set1_epi32(static_cast<int32_t>(w));
  } else {
    uint64_t w;
    std::memcpy(&w, query_code, sizeof(w));
    q = _mm256_set1_epi64x(static_cast<int64_t>(w));
  }
  const int64_t full = n - n % kGroup;
  for (int64_t i = 0; i < full; i += kGroup) Group<kWords>(key_codes + i * kWords, q, out + i);
  const int64_t rest = n - full;
  if (rest > 0) {
    uint16_t keys[kGroup * kWords] = {};
    uint16_t counts[kGroup];
    std::memcpy(keys, key_codes + full * kWords, sizeof(uint16_t) * rest * kWords);
    Group<kWords>(keys, q, counts);
    std::memcpy(out + full, counts, sizeof(uint16_t) * rest);
  }
}

// 8 words: two keys per vector; each 128-bit half's two 64-bit sums added.
void EightWords(const uint16_t* query_code, const uint16_t* key_codes, int64_t n, uint16_t* out) {
  const __m256i q =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(query_code)));
  const __m256i zero = _mm256_setzero_si256();
  const int64_t full = n - n % 2;
  for (int64_t i = 0; i < full; i += 2) {
    const __m256i s = _mm256_sad_epu8(CountXor(key_codes + i * 8, q), zero);
    const __m256i t = _mm256_add_epi64(s, _mm256_bsrli_epi128(s, 8));
    out[i] = static_cast<uint16_t>(_mm256_extract_epi16(t, 0));
    out[i + 1] = static_cast<uint16_t>(_mm256_extract_epi16(t, 8));
  }
  if (full < n) {
    const __m128i k = _mm_loadu_si128(reinterpret_cast<const __m128i*>(key_codes + full * 8));
    const __m256i x = _mm256_castsi128_si256(_mm_xor_si128(k, _mm256_castsi256_si128(q)));
    const __m256i s =
        _mm256_sad_epu8(_mm256_and_si256(PopcountBytes(x), _mm256_setr_epi64x(-1, -1, 0, 0)), zero);
    out[full] = static_cast<uint16_t>(
        _mm256_extract_epi16(_mm256_add_epi64(s, _mm256_bsrli_epi128(s, 8)), 0));
  }
}

// Any length: one key per vector, the bytes past its words masked off.
void OneKeyPerVector(const uint16_t* query_code, const uint16_t* key_codes, int64_t n, int words,
                     uint16_t* out) {
  uint16_t padded[kHammingMaxWords] = {};
  std::memcpy(padded, query_code, sizeof(uint16_t) * words);
  const __m256i q = Load(padded);
  alignas(32) uint16_t mask_words[kHammingMaxWords] = {};
  for (int w = 0; w < words; ++w) mask_words[w] = 0xFFFF;
  const __m256i mask = Load(mask_words);
  const __m256i zero = _mm256_setzero_si256();
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t* key = key_codes + i * words;
    __m256i k;
    if ((n - i) * words >= kHammingMaxWords) {
      k = Load(key);  // the 32 bytes stay inside key_codes
    } else {
      std::memcpy(padded, key, sizeof(uint16_t) * words);
      k = Load(padded);
    }
    const __m256i s =
        _mm256_sad_epu8(PopcountBytes(_mm256_and_si256(_mm256_xor_si256(k, q), mask)), zero);
    const __m128i h = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    out[i] = static_cast<uint16_t>(_mm_cvtsi128_si32(_mm_add_epi64(h, _mm_unpackhi_epi64(h, h))));
  }
}

}  // namespace

void HammingAvx2(const uint16_t* query_code, const uint16_t* key_codes, int64_t n, int words,
                 uint16_t* out) {
  switch (words) {
    case 1:
      return Grouped<1>(query_code, key_codes, n, out);
    case 2:
      return Grouped<2>(query_code, key_codes, n, out);
    case 4:
      return Grouped<4>(query_code, key_codes, n, out);
    case 8:
      return EightWords(query_code, key_codes, n, out);
    default:
      return OneKeyPerVector(query_code, key_codes, n, words, out);
  }
}

}  // namespace magicpig::attention::internal
