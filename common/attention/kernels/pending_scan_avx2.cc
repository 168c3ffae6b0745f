// AVX2 build (compiled with those flags only here) of the pending-segment scan: 16 codes per
// vpcmpeqw, the equal lanes counted as popcount(vpmovmskb) / 2; the last l % 16 tables one at a
// time (no load passes the end of a key's codes).
#include <immintrin.h>

#include <cstdint>

#include "common/attention/kernels/pending_scan.h"

namespace magicpig::attention::internal {

int64_t PendingCollisionsAvx2(const uint16_t* key_codes, int64_t n, int l, const uint16_t* q_codes,
                              int g, int32_t first_row, int32_t* rows, uint32_t* masks) {
  const int full = l - l % 16;
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t* key = key_codes + i * l;
    uint32_t mask = 0;
    for (int h = 0; h < g; ++h) {
      const uint16_t* q = q_codes + static_cast<int64_t>(h) * l;
      int bytes = 0;  // two mask bits per equal code
      for (int t = 0; t < full; t += 16) {
        const __m256i k = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(key + t));
        const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + t));
        bytes += __builtin_popcount(
            static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi16(k, qv))));
      }
      int hits = bytes / 2;
      for (int t = full; t < l; ++t) hits += key[t] == q[t] ? 1 : 0;
      mask |= (hits >= 2 ? 1u : 0u) << h;
    }
    rows[c] = first_row + static_cast<int32_t>(i);
    masks[c] = mask;
    c += mask != 0 ? 1 : 0;
  }
  return c;
}

}  // namespace magicpig::attention::internal
