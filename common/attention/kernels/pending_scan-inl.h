// The loop every pending_scan_<isa>.cc shares (pending_scan.h): keys in order, each one's codes
// prefetched a few keys ahead, a head mask from the ISA's count of equal codes, the sampled keys
// appended. Included by each ISA's unit, which passes its own count (a lambda, so every unit's
// instantiation is its own and none compiled with AVX flags can stand in for another's).
#ifndef MAGICPIG_COMMON_ATTENTION_KERNELS_PENDING_SCAN_INL_H_
#define MAGICPIG_COMMON_ATTENTION_KERNELS_PENDING_SCAN_INL_H_

#include <xmmintrin.h>

#include <cstdint>

namespace magicpig::attention::internal {

// Keys ahead whose codes are prefetched (~2.4 KB at L = 150). The segment is read once per step
// and is not in cache (84 groups x ~75 KB per SmolLM2 step at 8K): without the prefetch the
// AVX-512 compares waited on its lines (61% of the scan's samples).
inline constexpr int64_t kPendingPrefetchKeys = 8;

// count_hits(key, q) -> the number of tables t < l with key[t] == q[t].
template <class CountHits>
inline int64_t ScanPendingKeys(const uint16_t* key_codes, int64_t n, int l, const uint16_t* q_codes,
                               int g, int32_t first_row, int32_t* rows, uint32_t* masks,
                               CountHits count_hits) {
  const int64_t row_bytes = static_cast<int64_t>(l) * sizeof(uint16_t);
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t* key = key_codes + i * l;
    if (i + kPendingPrefetchKeys < n) {
      const char* ahead = reinterpret_cast<const char*>(key + kPendingPrefetchKeys * l);
      for (int64_t b = 0; b < row_bytes; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
    }
    uint32_t mask = 0;
    for (int h = 0; h < g; ++h) {
      mask |= (count_hits(key, q_codes + static_cast<int64_t>(h) * l) >= 2 ? 1u : 0u) << h;
    }
    rows[c] = first_row + static_cast<int32_t>(i);
    masks[c] = mask;
    c += mask != 0 ? 1 : 0;
  }
  return c;
}

}  // namespace magicpig::attention::internal

#endif  // MAGICPIG_COMMON_ATTENTION_KERNELS_PENDING_SCAN_INL_H_
