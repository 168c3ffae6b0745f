// AVX-512 BW build (compiled with those flags only here) of the pending-segment scan: 32 codes per
// vpcmpeqw into a mask register, counted by popcount; the last chunk of a key's codes is loaded
// under a mask, so no load passes the end of the array.
#include <immintrin.h>

#include <cstdint>

#include "common/attention/kernels/pending_scan.h"

namespace magicpig::attention::internal {

int64_t PendingCollisionsAvx512(const uint16_t* key_codes, int64_t n, int l,
                                const uint16_t* q_codes, int g, int32_t first_row, int32_t* rows,
                                uint32_t* masks) {
  const int full = l - l % 32;
  const __mmask32 tail = static_cast<__mmask32>((uint64_t{1} << (l % 32)) - 1);
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t* key = key_codes + i * l;
    uint32_t mask = 0;
    for (int h = 0; h < g; ++h) {
      const uint16_t* q = q_codes + static_cast<int64_t>(h) * l;
      int hits = 0;
      for (int t = 0; t < full; t += 32) {
        hits += __builtin_popcount(static_cast<uint32_t>(
            _mm512_cmpeq_epi16_mask(_mm512_loadu_si512(key + t), _mm512_loadu_si512(q + t))));
      }
      if (tail != 0) {
        hits += __builtin_popcount(static_cast<uint32_t>(
            _mm512_mask_cmpeq_epi16_mask(tail, _mm512_maskz_loadu_epi16(tail, key + full),
                                         _mm512_maskz_loadu_epi16(tail, q + full))));
      }
      mask |= (hits >= 2 ? 1u : 0u) << h;
    }
    rows[c] = first_row + static_cast<int32_t>(i);
    masks[c] = mask;
    c += mask != 0 ? 1 : 0;
  }
  return c;
}

}  // namespace magicpig::attention::internal
