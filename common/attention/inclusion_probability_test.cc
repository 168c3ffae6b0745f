// Tests for InclusionProbability: the spec's sanity table (§5), the unfactored Eq. 10, an exact
// long-double binomial tail where u is tiny, and the edge cases (cos = +-1, out of range, NaN, L =
// 1).
#include "common/attention/inclusion_probability.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace magicpig::attention {
namespace {

// Half a unit in the last printed digit of a value printed with 3 significant figures.
double HalfUlpOf3Sig(double printed) {
  const double e = std::floor(std::log10(std::fabs(printed)));
  return 0.5 * std::pow(10.0, e - 2);
}

struct Row {
  int k;
  int l;
  std::vector<double>
      u;  // at cos = -0.2, 0, 0.2, 0.4, 0.5, 0.6, 0.7 (the MagicPIG paper's values, as printed)
};

TEST(InclusionProbabilityTest, MatchesSpecSanityTable) {
  const std::vector<double> cos = {-0.2, 0.0, 0.2, 0.4, 0.5, 0.6, 0.7};
  const std::vector<Row> rows = {
      {10, 150, {6.69e-4, 9.68e-3, 8.67e-2, 0.443, 0.736, 0.943, 0.998}},
      {8, 75, {4.43e-3, 3.51e-2, 0.180, 0.565, 0.796, 0.947, 0.996}},
      {9, 120, {2.20e-3, 2.34e-2, 0.153, 0.569, 0.822, 0.967, 0.999}},
  };
  for (const Row& r : rows) {
    for (size_t i = 0; i < cos.size(); ++i) {
      const double u = InclusionProbability(cos[i], r.k, r.l);
      EXPECT_NEAR(u, r.u[i], HalfUlpOf3Sig(r.u[i]))
          << "K=" << r.k << " L=" << r.l << " cos=" << cos[i];
    }
    // ">= 0.8: ~1" (prints as 1.00 with 3 significant figures).
    for (double c : {0.8, 0.9, 1.0}) {
      EXPECT_GE(InclusionProbability(c, r.k, r.l), 0.9995) << "K=" << r.k << " cos=" << c;
      EXPECT_LE(InclusionProbability(c, r.k, r.l), 1.0);
    }
  }
}

TEST(InclusionProbabilityTest, AgreesWithUnfactoredEq10) {
  for (int k : {1, 4, 8, 10, 16}) {
    for (int l : {2, 3, 10, 75, 150, 512}) {
      for (double c = -0.99; c <= 0.99; c += 0.03) {
        const double p = 1.0 - std::acos(c) / std::numbers::pi;
        const double P = std::pow(p, k);
        const double eq10 = 1.0 - std::pow(1.0 - P, l) - l * P * std::pow(1.0 - P, l - 1);
        const double u = InclusionProbability(c, k, l);
        // The unfactored form cancels for small u; compare absolutely, with slack for that.
        EXPECT_NEAR(u, eq10, 1e-12) << "K=" << k << " L=" << l << " cos=" << c;
      }
    }
  }
}

// Exact tail sum_{j>=2} C(L,j) P^j (1-P)^(L-j) in long double (all terms, no truncation).
long double ExactTail(double cos, int k, int l) {
  const long double p =
      1.0L - std::acos(static_cast<long double>(cos)) / std::numbers::pi_v<long double>;
  const long double P = std::pow(p, k);
  long double sum = 0, binom = 1;  // C(L, 0)
  for (int j = 0; j <= l; ++j) {
    if (j >= 2) sum += binom * std::pow(P, j) * std::pow(1.0L - P, l - j);
    binom = binom * (l - j) / (j + 1);
  }
  return sum;
}

TEST(InclusionProbabilityTest, RelativelyAccurateWhereTiny) {
  for (int k : {8, 10, 16}) {
    for (int l : {2, 75, 150, 512}) {
      for (double c : {-0.999, -0.9, -0.6, -0.3, 0.0, 0.3, 0.6, 0.9}) {
        const long double exact = ExactTail(c, k, l);
        const double u = InclusionProbability(c, k, l);
        ASSERT_GT(exact, 0.0L);
        EXPECT_NEAR(u / static_cast<double>(exact), 1.0, 1e-9)
            << "K=" << k << " L=" << l << " cos=" << c << " u=" << u;
      }
    }
  }
}

TEST(InclusionProbabilityTest, EdgesAreFiniteAndExact) {
  for (int k : {1, 10, 16}) {
    for (int l : {1, 2, 150, 512}) {
      EXPECT_EQ(InclusionProbability(-1.0, k, l), 0.0);
      EXPECT_EQ(InclusionProbability(-1.0000001, k, l), 0.0);
      const double one = l >= 2 ? 1.0 : 0.0;
      EXPECT_EQ(InclusionProbability(1.0, k, l), one);
      EXPECT_EQ(InclusionProbability(1.0000001, k, l), one);
      const double u_nan = InclusionProbability(std::nan(""), k, l);
      EXPECT_FALSE(std::isnan(u_nan));
      EXPECT_EQ(u_nan, InclusionProbability(0.0, k, l));
    }
  }
  // L = 1: nothing can collide in two tables.
  EXPECT_EQ(InclusionProbability(0.7, 10, 1), 0.0);
}

TEST(InclusionProbabilityTest, MonotoneInCosAndInRange) {
  for (int k : {1, 8, 10, 16}) {
    for (int l : {2, 75, 150}) {
      double prev = -1.0;
      for (int i = -1000; i <= 1000; ++i) {
        const double u = InclusionProbability(i / 1000.0, k, l);
        ASSERT_GE(u, 0.0);
        ASSERT_LE(u, 1.0);
        ASSERT_GE(u, prev) << "K=" << k << " L=" << l << " cos=" << i / 1000.0;
        prev = u;
      }
    }
  }
}

TEST(InclusionProbabilityTest, BatchMatchesScalar) {
  const std::vector<float> cos = {-1.0f, -0.3f, 0.0f, 0.25f, 0.5f, 0.99f, 1.0f};
  std::vector<float> u(cos.size());
  InclusionProbabilities(cos.data(), static_cast<int64_t>(cos.size()), 10, 150, u.data());
  for (size_t i = 0; i < cos.size(); ++i) {
    EXPECT_EQ(u[i], static_cast<float>(InclusionProbability(cos[i], 10, 150)));
  }
}

}  // namespace
}  // namespace magicpig::attention

namespace magicpig::attention {
namespace {

// The fast kernels interpolate ln(u + 1e-4) linearly in this table: the interpolation error
// against the exact function, at random cosines between grid points, stays below 1e-3.
TEST(LogInclusionTableTest, LinearInterpolationIsAccurate) {
  std::mt19937_64 rng(4);
  std::uniform_real_distribution<double> uni(-1.0, 1.0);
  for (auto [k, l] : {std::pair{10, 150}, {9, 120}, {8, 75}, {6, 20}, {3, 12}, {16, 512}}) {
    const std::vector<float> t = LogInclusionTable(k, l);
    ASSERT_EQ(static_cast<int>(t.size()), kLogInclusionTableSize);
    double worst = 0.0;
    for (int i = 0; i < 200000; ++i) {
      const double c = uni(rng);
      const double pos = (c + 1.0) * 0.5 * (kLogInclusionTableSize - 1);
      const int j = std::min(static_cast<int>(pos), kLogInclusionTableSize - 2);
      const double f = pos - j;
      const double interp = t[j] + f * (t[j + 1] - t[j]);
      const double exact = std::log(InclusionProbability(c, k, l) + 1e-4);
      worst = std::max(worst, std::abs(interp - exact));
    }
    EXPECT_LT(worst, 1e-3) << "K=" << k << " L=" << l;
  }
}

}  // namespace
}  // namespace magicpig::attention
