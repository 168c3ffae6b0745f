// Tests for the pending-segment scan: every SIMD level against a plain count of equal codes, for
// table counts around the vector widths (16 and 32 codes) and group sizes up to 32, with codes from
// a small alphabet so that keys with 0, 1, 2 and more collisions all occur, and planted keys whose
// only collisions sit in the first and last tables (the masked tail).
#include "common/attention/kernels/pending_scan.h"

#include <cstdint>
#include <random>
#include <vector>

#include "common/cpu_features.h"
#include "gtest/gtest.h"

namespace magicpig::attention {
namespace {

struct Found {
  std::vector<int32_t> rows;
  std::vector<uint32_t> masks;
};

Found Reference(const std::vector<uint16_t>& keys, int64_t n, int l, const std::vector<uint16_t>& q,
                int g, int32_t first_row) {
  Found f;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t mask = 0;
    for (int h = 0; h < g; ++h) {
      int hits = 0;
      for (int t = 0; t < l; ++t) hits += keys[i * l + t] == q[h * l + t];
      if (hits >= 2) mask |= 1u << h;
    }
    if (mask != 0) {
      f.rows.push_back(first_row + static_cast<int32_t>(i));
      f.masks.push_back(mask);
    }
  }
  return f;
}

TEST(PendingScanTest, EveryLevelMatchesAPlainCount) {
  std::mt19937 rng(11);
  int64_t sampled = 0, unsampled = 0;
  for (int l : {1, 2, 15, 16, 17, 31, 32, 33, 70, 150, 200}) {
    for (int g : {1, 3, 4, 32}) {
      for (int64_t n : {0, 1, 5, 64}) {
        // An alphabet of about l / 2 codes: about two collisions per (key, head) on average.
        const int alphabet = l / 2 + 1;
        std::uniform_int_distribution<int> code(0, alphabet - 1);
        std::vector<uint16_t> q(static_cast<size_t>(g * l));
        for (uint16_t& c : q) c = static_cast<uint16_t>(code(rng));
        // Keys exactly n rows long (a read past the end is caught by ASan).
        std::vector<uint16_t> keys(static_cast<size_t>(n * l));
        for (uint16_t& c : keys) c = static_cast<uint16_t>(code(rng));
        if (n >= 5 && l >= 2) {
          // Key 0 collides with head g-1 in exactly the first and last tables, key 1 only in the
          // last, key 2 in every table.
          for (int r = 0; r < 2; ++r)
            for (int t = 0; t < l; ++t)
              keys[r * l + t] = static_cast<uint16_t>(q[(g - 1) * l + t] + 1);
          keys[0] = q[(g - 1) * l];
          keys[l - 1] = q[(g - 1) * l + l - 1];
          keys[2 * l - 1] = q[(g - 1) * l + l - 1];
          for (int t = 0; t < l; ++t) keys[2 * l + t] = q[t];
        }
        const int32_t first_row = 1000;
        const Found want = Reference(keys, n, l, q, g, first_row);
        sampled += static_cast<int64_t>(want.rows.size());
        unsampled += n - static_cast<int64_t>(want.rows.size());
        for (SimdLevel level : SupportedSimdLevels()) {
          std::vector<int32_t> rows(static_cast<size_t>(n));
          std::vector<uint32_t> masks(static_cast<size_t>(n));
          const int64_t c = PendingCollisions(level, keys.data(), n, l, q.data(), g, first_row,
                                              rows.data(), masks.data());
          ASSERT_EQ(c, static_cast<int64_t>(want.rows.size()))
              << SimdLevelName(level) << " l=" << l << " g=" << g << " n=" << n;
          rows.resize(static_cast<size_t>(c));
          masks.resize(static_cast<size_t>(c));
          EXPECT_EQ(rows, want.rows) << SimdLevelName(level) << " l=" << l << " g=" << g;
          EXPECT_EQ(masks, want.masks) << SimdLevelName(level) << " l=" << l << " g=" << g;
          if (n >= 5 && l >= 2) {
            // The planted keys: 0 (two collisions, first and last table) sampled by head g-1,
            // 2 (every table) by head 0.
            ASSERT_GE(c, 2);
            EXPECT_EQ(rows[0], first_row);
            EXPECT_NE(masks[0] & (1u << (g - 1)), 0u);
          }
        }
      }
    }
  }
  // Both outcomes occurred often, so the comparison is not vacuous.
  EXPECT_GT(sampled, 500);
  EXPECT_GT(unsampled, 500);
}

TEST(PendingScanTest, InvalidArgumentsWriteNothing) {
  const std::vector<uint16_t> keys(8, 1), q(8, 1);
  int32_t rows[2] = {-1, -1};
  uint32_t masks[2] = {7, 7};
  EXPECT_EQ(PendingCollisions(SimdLevel::kScalar, keys.data(), 2, 4, q.data(), 0, 0, rows, masks),
            0);
  EXPECT_EQ(PendingCollisions(SimdLevel::kAvx2, keys.data(), 2, 4, q.data(), 33, 0, rows, masks),
            0);
  EXPECT_EQ(PendingCollisions(SimdLevel::kAvx512, keys.data(), 2, 0, q.data(), 1, 0, rows, masks),
            0);
  EXPECT_EQ(rows[0], -1);
  EXPECT_EQ(masks[0], 7u);
}

}  // namespace
}  // namespace magicpig::attention
