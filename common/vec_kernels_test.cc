// Tests for vec_kernels.h: every supported SIMD level against a double-precision scalar loop, for
// every length 0..300 (covers all vector/tail splits).
#include "common/vec_kernels.h"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/half.h"
#include "gtest/gtest.h"

namespace magicpig {
namespace {

constexpr int kMaxLen = 300;

struct Data {
  std::vector<float> a, b, y;
  std::vector<uint16_t> h;
};

Data MakeData(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  Data d;
  for (int i = 0; i < n; ++i) {
    d.a.push_back(normal(rng));
    d.b.push_back(normal(rng));
    d.y.push_back(normal(rng));
    d.h.push_back(FloatToFp16(normal(rng)));
  }
  return d;
}

// Float32 summation of n products: error <= n * eps * sum |a_i b_i| (standard recursive bound).
double DotTolerance(int n, double abs_sum) { return (n + 2) * FLT_EPSILON * abs_sum + 1e-30; }

TEST(VecKernelsTest, DotF32MatchesDouble) {
  for (SimdLevel level : SupportedSimdLevels()) {
    for (int n = 0; n <= kMaxLen; ++n) {
      const Data d = MakeData(n, n);
      double exact = 0, abs_sum = 0;
      for (int i = 0; i < n; ++i) {
        exact += static_cast<double>(d.a[i]) * d.b[i];
        abs_sum += std::fabs(static_cast<double>(d.a[i]) * d.b[i]);
      }
      ASSERT_NEAR(DotF32(d.a.data(), d.b.data(), n, level), exact, DotTolerance(n, abs_sum))
          << SimdLevelName(level) << " n=" << n;
    }
  }
}

TEST(VecKernelsTest, DotF32F16MatchesDouble) {
  for (SimdLevel level : SupportedSimdLevels()) {
    for (int n = 0; n <= kMaxLen; ++n) {
      const Data d = MakeData(n, 1000 + n);
      double exact = 0, abs_sum = 0;
      for (int i = 0; i < n; ++i) {
        const double p = static_cast<double>(d.a[i]) * Fp16ToFloat(d.h[i]);
        exact += p;
        abs_sum += std::fabs(p);
      }
      ASSERT_NEAR(DotF32F16(d.a.data(), d.h.data(), n, level), exact, DotTolerance(n, abs_sum))
          << SimdLevelName(level) << " n=" << n;
    }
  }
}

TEST(VecKernelsTest, AxpyMatchesDouble) {
  const float alpha = -0.75f;
  for (SimdLevel level : SupportedSimdLevels()) {
    for (int n = 0; n <= kMaxLen; ++n) {
      const Data d = MakeData(n + 1, 2000 + n);
      std::vector<float> y32 = d.y, y16 = d.y;
      AxpyF32(alpha, d.a.data(), y32.data(), n, level);
      AxpyF16(alpha, d.h.data(), y16.data(), n, level);
      // One or two roundings (FMA or multiply-then-add): 2 eps of the operands' magnitude.
      for (int i = 0; i < n; ++i) {
        const double e32 = d.y[i] + static_cast<double>(alpha) * d.a[i];
        const double e16 = d.y[i] + static_cast<double>(alpha) * Fp16ToFloat(d.h[i]);
        ASSERT_NEAR(y32[i], e32, 2 * FLT_EPSILON * (std::fabs(d.y[i]) + std::fabs(alpha * d.a[i])))
            << SimdLevelName(level) << " n=" << n << " i=" << i;
        ASSERT_NEAR(y16[i], e16,
                    2 * FLT_EPSILON * (std::fabs(d.y[i]) + std::fabs(alpha * Fp16ToFloat(d.h[i]))))
            << SimdLevelName(level) << " n=" << n << " i=" << i;
      }
      ASSERT_EQ(y32[n], d.y[n]) << "wrote past the end";
      ASSERT_EQ(y16[n], d.y[n]) << "wrote past the end";
    }
  }
}

TEST(VecKernelsTest, ConvertF32ToF16IsRoundToNearestEven) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (SimdLevel level : SupportedSimdLevels()) {
    for (int n = 0; n <= kMaxLen; ++n) {
      std::vector<float> src(n);
      for (int i = 0; i < n; ++i) {
        // Normal, subnormal-range and overflowing magnitudes.
        const float scale = i % 3 == 0 ? 1.0f : i % 3 == 1 ? 1e-6f : 3e4f;
        src[i] = normal(rng) * scale;
      }
      std::vector<uint16_t> dst(n + 1, 0xABCD);
      ConvertF32ToF16(src.data(), dst.data(), n, level);
      for (int i = 0; i < n; ++i) {
        // Independent check: the chosen fp16 is the nearest one (ties are rare in random data).
        const float got = Fp16ToFloat(dst[i]);
        if (std::fabs(src[i]) > 65519.0f) {
          ASSERT_TRUE(std::isinf(got) && (got > 0) == (src[i] > 0)) << src[i];
          continue;
        }
        const uint16_t up = dst[i] + 1, down = dst[i] - 1;
        ASSERT_LE(std::fabs(got - src[i]), std::fabs(Fp16ToFloat(up) - src[i])) << src[i];
        if ((dst[i] & 0x7FFF) != 0) {
          ASSERT_LE(std::fabs(got - src[i]), std::fabs(Fp16ToFloat(down) - src[i])) << src[i];
        }
        ASSERT_EQ(dst[i], FloatToFp16(src[i])) << SimdLevelName(level) << " " << src[i];
      }
      ASSERT_EQ(dst[n], 0xABCD) << "wrote past the end";
    }
  }
}

TEST(VecKernelsTest, ConvertF16ToF32IsExactForEveryBitPattern) {
  // All 65,536 patterns in one call, then every length 0..kMaxLen (the vector/tail splits).
  std::vector<uint16_t> all(65536);
  for (int i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  for (SimdLevel level : SupportedSimdLevels()) {
    std::vector<float> got(all.size() + 1, 7.0f);
    ConvertF16ToF32(all.data(), got.data(), static_cast<int64_t>(all.size()), level);
    for (int i = 0; i < 65536; ++i) {
      const float want = Fp16ToFloat(all[i]);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(got[i])) << SimdLevelName(level) << " " << i;
        continue;
      }
      uint32_t a, b;
      std::memcpy(&a, &want, 4);
      std::memcpy(&b, &got[i], 4);
      ASSERT_EQ(a, b) << SimdLevelName(level) << " pattern " << i;
    }
    ASSERT_EQ(got.back(), 7.0f) << "wrote past the end";
    for (int n = 0; n <= kMaxLen; ++n) {
      std::vector<float> dst(n + 1, 7.0f);
      ConvertF16ToF32(all.data() + 15000, dst.data(), n, level);
      for (int i = 0; i < n; ++i) ASSERT_EQ(dst[i], Fp16ToFloat(all[15000 + i])) << n;
      ASSERT_EQ(dst[n], 7.0f) << SimdLevelName(level) << " wrote past the end at n = " << n;
    }
  }
}

}  // namespace
}  // namespace magicpig
