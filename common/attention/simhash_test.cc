// Tests for SimHash: argument validation, determinism of W, the bit order and sign convention
// against a direct float64 computation of x . W columns, and a Monte Carlo check that the frequency
// of ">= 2 equal tables" for (q, k) pairs at a fixed angle matches InclusionProbability.
#include "common/attention/simhash.h"

#include <cmath>
#include <numbers>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/attention/inclusion_probability.h"
#include "common/cpu_features.h"
#include "common/half.h"
#include "gtest/gtest.h"
#include "tbb/task_arena.h"

namespace magicpig::attention {
namespace {

TEST(SimHashTest, RejectsOutOfRangeArgumentsNamingTheField) {
  struct Bad {
    int64_t d;
    int k;
    int l;
    const char* field;
  };
  for (const Bad& b : {Bad{0, 10, 150, "d"}, Bad{128, 0, 150, "K"}, Bad{128, 17, 150, "K"},
                       Bad{128, 10, 0, "L"}, Bad{128, 10, 513, "L"}}) {
    auto s = SimHash::Create(b.d, b.k, b.l, 1);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(s.status().message()).find(std::string(b.field) + " must"),
              std::string::npos)
        << s.status();
  }
  EXPECT_TRUE(SimHash::Create(1, 1, 1, 1).ok());
  EXPECT_TRUE(SimHash::Create(128, 16, 512, 1).ok());
}

TEST(SimHashTest, ProjectionIsDeterministicPerSeedAndStandardNormal) {
  auto a = SimHash::Create(64, 10, 150, 42);
  auto b = SimHash::Create(64, 10, 150, 42);
  auto c = SimHash::Create(64, 10, 150, 43);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->projection(), b->projection());
  EXPECT_NE(a->projection(), c->projection());
  ASSERT_EQ(a->projection().size(), 64u * 1500u);
  // Row-major fill order from std::mt19937_64(seed) + std::normal_distribution<double>, each
  // draw rounded to float, then to bf16 (nearest even).
  std::mt19937_64 rng(42);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(a->projection()[i], Bf16ToFloat(FloatToBf16(static_cast<float>(normal(rng)))));
  }
  for (float v : a->projection()) ASSERT_EQ(v, Bf16ToFloat(FloatToBf16(v)));
  double sum = 0, sum2 = 0;
  for (float v : a->projection()) {
    sum += v;
    sum2 += static_cast<double>(v) * v;
  }
  const double n = static_cast<double>(a->projection().size());
  EXPECT_NEAR(sum / n, 0.0, 5.0 / std::sqrt(n));
  EXPECT_NEAR(sum2 / n, 1.0, 0.05);
}

// impl -1: CodesReference (float64); otherwise CodesAtLevel(level = impl), the fp32 SIMD path,
// whose bits must agree wherever the float64 projection is not within fp32 rounding of 0
// (|dot| > 1e-5 * sum |terms|, about 100x the worst-case fp32 error for d = 48).
TEST(SimHashTest, CodesFollowBitOrderAndStrictSignAgainstFloat64) {
  std::vector<int> impls = {-1};
  for (SimdLevel level : SupportedSimdLevels()) impls.push_back(static_cast<int>(level));
  for (int impl : impls)
    for (int k : {1, 3, 10, 16}) {
      const int64_t d = 48;
      const int l = 7;
      auto h = SimHash::Create(d, k, l, 1000 + k);
      ASSERT_TRUE(h.ok());
      const int64_t n = 40;
      std::mt19937 rng(k);
      std::normal_distribution<float> normal;
      std::vector<float> x(n * d);
      for (float& v : x) v = normal(rng);
      // Vector 0 is exactly zero: every projection is 0, so every bit is 0 (strict inequality).
      std::fill(x.begin(), x.begin() + d, 0.0f);
      std::vector<uint16_t> codes(n * l, 0xFFFF);
      const int64_t n_fast = impl < 0 ? n : 203;  // the fast path: ragged blocks of 4 and 64 too
      if (impl >= 0) {
        x.resize(n_fast * d);
        for (int64_t i = n * d; i < n_fast * d; ++i) x[i] = normal(rng);
        codes.assign(n_fast * l, 0xFFFF);
        ASSERT_TRUE(
            h->CodesAtLevel(x.data(), n_fast, d, codes.data(), static_cast<SimdLevel>(impl)).ok());
      } else {
        ASSERT_TRUE(h->CodesReference(x.data(), n, d, codes.data()).ok());
      }
      const double close_call = impl < 0 ? 1e-12 : 1e-5;
      const std::vector<float>& w = h->projection();
      const int64_t cols = static_cast<int64_t>(k) * l;
      int checked = 0;
      for (int64_t v = 0; v < n_fast; ++v) {
        for (int t = 0; t < l; ++t) {
          const uint16_t code = codes[v * l + t];
          if (k < 16) {
            EXPECT_LT(code, 1u << k);
          }
          for (int b = 0; b < k; ++b) {
            double dot = 0, mag = 0;
            for (int64_t i = 0; i < d; ++i) {
              const double term = static_cast<double>(x[v * d + i]) * w[i * cols + t * k + b];
              dot += term;
              mag += std::fabs(term);
            }
            if (v > 0 && std::fabs(dot) <= close_call * mag)
              continue;  // too close to call (counted)
            const int expected = dot > 0.0 ? 1 : 0;
            EXPECT_EQ((code >> b) & 1, expected)
                << "impl=" << impl << " k=" << k << " v=" << v << " t=" << t << " b=" << b;
            ++checked;
          }
        }
      }
      if (impl < 0) {
        EXPECT_EQ(checked, n * l * k);  // no bit was too close to call with these seeds
      } else {
        EXPECT_GE(checked, n_fast * l * k * 99 / 100);
      }
    }
}

// The fast path at every SIMD level for every tail of its vector blocks (n = 1 ... 13, and
// around the 64-vector blocks) and for long codes (K*L up to 16 x 512 columns: many column blocks,
// and the last table's bits at the end of a vector's bit row), against the float64 sign of each
// projection (a bit within fp32 rounding of 0 is skipped, as above; at most 1% of them).
std::vector<std::pair<SimdLevel, int>> LevelsAndWidths() {
  std::vector<std::pair<SimdLevel, int>> out;
  for (SimdLevel level : SupportedSimdLevels()) {
    for (int width : {1, 3}) out.emplace_back(level, width);
  }
  return out;
}

TEST(SimHashTest, FastPathMatchesFloat64ForEveryBlockTailAndLongCodes) {
  struct Case {
    int k, l;
  };
  for (const Case c : {Case{10, 150}, Case{16, 512}, Case{7, 33}, Case{1, 1}}) {
    const int64_t d = 40;
    auto h = SimHash::Create(d, c.k, c.l, 77 + c.k);
    ASSERT_TRUE(h.ok());
    const std::vector<float>& w = h->projection();
    const int64_t cols = static_cast<int64_t>(c.k) * c.l;
    std::mt19937 rng(c.l);
    std::normal_distribution<float> normal;
    for (int64_t n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 63, 64, 65, 71, 135}) {
      std::vector<float> x(static_cast<size_t>(n * d));
      for (float& v : x) v = normal(rng);
      // Widths 1 and 3: one block of vectors is projected by one thread, or with its columns
      // split over three (unevenly: K x L is not a multiple of 3 x 32).
      for (const auto& [level, width] : LevelsAndWidths()) {
        std::vector<uint16_t> codes(static_cast<size_t>(n * c.l), 0xFFFF);
        absl::Status status;
        tbb::task_arena(width).execute(
            [&] { status = h->CodesAtLevel(x.data(), n, d, codes.data(), level); });
        ASSERT_TRUE(status.ok()) << status;
        int64_t checked = 0;
        for (int64_t v = 0; v < n; ++v) {
          for (int t = 0; t < c.l; ++t) {
            const uint32_t code = codes[static_cast<size_t>(v * c.l + t)];
            ASSERT_LT(code, 1u << c.k);
            for (int b = 0; b < c.k; ++b) {
              double dot = 0, mag = 0;
              for (int64_t i = 0; i < d; ++i) {
                const double term =
                    static_cast<double>(x[static_cast<size_t>(v * d + i)]) *
                    w[static_cast<size_t>(i * cols + static_cast<int64_t>(t) * c.k + b)];
                dot += term;
                mag += std::fabs(term);
              }
              if (std::fabs(dot) <= 1e-5 * mag) continue;
              ASSERT_EQ((code >> b) & 1, dot > 0.0 ? 1u : 0u)
                  << SimdLevelName(level) << " width " << width << " k=" << c.k << " l=" << c.l
                  << " n=" << n << " v=" << v << " t=" << t << " b=" << b;
              ++checked;
            }
          }
        }
        EXPECT_GE(checked, n * cols * 99 / 100);
      }
    }
  }
}

// Key codes: the vectors rounded to bf16, then hashed. At every level and width (at kAvx512 on a
// CPU with AVX512_BF16 the bf16 kernel, and each level's fp32 kernel on the rounded values), for
// block tails, an odd d (the bf16 kernel's last pair padded) and long codes, against the float64
// sign of the rounded vector's projection (within fp32 rounding of 0 skipped, at most 1%); and
// KeyCodesReference exactly that sign.
TEST(SimHashTest, KeyCodesHashTheBf16RoundedVectorsAtEveryLevel) {
  struct Case {
    int64_t d;
    int k, l;
  };
  if (!CpuHasAvx512Bf16()) GTEST_LOG_(INFO) << "no AVX512_BF16 here: the bf16 kernel is not run";
  for (const Case c : {Case{40, 10, 150}, Case{37, 7, 33}, Case{128, 16, 512}, Case{1, 3, 2}}) {
    auto h = SimHash::Create(c.d, c.k, c.l, 300 + c.d);
    ASSERT_TRUE(h.ok());
    const std::vector<float>& w = h->projection();
    const int64_t d = c.d, cols = static_cast<int64_t>(c.k) * c.l;
    std::mt19937 rng(static_cast<unsigned>(c.d));
    std::normal_distribution<float> normal;
    for (int64_t n : {1, 5, 6, 7, 13, 64, 65, 135}) {
      std::vector<float> x(static_cast<size_t>(n * d)), rounded(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        x[i] = normal(rng) * 3.0f;
        rounded[i] = Bf16ToFloat(FloatToBf16(x[i]));
      }
      // Float64 projections of the rounded vectors: the sign, and how close to 0 it is.
      std::vector<double> dot(static_cast<size_t>(n * cols)), mag(dot.size());
      for (int64_t v = 0; v < n; ++v) {
        for (int64_t j = 0; j < cols; ++j) {
          double s = 0, m = 0;
          for (int64_t i = 0; i < d; ++i) {
            const double term = static_cast<double>(rounded[v * d + i]) * w[i * cols + j];
            s += term;
            m += std::fabs(term);
          }
          dot[v * cols + j] = s;
          mag[v * cols + j] = m;
        }
      }
      auto check = [&](const std::vector<uint16_t>& codes, double close_call,
                       const std::string& what) {
        int64_t checked = 0;
        for (int64_t v = 0; v < n; ++v) {
          for (int t = 0; t < c.l; ++t) {
            const uint32_t code = codes[static_cast<size_t>(v * c.l + t)];
            ASSERT_LT(code, 1u << c.k) << what;
            for (int b = 0; b < c.k; ++b) {
              const int64_t j = static_cast<int64_t>(t) * c.k + b;
              if (std::fabs(dot[v * cols + j]) <= close_call * mag[v * cols + j]) continue;
              ASSERT_EQ((code >> b) & 1, dot[v * cols + j] > 0.0 ? 1u : 0u)
                  << what << " d=" << d << " k=" << c.k << " n=" << n << " v=" << v << " t=" << t
                  << " b=" << b;
              ++checked;
            }
          }
        }
        EXPECT_GE(checked, n * cols * 99 / 100) << what;
      };
      std::vector<uint16_t> ref(static_cast<size_t>(n * c.l), 0xFFFF);
      ASSERT_TRUE(h->KeyCodesReference(x.data(), n, d, ref.data()).ok());
      ASSERT_NO_FATAL_FAILURE(check(ref, 1e-12, "reference"));
      for (const auto& [level, width] : LevelsAndWidths()) {
        // With and without the bf16 kernel: the fp32 kernels on the rounded values are what CPUs
        // without AVX512_BF16 run at this level.
        for (const bool bf16_kernel : {true, false}) {
          std::vector<uint16_t> codes(static_cast<size_t>(n * c.l), 0xFFFF);
          absl::Status status;
          tbb::task_arena(width).execute([&] {
            status = h->KeyCodesAtLevel(x.data(), n, d, codes.data(), level, bf16_kernel);
          });
          ASSERT_TRUE(status.ok()) << status;
          ASSERT_NO_FATAL_FAILURE(check(codes, 1e-5,
                                        std::string(SimdLevelName(level)) + " width " +
                                            std::to_string(width) +
                                            (bf16_kernel ? "" : " fp32 kernel")));
        }
      }
    }
  }
  // Wrong d is refused, as by Codes.
  auto h = SimHash::Create(8, 4, 4, 1);
  ASSERT_TRUE(h.ok());
  std::vector<float> x(16, 1.0f);
  std::vector<uint16_t> codes(8);
  EXPECT_EQ(h->KeyCodes(x.data(), 2, 7, codes.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(h->KeyCodesReference(x.data(), 2, 7, codes.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SimHashTest, NegatedVectorGetsComplementCodes) {
  const int k = 10, l = 20;
  const int64_t d = 32;
  auto h = SimHash::Create(d, k, l, 5);
  ASSERT_TRUE(h.ok());
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> x(d), nx(d);
  for (int64_t i = 0; i < d; ++i) {
    x[i] = normal(rng);
    nx[i] = -x[i];
  }
  std::vector<uint16_t> a(l), b(l);
  ASSERT_TRUE(h->Codes(x.data(), 1, d, a.data()).ok());
  ASSERT_TRUE(h->Codes(nx.data(), 1, d, b.data()).ok());
  for (int t = 0; t < l; ++t) EXPECT_EQ(a[t] ^ b[t], (1 << k) - 1);
}

TEST(SimHashTest, CodesRejectsWrongDimensionAndAcceptsEmpty) {
  auto h = SimHash::Create(16, 4, 4, 1);
  ASSERT_TRUE(h.ok());
  std::vector<float> x(16);
  std::vector<uint16_t> c(4);
  EXPECT_EQ(h->Codes(x.data(), 1, 15, c.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(h->Codes(x.data(), -1, 16, c.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(h->Codes(nullptr, 0, 16, nullptr).ok());
}

// Fills q (unit) and k (at exactly angle acos(cos) to q, random positive scale) in float64, then
// rounds them to float.
void PairAtCos(double cos, int64_t d, std::mt19937_64& rng, float* q, float* k) {
  std::normal_distribution<double> normal;
  std::vector<double> a(d), r(d);
  double na = 0;
  for (double& v : a) {
    v = normal(rng);
    na += v * v;
  }
  na = std::sqrt(na);
  for (double& v : a) v /= na;
  double proj = 0;
  for (int64_t i = 0; i < d; ++i) {
    r[i] = normal(rng);
    proj += r[i] * a[i];
  }
  double nr = 0;
  for (int64_t i = 0; i < d; ++i) {
    r[i] -= proj * a[i];
    nr += r[i] * r[i];
  }
  nr = std::sqrt(nr);
  const double sin = std::sqrt(1.0 - cos * cos);
  const double scale = 0.5 + std::uniform_real_distribution<double>(0.0, 2.0)(rng);
  for (int64_t i = 0; i < d; ++i) {
    q[i] = static_cast<float>(a[i]);
    k[i] = static_cast<float>(scale * (cos * a[i] + sin * r[i] / nr));
  }
}

// For each (K, L, d) and angle: several independent W (seeds), many pairs per W; the fraction of
// pairs whose codes agree in >= 2 tables must be within 3 standard errors of u(cos; K, L).
// The same frequencies must be > 5 standard errors away from the ">= 1 table" rule and from
// u(cos; K + 1, L), so the check can tell those apart.
// (A fixed W with random pairs equals a random W for a fixed pair only on average over W; drawing
// several W keeps the per-W geometry from biasing the frequency.)
TEST(SimHashTest, MonteCarloCollisionFrequencyMatchesInclusionProbability) {
  struct Config {
    int k;
    int l;
    int64_t d;
    std::vector<double> cos;
  };
  const std::vector<Config> configs = {
      {1, 2, 64, {-0.5, 0.0, 0.5}},
      {4, 16, 128, {-0.2, 0.1, 0.4}},
      {8, 75, 128, {0.1, 0.3, 0.5}},
      {10, 150, 64, {0.2, 0.4, 0.55}},
  };
  const int kSeeds = 8;
  const int kPairsPerSeed = 250;
  std::mt19937_64 rng(2024);
  for (const Config& c : configs) {
    for (double cos : c.cos) {
      const double u = InclusionProbability(cos, c.k, c.l);
      int64_t hits = 0, total = 0;
      for (int s = 0; s < kSeeds; ++s) {
        auto h = SimHash::Create(c.d, c.k, c.l, 7000 + 97 * s + c.k);
        ASSERT_TRUE(h.ok());
        std::vector<float> q(kPairsPerSeed * c.d), k(kPairsPerSeed * c.d);
        for (int p = 0; p < kPairsPerSeed; ++p) PairAtCos(cos, c.d, rng, &q[p * c.d], &k[p * c.d]);
        std::vector<uint16_t> cq(kPairsPerSeed * c.l), ck(kPairsPerSeed * c.l);
        ASSERT_TRUE(h->Codes(q.data(), kPairsPerSeed, c.d, cq.data()).ok());
        ASSERT_TRUE(h->Codes(k.data(), kPairsPerSeed, c.d, ck.data()).ok());
        for (int p = 0; p < kPairsPerSeed; ++p) {
          int equal = 0;
          for (int t = 0; t < c.l; ++t) equal += cq[p * c.l + t] == ck[p * c.l + t];
          hits += equal >= 2;
          ++total;
        }
      }
      const double freq = static_cast<double>(hits) / total;
      const double se = std::sqrt(u * (1.0 - u) / total);
      EXPECT_NEAR(freq, u, 3.0 * se)
          << "K=" << c.k << " L=" << c.l << " d=" << c.d << " cos=" << cos << " n=" << total;
      // Power: the same data rejects neighbouring models (the ">= 1 table" rule, K + 1 bits).
      const double p = 1.0 - std::acos(cos) / std::numbers::pi;
      const double u_ge1 = 1.0 - std::pow(1.0 - std::pow(p, c.k), c.l);
      EXPECT_GT(std::fabs(freq - u_ge1), 5.0 * se) << "K=" << c.k << " cos=" << cos;
      EXPECT_GT(std::fabs(freq - InclusionProbability(cos, c.k + 1, c.l)), 5.0 * se)
          << "K=" << c.k << " cos=" << cos;
    }
  }
}

}  // namespace
}  // namespace magicpig::attention
