// AVX-512 BW build (compiled with those flags only here) of the pending-segment scan: 32 codes per
// vpcmpeqw into a mask register, counted by popcount; the last chunk of a key's codes is loaded
// under a mask, so no load passes the end of the array.
#include <immintrin.h>

#include <cstdint>

#include "common/attention/kernels/pending_scan-inl.h"
#include "common/attention/kernels/pending_scan.h"

namespace magicpig::attention::internal {

int64_t PendingCollisionsAvx512(const uint16_t* key_codes, int64_t n, int l,
                                const uint16_t* q_codes, int g, int32_t first_row, int32_t* rows,
                                uint32_t* masks) {
  const int full = l - l % 32;
  const __mmask32 tail = static_cast<__mmask32>((uint64_t{1} << (l % 32)) - 1);
  return ScanPendingKeys(
      key_codes, n, l, q_codes, g, first_row, rows, masks,
      [full, tail](const uint16_t* key, const uint16_t* q) {
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
        return hits;
      });
}

}  // namespace magicpig::attention::internal
