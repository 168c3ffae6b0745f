// Tests for the collision scan of group retrieval: every SIMD level against a plain per-byte
// reference on counters whose bytes take the values 0-3 (so keys with no, some and all heads
// sampled occur at several densities), for lengths around the vector widths (8 and 16 keys) and
// every head shift RetrieveGroup uses; the counters must be zeroed and nothing written at or past
// entry n of the outputs.
#include "common/attention/kernels/collision_scan.h"

#include <cstdint>
#include <random>
#include <vector>

#include "common/cpu_features.h"
#include "gtest/gtest.h"

namespace magicpig::attention::internal {
namespace {

struct Found {
  std::vector<int32_t> rows;
  std::vector<uint32_t> masks;
};

Found Reference(const std::vector<uint32_t>& counters, int shift) {
  Found f;
  for (size_t i = 0; i < counters.size(); ++i) {
    uint32_t nib = 0;
    for (int b = 0; b < 4; ++b) {
      if (((counters[i] >> (8 * b)) & 0xffu) >= 2) nib |= 1u << b;
    }
    if (nib != 0) {
      f.rows.push_back(static_cast<int32_t>(i));
      f.masks.push_back(nib << shift);
    }
  }
  return f;
}

// Bytes of `heads` heads, each >= 2 with probability p (else 0 or 1); the other bytes 0.
std::vector<uint32_t> Counters(int64_t n, int heads, double p, std::mt19937_64& rng) {
  std::bernoulli_distribution sampled(p);
  std::uniform_int_distribution<uint32_t> low(0, 1), high(2, 3);
  std::vector<uint32_t> c(static_cast<size_t>(n));
  for (uint32_t& x : c) {
    for (int b = 0; b < heads; ++b) x |= (sampled(rng) ? high(rng) : low(rng)) << (8 * b);
  }
  return c;
}

TEST(CollisionScanTest, EveryLevelMatchesThePlainScan) {
  std::mt19937_64 rng(11);
  constexpr int32_t kSentinel = -7;
  const int64_t lengths[] = {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 100, 8192, 8203};
  const double densities[] = {0.0, 0.03, 0.3, 1.0};
  int compared = 0;
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    for (int64_t n : lengths) {
      for (double p : densities) {
        for (int shift : {0, 4, 8, 28}) {
          const int heads = shift == 28 ? 1 : 1 + static_cast<int>(rng() % 4);
          std::vector<uint32_t> counters = Counters(n, heads, p, rng);
          const Found want = Reference(counters, shift);
          std::vector<int32_t> rows(static_cast<size_t>(n) + 16, kSentinel);
          std::vector<uint32_t> masks(static_cast<size_t>(n) + 16, 0xdeadbeefu);
          const int64_t c =
              ScanCollisionCounters(level, counters.data(), n, shift, rows.data(), masks.data());
          SCOPED_TRACE(testing::Message() << "level " << static_cast<int>(level) << " n " << n
                                          << " p " << p << " shift " << shift);
          ASSERT_EQ(c, static_cast<int64_t>(want.rows.size()));
          for (int64_t j = 0; j < c; ++j) {
            ASSERT_EQ(rows[static_cast<size_t>(j)], want.rows[static_cast<size_t>(j)]) << j;
            ASSERT_EQ(masks[static_cast<size_t>(j)], want.masks[static_cast<size_t>(j)]) << j;
          }
          for (size_t j = static_cast<size_t>(n); j < rows.size(); ++j) {
            ASSERT_EQ(rows[j], kSentinel) << "written past n at " << j;
            ASSERT_EQ(masks[j], 0xdeadbeefu) << "written past n at " << j;
          }
          for (uint32_t x : counters) ASSERT_EQ(x, 0u);
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, 3 * 13 * 4 * 4);
  if (DetectedSimdLevel() < SimdLevel::kAvx512) {
    GTEST_LOG_(INFO) << "this CPU lacks AVX-512: that level ran as the highest one it has";
  }
}

// The sampled counts of a realistic shard (9.5% of 8K keys, three heads) written where the
// retrieval writes them: a second scan of the zeroed counters finds nothing.
TEST(CollisionScanTest, ASecondScanFindsNothing) {
  std::mt19937_64 rng(5);
  std::vector<uint32_t> counters = Counters(8192, 3, 0.033, rng);
  std::vector<int32_t> rows(8192);
  std::vector<uint32_t> masks(8192);
  const int64_t first =
      ScanCollisionCounters(ActiveSimdLevel(), counters.data(), 8192, 0, rows.data(), masks.data());
  EXPECT_GT(first, 300);
  EXPECT_EQ(
      ScanCollisionCounters(ActiveSimdLevel(), counters.data(), 8192, 0, rows.data(), masks.data()),
      0);
}

}  // namespace
}  // namespace magicpig::attention::internal
