// vattention and vattention-lsh against independent references: a float64 brute-force softmax
// (with every key kept, the estimate must be exact), Monte Carlo means over draw seeds for the
// unbiasedness of the numerator and denominator estimates, the sample-size rule recomputed by
// hand, the normal quantile against tabulated values, the empirical (epsilon, delta) guarantee on
// the denominator over many queries, the SIMD group path against the float64 path, and the
// validation errors.
#include "common/attention/vattention.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/attention/kv_shard.h"
#include "common/attention/monte_carlo_expect.h"
#include "common/attention/simhash.h"
#include "gtest/gtest.h"

namespace magicpig::attention {
namespace {

using test_util::ExpectUnbiased;

struct Problem {
  int64_t n = 0, d = 0;
  std::vector<float> keys, values;
  std::optional<SimHash> hash;
  std::optional<KvShard> shard;
};

// n keys in d dims; `spread` scales the keys (larger: peakier attention).
Problem MakeProblem(int64_t n, int64_t d, float spread, uint32_t seed, int k = 6, int l = 20) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Problem p;
  p.n = n;
  p.d = d;
  p.keys.resize(static_cast<size_t>(n * d));
  p.values.resize(static_cast<size_t>(n * d));
  for (float& x : p.keys) x = spread * nd(rng);
  for (float& x : p.values) x = nd(rng) + 0.5f;
  auto hash = SimHash::Create(d, k, l, seed + 1);
  EXPECT_TRUE(hash.ok());
  p.hash.emplace(*hash);
  auto shard =
      KvShard::Create(*p.hash, p.keys.data(), nullptr, p.values.data(), n, KvStorage::kF32);
  EXPECT_TRUE(shard.ok()) << shard.status();
  p.shard.emplace(*std::move(shard));
  return p;
}

std::vector<float> Query(int64_t d, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> q(static_cast<size_t>(d));
  for (float& x : q) x = nd(rng);
  return q;
}

// Exact attention in float64: the numerator N (per coordinate), the denominator D, both relative
// to exp(m) with m the largest logit; o = N / D, lse = m + ln D.
struct Exact {
  std::vector<double> num;
  double den = 0, m = 0;
  std::vector<double> o() const {
    std::vector<double> r(num.size());
    for (size_t t = 0; t < num.size(); ++t) r[t] = num[t] / den;
    return r;
  }
  double lse() const { return m + std::log(den); }
};

Exact BruteForce(const Problem& p, const std::vector<float>& q, float scale) {
  std::vector<double> x(static_cast<size_t>(p.n));
  Exact e;
  e.m = -INFINITY;
  for (int64_t i = 0; i < p.n; ++i) {
    double s = 0;
    for (int64_t t = 0; t < p.d; ++t) s += static_cast<double>(p.keys[i * p.d + t]) * q[t];
    x[i] = scale * s;
    e.m = std::max(e.m, x[i]);
  }
  e.num.assign(static_cast<size_t>(p.d), 0.0);
  for (int64_t i = 0; i < p.n; ++i) {
    const double w = std::exp(x[i] - e.m);
    e.den += w;
    for (int64_t t = 0; t < p.d; ++t) e.num[t] += w * p.values[i * p.d + t];
  }
  return e;
}

std::vector<uint16_t> CodesOf(const Problem& p, const std::vector<float>& q) {
  std::vector<uint16_t> c(static_cast<size_t>(p.hash->l()));
  EXPECT_TRUE(p.hash->Codes(q.data(), 1, p.d, c.data()).ok());
  return c;
}

// The queries ([g][d]) and SimHash codes ([g][L]) of g heads, head h's query from seed
// first_seed + h.
void GroupQueries(const Problem& p, int g, uint32_t first_seed, std::vector<float>* q,
                  std::vector<uint16_t>* codes) {
  for (int h = 0; h < g; ++h) {
    const std::vector<float> qh = Query(p.d, first_seed + h);
    q->insert(q->end(), qh.begin(), qh.end());
    const std::vector<uint16_t> ch = CodesOf(p, qh);
    codes->insert(codes->end(), ch.begin(), ch.end());
  }
}

double RelL2(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t t = 0; t < want.size(); ++t) {
    num += (got[t] - want[t]) * (got[t] - want[t]);
    den += want[t] * want[t];
  }
  return std::sqrt(num / den);
}

TEST(VAttentionTest, NormalQuantileMatchesTabulatedValues) {
  EXPECT_NEAR(NormalQuantile(0.5), 0.0, 1e-12);
  EXPECT_NEAR(NormalQuantile(0.95), 1.6448536269514722, 1e-10);
  EXPECT_NEAR(NormalQuantile(0.975), 1.959963984540054, 1e-10);
  EXPECT_NEAR(NormalQuantile(0.999999), 4.753424308822899, 1e-8);
  EXPECT_NEAR(NormalQuantile(0.05), -1.6448536269514722, 1e-10);
}

TEST(VAttentionTest, HeavyHitterCountAndSampleSizeRules) {
  EXPECT_EQ(HeavyHitterCount(0, 0), 0);
  EXPECT_EQ(HeavyHitterCount(0, 1), 1);
  EXPECT_EQ(HeavyHitterCount(0, 100), 1);
  EXPECT_EQ(HeavyHitterCount(0, 101), 2);
  EXPECT_EQ(HeavyHitterCount(0, 4096), 41);
  EXPECT_EQ(HeavyHitterCount(7, 4096), 7);
  EXPECT_EQ(HeavyHitterCount(7, 5), 5);
  // b = ceil((z sigma n_s / (eps D))^2): 1.6448536 * 0.5 * 1000 / (0.1 * 200) = 41.12 -> 1691.
  const double z = NormalQuantile(0.95);
  const double root = z * 0.5 * 1000 / (0.1 * 200);
  EXPECT_EQ(VAttentionSampleSize(z, 0.5, 1000, 0.1, 200, 10), 1000);  // root^2 > n_s: all
  EXPECT_GT(root * root, 1000);
  const double root2 = z * 0.05 * 1000 / (0.1 * 200);  // 4.11 -> 17
  EXPECT_EQ(VAttentionSampleSize(z, 0.05, 1000, 0.1, 200, 10),
            static_cast<int64_t>(std::ceil(root2 * root2)));
  EXPECT_EQ(VAttentionSampleSize(z, 0.001, 1000, 0.1, 200, 10), 10);  // below base: base
  EXPECT_EQ(VAttentionSampleSize(z, 0.0, 1000, 0.1, 200, 10), 10);    // no spread seen
}

// Every key kept (heavy >= n, or epsilon so small that b = n_s): exact attention.
TEST(VAttentionTest, KeepingEveryKeyIsExactAttention) {
  const Problem p = MakeProblem(600, 32, 0.3f, 1);
  const std::vector<float> q = Query(p.d, 2);
  const float scale = 0.4f;
  const Exact e = BruteForce(p, q, scale);
  const std::vector<uint16_t> codes = CodesOf(p, q);
  EstimatorScratch scratch;
  for (VAttentionParams params : {VAttentionParams{.heavy = 600}, VAttentionParams{.heavy = 5000},
                                  VAttentionParams{.epsilon = 1e-4, .delta = 1e-6, .heavy = 3}}) {
    VAttentionEstimator va(params, 7);
    VAttentionLshEstimator lsh(6, 20, params, 7);
    // vattention-lsh has no heavy count (its candidates are its deterministic set).
    std::vector<const Estimator*> ests = {&va};
    if (params.heavy < 600) ests.push_back(&lsh);
    for (const Estimator* est : ests) {
      auto got = est->Attend(*p.shard, q.data(), codes.data(), scale, &scratch);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_LT(RelL2(got->o, e.o()), 1e-6) << "heavy " << params.heavy;
      EXPECT_NEAR(got->lse, e.lse(), 1e-5);
      if (est == &va) {
        EXPECT_EQ(got->n_touched, 600);
      }
    }
  }
}

// N and D are unbiased: their means over draw seeds approach the exact sums within Monte Carlo
// error (4.5 standard errors; D relative to the exact D, N per coordinate).
TEST(VAttentionTest, NumeratorAndDenominatorAreUnbiased) {
  const Problem p = MakeProblem(1500, 32, 0.35f, 3);
  const std::vector<float> q = Query(p.d, 4);
  const float scale = 1.0f;
  const Exact e = BruteForce(p, q, scale);
  const std::vector<uint16_t> codes = CodesOf(p, q);
  // A loose bound, so that the samples are small and the estimates vary.
  const VAttentionParams params{.epsilon = 0.3, .delta = 0.3, .heavy = 5, .base_rate = 0.01};
  EstimatorScratch scratch;
  for (bool use_lsh : {false, true}) {
    const int runs = 1500;
    std::vector<double> dens, nums(static_cast<size_t>(runs * p.d));
    double mean_b = 0;
    for (int r = 0; r < runs; ++r) {
      VAttentionEstimator va(params, 1000 + r);
      VAttentionLshEstimator lsh(6, 20, params, 1000 + r);
      const Estimator& est = use_lsh ? static_cast<const Estimator&>(lsh) : va;
      auto got = est.Attend(*p.shard, q.data(), codes.data(), scale, &scratch);
      ASSERT_TRUE(got.ok()) << got.status();
      const double d_ratio = std::exp(static_cast<double>(got->lse) - e.lse());  // D̂ / D
      dens.push_back(d_ratio);
      for (int64_t t = 0; t < p.d; ++t) nums[r * p.d + t] = got->o[t] * d_ratio;  // N̂ / D
      mean_b += got->n_touched;
    }
    mean_b /= runs;
    EXPECT_LT(mean_b, 0.8 * p.n) << "the bound should leave keys unread";
    const std::string suffix = use_lsh ? " (lsh)" : "";
    ExpectUnbiased(dens, 1, 0, runs, 1.0, "D" + suffix);
    for (int64_t t = 0; t < p.d; t += 5) {
      ExpectUnbiased(nums, p.d, t, runs, e.o()[t], "N" + suffix);
    }
  }
}

// The group paths draw one key order for all heads of a group (vattention.h): each head's N and D
// must stay unbiased over draw seeds, every head at once (three heads with different queries, so
// different deterministic sets and sample sizes), on the SIMD path and its float64 reference;
// with a base rate of 0.6 the draws pass half the keys, where the order continues by Fisher-Yates
// over the undrawn keys instead of rejection.
TEST(VAttentionTest, CoupledGroupDrawsAreUnbiasedPerHead) {
  const Problem p = MakeProblem(1500, 32, 0.35f, 3);
  const int g = 3;
  std::vector<float> q;
  std::vector<uint16_t> codes;
  GroupQueries(p, g, 4, &q, &codes);
  std::vector<Exact> exact;
  for (int h = 0; h < g; ++h) {
    exact.push_back(BruteForce(p, Query(p.d, 4 + h), 1.0f));  // head h's query, as above
  }
  EstimatorScratch scratch;
  for (int variant = 0; variant < 8; ++variant) {
    const bool use_lsh = variant % 2 == 1, reference = variant % 4 >= 2;
    const double base_rate = variant >= 4 ? 0.6 : 0.01;
    const VAttentionParams params{.epsilon = 0.3, .delta = 0.3, .heavy = 5, .base_rate = base_rate};
    const int runs = 1200;
    // [run][head]: D̂ / D, and N̂ / D at coordinate 3.
    std::vector<double> dens(static_cast<size_t>(runs * g)), nums(dens.size());
    for (int r = 0; r < runs; ++r) {
      VAttentionEstimator va(params, 5000 + r);
      VAttentionLshEstimator lsh(6, 20, params, 5000 + r);
      std::vector<PartialAttention> out(g);
      absl::Status st;
      if (reference) {
        st = use_lsh ? lsh.AttendGroupReference(*p.shard, q.data(), codes.data(), g, 1.0f, &scratch,
                                                out.data())
                     : va.AttendGroupReference(*p.shard, q.data(), codes.data(), g, 1.0f, &scratch,
                                               out.data());
      } else {
        const Estimator& est = use_lsh ? static_cast<const Estimator&>(lsh) : va;
        st = est.AttendGroup(*p.shard, q.data(), codes.data(), g, 1.0f, &scratch, out.data());
      }
      ASSERT_TRUE(st.ok()) << st;
      for (int h = 0; h < g; ++h) {
        const double ratio = std::exp(static_cast<double>(out[h].lse) - exact[h].lse());
        dens[r * g + h] = ratio;
        nums[r * g + h] = out[h].o[3] * ratio;
      }
    }
    for (int h = 0; h < g; ++h) {
      const std::string what =
          absl::StrCat(" head ", h, use_lsh ? " lsh" : " va", reference ? " reference" : " simd",
                       " base rate ", base_rate);
      ExpectUnbiased(dens, g, h, runs, 1.0, "D" + what);
      ExpectUnbiased(nums, g, h, runs, exact[h].o()[3], "N" + what);
    }
  }
}

// The fraction of `queries` whose denominator estimate is within epsilon, and the mean keys
// touched; query i is make_query(i).
template <typename MakeQuery>
std::pair<double, double> DenominatorCoverage(const Problem& p, const Estimator& est, double eps,
                                              int queries, MakeQuery make_query) {
  EstimatorScratch scratch;
  int within = 0;
  int64_t touched = 0;
  for (int i = 0; i < queries; ++i) {
    const std::vector<float> q = make_query(i);
    const Exact e = BruteForce(p, q, 1.0f);
    const std::vector<uint16_t> codes = CodesOf(p, q);
    auto got = est.Attend(*p.shard, q.data(), codes.data(), 1.0f, &scratch);
    EXPECT_TRUE(got.ok());
    if (!got.ok()) return {0, 0};
    within += std::fabs(std::exp(static_cast<double>(got->lse) - e.lse()) - 1.0) <= eps;
    touched += got->n_touched;
  }
  return {static_cast<double>(within) / queries, static_cast<double>(touched) / queries};
}

// The bound targets the denominator: over many queries (each its own draws), |D̂ - D| <= eps D in
// at least 1 - delta of them, up to three binomial standard errors. vattention on keys without
// structure (its exact top 1% trims the tail of the residual's weights); vattention-lsh where the
// tables find the heavy hitters: 30 "needle" keys, each query near one of them.
TEST(VAttentionTest, DenominatorMeetsTheBoundOverManyQueries) {
  const VAttentionParams params{.epsilon = 0.05, .delta = 0.1, .heavy = 0, .base_rate = 0.05};
  const int queries = 400;
  const double slack = 3 * std::sqrt(params.delta * (1 - params.delta) / queries);
  {
    const Problem p = MakeProblem(3000, 32, 0.3f, 5);
    auto [frac, touched] = DenominatorCoverage(p, VAttentionEstimator(params, 11), params.epsilon,
                                               queries, [&](int i) { return Query(p.d, 100 + i); });
    EXPECT_GE(frac, 1 - params.delta - slack) << "vattention";
    std::cerr << "unstructured keys, vattention: " << frac << " within eps, " << touched << " of "
              << p.n << " keys touched\n";
    EXPECT_LT(touched, 0.8 * p.n) << "vattention read nearly every value";
  }
  Problem p = MakeProblem(3000, 32, 0.15f, 6, 8, 150);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<std::vector<float>> needles(30);
  for (size_t j = 0; j < needles.size(); ++j) {
    needles[j] = Query(p.d, 500 + j, 0.6f);  // norm ~3.4
    std::copy(needles[j].begin(), needles[j].end(), p.keys.begin() + (97 * j + 11) * p.d);
  }
  auto shard =
      KvShard::Create(*p.hash, p.keys.data(), nullptr, p.values.data(), p.n, KvStorage::kF32);
  ASSERT_TRUE(shard.ok());
  p.shard.emplace(*std::move(shard));
  auto near_needle = [&](int i) {
    std::vector<float> q = needles[i % needles.size()];
    for (float& x : q) x = 0.8f * x + 0.1f * nd(rng);
    return q;
  };
  for (const bool lsh : {false, true}) {
    const std::unique_ptr<Estimator> est =
        lsh ? std::unique_ptr<Estimator>(new VAttentionLshEstimator(8, 150, params, 11))
            : std::unique_ptr<Estimator>(new VAttentionEstimator(params, 11));
    auto [frac, touched] = DenominatorCoverage(p, *est, params.epsilon, queries, near_needle);
    EXPECT_GE(frac, 1 - params.delta - slack) << (lsh ? "vattention-lsh" : "vattention");
    EXPECT_LT(touched, 0.8 * p.n);
    std::cerr << "needle keys, " << (lsh ? "vattention-lsh" : "vattention") << ": " << frac
              << " within eps, " << touched << " of " << p.n << " keys touched\n";
  }
}

// The heavy hitters are attended exactly: one key far above the rest carries the output.
TEST(VAttentionTest, HeavyHittersAreKeptDeterministically) {
  Problem p = MakeProblem(2000, 32, 0.05f, 9);
  const std::vector<float> q = Query(p.d, 10, 1.0f);
  // Key 1234 = 40 q / |q|^2: logit 40 above a background near 0.
  double qq = 0;
  for (float x : q) qq += x * x;
  for (int64_t t = 0; t < p.d; ++t) p.keys[1234 * p.d + t] = static_cast<float>(40 * q[t] / qq);
  auto shard =
      KvShard::Create(*p.hash, p.keys.data(), nullptr, p.values.data(), p.n, KvStorage::kF32);
  ASSERT_TRUE(shard.ok());
  p.shard.emplace(*std::move(shard));
  const Exact e = BruteForce(p, q, 1.0f);
  EstimatorScratch scratch;
  VAttentionEstimator va(VAttentionParams{.heavy = 1}, 3);
  auto got = va.Attend(*p.shard, q.data(), nullptr, 1.0f, &scratch);
  ASSERT_TRUE(got.ok());
  EXPECT_LT(RelL2(got->o, e.o()), 1e-6);  // the rest weighs e^-40
}

// The SIMD group paths (fp32) follow the float64 group references: same heavy sets and draws on
// keys without near-ties, so the outputs agree to float rounding; n_touched equal unless an fp32
// spread rounds the sample size across an integer (then the draws differ: counted, and must stay
// rare).
TEST(VAttentionTest, GroupPathMatchesGroupReference) {
  const Problem p = MakeProblem(1200, 32, 0.3f, 12, 6, 20);
  const int g = 5;
  std::vector<float> q;
  std::vector<uint16_t> codes;
  GroupQueries(p, g, 20, &q, &codes);
  const VAttentionParams params{.epsilon = 0.1, .delta = 0.1};
  VAttentionEstimator va(params, 5);
  VAttentionLshEstimator lsh(6, 20, params, 5);
  EstimatorScratch scratch;
  for (const Estimator* est :
       {static_cast<const Estimator*>(&va), static_cast<const Estimator*>(&lsh)}) {
    std::vector<PartialAttention> out(g);
    ASSERT_TRUE(
        est->AttendGroup(*p.shard, q.data(), codes.data(), g, 0.5f, &scratch, out.data()).ok());
    std::vector<PartialAttention> refs(g);
    const absl::Status st = est == &va ? va.AttendGroupReference(*p.shard, q.data(), codes.data(),
                                                                 g, 0.5f, &scratch, refs.data())
                                       : lsh.AttendGroupReference(*p.shard, q.data(), codes.data(),
                                                                  g, 0.5f, &scratch, refs.data());
    ASSERT_TRUE(st.ok()) << st;
    int differ = 0;
    for (int h = 0; h < g; ++h) {
      const PartialAttention* ref = &refs[h];
      if (out[h].n_touched != ref->n_touched) {
        ++differ;
        continue;
      }
      std::vector<double> want(ref->o.begin(), ref->o.end());
      EXPECT_LT(RelL2(out[h].o, want), 1e-5) << "head " << h;
      EXPECT_NEAR(out[h].lse, ref->lse, 1e-4) << "head " << h;
    }
    EXPECT_LE(differ, 1);
  }
}

TEST(VAttentionTest, RejectsBadInputs) {
  const Problem p = MakeProblem(100, 16, 0.3f, 13);
  const std::vector<float> q = Query(p.d, 1);
  const std::vector<uint16_t> codes = CodesOf(p, q);
  EstimatorScratch scratch;
  VAttentionLshEstimator lsh(6, 20, VAttentionParams{}, 1);
  EXPECT_EQ(lsh.Attend(*p.shard, q.data(), nullptr, 1.0f, &scratch).status().code(),
            absl::StatusCode::kInvalidArgument);
  VAttentionLshEstimator wrong(7, 20, VAttentionParams{}, 1);
  auto bad = wrong.Attend(*p.shard, q.data(), codes.data(), 1.0f, &scratch);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("(7, 20)"), std::string::npos);
  EXPECT_EQ(lsh.Attend(*p.shard, q.data(), codes.data(), 1.0f, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  VAttentionEstimator va(VAttentionParams{}, 1);
  EXPECT_EQ(va.Attend(*p.shard, nullptr, nullptr, 1.0f, &scratch).status().code(),
            absl::StatusCode::kInvalidArgument);
  // An empty shard is the empty part.
  auto empty = KvShard::Create(*p.hash, nullptr, nullptr, nullptr, 0, KvStorage::kF32);
  ASSERT_TRUE(empty.ok());
  auto e1 = va.Attend(*empty, q.data(), nullptr, 1.0f, &scratch);
  auto e2 = lsh.Attend(*empty, q.data(), codes.data(), 1.0f, &scratch);
  ASSERT_TRUE(e1.ok() && e2.ok());
  EXPECT_TRUE(e1->empty());
  EXPECT_TRUE(e2->empty());
  // Parameters out of range are refused where they enter (the registry, the CLI, the proto).
  EstimatorParams params;
  params.vattention.epsilon = 0;
  EXPECT_FALSE(ValidateEstimatorParams(params, "").ok());
  params.vattention = {};
  params.vattention.delta = NAN;
  auto st = ValidateEstimatorParams(params, "shape.");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("shape.va_delta"), std::string::npos);
}

}  // namespace
}  // namespace magicpig::attention
