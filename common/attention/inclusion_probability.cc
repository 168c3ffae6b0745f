#include "common/attention/inclusion_probability.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace magicpig::attention {

double InclusionProbability(double cos, int k, int l) {
  if (l < 2) return 0.0;
  if (std::isnan(cos)) cos = 0.0;
  cos = std::clamp(cos, -1.0, 1.0);
  const double p = 1.0 - std::acos(cos) / std::numbers::pi;
  const double P = std::pow(p, k);
  if (P <= 0.0) return 0.0;
  if (P >= 1.0) return 1.0;
  const double L = l;
  if (L * P < 0.01) {
    // Direct binomial tail: term_j = C(L, j) P^j (1-P)^(L-j), j >= 2.
    const double log1m = std::log1p(-P);
    double term = 0.5 * L * (L - 1.0) * P * P * std::exp((L - 2.0) * log1m);
    double sum = 0.0;
    for (int j = 2; j <= l && j < 14; ++j) {
      sum += term;
      term *= (L - j) / (j + 1.0) * P / (1.0 - P);
    }
    return sum;
  }
  const double u = -std::expm1((L - 1.0) * std::log1p(-P) + std::log1p((L - 1.0) * P));
  return std::clamp(u, 0.0, 1.0);
}

void InclusionProbabilities(const float* cos, int64_t n, int k, int l, float* u) {
  for (int64_t i = 0; i < n; ++i) u[i] = static_cast<float>(InclusionProbability(cos[i], k, l));
}

std::vector<float> LogInclusionTable(int k, int l, int size) {
  std::vector<float> t(static_cast<size_t>(size));
  for (int i = 0; i < size; ++i) {
    const double c = -1.0 + 2.0 * i / (size - 1);
    t[static_cast<size_t>(i)] =
        static_cast<float>(LogInclusionWeight(InclusionProbability(c, k, l)));
  }
  return t;
}

}  // namespace magicpig::attention
