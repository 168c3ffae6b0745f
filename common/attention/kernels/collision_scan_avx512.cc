// AVX-512 BW build (compiled with those flags only here) of the collision scan: 16 counters per
// step, the sampled heads of each key as a nibble, the sampled keys' indices and nibbles packed to
// the front of a register by vpcompressd and stored whole (a compress straight to memory is
// microcoded and slow on AMD Zen 4). Whole-vector stores at rows + c stay inside the caller's n
// entries: c <= i and i + 16 <= n.
#include <immintrin.h>

#include <cstdint>

#include "common/attention/kernels/collision_scan.h"

namespace magicpig::attention::internal {

int64_t ScanCollisionCountersAvx512(uint32_t* counters, int64_t n, int shift, int32_t* rows,
                                    uint32_t* masks) {
  const __m512i two = _mm512_set1_epi8(2);
  // Byte b of each key's word set to bit b where that byte (head) reached 2.
  const __m512i head_bits = _mm512_set1_epi32(0x08040201);
  const __m512i low_nibble = _mm512_set1_epi32(0xf);
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m128i count = _mm_cvtsi32_si128(shift);
  int64_t c = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i x = _mm512_loadu_si512(counters + i);
    _mm512_storeu_si512(counters + i, _mm512_setzero_si512());
    const __mmask64 ge = _mm512_cmpge_epu8_mask(x, two);
    if (ge == 0) continue;
    const __m512i v = _mm512_maskz_mov_epi8(ge, head_bits);
    const __mmask16 sampled = _mm512_test_epi32_mask(v, v);
    // The four bytes' distinct bits folded into the low nibble.
    __m512i nib = _mm512_or_si512(v, _mm512_srli_epi32(v, 8));
    nib = _mm512_or_si512(nib, _mm512_srli_epi32(nib, 16));
    nib = _mm512_sll_epi32(_mm512_and_si512(nib, low_nibble), count);
    const __m512i index = _mm512_add_epi32(iota, _mm512_set1_epi32(static_cast<int32_t>(i)));
    _mm512_storeu_si512(rows + c, _mm512_maskz_compress_epi32(sampled, index));
    _mm512_storeu_si512(masks + c, _mm512_maskz_compress_epi32(sampled, nib));
    c += __builtin_popcount(sampled);
  }
  return ScanCollisionTail(counters, i, n, shift, rows, masks, c);
}

}  // namespace magicpig::attention::internal
