// Dispatch for PendingCollisions plus its portable kernel (baseline ISA).
#include <algorithm>

#include "common/attention/kernels/pending_scan-inl.h"
#include "common/attention/kernels/pending_scan.h"

namespace magicpig::attention {
namespace internal {

int64_t PendingCollisionsScalar(const uint16_t* key_codes, int64_t n, int l,
                                const uint16_t* q_codes, int g, int32_t first_row, int32_t* rows,
                                uint32_t* masks) {
  return ScanPendingKeys(key_codes, n, l, q_codes, g, first_row, rows, masks,
                         [l](const uint16_t* key, const uint16_t* q) {
                           // 32 tables at a time without a branch per table (a key usually
                           // collides in none or one, so the scan reads all l codes anyway), then
                           // the early exit.
                           int hits = 0;
                           for (int t0 = 0; t0 < l && hits < 2; t0 += 32) {
                             const int t1 = std::min(l, t0 + 32);
                             for (int t = t0; t < t1; ++t) hits += key[t] == q[t] ? 1 : 0;
                           }
                           return hits;
                         });
}

}  // namespace internal

int64_t PendingCollisions(SimdLevel level, const uint16_t* key_codes, int64_t n, int l,
                          const uint16_t* q_codes, int g, int32_t first_row, int32_t* rows,
                          uint32_t* masks) {
  if (n <= 0 || l < 1 || g < 1 || g > 32) return 0;
  level = ClampToDetected(level);
  switch (level) {
    case SimdLevel::kAvx512:
      return internal::PendingCollisionsAvx512(key_codes, n, l, q_codes, g, first_row, rows, masks);
    case SimdLevel::kAvx2:
      return internal::PendingCollisionsAvx2(key_codes, n, l, q_codes, g, first_row, rows, masks);
    default:
      return internal::PendingCollisionsScalar(key_codes, n, l, q_codes, g, first_row, rows, masks);
  }
}

}  // namespace magicpig::attention
