// AVX2 build (compiled with those flags only here) of the pending-segment scan: 16 codes per
// vpcmpeqw, the equal lanes counted as popcount(vpmovmskb) / 2; the last l % 16 tables one at a
// time (no load passes the end of a key's codes).
#include <immintrin.h>

#include <cstdint>

#include "common/attention/kernels/pending_scan-inl.h"
#include "common/attention/kernels/pending_scan.h"

namespace magicpig::attention::internal {

int64_t PendingCollisionsAvx2(const uint16_t* key_codes, int64_t n, int l, const uint16_t* q_codes,
                              int g, int32_t first_row, int32_t* rows, uint32_t* masks) {
  const int full = l - l % 16;
  return ScanPendingKeys(
      key_codes, n, l, q_codes, g, first_row, rows, masks,
      [full, l](const uint16_t* key, const uint16_t* q) {
        int bytes = 0;  // two mask bits per equal code
        for (int t = 0; t < full; t += 16) {
          const __m256i k = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(key + t));
          const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + t));
          bytes += __builtin_popcount(
              static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi16(k, qv))));
        }
        int hits = bytes / 2;
        for (int t = full; t < l; ++t) hits += key[t] == q[t] ? 1 : 0;
        return hits;
      });
}

}  // namespace magicpig::attention::internal
