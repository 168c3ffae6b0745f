// The spotlight estimator, vattention-spotlight (vAttention with spotlight's candidates) and
// their codes-only shards against independent references: a float64
// brute force (distances bit by bit, a stable sort by distance then index, softmax over the first
// m; with rescoring, the best m of the first R m by float64 logit, and top-k when R m >= n), the
// row-list logits kernel, the SIMD group path against the float64 path at every SIMD level, appends
// that keep codes in key order, the validation errors; for vattention-spotlight: every key a
// candidate is exact attention, Monte Carlo means of its numerator and denominator over draw seeds
// equal the exact sums, and its group path matches its reference.
#include "common/attention/spotlight_estimator.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "common/attention/estimator_test_util.h"
#include "common/attention/group_kernel_runner.h"
#include "common/attention/kv_shard.h"
#include "common/attention/monte_carlo_expect.h"
#include "common/attention/simhash.h"
#include "common/attention/vattention.h"
#include "gtest/gtest.h"

namespace magicpig::attention {
namespace {

using Problem = test_util::CodesProblem;
using test_util::CodesShard;

// Keys spread so that attention is peaked; codes drawn with few distinct values per word, so that
// many keys tie in distance (ties must go to the lower index).
Problem MakeProblem(int64_t n, int64_t d, int words, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Problem p{n, d, words, {}, {}, {}};
  p.keys.resize(static_cast<size_t>(n * d));
  p.values.resize(static_cast<size_t>(n * d));
  for (float& x : p.keys) x = 2.0f * nd(rng);
  for (float& x : p.values) x = nd(rng) + 0.5f;
  std::uniform_int_distribution<int> pick(0, 3);
  const uint16_t choices[4] = {0x0000, 0xFFFF, 0x00FF, 0x0F0F};
  p.codes.resize(static_cast<size_t>(n * words));
  for (uint16_t& c : p.codes) c = choices[pick(rng)];
  return p;
}

// Brute force in float64 over the float32 keys and values. rerank > 1: the first min(n, rerank m)
// keys of the distance order are scored and the m of largest logit (ties: lower index) attended.
PartialAttention BruteForce(const Problem& p, const float* q, const uint16_t* q_codes, float scale,
                            double fraction, int64_t rerank = 1) {
  std::vector<int> dist(static_cast<size_t>(p.n));
  for (int64_t i = 0; i < p.n; ++i) {
    for (int w = 0; w < p.words; ++w) {
      dist[static_cast<size_t>(i)] += std::popcount(
          static_cast<unsigned>(p.codes[static_cast<size_t>(i * p.words + w)] ^ q_codes[w]));
    }
  }
  std::vector<int64_t> order(static_cast<size_t>(p.n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return dist[static_cast<size_t>(a)] < dist[static_cast<size_t>(b)];
  });
  const int64_t m = std::clamp<int64_t>(
      static_cast<int64_t>(std::ceil(fraction * static_cast<double>(p.n))), 1, p.n);
  if (rerank > 1) {
    order.resize(static_cast<size_t>(std::min(p.n, rerank * m)));
    std::vector<double> x(static_cast<size_t>(p.n));
    for (int64_t i : order) {
      for (int64_t t = 0; t < p.d; ++t)
        x[static_cast<size_t>(i)] += double{q[t]} * p.keys[static_cast<size_t>(i * p.d + t)];
    }
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      const double xa = x[static_cast<size_t>(a)], xb = x[static_cast<size_t>(b)];
      return xa > xb || (xa == xb && a < b);
    });
  }
  return test_util::SoftmaxOverRows(p.keys, p.values, p.d, order, m, q, scale);
}

std::vector<float> Queries(int64_t count, int64_t d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  std::vector<float> q(static_cast<size_t>(count * d));
  for (float& x : q) x = nd(rng);
  return q;
}

TEST(SpotlightRetrieved, ClampsAndRoundsUp) {
  EXPECT_EQ(SpotlightRetrieved(0.02, 0), 0);
  EXPECT_EQ(SpotlightRetrieved(0.02, 1), 1);
  EXPECT_EQ(SpotlightRetrieved(0.02, 100), 2);
  EXPECT_EQ(SpotlightRetrieved(0.02, 101), 3);
  EXPECT_EQ(SpotlightRetrieved(1e-6, 1000), 1);
  EXPECT_EQ(SpotlightRetrieved(1.0, 77), 77);
}

TEST(SpotlightEstimator, ReferenceMatchesBruteForce) {
  for (int words : {2, 4, 8}) {
    const Problem p = MakeProblem(500, 32, words, 7 + words);
    const KvShard shard = CodesShard(p);
    const std::vector<float> q = Queries(4, p.d, 3);
    const std::vector<uint16_t> q_codes = {0x0F0F, 0x00FF, 0xFFFF, 0x0000,
                                           0x1234, 0x0F0F, 0x00FF, 0xFFFF};
    for (double fraction : {0.001, 0.03, 0.2, 1.0}) {
      const SpotlightEstimator est(fraction);
      EstimatorScratch scratch;
      for (int h = 0; h < 4; ++h) {
        auto got = est.Attend(shard, q.data() + h * p.d, q_codes.data() + (h % 2), 0.3f, &scratch);
        ASSERT_TRUE(got.ok()) << got.status();
        const PartialAttention want =
            BruteForce(p, q.data() + h * p.d, q_codes.data() + (h % 2), 0.3f, fraction);
        EXPECT_EQ(got->n_touched, want.n_touched);
        EXPECT_NEAR(got->lse, want.lse, 1e-5 * (1 + std::abs(want.lse)));
        for (int64_t t = 0; t < p.d; ++t) {
          EXPECT_NEAR(got->o[static_cast<size_t>(t)], want.o[static_cast<size_t>(t)], 1e-5)
              << "words " << words << " fraction " << fraction << " t " << t;
        }
      }
    }
  }
}

TEST(SpotlightEstimator, RescoringMatchesBruteForce) {
  const Problem p = MakeProblem(700, 32, 4, 17);
  const KvShard shard = CodesShard(p);
  const std::vector<float> q = Queries(3, p.d, 13);
  const std::vector<uint16_t> q_codes = {0x0F0F, 0x00FF, 0xFFFF, 0x0000, 0x1234, 0x0F0F};
  for (int64_t rerank : {2, 8, 64}) {
    for (double fraction : {0.001, 0.02, 0.1}) {
      const SpotlightEstimator est(fraction, rerank);
      EstimatorScratch scratch;
      for (int h = 0; h < 3; ++h) {
        auto got = est.Attend(shard, q.data() + h * p.d, q_codes.data() + h, 0.3f, &scratch);
        ASSERT_TRUE(got.ok()) << got.status();
        const PartialAttention want =
            BruteForce(p, q.data() + h * p.d, q_codes.data() + h, 0.3f, fraction, rerank);
        EXPECT_EQ(got->n_touched, want.n_touched);
        EXPECT_NEAR(got->lse, want.lse, 1e-5 * (1 + std::abs(want.lse)));
        for (int64_t t = 0; t < p.d; ++t) {
          EXPECT_NEAR(got->o[static_cast<size_t>(t)], want.o[static_cast<size_t>(t)], 1e-5)
              << "rerank " << rerank << " fraction " << fraction << " head " << h;
        }
      }
    }
  }
  // Rescoring every key is top-k by exact score (a second implementation: TopKEstimator).
  const SpotlightEstimator all(0.02, 64);
  const TopKEstimator topk(SpotlightRetrieved(0.02, p.n));
  EstimatorScratch scratch;
  auto a = all.Attend(shard, q.data(), q_codes.data(), 0.3f, &scratch);
  auto b = topk.Attend(shard, q.data(), nullptr, 0.3f, &scratch);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->n_touched, b->n_touched);
  EXPECT_NEAR(a->lse, b->lse, 1e-6 * (1 + std::abs(b->lse)));
  for (int64_t t = 0; t < p.d; ++t) {
    EXPECT_NEAR(a->o[static_cast<size_t>(t)], b->o[static_cast<size_t>(t)], 1e-6);
  }
}

// The rescoring's kernel: logits of a row list, -inf for the heads a row's mask leaves out.
TEST(SpotlightEstimator, ListLogitsMatchFloat64WithMaskedHeadsAtMinusInf) {
  const Problem p = MakeProblem(2000, 64, 4, 37);
  const int g = 5;
  const std::vector<int32_t> rows = {0, 5, 17, 300, 301, 1200, 1999};
  const std::vector<uint32_t> masks = {0b11111, 0b00001, 0b10010, 0b00000, 0b01100, 0b11111, 0b10};
  const std::vector<float> q = Queries(g, p.d, 41);
  for (KvStorage storage : {KvStorage::kF32, KvStorage::kBf16}) {
    const KvShard shard = CodesShard(p, storage);
    for (SimdLevel level : SupportedSimdLevels()) {
      for (bool with_masks : {false, true}) {
        EstimatorScratch scratch;
        internal::GroupListLogits(level, shard, q.data(), g, 0.5f, rows.data(),
                                  static_cast<int64_t>(rows.size()),
                                  with_masks ? masks.data() : nullptr, &scratch);
        ASSERT_EQ(scratch.scores.size(), g * rows.size());
        for (int h = 0; h < g; ++h) {
          for (size_t j = 0; j < rows.size(); ++j) {
            const float x = scratch.scores[h * rows.size() + j];
            if (with_masks && !((masks[j] >> h) & 1u)) {
              EXPECT_EQ(x, -std::numeric_limits<float>::infinity());
            } else {
              const double want = 0.5 * shard.KeyDot(rows[j], q.data() + h * p.d);
              EXPECT_NEAR(x, want, 1e-4 * (1 + std::abs(want)))
                  << SimdLevelName(level) << " head " << h << " row " << rows[j];
            }
          }
        }
      }
    }
  }
}

// Every SIMD level, without rescoring and rescored from 8x (the group path scores the union of
// the heads' candidates with the row-list kernel).
std::vector<std::pair<int64_t, SimdLevel>> LevelsAndRerank() {
  std::vector<std::pair<int64_t, SimdLevel>> out;
  for (int64_t rerank : {1, 8}) {
    for (SimdLevel level : SupportedSimdLevels()) out.emplace_back(rerank, level);
  }
  return out;
}

TEST(SpotlightEstimator, GroupPathMatchesReferenceAtEveryLevel) {
  const int g = 5;
  const Problem p = MakeProblem(3000, 64, 4, 11);
  for (KvStorage storage : {KvStorage::kF32, KvStorage::kBf16}) {
    const KvShard shard = CodesShard(p, storage);
    const std::vector<float> q = Queries(g, p.d, 5);
    std::vector<uint16_t> q_codes(static_cast<size_t>(g * p.words));
    std::mt19937 rng(9);
    for (uint16_t& c : q_codes) c = static_cast<uint16_t>(rng());
    for (const auto& [rerank, level] : LevelsAndRerank()) {
      const SpotlightEstimator est(0.04, rerank, level);
      EstimatorScratch scratch;
      std::vector<PartialAttention> out(static_cast<size_t>(g));
      ASSERT_TRUE(
          est.AttendGroup(shard, q.data(), q_codes.data(), g, 0.125f, &scratch, out.data()).ok());
      for (int h = 0; h < g; ++h) {
        auto want =
            est.Attend(shard, q.data() + h * p.d, q_codes.data() + h * p.words, 0.125f, &scratch);
        ASSERT_TRUE(want.ok());
        EXPECT_EQ(out[static_cast<size_t>(h)].n_touched, 120);
        EXPECT_EQ(out[static_cast<size_t>(h)].n_touched, want->n_touched);
        EXPECT_NEAR(out[static_cast<size_t>(h)].lse, want->lse, 1e-4 * (1 + std::abs(want->lse)));
        for (int64_t t = 0; t < p.d; ++t) {
          EXPECT_NEAR(out[static_cast<size_t>(h)].o[static_cast<size_t>(t)],
                      want->o[static_cast<size_t>(t)], 1e-4)
              << SimdLevelName(level) << " rerank " << rerank << " head " << h;
        }
      }
    }
  }
}

TEST(SpotlightEstimator, AppendedKeysAreRetrievedLikeBuiltOnes) {
  const Problem p = MakeProblem(900, 32, 2, 21);
  const KvShard whole = CodesShard(p);
  auto part = KvShard::CreateFromCodes(p.d, 16, p.words, p.keys.data(), p.codes.data(),
                                       p.values.data(), 400, KvStorage::kF32, KvIndex::kCodes);
  ASSERT_TRUE(part.ok());
  ASSERT_TRUE(part->AppendWithCodes(p.keys.data() + 400 * p.d, p.codes.data() + 400 * p.words,
                                    p.values.data() + 400 * p.d, 500)
                  .ok());
  ASSERT_EQ(part->size(), 900);
  ASSERT_TRUE(std::equal(p.codes.begin(), p.codes.end(), part->unindexed_codes()));
  const std::vector<float> q = Queries(1, p.d, 8);
  const uint16_t q_codes[2] = {0x00FF, 0x0F0F};
  const SpotlightEstimator est(0.05);
  EstimatorScratch scratch;
  auto a = est.Attend(whole, q.data(), q_codes, 0.2f, &scratch);
  auto b = est.Attend(*part, q.data(), q_codes, 0.2f, &scratch);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->o, b->o);
  EXPECT_EQ(a->lse, b->lse);
}

TEST(SpotlightEstimator, RejectsWhatItCannotRead) {
  const Problem p = MakeProblem(50, 16, 2, 4);
  const std::vector<float> q = Queries(1, p.d, 1);
  const SpotlightEstimator est(0.1);
  EstimatorScratch scratch;
  // A shard with LSH tables (built for MagicPIG) has no learned codes.
  auto hash = SimHash::Create(p.d, 4, 3, 1);
  ASSERT_TRUE(hash.ok());
  auto lsh = KvShard::Create(*hash, p.keys.data(), nullptr, p.values.data(), p.n);
  ASSERT_TRUE(lsh.ok());
  const uint16_t codes[3] = {1, 2, 3};
  EXPECT_EQ(est.Attend(*lsh, q.data(), codes, 1.0f, &scratch).status().code(),
            absl::StatusCode::kInvalidArgument);
  const KvShard shard = CodesShard(p);
  EXPECT_EQ(est.Attend(shard, q.data(), nullptr, 1.0f, &scratch).status().code(),
            absl::StatusCode::kInvalidArgument);
  PartialAttention out;
  EXPECT_EQ(est.AttendGroup(shard, q.data(), nullptr, 1, 1.0f, &scratch, &out).code(),
            absl::StatusCode::kInvalidArgument);
  // A codes-only shard has no tables to retrieve from.
  std::vector<int32_t> got;
  LshScratch lsh_scratch;
  EXPECT_EQ(shard.Retrieve(codes, &lsh_scratch, &got).code(), absl::StatusCode::kInvalidArgument);
  // Codes wider than K bits are rejected at creation and append, and an append changes nothing.
  auto narrow = KvShard::CreateFromCodes(p.d, 8, p.words, p.keys.data(), p.codes.data(),
                                         p.values.data(), p.n, KvStorage::kF32, KvIndex::kCodes);
  EXPECT_EQ(narrow.status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<uint16_t> low(p.codes);
  for (uint16_t& c : low) c &= 0xFF;
  auto eight = KvShard::CreateFromCodes(p.d, 8, p.words, p.keys.data(), low.data(), p.values.data(),
                                        p.n, KvStorage::kF32, KvIndex::kCodes);
  ASSERT_TRUE(eight.ok()) << eight.status();
  const uint16_t wide[2] = {0x0001, 0x0100};
  EXPECT_EQ(eight->AppendWithCodes(p.keys.data(), wide, p.values.data(), 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(eight->size(), p.n);
}

TEST(VAttentionSpotlight, EveryKeyACandidateIsExactAttention) {
  const Problem p = MakeProblem(400, 32, 4, 31);
  const KvShard shard = CodesShard(p);
  const std::vector<float> q = Queries(1, p.d, 2);
  const uint16_t q_codes[4] = {1, 2, 3, 4};
  const auto est = VAttentionLshEstimator::WithLearnedCodes(1.0, VAttentionParams{}, 7);
  EstimatorScratch scratch;
  auto got = est.Attend(shard, q.data(), q_codes, 0.4f, &scratch);
  ASSERT_TRUE(got.ok()) << got.status();
  const PartialAttention want = BruteForce(p, q.data(), q_codes, 0.4f, 1.0);
  EXPECT_EQ(got->n_touched, p.n);
  EXPECT_NEAR(got->lse, want.lse, 1e-6 * (1 + std::abs(want.lse)));
  for (int64_t t = 0; t < p.d; ++t) EXPECT_NEAR(got->o[t], want.o[t], 1e-6);
}

TEST(VAttentionSpotlight, NumeratorAndDenominatorAreUnbiased) {
  const Problem p = MakeProblem(1500, 32, 4, 33);
  const KvShard shard = CodesShard(p);
  std::vector<float> q = Queries(1, p.d, 4);
  for (float& x : q) x *= 0.3f;  // a flatter softmax: the residual matters
  const uint16_t q_codes[4] = {0x0F0F, 0x00FF, 0xFFFF, 0x0000};
  const PartialAttention exact = BruteForce(p, q.data(), q_codes, 1.0f, 1.0);
  const VAttentionParams params{.epsilon = 0.3, .delta = 0.3, .heavy = 0, .base_rate = 0.01};
  EstimatorScratch scratch;
  const int runs = 1500;
  std::vector<double> dens, nums(static_cast<size_t>(runs * p.d));
  double touched = 0;
  for (int r = 0; r < runs; ++r) {
    const auto est = VAttentionLshEstimator::WithLearnedCodes(0.01, params, 1000 + r);
    auto got = est.Attend(shard, q.data(), q_codes, 1.0f, &scratch);
    ASSERT_TRUE(got.ok()) << got.status();
    const double ratio = std::exp(static_cast<double>(got->lse) - exact.lse);  // D̂ / D
    dens.push_back(ratio);
    for (int64_t t = 0; t < p.d; ++t) nums[r * p.d + t] = got->o[t] * ratio;  // N̂ / D
    touched += static_cast<double>(got->n_touched);
  }
  EXPECT_LT(touched / runs, 0.8 * p.n) << "the bound should leave keys unread";
  test_util::ExpectUnbiased(dens, 1, 0, runs, 1.0, "D");
  for (int64_t t = 0; t < p.d; t += 5)
    test_util::ExpectUnbiased(nums, p.d, t, runs, exact.o[t], "N");
}

TEST(VAttentionSpotlight, GroupPathMatchesReferenceAndRejectsTables) {
  const int g = 4;
  const Problem p = MakeProblem(2000, 32, 4, 35);
  const KvShard shard = CodesShard(p);
  const std::vector<float> q = Queries(g, p.d, 6);
  std::vector<uint16_t> q_codes(static_cast<size_t>(g * p.words));
  std::mt19937 rng(3);
  for (uint16_t& c : q_codes) c = static_cast<uint16_t>(rng());
  const VAttentionParams params{.epsilon = 0.1, .delta = 0.1};
  for (SimdLevel level : SupportedSimdLevels()) {
    const auto est = VAttentionLshEstimator::WithLearnedCodes(0.02, params, 5, level);
    EstimatorScratch scratch;
    std::vector<PartialAttention> out(g);
    ASSERT_TRUE(
        est.AttendGroup(shard, q.data(), q_codes.data(), g, 0.5f, &scratch, out.data()).ok());
    int differ = 0;
    for (int h = 0; h < g; ++h) {
      auto ref =
          est.Attend(shard, q.data() + h * p.d, q_codes.data() + h * p.words, 0.5f, &scratch);
      ASSERT_TRUE(ref.ok());
      if (out[h].n_touched != ref->n_touched) {  // a sample size rounded the other way
        ++differ;
        continue;
      }
      for (int64_t t = 0; t < p.d; ++t) EXPECT_NEAR(out[h].o[t], ref->o[t], 1e-4) << h;
      EXPECT_NEAR(out[h].lse, ref->lse, 1e-4) << "head " << h;
    }
    EXPECT_LE(differ, 1) << SimdLevelName(level);
  }
  // A shard with tables has no learned codes.
  auto hash = SimHash::Create(p.d, 4, 3, 1);
  ASSERT_TRUE(hash.ok());
  auto lsh = KvShard::Create(*hash, p.keys.data(), nullptr, p.values.data(), p.n);
  ASSERT_TRUE(lsh.ok());
  const auto est = VAttentionLshEstimator::WithLearnedCodes(0.02, params, 5);
  EstimatorScratch scratch;
  EXPECT_EQ(est.Attend(*lsh, q.data(), q_codes.data(), 0.5f, &scratch).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace magicpig::attention
