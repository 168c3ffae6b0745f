// Tests for the estimators against independent float64 references: FullEstimator vs a direct
// softmax attention; MagicPigEstimator vs a brute-force collision count + Eq. 10 logits, and (with
// u forced to 1 and every key sampled) vs FullEstimator; sharding + LSE merge equals the unsharded
// result; centering leaves full attention unchanged; TopKEstimator vs a sorted reference;
// validation; concurrent use with per-thread scratch.
#include "common/attention/estimators.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/attention/inclusion_probability.h"
#include "common/attention/kv_shard.h"
#include "common/attention/partial_attention.h"
#include "common/attention/simhash.h"
#include "common/half.h"
#include "gtest/gtest.h"

namespace magicpig::attention {
namespace {

constexpr double kTol = 1e-5;

std::vector<float> Randn(size_t count, std::mt19937& rng, float sigma = 1.0f, float offset = 0.0f) {
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<float> v(count);
  for (auto& x : v) x = nd(rng) + offset;
  return v;
}

double Dot(const float* a, const float* b, int64_t d) {
  double s = 0;
  for (int64_t j = 0; j < d; ++j) s += static_cast<double>(a[j]) * b[j];
  return s;
}

// Softmax attention over the keys `idx` with the given logits (one per idx), float64 throughout.
PartialAttention Reference(const std::vector<int64_t>& idx, const std::vector<double>& logits,
                           const std::vector<float>& values, int64_t d) {
  PartialAttention p;
  p.o.assign(d, 0.0f);
  p.n_touched = static_cast<int64_t>(idx.size());
  if (idx.empty()) return p;
  const double m = *std::max_element(logits.begin(), logits.end());
  double z = 0;
  for (double x : logits) z += std::exp(x - m);
  std::vector<double> o(d, 0.0);
  for (size_t j = 0; j < idx.size(); ++j) {
    const double w = std::exp(logits[j] - m) / z;
    for (int64_t t = 0; t < d; ++t) o[t] += w * values[idx[j] * d + t];
  }
  for (int64_t t = 0; t < d; ++t) p.o[t] = static_cast<float>(o[t]);
  p.lse = static_cast<float>(m + std::log(z));
  return p;
}

// Relative closeness: max |Δo| <= tol * max |want.o|, |Δlse| <= tol * max(1, |want.lse|).
void ExpectClose(const PartialAttention& got, const PartialAttention& want, double tol,
                 bool check_touched = true) {
  ASSERT_EQ(got.o.size(), want.o.size());
  if (check_touched) {
    EXPECT_EQ(got.n_touched, want.n_touched);
  }
  if (want.empty()) {
    EXPECT_TRUE(got.empty());
    return;
  }
  double scale = 0, err = 0;
  for (size_t t = 0; t < want.o.size(); ++t) {
    scale = std::max(scale, std::fabs(static_cast<double>(want.o[t])));
    err = std::max(err, std::fabs(static_cast<double>(got.o[t]) - want.o[t]));
  }
  EXPECT_LE(err, tol * scale) << "max |o - ref| = " << err << ", max |ref| = " << scale;
  EXPECT_NEAR(got.lse, want.lse, tol * std::max(1.0, std::fabs(static_cast<double>(want.lse))));
}

std::vector<uint16_t> QueryCodes(const SimHash& hash, const std::vector<float>& q) {
  std::vector<uint16_t> codes(hash.l());
  EXPECT_TRUE(hash.Codes(q.data(), 1, hash.dim(), codes.data()).ok());
  return codes;
}

KvShard MakeShard(const SimHash& hash, const std::vector<float>& keys, const float* center,
                  const std::vector<float>& values, int64_t begin, int64_t end) {
  const int64_t d = hash.dim();
  auto shard = KvShard::Create(hash, keys.data() + begin * d, center, values.data() + begin * d,
                               end - begin, KvStorage::kF32);
  EXPECT_TRUE(shard.ok()) << shard.status();
  return *std::move(shard);
}

PartialAttention AttendOk(const Estimator& e, const KvShard& shard, const std::vector<float>& q,
                          const std::vector<uint16_t>& codes, float scale,
                          EstimatorScratch* scratch) {
  auto r = e.Attend(shard, q.data(), codes.data(), scale, scratch);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : PartialAttention{};
}

TEST(EstimatorsTest, FullMatchesFloat64Reference) {
  std::mt19937 rng(1);
  for (int64_t d : {16, 64, 128}) {
    for (int64_t n : {1, 7, 500}) {
      const float scale = 1.0f / std::sqrt(static_cast<float>(d));
      auto hash = SimHash::Create(d, 8, 10, 5);
      ASSERT_TRUE(hash.ok());
      const std::vector<float> keys = Randn(n * d, rng, 1.5f);
      const std::vector<float> values = Randn(n * d, rng);
      const std::vector<float> q = Randn(d, rng, 2.0f);
      const KvShard shard = MakeShard(*hash, keys, nullptr, values, 0, n);
      std::vector<int64_t> idx(n);
      std::iota(idx.begin(), idx.end(), 0);
      std::vector<double> logits(n);
      for (int64_t i = 0; i < n; ++i) logits[i] = scale * Dot(q.data(), &keys[i * d], d);
      EstimatorScratch scratch;
      const PartialAttention got = AttendOk(FullEstimator(), shard, q, {}, scale, &scratch);
      ExpectClose(got, Reference(idx, logits, values, d), kTol);
      EXPECT_EQ(got.n_touched, n);
    }
  }
}

TEST(EstimatorsTest, EmptyShardGivesEmptyPart) {
  auto hash = SimHash::Create(8, 4, 6, 5);
  ASSERT_TRUE(hash.ok());
  auto shard = KvShard::Create(*hash, nullptr, nullptr, nullptr, 0);
  ASSERT_TRUE(shard.ok());
  std::vector<float> q(8, 1.0f);
  const std::vector<uint16_t> codes = QueryCodes(*hash, q);
  EstimatorScratch scratch;
  const FullEstimator full;
  const MagicPigEstimator pig(4, 6);
  const TopKEstimator top(3);
  for (const Estimator* e : std::vector<const Estimator*>{&full, &pig, &top}) {
    const PartialAttention p = AttendOk(*e, *shard, q, codes, 0.5f, &scratch);
    EXPECT_TRUE(p.empty());
    EXPECT_EQ(p.lse, -std::numeric_limits<float>::infinity());
    ASSERT_EQ(p.o.size(), 8u);
    for (float x : p.o) EXPECT_EQ(x, 0.0f);
    EXPECT_EQ(p.n_touched, 0);
  }
}

// K = 1 with L = 64: a key at cosine c to q collides per table with p = 1 - acos(c)/pi ~ 0.5, so
// missing >= 2 collisions has probability ~ 65 / 2^64: every key is sampled.
TEST(EstimatorsTest, MagicPigForcedUnitWithEveryKeySampledEqualsFull) {
  std::mt19937 rng(2);
  const int64_t n = 400, d = 64;
  const float scale = 0.125f;
  auto hash = SimHash::Create(d, 1, 64, 9);
  ASSERT_TRUE(hash.ok());
  const std::vector<float> keys = Randn(n * d, rng, 1.0f, 0.5f);
  const std::vector<float> values = Randn(n * d, rng);
  const std::vector<float> center = Randn(d, rng, 0.1f, 0.5f);
  const std::vector<float> q = Randn(d, rng, 1.5f);
  const KvShard shard = MakeShard(*hash, keys, center.data(), values, 0, n);
  const std::vector<uint16_t> codes = QueryCodes(*hash, q);
  EstimatorScratch scratch;
  const PartialAttention full = AttendOk(FullEstimator(), shard, q, codes, scale, &scratch);
  const PartialAttention pig = AttendOk(MagicPigEstimator(1, 64, {.force_unit_inclusion = true}),
                                        shard, q, codes, scale, &scratch);
  ASSERT_EQ(pig.n_touched, n);
  ExpectClose(pig, full, kTol);
}

// Keys that are positive multiples of q (no centering) get q's codes in every table, so every key
// is sampled at any (K, L) with L >= 2, and cos = 1 gives u = 1: the unforced estimator differs
// from exact attention only by the constant shift -ln(1 + 1e-4) on every logit.
TEST(EstimatorsTest, MagicPigKeysAlongQueryAreAllSampled) {
  std::mt19937 rng(3);
  const int64_t n = 300, d = 32;
  const int k = 10, l = 12;
  const float scale = 1.0f / std::sqrt(32.0f);
  auto hash = SimHash::Create(d, k, l, 17);
  ASSERT_TRUE(hash.ok());
  const std::vector<float> q = Randn(d, rng);
  std::uniform_real_distribution<float> a(0.1f, 3.0f);
  std::vector<float> keys(n * d);
  for (int64_t i = 0; i < n; ++i) {
    const float ai = a(rng);
    for (int64_t j = 0; j < d; ++j) keys[i * d + j] = ai * q[j];
  }
  const std::vector<float> values = Randn(n * d, rng);
  const KvShard shard = MakeShard(*hash, keys, nullptr, values, 0, n);
  const std::vector<uint16_t> codes = QueryCodes(*hash, q);
  EstimatorScratch scratch;
  const PartialAttention full = AttendOk(FullEstimator(), shard, q, codes, scale, &scratch);
  const PartialAttention forced = AttendOk(MagicPigEstimator(k, l, {.force_unit_inclusion = true}),
                                           shard, q, codes, scale, &scratch);
  ASSERT_EQ(forced.n_touched, n);
  ExpectClose(forced, full, kTol);
  const PartialAttention pig = AttendOk(MagicPigEstimator(k, l), shard, q, codes, scale, &scratch);
  ASSERT_EQ(pig.n_touched, n);
  PartialAttention shifted = full;
  shifted.lse = static_cast<float>(full.lse - std::log(1.0 + 1e-4));
  ExpectClose(pig, shifted, kTol);
}

// Brute-force reference: S from equal codes in >= 2 tables, u from Eq. 10 at the analytic cosine
// of raw q and centred k, logit = scale*s - ln(u + 1e-4), softmax in float64.
PartialAttention MagicPigReference(const SimHash& hash, const std::vector<float>& centred,
                                   const std::vector<float>& values, const std::vector<float>& q,
                                   float scale, bool force_unit) {
  const int64_t d = hash.dim();
  const int64_t n = static_cast<int64_t>(centred.size()) / d;
  const int l = hash.l();
  std::vector<uint16_t> kc(n * l);
  EXPECT_TRUE(hash.KeyCodes(centred.data(), n, d, kc.data()).ok());
  const std::vector<uint16_t> qc = QueryCodes(hash, q);
  const double qn = std::sqrt(Dot(q.data(), q.data(), d));
  std::vector<int64_t> idx;
  std::vector<double> logits;
  for (int64_t i = 0; i < n; ++i) {
    int eq = 0;
    for (int t = 0; t < l; ++t) eq += kc[i * l + t] == qc[t];
    if (eq < 2) continue;
    const double s = Dot(q.data(), &centred[i * d], d);
    const double kn = std::sqrt(Dot(&centred[i * d], &centred[i * d], d));
    const double cos = std::clamp(s / (qn * kn), -1.0, 1.0);
    idx.push_back(i);
    logits.push_back(scale * s -
                     (force_unit ? 0.0 : std::log(InclusionProbability(cos, hash.k(), l) + 1e-4)));
  }
  return Reference(idx, logits, values, d);
}

TEST(EstimatorsTest, MagicPigMatchesBruteForceReference) {
  std::mt19937 rng(4);
  const int64_t d = 64;
  const float scale = 0.125f;
  for (auto [k, l] : std::vector<std::pair<int, int>>{{6, 20}, {8, 75}, {10, 150}, {4, 2}}) {
    const int64_t n = 3000;
    auto hash = SimHash::Create(d, k, l, 100 + k);
    ASSERT_TRUE(hash.ok());
    const std::vector<float> q = Randn(d, rng, 1.0f);
    // Keys: a random cloud plus a block of keys correlated with q (so high-u keys exist).
    std::vector<float> keys = Randn(n * d, rng, 1.0f, 0.3f);
    for (int64_t i = 0; i < n / 10; ++i)
      for (int64_t j = 0; j < d; ++j) keys[i * d + j] += 1.5f * q[j];
    const std::vector<float> values = Randn(n * d, rng);
    std::vector<float> center(d, 0.0f);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < d; ++j) center[j] += keys[i * d + j] / n;
    std::vector<float> centred(n * d);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < d; ++j) centred[i * d + j] = keys[i * d + j] - center[j];
    const KvShard shard = MakeShard(*hash, keys, center.data(), values, 0, n);
    const std::vector<uint16_t> codes = QueryCodes(*hash, q);
    EstimatorScratch scratch;
    for (bool force : {false, true}) {
      const PartialAttention got =
          AttendOk(MagicPigEstimator(k, l, {.force_unit_inclusion = force}), shard, q, codes, scale,
                   &scratch);
      const PartialAttention want = MagicPigReference(*hash, centred, values, q, scale, force);
      SCOPED_TRACE(testing::Message()
                   << "K=" << k << " L=" << l << " force=" << force << " |S|=" << want.n_touched);
      ExpectClose(got, want, kTol);
      if (k == 4 && l == 2) continue;
      EXPECT_GT(want.n_touched, 0);
      EXPECT_LT(want.n_touched, n);
    }
  }
}

// Contiguous random cut points, 1..8 shards, each with its own tables from the same SimHash and
// the same center: merged estimates equal the unsharded estimate (the same S for magicpig).
TEST(EstimatorsTest, ShardingAndMergeEqualsUnsharded) {
  std::mt19937 rng(5);
  const int64_t n = 1537, d = 32;
  const int k = 5, l = 24;
  const float scale = 1.0f / std::sqrt(32.0f);
  auto hash = SimHash::Create(d, k, l, 77);
  ASSERT_TRUE(hash.ok());
  const std::vector<float> keys = Randn(n * d, rng, 1.0f, 0.4f);
  const std::vector<float> values = Randn(n * d, rng);
  const std::vector<float> center = Randn(d, rng, 0.1f, 0.4f);
  const std::vector<float> q = Randn(d, rng, 2.0f);
  const std::vector<uint16_t> codes = QueryCodes(*hash, q);
  const KvShard whole = MakeShard(*hash, keys, center.data(), values, 0, n);
  const FullEstimator full;
  const MagicPigEstimator pig(k, l);
  const MagicPigEstimator pig_forced(k, l, {.force_unit_inclusion = true});
  const TopKEstimator top_all(n);
  EstimatorScratch scratch;
  for (const Estimator* e : std::vector<const Estimator*>{&full, &pig, &pig_forced, &top_all}) {
    const PartialAttention ref = AttendOk(*e, whole, q, codes, scale, &scratch);
    EXPECT_GT(ref.n_touched, 0);
    for (int parts = 1; parts <= 8; ++parts) {
      std::vector<int64_t> cuts = {0, n};
      std::uniform_int_distribution<int64_t> cut(0, n);
      for (int p = 1; p < parts; ++p) cuts.push_back(cut(rng));
      std::sort(cuts.begin(), cuts.end());
      std::vector<PartialAttention> results;
      for (size_t p = 0; p + 1 < cuts.size(); ++p) {
        const KvShard shard = MakeShard(*hash, keys, center.data(), values, cuts[p], cuts[p + 1]);
        results.push_back(AttendOk(*e, shard, q, codes, scale, &scratch));
      }
      SCOPED_TRACE(testing::Message() << "parts=" << parts);
      ExpectClose(MergePartials(results), ref, kTol);
    }
  }
}

// Shifting every key by the same c leaves full attention unchanged: scale*q.(k - c) =
// scale*q.k - scale*q.c, a constant. Only lse moves, by scale*q.c.
TEST(EstimatorsTest, CenteringLeavesFullAttentionUnchanged) {
  std::mt19937 rng(6);
  const int64_t n = 800, d = 64;
  const float scale = 0.125f;
  auto hash = SimHash::Create(d, 8, 10, 3);
  ASSERT_TRUE(hash.ok());
  // Keys in a narrow cone far from the origin, as real keys are (docs/architecture.md §4.2).
  const std::vector<float> offset = Randn(d, rng, 1.0f, 1.0f);
  std::vector<float> keys = Randn(n * d, rng, 0.5f);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) keys[i * d + j] += offset[j];
  const std::vector<float> values = Randn(n * d, rng);
  std::vector<float> center(d, 0.0f);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) center[j] += keys[i * d + j] / n;
  const std::vector<float> q = Randn(d, rng, 0.5f);
  EstimatorScratch scratch;
  const KvShard raw = MakeShard(*hash, keys, nullptr, values, 0, n);
  const KvShard centred = MakeShard(*hash, keys, center.data(), values, 0, n);
  const PartialAttention a = AttendOk(FullEstimator(), raw, q, {}, scale, &scratch);
  const PartialAttention b = AttendOk(FullEstimator(), centred, q, {}, scale, &scratch);
  PartialAttention b_shifted = b;
  b_shifted.lse = static_cast<float>(b.lse + scale * Dot(q.data(), center.data(), d));
  ExpectClose(b_shifted, a, kTol);
  // An arbitrary constant shift, applied by the caller before Create, behaves the same.
  const std::vector<float> c2 = Randn(d, rng, 3.0f);
  std::vector<float> shifted_keys(keys);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) shifted_keys[i * d + j] -= c2[j];
  const KvShard pre = MakeShard(*hash, shifted_keys, nullptr, values, 0, n);
  PartialAttention c = AttendOk(FullEstimator(), pre, q, {}, scale, &scratch);
  c.lse = static_cast<float>(c.lse + scale * Dot(q.data(), c2.data(), d));
  ExpectClose(c, a, kTol);
}

TEST(EstimatorsTest, TopKMatchesSortedReference) {
  std::mt19937 rng(7);
  const int64_t n = 500, d = 32;
  const float scale = 0.2f;
  auto hash = SimHash::Create(d, 4, 4, 1);
  ASSERT_TRUE(hash.ok());
  const std::vector<float> keys = Randn(n * d, rng);
  const std::vector<float> values = Randn(n * d, rng);
  const std::vector<float> q = Randn(d, rng, 1.5f);
  const KvShard shard = MakeShard(*hash, keys, nullptr, values, 0, n);
  std::vector<std::pair<double, int64_t>> scored;
  for (int64_t i = 0; i < n; ++i) scored.push_back({-Dot(q.data(), &keys[i * d], d), i});
  std::sort(scored.begin(), scored.end());
  EstimatorScratch scratch;
  for (int64_t budget : {0, 1, 10, 64, 499, 500, 10000}) {
    const int64_t keep = std::min(budget, n);
    std::vector<int64_t> idx;
    std::vector<double> logits;
    for (int64_t j = 0; j < keep; ++j) {
      idx.push_back(scored[j].second);
      logits.push_back(-scale * scored[j].first);
    }
    SCOPED_TRACE(testing::Message() << "budget=" << budget);
    ExpectClose(AttendOk(TopKEstimator(budget), shard, q, {}, scale, &scratch),
                Reference(idx, logits, values, d), kTol);
  }
  ExpectClose(AttendOk(TopKEstimator(n), shard, q, {}, scale, &scratch),
              AttendOk(FullEstimator(), shard, q, {}, scale, &scratch), kTol);
}

TEST(EstimatorsTest, Validation) {
  auto hash = SimHash::Create(8, 4, 6, 5);
  ASSERT_TRUE(hash.ok());
  std::mt19937 rng(8);
  const std::vector<float> keys = Randn(40 * 8, rng);
  const KvShard shard = MakeShard(*hash, keys, nullptr, keys, 0, 40);
  const std::vector<float> q = Randn(8, rng);
  const std::vector<uint16_t> codes = QueryCodes(*hash, q);
  EstimatorScratch scratch;
  EXPECT_FALSE(MagicPigEstimator(5, 6).Attend(shard, q.data(), codes.data(), 1.0f, &scratch).ok());
  EXPECT_FALSE(MagicPigEstimator(4, 7).Attend(shard, q.data(), codes.data(), 1.0f, &scratch).ok());
  EXPECT_FALSE(MagicPigEstimator(4, 6).Attend(shard, q.data(), nullptr, 1.0f, &scratch).ok());
  EXPECT_FALSE(MagicPigEstimator(4, 6).Attend(shard, q.data(), codes.data(), 1.0f, nullptr).ok());
  std::vector<uint16_t> bad = codes;
  bad[2] = 16;  // >= 2^K
  EXPECT_FALSE(MagicPigEstimator(4, 6).Attend(shard, q.data(), bad.data(), 1.0f, &scratch).ok());
  EXPECT_FALSE(FullEstimator().Attend(shard, nullptr, nullptr, 1.0f, &scratch).ok());
  EXPECT_FALSE(FullEstimator().Attend(shard, q.data(), nullptr, 1.0f, nullptr).ok());
  EXPECT_TRUE(MagicPigEstimator(4, 6).Attend(shard, q.data(), codes.data(), 1.0f, &scratch).ok());
}

TEST(EstimatorsTest, ConcurrentAttendWithPerThreadScratch) {
  std::mt19937 rng(9);
  const int64_t n = 2000, d = 32;
  const int k = 6, l = 30;
  auto hash = SimHash::Create(d, k, l, 12);
  ASSERT_TRUE(hash.ok());
  const std::vector<float> keys = Randn(n * d, rng);
  const std::vector<float> values = Randn(n * d, rng);
  const KvShard shard = MakeShard(*hash, keys, nullptr, values, 0, n);
  const MagicPigEstimator pig(k, l);
  std::vector<std::vector<float>> qs;
  std::vector<PartialAttention> want;
  EstimatorScratch scratch;
  for (int h = 0; h < 16; ++h) {
    qs.push_back(Randn(d, rng));
    want.push_back(AttendOk(pig, shard, qs.back(), QueryCodes(*hash, qs.back()), 0.2f, &scratch));
  }
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      EstimatorScratch own;
      for (int rep = 0; rep < 5; ++rep) {
        for (int h = 0; h < 16; ++h) {
          std::vector<uint16_t> codes(l);
          (void)hash->Codes(qs[h].data(), 1, d, codes.data());
          auto r = pig.Attend(shard, qs[h].data(), codes.data(), 0.2f, &own);
          if (!r.ok() || r->o != want[h].o || r->lse != want[h].lse ||
              r->n_touched != want[h].n_touched) {
            ++mismatches[t];
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

// bf16 storage: full attention equals a float64 reference on the bf16-rounded centred keys and
// values, and differs from the fp32 shard by no more than the bf16 rounding bound:
// each stored element has relative error <= 2^-9, so logit_i moves by at most
// delta_i = scale * sum_j |q_j| |k̄_ij| 2^-9 <= Delta; softmax weights move by a factor within
// e^{±2 Delta}, hence sum_i |p'_i - p_i| <= e^{2 Delta} - 1, and
// |o' - o|_t <= max|v| (2^-9 + e^{2 Delta} - 1), |lse' - lse| <= Delta (plus float32 output slack).
TEST(EstimatorsTest, Bf16StorageFullAttention) {
  std::mt19937 rng(21);
  for (int64_t d : {16, 64}) {
    const int64_t n = 400;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    auto hash = SimHash::Create(d, 6, 8, 5);
    ASSERT_TRUE(hash.ok());
    const std::vector<float> keys = Randn(n * d, rng, 1.5f, 0.3f);
    const std::vector<float> values = Randn(n * d, rng);
    const std::vector<float> center = Randn(d, rng, 0.5f, 0.3f);
    const std::vector<float> q = Randn(d, rng, 1.0f);
    auto f32 =
        KvShard::Create(*hash, keys.data(), center.data(), values.data(), n, KvStorage::kF32);
    auto bf =
        KvShard::Create(*hash, keys.data(), center.data(), values.data(), n, KvStorage::kBf16);
    ASSERT_TRUE(f32.ok() && bf.ok());
    std::vector<float> kr(n * d), vr(n * d);
    double big_delta = 0, vmax = 0;
    std::vector<int64_t> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    std::vector<double> logits(n);
    for (int64_t i = 0; i < n; ++i) {
      double delta = 0;
      for (int64_t j = 0; j < d; ++j) {
        const float c = keys[i * d + j] - center[j];
        kr[i * d + j] = Bf16ToFloat(FloatToBf16(c));
        vr[i * d + j] = Bf16ToFloat(FloatToBf16(values[i * d + j]));
        delta += std::fabs(static_cast<double>(q[j]) * c);
        vmax = std::max(vmax, std::fabs(static_cast<double>(values[i * d + j])));
      }
      big_delta = std::max(big_delta, scale * delta * std::ldexp(1.0, -9));
      logits[i] = scale * Dot(q.data(), &kr[i * d], d);
    }
    EstimatorScratch scratch;
    const PartialAttention got = AttendOk(FullEstimator(), *bf, q, {}, scale, &scratch);
    ExpectClose(got, Reference(idx, logits, vr, d), kTol);
    const PartialAttention want = AttendOk(FullEstimator(), *f32, q, {}, scale, &scratch);
    const double o_bound = vmax * (std::ldexp(1.0, -9) + std::expm1(2 * big_delta)) + 1e-6;
    double max_diff = 0;
    for (int64_t t = 0; t < d; ++t)
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(got.o[t]) - want.o[t]));
    EXPECT_LE(max_diff, o_bound);
    RecordProperty(absl::StrCat("d", d, "_max_diff_vs_bound"),
                   absl::StrCat(max_diff, " / ", o_bound));
    EXPECT_GT(max_diff, 0.0);  // the rounding is actually visible
    EXPECT_LE(std::fabs(static_cast<double>(got.lse) - want.lse),
              big_delta + 1e-6 * std::max(1.0, std::fabs(static_cast<double>(want.lse))));
  }
}

// Exact softmax attention over every key of the shard (float64 reference on the stored keys).
PartialAttention ExactOver(const std::vector<float>& keys, const std::vector<float>& values,
                           const std::vector<float>& q, int64_t n, int64_t d, float scale) {
  std::vector<int64_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::vector<double> logits(n);
  for (int64_t i = 0; i < n; ++i) logits[i] = scale * Dot(q.data(), &keys[i * d], d);
  return Reference(idx, logits, values, d);
}

double RelL2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t t = 0; t < want.size(); ++t) {
    num += (static_cast<double>(got[t]) - want[t]) * (static_cast<double>(got[t]) - want[t]);
    den += static_cast<double>(want[t]) * want[t];
  }
  return std::sqrt(num / den);
}

TEST(EstimatorsTest, OracleConvergesToFullAttention) {
  const int64_t n = 2000, d = 32;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  auto hash = SimHash::Create(d, 6, 4, 5);
  ASSERT_TRUE(hash.ok());
  std::mt19937 rng(31);
  const std::vector<float> keys = Randn(n * d, rng, 1.5f);
  const std::vector<float> values = Randn(n * d, rng);
  const std::vector<float> q = Randn(d, rng, 1.5f);
  const KvShard shard = MakeShard(*hash, keys, nullptr, values, 0, n);
  const PartialAttention exact = ExactOver(keys, values, q, n, d, scale);
  EstimatorScratch scratch;
  double err_small = 0, err_big = 0;
  for (int64_t budget : {100, 1000, 10000, 100000}) {
    const PartialAttention got =
        AttendOk(OracleEstimator(budget, 7), shard, q, {}, scale, &scratch);
    // lse is the exact shard log-sum-exp regardless of the budget.
    EXPECT_NEAR(got.lse, exact.lse,
                kTol * std::max(1.0, std::fabs(static_cast<double>(exact.lse))));
    EXPECT_GE(got.n_touched, 1);
    EXPECT_LE(got.n_touched, std::min<int64_t>(budget, n));
    const double err = RelL2(got.o, exact.o);
    if (budget == 100) err_small = err;
    if (budget == 100000) err_big = err;
    RecordProperty(absl::StrCat("rel_l2_err_budget_", budget), absl::StrCat(err));
  }
  EXPECT_LT(err_big, 0.02);
  // ~1/sqrt(budget): a 1000x larger budget should cut the error by ~31x; demand at least 8x.
  EXPECT_LT(err_big * 8, err_small) << "err(100) = " << err_small << ", err(1e5) = " << err_big;
  // Deterministic for a seed; a different seed gives a different sample.
  const PartialAttention a = AttendOk(OracleEstimator(50, 11), shard, q, {}, scale, &scratch);
  const PartialAttention b = AttendOk(OracleEstimator(50, 11), shard, q, {}, scale, &scratch);
  const PartialAttention c = AttendOk(OracleEstimator(50, 12), shard, q, {}, scale, &scratch);
  EXPECT_EQ(a.o, b.o);
  EXPECT_EQ(a.n_touched, b.n_touched);
  EXPECT_NE(a.o, c.o);
}

// Monte Carlo unbiasedness: over 200 independent seeds at budget 50, the mean estimate is within 3
// standard errors (sample std / sqrt(200)) of the exact o in every coordinate.
TEST(EstimatorsTest, OracleIsUnbiased) {
  const int64_t n = 300, d = 8;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  auto hash = SimHash::Create(d, 4, 4, 5);
  ASSERT_TRUE(hash.ok());
  std::mt19937 rng(41);
  const std::vector<float> keys = Randn(n * d, rng, 1.5f);
  const std::vector<float> values = Randn(n * d, rng);
  const std::vector<float> q = Randn(d, rng, 1.5f);
  const KvShard shard = MakeShard(*hash, keys, nullptr, values, 0, n);
  const PartialAttention exact = ExactOver(keys, values, q, n, d, scale);
  const int runs = 200;
  std::vector<double> sum(d, 0.0), sum2(d, 0.0);
  EstimatorScratch scratch;
  for (int r = 0; r < runs; ++r) {
    const PartialAttention got =
        AttendOk(OracleEstimator(50, 1000 + r), shard, q, {}, scale, &scratch);
    for (int64_t t = 0; t < d; ++t) {
      sum[t] += got.o[t];
      sum2[t] += static_cast<double>(got.o[t]) * got.o[t];
    }
  }
  for (int64_t t = 0; t < d; ++t) {
    const double mean = sum[t] / runs;
    const double var = (sum2[t] - runs * mean * mean) / (runs - 1);
    const double se = std::sqrt(std::max(var, 0.0) / runs);
    EXPECT_GT(se, 0.0);
    EXPECT_LE(std::fabs(mean - exact.o[t]), 3 * se) << "coordinate " << t;
    RecordProperty(absl::StrCat("z_", t), absl::StrCat((mean - exact.o[t]) / se));
  }
}

TEST(EstimatorsTest, OracleEmptyCases) {
  const int64_t d = 8;
  auto hash = SimHash::Create(d, 4, 4, 5);
  ASSERT_TRUE(hash.ok());
  std::mt19937 rng(51);
  const std::vector<float> keys = Randn(20 * d, rng);
  const std::vector<float> values = Randn(20 * d, rng);
  const std::vector<float> q = Randn(d, rng);
  const KvShard shard = MakeShard(*hash, keys, nullptr, values, 0, 20);
  auto empty = KvShard::Create(*hash, nullptr, nullptr, nullptr, 0);
  ASSERT_TRUE(empty.ok());
  EstimatorScratch scratch;
  for (const PartialAttention& p :
       {AttendOk(OracleEstimator(0, 1), shard, q, {}, 0.5f, &scratch),
        AttendOk(OracleEstimator(-5, 1), shard, q, {}, 0.5f, &scratch),
        AttendOk(OracleEstimator(10, 1), *empty, q, {}, 0.5f, &scratch)}) {
    EXPECT_TRUE(p.empty());
    EXPECT_EQ(p.lse, -std::numeric_limits<float>::infinity());
    EXPECT_EQ(p.n_touched, 0);
    ASSERT_EQ(p.o.size(), static_cast<size_t>(d));
    for (float x : p.o) EXPECT_EQ(x, 0.0f);
  }
  EXPECT_FALSE(OracleEstimator(5, 1).Attend(shard, q.data(), nullptr, 0.5f, nullptr).ok());
  EXPECT_FALSE(OracleEstimator(5, 1).Attend(shard, nullptr, nullptr, 0.5f, &scratch).ok());
}

}  // namespace
}  // namespace magicpig::attention
