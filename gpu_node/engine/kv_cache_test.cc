// KvCache::Release against the kernel's own view (mincore): the released rows' whole pages leave
// memory, the rows around them keep their values, other layers are untouched, and ResidentBytes
// agrees with what Release reported.
#include "gpu_node/engine/kv_cache.h"

#include <unistd.h>

#include <cstdint>

#include "gtest/gtest.h"

namespace magicpig::engine {
namespace {

constexpr int64_t kLayers = 2, kKv = 3, kD = 64, kCapacity = 4096;
constexpr int64_t kRow = kKv * kD;  // fp16 values per position

uint16_t Pattern(int64_t layer, int64_t pos, int64_t i, bool value) {
  return static_cast<uint16_t>((layer * 7919 + pos * 31 + i + (value ? 5 : 0)) | 1);
}

TEST(KvCacheTest, ReleaseGivesWholePagesBackAndKeepsTheRest) {
  auto kv = KvCache::Create(kLayers, kKv, kD, kCapacity);
  ASSERT_TRUE(kv.ok()) << kv.status();
  EXPECT_EQ((*kv)->ResidentBytes(), 0);  // nothing touched yet
  for (int64_t l = 0; l < kLayers; ++l) {
    const backend::KvLayerView view = (*kv)->layer(l);
    for (int64_t p = 0; p < kCapacity; ++p) {
      for (int64_t i = 0; i < kRow; ++i) {
        view.k[p * kRow + i] = Pattern(l, p, i, false);
        view.v[p * kRow + i] = Pattern(l, p, i, true);
      }
    }
  }
  const int64_t all = (*kv)->ResidentBytes();
  EXPECT_EQ(all, (*kv)->bytes());

  const int64_t begin = 100, end = 3000;
  const int64_t freed = (*kv)->Release(1, begin, end);
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t row_bytes = kRow * 2;
  const int64_t lo = (begin * row_bytes + page - 1) / page * page;
  const int64_t hi = end * row_bytes / page * page;
  EXPECT_EQ(freed, 2 * (hi - lo));  // K and V
  EXPECT_EQ((*kv)->released_bytes(), freed);
  EXPECT_EQ((*kv)->ResidentBytes(), all - freed);

  // Rows outside the released pages keep their values, in both layers.
  for (int64_t l = 0; l < kLayers; ++l) {
    const backend::KvLayerView view = (*kv)->layer(l);
    for (int64_t p = 0; p < kCapacity; ++p) {
      const bool released = l == 1 && p * row_bytes >= lo && (p + 1) * row_bytes <= hi;
      if (released) continue;
      const bool straddles = l == 1 && p * row_bytes < hi && (p + 1) * row_bytes > lo;
      for (int64_t i = 0; i < kRow; ++i) {
        const int64_t byte = (p * kRow + i) * 2;
        if (straddles && byte >= lo && byte < hi) continue;  // this part of the row was released
        ASSERT_EQ(view.k[p * kRow + i], Pattern(l, p, i, false)) << l << " " << p;
        ASSERT_EQ(view.v[p * kRow + i], Pattern(l, p, i, true)) << l << " " << p;
      }
    }
  }
  // Nothing to release: empty or out-of-range requests.
  EXPECT_EQ((*kv)->Release(0, 10, 10), 0);
  EXPECT_EQ((*kv)->Release(5, 0, 100), 0);
  EXPECT_EQ((*kv)->Release(0, 0, 1), 0);  // less than a page
}

}  // namespace
}  // namespace magicpig::engine
