// Tests for the Hamming kernels: every SIMD level against a bit-by-bit loop for every code length
// the kernels special-case (and odd ones) and for key counts around their vector steps, and
// SelectNearest against a stable sort by distance with many ties, at every level of its collecting
// pass, and each collecting pass against brute force.
#include "common/attention/kernels/hamming_kernel.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/attention/kernels/nearest_collect.h"
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

// Every level's collecting pass, with key counts around the vector steps (16 and 32) and the
// distances of real codes (around half the bits, the selection in the low tail) as well as
// heavily tied ones.
TEST(HammingKernelTest, SelectNearestMatchesAStableSortWithTiesAtEveryLevel) {
  std::mt19937 rng(17);
  std::binomial_distribution<int> code_distance(64, 0.5);
  for (int range : {1, 3, 8, 65, 0}) {  // distances in [0, range) (many ties when small); 0: codes
    for (int64_t n : {0, 1, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 1000, 4099}) {
      std::vector<uint16_t> d(static_cast<size_t>(n));
      for (uint16_t& v : d) {
        v = static_cast<uint16_t>(range > 0 ? rng() % range : code_distance(rng));
      }
      for (int64_t m : {int64_t{0}, int64_t{1}, n / 50, n / 3, n - 1, n, n + 5, int64_t{-2}}) {
        const std::vector<int32_t> expected = SelectBySort(d, m);
        for (SimdLevel level : SupportedSimdLevels()) {
          std::vector<int32_t> out = {42};
          SelectNearest(d.data(), n, m, 64, &out, level);
          EXPECT_EQ(out, expected)
              << SimdLevelName(level) << " range=" << range << " n=" << n << " m=" << m;
        }
      }
    }
  }
}

TEST(HammingKernelTest, SelectNearestTreatsDistancesAboveTheMaximumAsTied) {
  const std::vector<uint16_t> d = {9, 2, 7, 2, 8, 0};
  for (SimdLevel level : SupportedSimdLevels()) {
    std::vector<int32_t> out;
    SelectNearest(d.data(), 6, 4, 4, &out, level);  // 0, 2, 2, then the first of {9, 7, 8}: 0
    EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 3, 5})) << SimdLevelName(level);
    SelectNearest(d.data(), 6, 4, 256, &out, level);  // exact: 0, 2, 2, 7
    EXPECT_EQ(out, (std::vector<int32_t>{1, 2, 3, 5})) << SimdLevelName(level);
  }
  // Distances of 65,535 (above any clamp) against a maximum of 0: all tie at 1 but the zeros.
  const std::vector<uint16_t> far = {65535, 0, 65535, 65535, 0};
  for (SimdLevel level : SupportedSimdLevels()) {
    std::vector<int32_t> out;
    SelectNearest(far.data(), 5, 3, 0, &out, level);
    EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 4})) << SimdLevelName(level);
  }
}

// The window counts, each kernel directly against a loop, including runs long enough for a lane's
// 16-bit counter to pass 2^15 and 2^16 (every distance the same, 32 lanes: 2.2M keys).
TEST(HammingKernelTest, EachWindowCountMatchesALoop) {
  std::mt19937 rng(29);
  std::vector<internal::WindowCounts (*)(const uint16_t*, int64_t, int, int)> kernels = {
      internal::CountWindowScalar};
  if (DetectedSimdLevel() >= SimdLevel::kAvx2) kernels.push_back(internal::CountWindowAvx2);
  if (DetectedSimdLevel() == SimdLevel::kAvx512) kernels.push_back(internal::CountWindowAvx512);
  auto check = [&](const std::vector<uint16_t>& d, int top, int lo, const std::string& what) {
    internal::WindowCounts expected;
    for (uint16_t x : d) {
      const int v = std::min<int>(x, top);
      if (v < lo) ++expected.below;
      if (v >= lo && v < lo + internal::kWindow) ++expected.at[v - lo];
    }
    for (size_t k = 0; k < kernels.size(); ++k) {
      const internal::WindowCounts got =
          kernels[k](d.data(), static_cast<int64_t>(d.size()), top, lo);
      EXPECT_EQ(got.below, expected.below) << "kernel " << k << " " << what;
      for (int j = 0; j < internal::kWindow; ++j) {
        EXPECT_EQ(got.at[j], expected.at[j]) << "kernel " << k << " j=" << j << " " << what;
      }
    }
  };
  for (int64_t n : {0, 1, 15, 16, 17, 31, 32, 33, 1000, 4099}) {
    std::vector<uint16_t> d(static_cast<size_t>(n));
    for (uint16_t& v : d) v = static_cast<uint16_t>(rng() % 70);
    if (d.size() > 3) {
      d[0] = 65535;  // above top
      d[1] = 0;
    }
    for (int lo : {0, 5, 28, 60}) check(d, 64, lo, "n=" + std::to_string(n));
  }
  const std::vector<uint16_t> same(2'200'000, 9);
  check(same, 64, 9, "2.2M at lo");
  check(same, 64, 2, "2.2M inside");
  check(same, 64, 20, "2.2M below");
}

// The pass itself, each kernel directly: it stops after `want` indices even when more keys
// qualify (never writing past them), and takes ties in index order.
TEST(HammingKernelTest, EachCollectingPassStopsAtWantAndTakesTiesInOrder) {
  std::mt19937 rng(23);
  for (int64_t n : {1, 16, 40, 100, 333}) {
    std::vector<uint16_t> d(static_cast<size_t>(n));
    for (uint16_t& v : d) v = static_cast<uint16_t>(rng() % 6);
    for (int t : {0, 2, 5}) {
      for (int64_t ties : {0, 1, 3, 1000}) {
        for (int64_t want : {int64_t{0}, int64_t{1}, int64_t{5}, n}) {
          internal::NearestCollect a;
          a.distances = d.data();
          a.n = n;
          a.t = t;
          a.top = 4;  // distance 5 counts as 4
          a.ties = ties;
          a.want = want;
          // Brute force: below t, then ties at t in index order, cut at want.
          std::vector<int32_t> expected;
          int64_t left = ties;
          for (int64_t i = 0; i < n && static_cast<int64_t>(expected.size()) < want; ++i) {
            const int v = std::min<int>(d[i], 4);
            if (v < t || (v == t && left-- > 0)) expected.push_back(static_cast<int32_t>(i));
          }
          std::vector<int64_t (*)(const internal::NearestCollect&, int32_t*)> kernels = {
              internal::CollectNearestScalar};
          if (DetectedSimdLevel() >= SimdLevel::kAvx2)
            kernels.push_back(internal::CollectNearestAvx2);
          if (DetectedSimdLevel() == SimdLevel::kAvx512) {
            kernels.push_back(internal::CollectNearestAvx512);
          }
          for (size_t k = 0; k < kernels.size(); ++k) {
            std::vector<int32_t> out(static_cast<size_t>(want) + 1, -7);  // + a guard
            const int64_t c = kernels[k](a, out.data());
            EXPECT_EQ(out.back(), -7) << "kernel " << k << " wrote past want";
            out.resize(static_cast<size_t>(c));
            EXPECT_EQ(out, expected) << "kernel " << k << " n=" << n << " t=" << t
                                     << " ties=" << ties << " want=" << want;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace magicpig::attention
