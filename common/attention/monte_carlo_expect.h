// Test helper shared by the estimator tests: a Monte Carlo check that an estimate is unbiased.
// Header-only, for gtest test files only.
#ifndef MAGICPIG_COMMON_ATTENTION_MONTE_CARLO_EXPECT_H_
#define MAGICPIG_COMMON_ATTENTION_MONTE_CARLO_EXPECT_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace magicpig::attention::test_util {

// The mean of x[r * stride + offset] over runs r in [0, runs) is within 4.5 Monte Carlo standard
// errors of want, and the values vary (an estimate that never varies proves nothing).
inline void ExpectUnbiased(const std::vector<double>& x, size_t stride, size_t offset, int runs,
                           double want, const std::string& what) {
  double s = 0, s2 = 0;
  for (int r = 0; r < runs; ++r) {
    const double v = x[static_cast<size_t>(r) * stride + offset];
    s += v;
    s2 += v * v;
  }
  const double mean = s / runs;
  const double se = std::sqrt(std::max(0.0, s2 / runs - mean * mean) / runs);
  EXPECT_GT(se, 0.0) << what << ": the estimate never varied";
  EXPECT_LE(std::fabs(mean - want), 4.5 * se + 1e-12)
      << what << ": mean " << mean << " want " << want << " se " << se;
}

}  // namespace magicpig::attention::test_util

#endif  // MAGICPIG_COMMON_ATTENTION_MONTE_CARLO_EXPECT_H_
