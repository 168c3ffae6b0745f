#include "tests/testing/attention_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/half.h"

namespace magicpig::testing {

ReferenceAttention RangeAttentionReference(const float* q, int64_t n_head, double scale,
                                           const Fp16Cache& cache,
                                           const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  const int64_t hd = cache.head_dim, group = n_head / cache.n_kv;
  ReferenceAttention r;
  r.o.assign(static_cast<size_t>(n_head * hd), 0.0);
  r.lse.assign(static_cast<size_t>(n_head), -std::numeric_limits<double>::infinity());
  std::vector<int64_t> keys;
  for (auto [b, e] : ranges) {
    for (int64_t j = b; j < e; ++j) keys.push_back(j);
  }
  if (keys.empty()) return r;
  for (int64_t h = 0; h < n_head; ++h) {
    const int64_t g = h / group;
    std::vector<double> s;
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t j : keys) {
      double dot = 0;
      for (int64_t d = 0; d < hd; ++d) {
        dot += static_cast<double>(q[h * hd + d]) *
               Fp16ToFloat((*cache.k)[static_cast<size_t>((j * cache.n_kv + g) * hd + d)]);
      }
      s.push_back(dot * scale);
      m = std::max(m, s.back());
    }
    double z = 0;
    for (double x : s) z += std::exp(x - m);
    r.lse[static_cast<size_t>(h)] = m + std::log(z);
    for (size_t i = 0; i < keys.size(); ++i) {
      const double w = std::exp(s[i] - m) / z;
      for (int64_t d = 0; d < hd; ++d) {
        r.o[static_cast<size_t>(h * hd + d)] +=
            w * Fp16ToFloat((*cache.v)[static_cast<size_t>((keys[i] * cache.n_kv + g) * hd + d)]);
      }
    }
  }
  return r;
}

std::vector<double> CausalAttentionReference(const float* q, int64_t n_tokens, int64_t first_pos,
                                             int64_t n_head, double scale, const Fp16Cache& cache) {
  const int64_t row = n_head * cache.head_dim;
  std::vector<double> out;
  out.reserve(static_cast<size_t>(n_tokens * row));
  for (int64_t t = 0; t < n_tokens; ++t) {
    const ReferenceAttention r =
        RangeAttentionReference(q + t * row, n_head, scale, cache, {{0, first_pos + t + 1}});
    out.insert(out.end(), r.o.begin(), r.o.end());
  }
  return out;
}

}  // namespace magicpig::testing
