// AVX-512 BW build (compiled with those flags only here) of the pending-segment scan: 32 codes per
// vpcmpeqw into a mask register, counted by popcount; the last chunk of a key's codes is loaded
// under a mask, so no load passes the end of the array.
#include <immintrin.h>

#include <cstdint>

#include "common/attention/kernels/pending_scan.h"

namespace magicpig::attention::internal {

constexpr int64_t kPrefetchKeys = 8;  // keys ahead (~2.4 KB at L = 150)

int64_t PendingCollisionsAvx512(const uint16_t* key_codes, int64_t n, int l,
                                const uint16_t* q_codes, int g, int32_t first_row, int32_t* rows,
                                uint32_t* masks) {
  const int full = l - l % 32;
  const __mmask32 tail = static_cast<__mmask32>((uint64_t{1} << (l % 32)) - 1);
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
