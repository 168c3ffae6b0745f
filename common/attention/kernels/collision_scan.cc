// The baseline (SSE2) collision scan, the scalar tail every level shares, and the dispatch.
#include "common/attention/kernels/collision_scan.h"

#include <emmintrin.h>

namespace magicpig::attention::internal {
namespace {

// Bit b of the result: byte b of c is >= 2.
inline uint32_t SampledHeads(uint32_t c) {
  uint32_t m = 0;
  for (int b = 0; b < 4; ++b) m |= (((c >> (8 * b)) & 0xffu) >= 2u ? 1u : 0u) << b;
  return m;
}

}  // namespace

int64_t ScanCollisionTail(uint32_t* counters, int64_t i, int64_t n, int shift, int32_t* rows,
                          uint32_t* masks, int64_t c) {
  for (; i < n; ++i) {
    const uint32_t nib = SampledHeads(counters[i]);
    counters[i] = 0;
    if (nib != 0) {
      rows[c] = static_cast<int32_t>(i);
      masks[c] = nib << shift;
      ++c;
    }
  }
  return c;
}

int64_t ScanCollisionCountersSse2(uint32_t* counters, int64_t n, int shift, int32_t* rows,
                                  uint32_t* masks) {
  const __m128i two = _mm_set1_epi8(2);
  const __m128i zero = _mm_setzero_si128();
  int64_t c = 0;
  int64_t i = 0;
  // 16 keys per step; most steps of a long shard hold no sampled key and cost 4 loads and stores.
  for (; i + 16 <= n; i += 16) {
    __m128i* p = reinterpret_cast<__m128i*>(counters + i);
    uint32_t bits[4];
    uint32_t any = 0;
    for (int v = 0; v < 4; ++v) {
      const __m128i x = _mm_loadu_si128(p + v);
      // Byte >= 2  <=>  max(byte, 2) == byte (unsigned).
      bits[v] = static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_max_epu8(x, two), x)));
      _mm_storeu_si128(p + v, zero);
      any |= bits[v];
    }
    if (any == 0) continue;
    for (int v = 0; v < 4; ++v) {
      for (int k = 0; k < 4; ++k) {
        const uint32_t nib = (bits[v] >> (4 * k)) & 0xfu;
        rows[c] = static_cast<int32_t>(i + 4 * v + k);
        masks[c] = nib << shift;
        c += nib != 0 ? 1 : 0;
      }
    }
  }
  return ScanCollisionTail(counters, i, n, shift, rows, masks, c);
}

int64_t ScanCollisionCounters(SimdLevel level, uint32_t* counters, int64_t n, int shift,
                              int32_t* rows, uint32_t* masks) {
  level = ClampToDetected(level);
  switch (level) {
    case SimdLevel::kAvx512:
      return ScanCollisionCountersAvx512(counters, n, shift, rows, masks);
    case SimdLevel::kAvx2:
      return ScanCollisionCountersAvx2(counters, n, shift, rows, masks);
    default:
      return ScanCollisionCountersSse2(counters, n, shift, rows, masks);
  }
}

}  // namespace magicpig::attention::internal
