// Test helpers shared by the codes-shard estimator tests (spotlight, sketch): a problem of keys,
// values and codes, its codes-only shard, and exact softmax attention over chosen rows in float64.
// Header-only, for gtest test files only.
#ifndef MAGICPIG_COMMON_ATTENTION_ESTIMATOR_TEST_UTIL_H_
#define MAGICPIG_COMMON_ATTENTION_ESTIMATOR_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "common/attention/kv_shard.h"
#include "common/attention/partial_attention.h"
#include "gtest/gtest.h"

namespace magicpig::attention::test_util {

// n keys and values of dimension d ([n][d] float32) with their codes ([n][words] uint16).
struct CodesProblem {
  int64_t n = 0, d = 0;
  int words = 0;
  std::vector<float> keys, values;
  std::vector<uint16_t> codes;
};

// The problem's keys, values and codes in a codes-only shard (KvIndex::kCodes, 16-bit words).
inline KvShard CodesShard(const CodesProblem& p, KvStorage storage = KvStorage::kF32) {
  auto shard = KvShard::CreateFromCodes(p.d, 16, p.words, p.keys.data(), p.codes.data(),
                                        p.values.data(), p.n, storage, KvIndex::kCodes);
  EXPECT_TRUE(shard.ok()) << shard.status();
  return *std::move(shard);
}

// Attention of q over keys[rows[j]] and values[rows[j]] (row-major [n][d] float32) for j < m, in
// float64: o = softmax(scale * q . k) weighted values, lse = ln sum exp(scale * q . k); n_touched
// = m. m >= 1.
inline PartialAttention SoftmaxOverRows(const std::vector<float>& keys,
                                        const std::vector<float>& values, int64_t d,
                                        const std::vector<int64_t>& rows, int64_t m, const float* q,
                                        float scale) {
  std::vector<double> logit(static_cast<size_t>(m));
  double mx = -1e300;
  for (int64_t j = 0; j < m; ++j) {
    double s = 0;
    for (int64_t t = 0; t < d; ++t)
      s += double{q[t]} * keys[static_cast<size_t>(rows[static_cast<size_t>(j)] * d + t)];
    logit[static_cast<size_t>(j)] = double{scale} * s;
    mx = std::max(mx, logit[static_cast<size_t>(j)]);
  }
  std::vector<double> acc(static_cast<size_t>(d), 0.0);
  double z = 0;
  for (int64_t j = 0; j < m; ++j) {
    const double w = std::exp(logit[static_cast<size_t>(j)] - mx);
    z += w;
    for (int64_t t = 0; t < d; ++t) {
      acc[static_cast<size_t>(t)] +=
          w * values[static_cast<size_t>(rows[static_cast<size_t>(j)] * d + t)];
    }
  }
  PartialAttention out;
  out.o.resize(static_cast<size_t>(d));
  for (int64_t t = 0; t < d; ++t)
    out.o[static_cast<size_t>(t)] = static_cast<float>(acc[static_cast<size_t>(t)] / z);
  out.lse = static_cast<float>(mx + std::log(z));
  out.n_touched = m;
  return out;
}

}  // namespace magicpig::attention::test_util

#endif  // MAGICPIG_COMMON_ATTENTION_ESTIMATOR_TEST_UTIL_H_
