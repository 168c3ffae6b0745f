// The low-rank key sketch (key_sketch.h), its score kernel and selection (kernels/sketch_kernel.h)
// and the sketch estimator against independent references: the basis against the leading
// eigenvectors that power iteration with deflation finds in the float64 second-moment matrix
// (keys with a planted spectrum), codes against float64 rounding, scores at every SIMD level
// against an integer brute force, the selection against a stable sort, the estimator's reference
// against a float64 brute force (sort by score then index, softmax over the first m), its group
// path against its reference at every level with and without rescoring, and a full-rank sketch
// retrieving the planted top keys exactly.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "common/attention/estimator_test_util.h"
#include "common/attention/kernels/sketch_kernel.h"
#include "common/attention/key_sketch.h"
#include "common/attention/kv_shard.h"
#include "common/attention/spotlight_estimator.h"
#include "common/attention/vattention.h"
#include "gtest/gtest.h"

namespace magicpig::attention {
namespace {

// Keys sum_j z_j sigma_j v_j + noise over random orthonormal v_j, sigma_j = 8 * 0.75^j: a spectrum
// whose leading directions are well separated.
std::vector<float> PlantedKeys(int64_t n, int64_t d, uint32_t seed, std::vector<double>* dirs) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  dirs->assign(static_cast<size_t>(d * d), 0.0);
  std::vector<double>& v = *dirs;
  for (double& x : v) x = nd(rng);
  for (int64_t a = 0; a < d; ++a) {  // Gram-Schmidt: rows orthonormal
    for (int64_t b = 0; b < a; ++b) {
      double dot = 0;
      for (int64_t t = 0; t < d; ++t) dot += v[a * d + t] * v[b * d + t];
      for (int64_t t = 0; t < d; ++t) v[a * d + t] -= dot * v[b * d + t];
    }
    double norm = 0;
    for (int64_t t = 0; t < d; ++t) norm += v[a * d + t] * v[a * d + t];
    for (int64_t t = 0; t < d; ++t) v[a * d + t] /= std::sqrt(norm);
  }
  std::vector<float> keys(static_cast<size_t>(n * d));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < d; ++j) {
      const double z = nd(rng) * 8.0 * std::pow(0.75, static_cast<double>(j));
      for (int64_t t = 0; t < d; ++t) keys[i * d + t] += static_cast<float>(z * v[j * d + t]);
    }
  }
  return keys;
}

// The r leading eigenvectors of sum_i k_i k_i^T (float64), by power iteration with deflation.
std::vector<double> ReferenceBasis(const std::vector<float>& keys, int64_t n, int64_t d, int r,
                                   std::vector<double>* values) {
  std::vector<double> m(static_cast<size_t>(d * d), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t a = 0; a < d; ++a)
      for (int64_t b = 0; b < d; ++b) m[a * d + b] += double{keys[i * d + a]} * keys[i * d + b];
  std::vector<double> basis;
  values->clear();
  for (int j = 0; j < r; ++j) {
    std::vector<double> x(static_cast<size_t>(d), 1.0);
    x[static_cast<size_t>(j)] += 1;
    double lambda = 0;
    for (int it = 0; it < 3000; ++it) {
      std::vector<double> y(static_cast<size_t>(d), 0.0);
      for (int64_t a = 0; a < d; ++a)
        for (int64_t b = 0; b < d; ++b) y[a] += m[a * d + b] * x[b];
      double norm = 0;
      for (double t : y) norm += t * t;
      norm = std::sqrt(norm);
      for (int64_t a = 0; a < d; ++a) x[a] = y[a] / norm;
      lambda = norm;
    }
    values->push_back(lambda);
    for (int64_t a = 0; a < d; ++a)
      for (int64_t b = 0; b < d; ++b) m[a * d + b] -= lambda * x[a] * x[b];
    basis.insert(basis.end(), x.begin(), x.end());
  }
  return basis;
}

TEST(KeySketch, BasisIsTheLeadingEigenvectorsInOrder) {
  const int64_t n = 3000, d = 24;
  const int r = 8;
  std::vector<double> dirs;
  const std::vector<float> keys = PlantedKeys(n, d, 5, &dirs);
  auto sketch = KeySketch::Fit(keys.data(), n, d, r);
  ASSERT_TRUE(sketch.ok()) << sketch.status();
  ASSERT_EQ(sketch->words(), 4);
  std::vector<double> values;
  const std::vector<double> want = ReferenceBasis(keys, n, d, r, &values);
  const std::vector<float>& got = sketch->basis();
  for (int j = 0; j < r; ++j) {
    double dot = 0, norm = 0, variance = 0;
    for (int64_t t = 0; t < d; ++t) {
      dot += double{got[j * d + t]} * want[j * d + t];
      norm += double{got[j * d + t]} * got[j * d + t];
    }
    for (int64_t i = 0; i < n; ++i) {
      double s = 0;
      for (int64_t t = 0; t < d; ++t) s += double{got[j * d + t]} * keys[i * d + t];
      variance += s * s;
    }
    EXPECT_NEAR(norm, 1.0, 1e-5) << "direction " << j;
    EXPECT_NEAR(std::fabs(dot), 1.0, 1e-4) << "direction " << j;  // the same axis, either sign
    EXPECT_NEAR(variance, values[static_cast<size_t>(j)], 1e-4 * values[static_cast<size_t>(j)]);
    for (int k = 0; k < j; ++k) {
      double cross = 0;
      for (int64_t t = 0; t < d; ++t) cross += double{got[j * d + t]} * got[k * d + t];
      EXPECT_NEAR(cross, 0.0, 1e-5);
    }
  }
}

TEST(KeySketch, CodesRoundTheProjectionsAndPackTwoPerWord) {
  const int64_t n = 1000, d = 32;
  const int r = 16;
  std::vector<double> dirs;
  const std::vector<float> keys = PlantedKeys(n, d, 9, &dirs);
  auto sketch = KeySketch::Fit(keys.data(), n, d, r);
  ASSERT_TRUE(sketch.ok()) << sketch.status();
  const std::vector<float>& u = sketch->basis();
  // Scales: the largest |projection| over the keys maps to 127.
  std::vector<double> largest(r, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int j = 0; j < r; ++j) {
      double s = 0;
      for (int64_t t = 0; t < d; ++t) s += double{u[j * d + t]} * keys[i * d + t];
      largest[j] = std::max(largest[j], std::fabs(s));
    }
  for (int j = 0; j < r; ++j) EXPECT_NEAR(sketch->scales()[j], largest[j] / 127, 1e-5 * largest[j]);
  // Keys, including one beyond the fitted range (clamped) appended later.
  std::vector<float> more = keys;
  for (int64_t t = 0; t < d; ++t) more.push_back(100.0f * u[t]);
  std::vector<uint16_t> codes((n + 1) * sketch->words());
  sketch->KeyCodes(more.data(), n + 1, codes.data());
  int64_t off_by_one = 0;
  for (int64_t i = 0; i <= n; ++i)
    for (int j = 0; j < r; ++j) {
      double s = 0;
      for (int64_t t = 0; t < d; ++t) s += double{u[j * d + t]} * more[i * d + t];
      const double want = std::clamp(std::nearbyint(s / sketch->scales()[j]), -127.0, 127.0);
      const int got = SketchCoordinate(codes.data() + i * sketch->words(), j);
      ASSERT_LE(std::abs(got - want), 1) << "key " << i << " coordinate " << j;
      off_by_one += got != want;
    }
  EXPECT_LE(off_by_one, 2);  // float32 sums differ from float64 only at rounding ties
  EXPECT_EQ(SketchCoordinate(codes.data() + n * sketch->words(), 0), 127);
  // The packing: coordinate 2w in the low byte of word w.
  EXPECT_EQ(static_cast<int8_t>(codes[0] & 0xFF), SketchCoordinate(codes.data(), 0));
  EXPECT_EQ(static_cast<int8_t>(codes[0] >> 8), SketchCoordinate(codes.data(), 1));
  // A query: coordinates (u_j . q) s_j, scaled so the largest is 127.
  std::vector<float> q(d);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (float& x : q) x = nd(rng);
  std::vector<uint16_t> qc(sketch->words());
  sketch->QueryCode(q.data(), qc.data());
  std::vector<double> z(r);
  double zmax = 0;
  for (int j = 0; j < r; ++j) {
    for (int64_t t = 0; t < d; ++t) z[j] += double{u[j * d + t]} * q[t];
    z[j] *= sketch->scales()[j];
    zmax = std::max(zmax, std::fabs(z[j]));
  }
  for (int j = 0; j < r; ++j) {
    EXPECT_LE(std::abs(SketchCoordinate(qc.data(), j) - std::nearbyint(127 * z[j] / zmax)), 1);
  }
  // A zero query has a zero code.
  std::vector<float> zero(d, 0.0f);
  sketch->QueryCode(zero.data(), qc.data());
  for (uint16_t w : qc) EXPECT_EQ(w, 0);
}

TEST(KeySketch, FewOrNoKeysAndBadInput) {
  const int64_t d = 16;
  std::vector<float> keys(3 * d, 0.0f);
  for (int64_t t = 0; t < d; ++t) keys[t] = 1.0f, keys[d + t] = t % 2 ? 1.0f : -1.0f;
  // Three keys (rank 2), eight directions: still an orthonormal basis.
  auto few = KeySketch::Fit(keys.data(), 3, d, 8);
  ASSERT_TRUE(few.ok()) << few.status();
  for (int a = 0; a < 8; ++a)
    for (int b = 0; b <= a; ++b) {
      double dot = 0;
      for (int64_t t = 0; t < d; ++t)
        dot += double{few->basis()[a * d + t]} * few->basis()[b * d + t];
      EXPECT_NEAR(dot, a == b ? 1.0 : 0.0, 1e-5) << a << " " << b;
    }
  auto none = KeySketch::Fit(nullptr, 0, d, 4);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->basis()[0], 1.0f);
  EXPECT_EQ(none->basis()[d + 1], 1.0f);
  EXPECT_FALSE(KeySketch::Fit(keys.data(), 3, d, 7).ok());  // odd
  EXPECT_FALSE(KeySketch::Fit(keys.data(), 3, d, 0).ok());
  EXPECT_FALSE(KeySketch::Fit(keys.data(), 3, d, 18).ok());  // above d
  std::vector<float> wide(40 * 3, 1.0f);
  EXPECT_FALSE(KeySketch::Fit(wide.data(), 3, 40, 34).ok());  // above kMaxDims
  EXPECT_FALSE(KeySketch::Fit(keys.data(), 3, 0, 2).ok());
  EXPECT_FALSE(KeySketch::Fit(nullptr, 3, d, 4).ok());
  keys[5] = std::numeric_limits<float>::quiet_NaN();
  auto bad = KeySketch::Fit(keys.data(), 3, d, 4);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("non-finite"), std::string_view::npos);
}

TEST(SketchKernel, ScoresMatchIntegerBruteForceAtEveryLevel) {
  std::mt19937 rng(17);
  for (int words = 1; words <= 16; ++words) {
    for (int64_t n : {1, 7, 8, 9, 100, 257}) {
      std::vector<uint16_t> keys(static_cast<size_t>(n * words));
      for (uint16_t& w : keys) w = static_cast<uint16_t>(rng());
      // Extremes included: -128 and 127 in both bytes.
      keys[0] = 0x8080;
      std::vector<uint16_t> q(static_cast<size_t>(words));
      for (uint16_t& w : q) w = static_cast<uint16_t>(rng());
      q[0] = 0x8080;
      std::vector<int32_t> want(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i)
        for (int j = 0; j < 2 * words; ++j)
          want[i] += SketchCoordinate(q.data(), j) * SketchCoordinate(keys.data() + i * words, j);
      for (SimdLevel level : SupportedSimdLevels()) {
        std::vector<int32_t> got(static_cast<size_t>(n), -1);
        SketchScores(level, q.data(), keys.data(), n, words, got.data());
        ASSERT_EQ(got, want) << SimdLevelName(level) << " words " << words << " n " << n;
      }
    }
  }
}

TEST(SketchKernel, SelectLargestMatchesStableSort) {
  std::mt19937 rng(23);
  for (int64_t n : {1, 2, 50, 3000}) {
    for (int spread : {3, 2000, kSketchMaxScore}) {
      std::uniform_int_distribution<int32_t> pick(-spread, spread);
      std::vector<int32_t> scores(static_cast<size_t>(n));
      for (int32_t& s : scores) s = pick(rng);
      scores[0] = kSketchMaxScore;
      if (n > 1) scores[n - 1] = -kSketchMaxScore;
      std::vector<int64_t> order(static_cast<size_t>(n));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return scores[a] > scores[b]; });
      for (int64_t m : {int64_t{0}, int64_t{1}, n / 3, n - 1, n, n + 5}) {
        std::vector<int32_t> want(order.begin(), order.begin() + std::clamp<int64_t>(m, 0, n));
        std::sort(want.begin(), want.end());
        std::vector<int32_t> got;
        SelectLargest(scores.data(), n, m, &got);
        ASSERT_EQ(got, want) << "n " << n << " spread " << spread << " m " << m;
      }
    }
  }
}

// Integer brute force: key i's score against query code q (words words).
int32_t BruteScore(const uint16_t* q, const uint16_t* key, int words) {
  int32_t s = 0;
  for (int j = 0; j < 2 * words; ++j) s += SketchCoordinate(q, j) * SketchCoordinate(key, j);
  return s;
}

TEST(SketchKernel, GroupScoresMatchBruteForceAtEveryLevel) {
  std::mt19937 rng(29);
  for (int words : {1, 6, 8, 16}) {
    for (int g : {1, 3, 4, 5, 33}) {  // 33: more heads than the VNNI kernel holds at once
      for (int64_t n : {1, 15, 16, 17, 100, 300}) {
        std::vector<uint16_t> keys(static_cast<size_t>(n * words));
        for (uint16_t& w : keys) w = static_cast<uint16_t>(rng());
        keys[0] = 0x8080;
        std::vector<uint16_t> q(static_cast<size_t>(g * words));
        for (uint16_t& w : q) w = static_cast<uint16_t>(rng());
        q[0] = 0x8080;
        std::vector<int32_t> want(static_cast<size_t>(g * n));
        for (int h = 0; h < g; ++h)
          for (int64_t i = 0; i < n; ++i)
            want[h * n + i] = BruteScore(q.data() + h * words, keys.data() + i * words, words);
        for (SimdLevel level : SupportedSimdLevels()) {
          std::vector<int32_t> got(static_cast<size_t>(g * n), -1);
          SketchScoresGroup(level, q.data(), g, keys.data(), n, words, got.data());
          ASSERT_EQ(got, want) << SimdLevelName(level) << " words " << words << " g " << g << " n "
                               << n;
        }
      }
    }
  }
}

// The m best keys of head h by brute force: a stable sort by score, the first m, in index order.
std::vector<int32_t> BestByBruteForce(const std::vector<uint16_t>& keys,
                                      const std::vector<uint16_t>& q, int h, int words, int64_t n,
                                      int64_t m) {
  std::vector<int32_t> score(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    score[i] = BruteScore(q.data() + h * words, keys.data() + i * words, words);
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return score[a] > score[b]; });
  std::vector<int32_t> best(order.begin(), order.begin() + std::clamp<int64_t>(m, 0, n));
  std::sort(best.begin(), best.end());
  return best;
}

// BestSketchKeys against brute force at every level, through each of its paths: all scores (small
// n, large m), the sampled threshold, and the fallback where the stride aliases with the scores.
TEST(SketchKernel, BestSketchKeysMatchBruteForceAtEveryLevel) {
  std::mt19937 rng(41);
  enum class Keys { kRandom, kFewValues, kStrideAliased };
  for (Keys kind : {Keys::kRandom, Keys::kFewValues, Keys::kStrideAliased}) {
    for (int words : {16, 8, 6}) {
      for (int64_t n : {int64_t{300}, kSketchSampledMin, int64_t{9000}}) {
        const int g = 3;
        std::vector<uint16_t> keys(static_cast<size_t>(n * words));
        std::vector<uint16_t> q(static_cast<size_t>(g * words));
        for (uint16_t& w : q) w = static_cast<uint16_t>(rng());
        for (int64_t i = 0; i < n; ++i) {
          uint16_t* key = keys.data() + i * words;
          for (int w = 0; w < words; ++w) key[w] = static_cast<uint16_t>(rng());
          if (kind == Keys::kFewValues) {
            // Scores from a handful of values: ties everywhere, at the threshold too.
            for (int w = 0; w < words; ++w) key[w] = static_cast<uint16_t>(rng() % 3);
          } else if (kind == Keys::kStrideAliased) {
            // The keys the sample reads (every 32nd, from the 16th) score highest for head 0, so
            // its threshold admits only them: fewer than m, the fallback runs.
            for (int w = 0; w < words; ++w) key[w] = 0;
            if (i % kSketchSampleStride == kSketchSampleStride / 2) key[0] = q[0];
          }
        }
        for (int64_t m : {int64_t{0}, int64_t{1}, n / 50, n / 8, n / 4 + 1, n}) {
          std::vector<std::vector<int32_t>> want;
          for (int h = 0; h < g; ++h) want.push_back(BestByBruteForce(keys, q, h, words, n, m));
          for (SimdLevel level : SupportedSimdLevels()) {
            SketchSelectScratch scratch;
            std::vector<std::vector<int32_t>> got(g, std::vector<int32_t>{-1});
            BestSketchKeys(level, q.data(), g, keys.data(), n, words, m, &scratch, got.data());
            for (int h = 0; h < g; ++h) {
              ASSERT_EQ(got[h], want[h])
                  << SimdLevelName(level) << " kind " << static_cast<int>(kind) << " words "
                  << words << " n " << n << " m " << m << " head " << h;
            }
          }
        }
      }
    }
  }
}

using Problem = test_util::CodesProblem;
using test_util::CodesShard;

Problem MakeProblem(int64_t n, int64_t d, int dims, uint32_t seed) {
  Problem p{n, d, dims / 2, {}, {}, {}};
  std::vector<double> dirs;
  p.keys = PlantedKeys(n, d, seed, &dirs);
  std::mt19937 rng(seed + 1);
  std::normal_distribution<float> nd;
  p.values.resize(static_cast<size_t>(n * d));
  for (float& x : p.values) x = nd(rng) + 0.5f;
  auto sketch = KeySketch::Fit(p.keys.data(), n, d, dims);
  EXPECT_TRUE(sketch.ok());
  p.codes.resize(static_cast<size_t>(n * p.words));
  sketch->KeyCodes(p.keys.data(), n, p.codes.data());
  return p;
}

// Float64 brute force: keys ordered by sketch score (ties: lower index), the first m attended.
PartialAttention BruteForce(const Problem& p, const float* q, const uint16_t* q_code, float scale,
                            int64_t m) {
  std::vector<int64_t> score(static_cast<size_t>(p.n));
  for (int64_t i = 0; i < p.n; ++i)
    for (int j = 0; j < 2 * p.words; ++j)
      score[i] += SketchCoordinate(q_code, j) * SketchCoordinate(p.codes.data() + i * p.words, j);
  std::vector<int64_t> order(static_cast<size_t>(p.n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return score[a] > score[b]; });
  return test_util::SoftmaxOverRows(p.keys, p.values, p.d, order, m, q, scale);
}

std::vector<float> Queries(int64_t count, int64_t d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.3f);
  std::vector<float> q(static_cast<size_t>(count * d));
  for (float& x : q) x = nd(rng);
  return q;
}

TEST(SketchEstimator, ReferenceMatchesBruteForce) {
  for (int dims : {2, 8, 16}) {
    const Problem p = MakeProblem(600, 32, dims, 31 + dims);
    const KvShard shard = CodesShard(p);
    auto sketch = KeySketch::Fit(p.keys.data(), p.n, p.d, dims);
    ASSERT_TRUE(sketch.ok());
    const std::vector<float> q = Queries(3, p.d, 7);
    for (double fraction : {0.001, 0.03, 0.5}) {
      const SpotlightEstimator est(fraction, 1, ActiveSimdLevel(), CodeScore::kSketch);
      EstimatorScratch scratch;
      for (int h = 0; h < 3; ++h) {
        std::vector<uint16_t> qc(static_cast<size_t>(p.words));
        sketch->QueryCode(q.data() + h * p.d, qc.data());
        auto got = est.Attend(shard, q.data() + h * p.d, qc.data(), 0.25f, &scratch);
        ASSERT_TRUE(got.ok()) << got.status();
        const PartialAttention want =
            BruteForce(p, q.data() + h * p.d, qc.data(), 0.25f, SpotlightRetrieved(fraction, p.n));
        EXPECT_EQ(got->n_touched, want.n_touched);
        EXPECT_NEAR(got->lse, want.lse, 1e-5 * (1 + std::abs(want.lse)));
        for (int64_t t = 0; t < p.d; ++t) {
          EXPECT_NEAR(got->o[t], want.o[t], 1e-5) << "dims " << dims << " fraction " << fraction;
        }
      }
    }
  }
}

TEST(SketchEstimator, GroupPathMatchesReferenceAtEveryLevel) {
  const int g = 4;
  for (int dims : {16, 32, 12}) {  // 8 and 16 words take the SIMD kernel; 6 words the scalar one
    const Problem p = MakeProblem(2500, 64, dims, 3 + dims);
    auto sketch = KeySketch::Fit(p.keys.data(), p.n, p.d, dims);
    ASSERT_TRUE(sketch.ok());
    const std::vector<float> q = Queries(g, p.d, 5);
    std::vector<uint16_t> qc(static_cast<size_t>(g * p.words));
    for (int h = 0; h < g; ++h) sketch->QueryCode(q.data() + h * p.d, qc.data() + h * p.words);
    for (KvStorage storage : {KvStorage::kF32, KvStorage::kBf16}) {
      const KvShard shard = CodesShard(p, storage);
      for (int64_t rerank : {1, 8}) {
        for (SimdLevel level : SupportedSimdLevels()) {
          const SpotlightEstimator est(0.03, rerank, level, CodeScore::kSketch);
          EstimatorScratch scratch;
          std::vector<PartialAttention> out(g);
          ASSERT_TRUE(
              est.AttendGroup(shard, q.data(), qc.data(), g, 0.125f, &scratch, out.data()).ok());
          for (int h = 0; h < g; ++h) {
            auto want =
                est.Attend(shard, q.data() + h * p.d, qc.data() + h * p.words, 0.125f, &scratch);
            ASSERT_TRUE(want.ok());
            EXPECT_EQ(out[h].n_touched, 75);
            EXPECT_EQ(out[h].n_touched, want->n_touched);
            EXPECT_NEAR(out[h].lse, want->lse, 1e-4 * (1 + std::abs(want->lse)));
            for (int64_t t = 0; t < p.d; ++t) {
              EXPECT_NEAR(out[h].o[t], want->o[t], 1e-4)
                  << SimdLevelName(level) << " dims " << dims << " rerank " << rerank;
            }
          }
        }
      }
    }
  }
}

// With as many directions as the head has, the sketch ranks keys by q . k up to int8 rounding:
// planted keys far above the rest are exactly the ones retrieved, and the result is top-k's.
TEST(SketchEstimator, FullRankSketchRetrievesThePlantedTopKeys) {
  const int64_t n = 2000, d = 16;
  std::mt19937 rng(41);
  std::normal_distribution<float> nd;
  std::vector<float> keys(n * d), values(n * d), q(d);
  for (float& x : keys) x = nd(rng);
  for (float& x : values) x = nd(rng);
  for (float& x : q) x = nd(rng);
  const std::vector<int64_t> planted = {3, 400, 401, 1234, 1999};
  for (int64_t i : planted)
    for (int64_t t = 0; t < d; ++t) keys[i * d + t] = 3.0f * q[t] + 0.1f * nd(rng);
  auto sketch = KeySketch::Fit(keys.data(), n, d, 16);
  ASSERT_TRUE(sketch.ok());
  std::vector<uint16_t> codes(n * sketch->words()), qc(sketch->words());
  sketch->KeyCodes(keys.data(), n, codes.data());
  sketch->QueryCode(q.data(), qc.data());
  std::vector<int32_t> scores(n), best;
  SketchScores(ActiveSimdLevel(), qc.data(), codes.data(), n, sketch->words(), scores.data());
  SelectLargest(scores.data(), n, static_cast<int64_t>(planted.size()), &best);
  EXPECT_EQ(std::vector<int64_t>(best.begin(), best.end()), planted);
  auto shard = KvShard::CreateFromCodes(d, 16, sketch->words(), keys.data(), codes.data(),
                                        values.data(), n, KvStorage::kF32, KvIndex::kCodes);
  ASSERT_TRUE(shard.ok());
  const double fraction = static_cast<double>(planted.size()) / n;
  const SpotlightEstimator est(fraction, 1, ActiveSimdLevel(), CodeScore::kSketch);
  const TopKEstimator topk(static_cast<int64_t>(planted.size()));
  EstimatorScratch scratch;
  auto a = est.Attend(*shard, q.data(), qc.data(), 0.25f, &scratch);
  auto b = topk.Attend(*shard, q.data(), nullptr, 0.25f, &scratch);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NEAR(a->lse, b->lse, 1e-6 * (1 + std::abs(b->lse)));
  for (int64_t t = 0; t < d; ++t) EXPECT_NEAR(a->o[t], b->o[t], 1e-6);
}

// vattention-sketch keeps the key sketch's best keys exact. Handmade codes: the query's code is
// (100, 0, ...); key 1234 (127, 0, ...) scores highest but is 4 bits from it, key 5 has the
// query's own code (Hamming distance 0, lower score), every other key the zero code (score 0, 3
// bits). Key 1234's logit is 40 above the rest: kept exactly (the sketch's one candidate), the
// output is exact attention up to e^-40; found by Hamming distance instead it would be sampled.
TEST(VAttentionSketch, KeepsTheSketchsBestKeysExact) {
  const int64_t n = 2000, d = 16;
  const int words = 8;
  std::mt19937 rng(43);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<float> keys(n * d), values(n * d), q(d);
  for (float& x : keys) x = nd(rng);
  for (float& x : values) x = nd(rng) * 20;
  for (float& x : q) x = nd(rng) * 20;
  double qq = 0;
  for (float x : q) qq += x * x;
  for (int64_t t = 0; t < d; ++t) keys[1234 * d + t] = static_cast<float>(40 * q[t] / qq);
  std::vector<uint16_t> codes(n * words, 0), q_code(words, 0);
  q_code[0] = 100;
  codes[1234 * words] = 127;
  codes[5 * words] = 100;
  auto shard = KvShard::CreateFromCodes(d, 16, words, keys.data(), codes.data(), values.data(), n,
                                        KvStorage::kF32, KvIndex::kCodes);
  ASSERT_TRUE(shard.ok()) << shard.status();
  std::vector<int64_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  const PartialAttention exact =
      test_util::SoftmaxOverRows(keys, values, d, all, n, q.data(), 1.0f);
  const VAttentionParams params{.epsilon = 0.3, .delta = 0.3, .heavy = 0, .base_rate = 0.01};
  for (SimdLevel level : SupportedSimdLevels()) {
    const auto est =
        VAttentionLshEstimator::WithLearnedCodes(1.0 / n, params, 3, level, CodeScore::kSketch);
    EstimatorScratch scratch;
    auto got = est.Attend(*shard, q.data(), q_code.data(), 1.0f, &scratch);
    ASSERT_TRUE(got.ok()) << got.status();
    std::vector<PartialAttention> group(2);
    std::vector<float> q2(q);
    q2.insert(q2.end(), q.begin(), q.end());
    std::vector<uint16_t> c2(q_code);
    c2.insert(c2.end(), q_code.begin(), q_code.end());
    ASSERT_TRUE(
        est.AttendGroup(*shard, q2.data(), c2.data(), 2, 1.0f, &scratch, group.data()).ok());
    for (const PartialAttention* a : {&*got, &group[0], &group[1]}) {
      EXPECT_NEAR(a->lse, exact.lse, 1e-5 * std::abs(exact.lse)) << SimdLevelName(level);
      for (int64_t t = 0; t < d; ++t)
        EXPECT_NEAR(a->o[t], exact.o[t], 1e-4) << SimdLevelName(level);
    }
  }
}

// The SIMD group path against the float64 group reference (the same candidates and coupled draws)
// on fitted sketches.
TEST(VAttentionSketch, GroupPathMatchesReference) {
  const int g = 4;
  const Problem p = MakeProblem(3000, 32, 16, 47);
  const KvShard shard = CodesShard(p);
  auto sketch = KeySketch::Fit(p.keys.data(), p.n, p.d, 16);
  ASSERT_TRUE(sketch.ok());
  const std::vector<float> q = Queries(g, p.d, 8);
  std::vector<uint16_t> q_codes(static_cast<size_t>(g * p.words));
  for (int h = 0; h < g; ++h) sketch->QueryCode(q.data() + h * p.d, q_codes.data() + h * p.words);
  const VAttentionParams params{.epsilon = 0.1, .delta = 0.1};
  for (SimdLevel level : SupportedSimdLevels()) {
    const auto est =
        VAttentionLshEstimator::WithLearnedCodes(0.02, params, 5, level, CodeScore::kSketch);
    EstimatorScratch scratch;
    std::vector<PartialAttention> out(g), ref(g);
    ASSERT_TRUE(
        est.AttendGroup(shard, q.data(), q_codes.data(), g, 0.5f, &scratch, out.data()).ok());
    ASSERT_TRUE(
        est.AttendGroupReference(shard, q.data(), q_codes.data(), g, 0.5f, &scratch, ref.data())
            .ok());
    int differ = 0;
    for (int h = 0; h < g; ++h) {
      if (out[h].n_touched != ref[h].n_touched) {  // a sample size rounded the other way
        ++differ;
        continue;
      }
      for (int64_t t = 0; t < p.d; ++t) EXPECT_NEAR(out[h].o[t], ref[h].o[t], 1e-4) << h;
      EXPECT_NEAR(out[h].lse, ref[h].lse, 1e-4) << "head " << h;
    }
    EXPECT_LE(differ, 1) << SimdLevelName(level);
  }
}

}  // namespace
}  // namespace magicpig::attention
