#include "attn_node/core/simhash.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"

namespace magicpig {

absl::StatusOr<SimHash> SimHash::Create(int64_t d, int k, int l, uint64_t seed) {
  if (d < 1) return absl::InvalidArgumentError(absl::StrCat("SimHash: d must be >= 1, got ", d));
  if (k < 1 || k > kSimHashMaxK) {
    return absl::InvalidArgumentError(
        absl::StrCat("SimHash: K must be in [1, ", kSimHashMaxK, "], got ", k));
  }
  if (l < 1 || l > kSimHashMaxL) {
    return absl::InvalidArgumentError(
        absl::StrCat("SimHash: L must be in [1, ", kSimHashMaxL, "], got ", l));
  }
  const int64_t cols = static_cast<int64_t>(k) * l;
  std::vector<float> w(static_cast<size_t>(d * cols));
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (float& v : w) v = static_cast<float>(normal(rng));
  return SimHash(d, k, l, seed, std::move(w));
}

absl::Status SimHash::Codes(const float* x, int64_t n, int64_t d, uint16_t* codes) const {
  if (d != d_) {
    return absl::InvalidArgumentError(
        absl::StrCat("SimHash::Codes: d must equal the projection's d = ", d_, ", got ", d));
  }
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("SimHash::Codes: n < 0: ", n));
  const int64_t cols = static_cast<int64_t>(k_) * l_;
  std::vector<double> acc(static_cast<size_t>(cols));
  for (int64_t v = 0; v < n; ++v) {
    const float* xv = x + v * d_;
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t i = 0; i < d_; ++i) {
      const double xi = xv[i];
      const float* row = w_.data() + i * cols;
      for (int64_t j = 0; j < cols; ++j) acc[j] += xi * static_cast<double>(row[j]);
    }
    uint16_t* out = codes + v * l_;
    for (int t = 0; t < l_; ++t) {
      uint32_t code = 0;
      const double* a = acc.data() + static_cast<int64_t>(t) * k_;
      for (int b = 0; b < k_; ++b) code |= static_cast<uint32_t>(a[b] > 0.0) << b;
      out[t] = static_cast<uint16_t>(code);
    }
  }
  return absl::OkStatus();
}

}  // namespace magicpig
