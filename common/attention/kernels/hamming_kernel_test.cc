// Tests for the Hamming kernels: every SIMD level against a bit-by-bit loop for every code length
// the kernels special-case (and odd ones) and for key counts around their vector steps, and
// SelectNearest against a stable sort by distance with many ties.
#include "common/attention/kernels/hamming_kernel.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "common/cpu_features.h"
#include "gtest/gtest.h"

namespace magicpig::attention {
namespace {

uint16_t BruteForce(const uint16_t* a, const uint16_t* b, int words) {
  int count = 0;
  for (int w = 0; w < words; ++w) {
    for (int bit = 0; bit < 16; ++bit) count += ((a[w] >> bit) & 1) != ((b[w] >> bit) & 1);
  }
  return static_cast<uint16_t>(count);
}

TEST(HammingKernelTest, EveryLevelMatchesABitLoop) {
  std::mt19937 rng(5);
  for (int words = 1; words <= kHammingMaxWords; ++words) {
    for (int64_t n : {0, 1, 2, 7, 8, 15, 16, 17, 31, 32, 33, 1000}) {
      // Keys exactly as long as n rows (so a read past the end would be caught by ASan), with
      // some equal to the query, some its complement.
      std::vector<uint16_t> query(static_cast<size_t>(words));
      for (uint16_t& q : query) q = static_cast<uint16_t>(rng());
      std::vector<uint16_t> keys(static_cast<size_t>(n * words));
      for (uint16_t& k : keys) k = static_cast<uint16_t>(rng());
      if (n > 2) {
        std::copy(query.begin(), query.end(), keys.begin());
        for (int w = 0; w < words; ++w) keys[words + w] = static_cast<uint16_t>(~query[w]);
      }
      std::vector<uint16_t> expected(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        expected[i] = BruteForce(query.data(), keys.data() + i * words, words);
      }
      if (n > 2) {
        EXPECT_EQ(expected[0], 0);
        EXPECT_EQ(expected[1], 16 * words);
      }
      for (SimdLevel level : SupportedSimdLevels()) {
        std::vector<uint16_t> out(static_cast<size_t>(n) + 1, 0xBEEF);  // + a guard
        HammingDistances(level, query.data(), keys.data(), n, words, out.data());
        EXPECT_EQ(out.back(), 0xBEEF) << "wrote past n";
        out.pop_back();
        EXPECT_EQ(out, expected) << SimdLevelName(level) << " words=" << words << " n=" << n;
      }
    }
  }
}

// The scalar kernel and, where the CPU has them, the AVX2 and VPOPCNTDQ kernels directly (the
// dispatcher runs the AVX2 kernel at kAvx512 without VPOPCNTDQ).
TEST(HammingKernelTest, EachKernelMatchesTheScalarOne) {
  std::mt19937 rng(11);
  for (int words : {1, 2, 3, 4, 5, 8, 16}) {
    const int64_t n = 333;
    std::vector<uint16_t> query(static_cast<size_t>(words));
    std::vector<uint16_t> keys(static_cast<size_t>(n * words));
    for (uint16_t& q : query) q = static_cast<uint16_t>(rng());
    for (uint16_t& k : keys) k = static_cast<uint16_t>(rng());
    std::vector<uint16_t> scalar(n), avx2(n), avx512(n);
    internal::HammingScalar(query.data(), keys.data(), n, words, scalar.data());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(scalar[i], BruteForce(query.data(), keys.data() + i * words, words));
    }
    if (DetectedSimdLevel() >= SimdLevel::kAvx2) {
      internal::HammingAvx2(query.data(), keys.data(), n, words, avx2.data());
      EXPECT_EQ(avx2, scalar) << "words=" << words;
    }
    if (DetectedSimdLevel() == SimdLevel::kAvx512 && CpuHasAvx512Vpopcntdq()) {
      internal::HammingAvx512(query.data(), keys.data(), n, words, avx512.data());
      EXPECT_EQ(avx512, scalar) << "words=" << words;
    }
  }
}

std::vector<int32_t> SelectBySort(const std::vector<uint16_t>& d, int64_t m) {
  std::vector<int32_t> idx(d.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return d[a] < d[b]; });
  idx.resize(static_cast<size_t>(std::clamp<int64_t>(m, 0, static_cast<int64_t>(d.size()))));
  std::sort(idx.begin(), idx.end());
  return idx;
}

TEST(HammingKernelTest, SelectNearestMatchesAStableSortWithTies) {
  std::mt19937 rng(17);
  for (int range : {1, 3, 8, 65}) {  // distances in [0, range): many ties for small ranges
    for (int64_t n : {0, 1, 7, 33, 1000}) {
      std::vector<uint16_t> d(static_cast<size_t>(n));
      for (uint16_t& v : d) v = static_cast<uint16_t>(rng() % range);
      for (int64_t m : {int64_t{0}, int64_t{1}, n / 3, n, n + 5, int64_t{-2}}) {
        std::vector<int32_t> out = {42};
        SelectNearest(d.data(), n, m, 64, &out);
        EXPECT_EQ(out, SelectBySort(d, m)) << "range=" << range << " n=" << n << " m=" << m;
      }
    }
  }
}

TEST(HammingKernelTest, SelectNearestTreatsDistancesAboveTheMaximumAsTied) {
  const std::vector<uint16_t> d = {9, 2, 7, 2, 8, 0};
  std::vector<int32_t> out;
  SelectNearest(d.data(), 6, 4, 4, &out);  // 0, 2, 2, then the first of {9, 7, 8}: index 0
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 3, 5}));
  SelectNearest(d.data(), 6, 4, 256, &out);  // exact: 0, 2, 2, 7
  EXPECT_EQ(out, (std::vector<int32_t>{1, 2, 3, 5}));
}

}  // namespace
}  // namespace magicpig::attention
