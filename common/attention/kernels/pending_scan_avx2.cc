// AVX2 build (compiled with those flags only here) of the pending-segment scan: 16 codes per
// vpcmpeqw, the equal lanes counted as popcount(vpmovmskb) / 2; the last l % 16 tables one at a
// time (no load passes the end of a key's codes).
#include <immintrin.h>

#include <cstdint>

#include "common/attention/kernels/pending_scan.h"

namespace magicpig::attention::internal {

constexpr int64_t kPrefetchKeys = 8;  // keys ahead (~2.4 KB at L = 150)

int64_t PendingCollisionsAvx2(const uint16_t* key_codes, int64_t n, int l, const uint16_t* q_codes,
                              int g, int32_t first_row, int32_t* rows, uint32_t* masks) {
  const int full = l - l % 16;
  int64_t c = 0;
  const int64_t row_bytes = static_cast<int64_t>(l) * sizeof(uint16_t);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t* key = key_codes + i * l;
    // The segment is read once per step and is not in cache (84 groups x ~75 KB per SmolLM2 step
    // at 8K): without prefetching ahead the compares waited on its lines.
    if (i + kPrefetchKeys < n) {
      const char* ahead = reinterpret_cast<const char*>(key + kPrefetchKeys * l);
      for (int64_t b = 0; b < row_bytes; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
    }
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
