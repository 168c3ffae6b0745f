// AVX-512 build (compiled with the AVX-512 flags plus -mavx512vpopcntdq, only here) of the Hamming
// distance kernel; the dispatcher calls it only where the CPU has AVX512_VPOPCNTDQ. XOR, then
// vpopcntd/vpopcntq, then per-key sums: 32 keys per step for 1 word (two 16-bit halves of each
// dword), 16 for 2 (vpmovdw), 8 for 4 (vpmovqw), 8 for 8 and 16 (pairwise sums by vpermt2q, then
// vpmovqw); any other length one key per vector under a word mask. The last keys of a step are read
// and written under masks, so nothing passes the ends of the arrays.
#include <immintrin.h>

#include <cstdint>

#include "common/attention/kernels/hamming_kernel.h"

namespace magicpig::attention::internal {
namespace {

// The first min(max(count, 0), 32) of 32 lanes.
inline __mmask32 PrefixMask32(int64_t count) {
  if (count <= 0) return 0;
  if (count >= 32) return ~__mmask32{0};
  return static_cast<__mmask32>((uint32_t{1} << count) - 1);
}

// 32 words from p + 32 * v, the words at or past `valid` (counted from p) read as 0 and not
// touched.
template <bool kTail>
inline __m512i LoadWords(const uint16_t* p, int v, int64_t valid) {
  if constexpr (kTail) return _mm512_maskz_loadu_epi16(PrefixMask32(valid - 32 * v), p + 32 * v);
  return _mm512_loadu_si512(p + 32 * v);
}

// Sum of adjacent 64-bit lanes of a and b: [a0+a1, a2+a3, a4+a5, a6+a7, b0+b1, ..., b6+b7].
inline __m512i PairSums(__m512i a, __m512i b) {
  const __m512i even = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
  const __m512i odd = _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15);
  return _mm512_add_epi64(_mm512_permutex2var_epi64(a, even, b),
                          _mm512_permutex2var_epi64(a, odd, b));
}

template <int kWords>
constexpr int kKeysPerStep = kWords == 1   ? 32
                             : kWords == 2 ? 16
                                           : 8;

// kKeysPerStep keys at keys -> out; with kTail only the first `count` (< kKeysPerStep) are read
// and written.
template <int kWords, bool kTail>
inline void Step(const uint16_t* keys, __m512i q, int64_t count, uint16_t* out) {
  const int64_t valid = count * kWords;
  if constexpr (kWords == 1) {
    const __m512i x = _mm512_xor_si512(LoadWords<kTail>(keys, 0, valid), q);
    const __m512i lo = _mm512_popcnt_epi32(_mm512_and_si512(x, _mm512_set1_epi32(0xFFFF)));
    const __m512i hi = _mm512_popcnt_epi32(_mm512_srli_epi32(x, 16));
    const __m512i c = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
    if constexpr (kTail) {
      _mm512_mask_storeu_epi16(out, PrefixMask32(count), c);
    } else {
      _mm512_storeu_si512(out, c);
    }
  } else if constexpr (kWords == 2) {
    const __m512i x = _mm512_xor_si512(LoadWords<kTail>(keys, 0, valid), q);
    const __m256i c = _mm512_cvtepi32_epi16(_mm512_popcnt_epi32(x));
    if constexpr (kTail) {
      _mm256_mask_storeu_epi16(out, static_cast<__mmask16>(PrefixMask32(count)), c);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), c);
    }
  } else {
    __m512i c;
    if constexpr (kWords == 4) {
      c = _mm512_popcnt_epi64(_mm512_xor_si512(LoadWords<kTail>(keys, 0, valid), q));
    } else if constexpr (kWords == 8) {
      const __m512i a = _mm512_popcnt_epi64(_mm512_xor_si512(LoadWords<kTail>(keys, 0, valid), q));
      const __m512i b = _mm512_popcnt_epi64(_mm512_xor_si512(LoadWords<kTail>(keys, 1, valid), q));
      c = PairSums(a, b);
    } else {
      static_assert(kWords == 16);
      __m512i p[4];
      for (int v = 0; v < 4; ++v) {
        p[v] = _mm512_popcnt_epi64(_mm512_xor_si512(LoadWords<kTail>(keys, v, valid), q));
      }
      c = PairSums(PairSums(p[0], p[1]), PairSums(p[2], p[3]));
    }
    const __m128i c16 = _mm512_cvtepi64_epi16(c);
    if constexpr (kTail) {
      _mm_mask_storeu_epi16(out, static_cast<__mmask8>(PrefixMask32(count)), c16);
    } else {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out), c16);
    }
  }
}

template <int kWords>
void Stepped(const uint16_t* query_code, const uint16_t* key_codes, int64_t n, uint16_t* out) {
  // The query repeated across the vector (a 512-bit vector holds 32 / kWords codes, or half of a
  // 16-word code).
  uint16_t pattern[32];
  for (int i = 0; i < 32; ++i) pattern[i] = query_code[i % kWords];
  const __m512i q = _mm512_loadu_si512(pattern);
  constexpr int64_t kStep = kKeysPerStep<kWords>;
  const int64_t full = n - n % kStep;
  for (int64_t i = 0; i < full; i += kStep) {
    Step<kWords, false>(key_codes + i * kWords, q, kStep, out + i);
  }
  if (full < n) Step<kWords, true>(key_codes + full * kWords, q, n - full, out + full);
}

// Any length: one key per vector, loaded under the mask of its words.
void OneKeyPerVector(const uint16_t* query_code, const uint16_t* key_codes, int64_t n, int words,
                     uint16_t* out) {
  const __mmask32 mask = PrefixMask32(words);
  const __m512i q = _mm512_maskz_loadu_epi16(mask, query_code);
  for (int64_t i = 0; i < n; ++i) {
    const __m512i k = _mm512_maskz_loadu_epi16(mask, key_codes + i * words);
    out[i] =
        static_cast<uint16_t>(_mm512_reduce_add_epi64(_mm512_popcnt_epi64(_mm512_xor_si512(k, q))));
  }
}

}  // namespace

void HammingAvx512(const uint16_t* query_code, const uint16_t* key_codes, int64_t n, int words,
                   uint16_t* out) {
  switch (words) {
    case 1:
      return Stepped<1>(query_code, key_codes, n, out);
    case 2:
      return Stepped<2>(query_code, key_codes, n, out);
    case 4:
      return Stepped<4>(query_code, key_codes, n, out);
    case 8:
      return Stepped<8>(query_code, key_codes, n, out);
    case 16:
      return Stepped<16>(query_code, key_codes, n, out);
    default:
      return OneKeyPerVector(query_code, key_codes, n, words, out);
  }
}

}  // namespace magicpig::attention::internal
