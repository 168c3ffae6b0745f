// AVX2 build (compiled with those flags only here) of the collision scan: 8 counters per step,
// the sampled heads of each key as a nibble, the sampled keys' indices and nibbles moved to the
// front of the register by a vpermd whose index vector is looked up from the 8-bit mask of the
// sampled keys, and stored whole. Whole-vector stores at rows + c stay inside the caller's n
// entries: c <= i and i + 8 <= n.
#include <immintrin.h>

#include <cstdint>

#include "common/attention/kernels/collision_scan.h"
#include "common/attention/kernels/compact_table.h"

namespace magicpig::attention::internal {

int64_t ScanCollisionCountersAvx2(uint32_t* counters, int64_t n, int shift, int32_t* rows,
                                  uint32_t* masks) {
  const __m256i two = _mm256_set1_epi8(2);
  const __m256i zero = _mm256_setzero_si256();
  const __m256i head_bits = _mm256_set1_epi32(0x08040201);
  const __m256i low_nibble = _mm256_set1_epi32(0xf);
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m128i count = _mm_cvtsi32_si128(shift);
  int64_t c = 0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i* p = reinterpret_cast<__m256i*>(counters + i);
    const __m256i x = _mm256_loadu_si256(p);
    _mm256_storeu_si256(p, zero);
    // Byte >= 2  <=>  max(byte, 2) == byte (unsigned).
    const __m256i ge = _mm256_cmpeq_epi8(_mm256_max_epu8(x, two), x);
    if (_mm256_testz_si256(ge, ge)) continue;
    const __m256i v = _mm256_and_si256(ge, head_bits);
    const int sampled = _mm256_movemask_ps(
        _mm256_castsi256_ps(_mm256_xor_si256(_mm256_cmpeq_epi32(v, zero), _mm256_set1_epi32(-1))));
    __m256i nib = _mm256_or_si256(v, _mm256_srli_epi32(v, 8));
    nib = _mm256_or_si256(nib, _mm256_srli_epi32(nib, 16));
    nib = _mm256_sll_epi32(_mm256_and_si256(nib, low_nibble), count);
    const __m256i perm =
        _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(kCompact.entry[sampled])));
    const __m256i index = _mm256_add_epi32(iota, _mm256_set1_epi32(static_cast<int32_t>(i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(rows + c),
                        _mm256_permutevar8x32_epi32(index, perm));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(masks + c),
                        _mm256_permutevar8x32_epi32(nib, perm));
    c += __builtin_popcount(static_cast<unsigned>(sampled));
  }
  return ScanCollisionTail(counters, i, n, shift, rows, masks, c);
}

}  // namespace magicpig::attention::internal
