// Tests for MatMul/GetRow at every SIMD level this CPU supports, against a float64 product of the
// reference-dequantised weights with the raw float activations.
//
// Tolerance for the integer types: activations are rounded to q = round(x/d) with d = amax/127 per
// block of 32, so |x - d*q| <= d/2 = amax_b/254, and the product can move by at most
// sum_b (amax_b/254) * sum_{i in b} |w_i|. On top of that, float32 accumulation gets a relative
// allowance of 2e-5 of sum_b max|w_b| * sum|x_b| (terms before cancellation). Float types only
// get the float32 allowance.
#include "common/quant/matmul.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "common/quant/dequantize.h"
#include "common/quant/matmul_kernels.h"
#include "gtest/gtest.h"
#include "tests/testing/quantize_reference.h"

namespace magicpig {
namespace {

struct Case {
  GgmlType type;
  int64_t rows;
  int64_t cols;
};

struct Problem {
  std::vector<uint8_t> bytes;
  std::vector<float> w;  // dequantised weights, rows x cols
  std::vector<float> x;  // n_tokens x ldx
  QuantMatrix m;
  int64_t ldx;
};

Problem MakeProblem(const Case& c, int64_t n_tokens, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  Problem p;
  std::vector<float> raw(static_cast<size_t>(c.rows * c.cols));
  for (float& v : raw) v = normal(rng) + 0.3f;  // an offset so Q4_1/Q5_1 minima matter
  for (int64_t r = 0; r < c.rows; ++r) {
    absl::StatusOr<std::vector<uint8_t>> q =
        testing::QuantizeReference(c.type, raw.data() + r * c.cols, c.cols);
    EXPECT_TRUE(q.ok());
    p.bytes.insert(p.bytes.end(), q->begin(), q->end());
  }
  p.w.resize(raw.size());
  const int64_t row_bytes = GgmlRowBytes(c.type, c.cols);
  for (int64_t r = 0; r < c.rows; ++r) {
    EXPECT_TRUE(
        DequantizeRow(c.type, p.bytes.data() + r * row_bytes, p.w.data() + r * c.cols, c.cols)
            .ok());
  }
  p.ldx = c.cols + 3;  // a padded leading dimension catches stride mistakes
  p.x.assign(static_cast<size_t>(n_tokens * p.ldx), 1e30f);
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t k = 0; k < c.cols; ++k) p.x[t * p.ldx + k] = normal(rng) * (k % 7 == 0 ? 4 : 1);
  }
  p.m = QuantMatrix{c.type, p.bytes.data(), c.rows, c.cols};
  return p;
}

bool IsIntegerType(GgmlType t) {
  return quant_internal::UsesQuantizedActivations(t) || quant_internal::IsKQuant(t);
}

// Values per activation scale: 32 for the 32-block integer types, 256 for K-quants.
int64_t ActivationBlock(GgmlType t) {
  return quant_internal::IsKQuant(t) ? quant_internal::kSuperBlock : quant_internal::kActBlock;
}

struct Allowance {
  double activation_rounding;  // integer types only
  double float_sum;
};

// |y - exact| allowed for output (t, r), in two parts; see the file comment.
Allowance Tolerance(const Problem& p, GgmlType type, int64_t t, int64_t r) {
  const int64_t cols = p.m.cols;
  const float* w = p.w.data() + r * cols;
  const float* x = p.x.data() + t * p.ldx;
  double act = 0, magnitude = 0;
  const int64_t ab = ActivationBlock(type);
  for (int64_t b = 0; b < cols; b += ab) {
    double amax_x = 0, sum_w = 0;
    for (int64_t i = b; i < std::min(cols, b + ab); ++i) {
      amax_x = std::max(amax_x, std::fabs(static_cast<double>(x[i])));
      sum_w += std::fabs(w[i]);
    }
    act += amax_x / 254 * sum_w;
  }
  for (int64_t b = 0; b < cols; b += 32) {
    const int64_t len = std::min<int64_t>(32, cols - b);
    double max_w = 0, sum_x = 0;
    for (int64_t i = b; i < b + len; ++i) {
      max_w = std::max(max_w, std::fabs(static_cast<double>(w[i])));
      sum_x += std::fabs(x[i]);
    }
    magnitude += max_w * sum_x;
  }
  return {IsIntegerType(type) ? act : 0.0, 2e-5 * magnitude + 1e-6};
}

std::vector<float> RunMatMul(const Problem& p, int64_t n_tokens, SimdLevel level) {
  const int64_t ldy = p.m.rows + 1;
  std::vector<float> y(static_cast<size_t>(n_tokens * ldy), -7.0f);
  EXPECT_TRUE(MatMul(p.m, p.x.data(), p.ldx, n_tokens, y.data(), ldy, level).ok());
  for (int64_t t = 0; t < n_tokens; ++t) EXPECT_EQ(y[t * ldy + p.m.rows], -7.0f) << "overwrite";
  return y;
}

// d * q for every activation, as QuantizeActivationRow (QuantizeActivationRowK for K-quants)
// produces them (n_tokens x cols, value order).
std::vector<double> DequantizedActivations(const Problem& p, int64_t n_tokens) {
  using quant_internal::kActBlock;
  using quant_internal::kScaleRepeat;
  const int64_t cols = p.m.cols, nb = cols / kActBlock;
  if (quant_internal::IsKQuant(p.m.type)) {
    const int64_t nsb = cols / quant_internal::kSuperBlock;
    std::vector<int8_t> q(cols);
    std::vector<float> d(nsb);
    std::vector<int16_t> bs(cols / 16);
    std::vector<double> out(static_cast<size_t>(n_tokens * cols));
    for (int64_t t = 0; t < n_tokens; ++t) {
      quant_internal::QuantizeActivationRowK(p.x.data() + t * p.ldx, cols,
                                             quant_internal::KActOrder::kNatural, q.data(),
                                             d.data(), bs.data());
      for (int64_t k = 0; k < cols; ++k) {
        out[t * cols + k] = static_cast<double>(d[k / quant_internal::kSuperBlock]) * q[k];
      }
    }
    return out;
  }
  std::vector<int8_t> q(cols);
  std::vector<float> d(nb * kScaleRepeat), s(nb);
  std::vector<double> out(static_cast<size_t>(n_tokens * cols));
  for (int64_t t = 0; t < n_tokens; ++t) {
    quant_internal::QuantizeActivationRow(p.x.data() + t * p.ldx, cols, q.data(), d.data(),
                                          s.data());
    for (int64_t k = 0; k < cols; ++k) {
      out[t * cols + k] = static_cast<double>(d[(k / kActBlock) * kScaleRepeat]) * q[k];
    }
  }
  return out;
}

TEST(QuantizeActivationRowTest, RoundingWithinHalfStep) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::vector<float> x(96);
  for (float& v : x) v = normal(rng);
  for (int i = 64; i < 96; ++i) x[i] = 0.0f;  // an all-zero block must give q = 0, s = 0
  std::vector<int8_t> q(96);
  std::vector<float> d(3 * quant_internal::kScaleRepeat), s(3);
  quant_internal::QuantizeActivationRow(x.data(), 96, q.data(), d.data(), s.data());
  for (int b = 0; b < 3; ++b) {
    double amax = 0;
    int sum = 0;
    for (int i = 0; i < 32; ++i)
      amax = std::max(amax, std::fabs(static_cast<double>(x[32 * b + i])));
    const float db = d[b * quant_internal::kScaleRepeat];
    for (int r = 0; r < quant_internal::kScaleRepeat; ++r) {
      EXPECT_EQ(d[b * quant_internal::kScaleRepeat + r], db);
    }
    EXPECT_NEAR(db, amax / 127, 1e-6 * amax);
    for (int i = 0; i < 32; ++i) {
      EXPECT_LE(std::abs(q[32 * b + i]), 127);
      EXPECT_LE(std::fabs(db * q[32 * b + i] - x[32 * b + i]), amax / 254 * (1 + 1e-5));
      sum += q[32 * b + i];
    }
    EXPECT_FLOAT_EQ(s[b], db * sum);
  }
  EXPECT_EQ(s[2], 0.0f);
}

// Super-block activations: half-step rounding with one scale per 256 values, bsums that are the
// sums of the stored q, and the paired-nibble order a permutation of the natural one.
TEST(QuantizeActivationRowKTest, RoundingBsumsAndOrder) {
  using quant_internal::KActOrder;
  std::mt19937 rng(12);
  std::normal_distribution<float> normal;
  const int64_t cols = 768;
  std::vector<float> x(cols);
  for (float& v : x) v = normal(rng);
  for (int i = 512; i < 768; ++i) x[i] = 0.0f;  // an all-zero super-block gives q = 0, d = 0
  x[7] = 9.0f;                                  // one outlier sets the first super-block's scale
  std::vector<int8_t> q(cols), qp(cols);
  std::vector<float> d(3), dp(3);
  std::vector<int16_t> bs(cols / 16), bsp(cols / 16);
  quant_internal::QuantizeActivationRowK(x.data(), cols, KActOrder::kNatural, q.data(), d.data(),
                                         bs.data());
  quant_internal::QuantizeActivationRowK(x.data(), cols, KActOrder::kPairedNibbles, qp.data(),
                                         dp.data(), bsp.data());
  for (int sb = 0; sb < 3; ++sb) {
    double amax = 0;
    for (int i = 0; i < 256; ++i)
      amax = std::max(amax, std::fabs(static_cast<double>(x[256 * sb + i])));
    EXPECT_NEAR(d[sb], amax / 127, 1e-6 * amax);
    EXPECT_EQ(dp[sb], d[sb]);
    for (int i = 0; i < 256; ++i) {
      const int64_t k = 256 * sb + i;
      EXPECT_LE(std::abs(q[k]), 127);
      EXPECT_LE(std::fabs(d[sb] * q[k] - x[k]), amax / 254 * (1 + 1e-5)) << k;
      // Slot p of the paired order holds sub-block kPairedNibbleOrder[p].
      const int slot =
          static_cast<int>(std::find(std::begin(quant_internal::kPairedNibbleOrder),
                                     std::end(quant_internal::kPairedNibbleOrder), i / 32) -
                           std::begin(quant_internal::kPairedNibbleOrder));
      EXPECT_EQ(qp[256 * sb + 32 * slot + i % 32], q[k]) << k;
    }
    for (int l = 0; l < 16; ++l) {
      int sum = 0, sum_p = 0;
      for (int i = 0; i < 16; ++i) {
        sum += q[256 * sb + 16 * l + i];
        sum_p += qp[256 * sb + 16 * l + i];
      }
      EXPECT_EQ(bs[16 * sb + l], sum);
      EXPECT_EQ(bsp[16 * sb + l], sum_p);
    }
  }
  EXPECT_EQ(d[2], 0.0f);
}

class MatMulTest : public ::testing::TestWithParam<Case> {};

TEST_P(MatMulTest, MatchesFloat64ProductAtEveryLevel) {
  const Case c = GetParam();
  for (int64_t n_tokens : {1, 3, 7, 64, 70}) {  // 70: past one 64-token cache block
    const Problem p = MakeProblem(c, n_tokens, static_cast<uint32_t>(c.rows * 31 + n_tokens));
    std::vector<std::vector<float>> per_level;
    for (SimdLevel level : SupportedSimdLevels()) {
      const std::vector<float> y = RunMatMul(p, n_tokens, level);
      const int64_t ldy = c.rows + 1;
      for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t r = 0; r < c.rows; ++r) {
          double exact = 0;
          for (int64_t k = 0; k < c.cols; ++k) {
            exact += static_cast<double>(p.w[r * c.cols + k]) * p.x[t * p.ldx + k];
          }
          const Allowance tol = Tolerance(p, c.type, t, r);
          ASSERT_NEAR(y[t * ldy + r], exact, tol.activation_rounding + tol.float_sum)
              << GgmlTypeName(c.type) << " level " << SimdLevelName(level) << " tokens " << n_tokens
              << " t " << t << " r " << r;
        }
      }
      if (IsIntegerType(c.type)) {
        // Tighter: against float64 with the activations as the kernels see them (d * q), only
        // the float allowance remains. The rounding itself is checked in the next test.
        const std::vector<double> xdq = DequantizedActivations(p, n_tokens);
        for (int64_t t = 0; t < n_tokens; ++t) {
          for (int64_t r = 0; r < c.rows; ++r) {
            double exact = 0;
            for (int64_t k = 0; k < c.cols; ++k) {
              exact += static_cast<double>(p.w[r * c.cols + k]) * xdq[t * c.cols + k];
            }
            ASSERT_NEAR(y[t * ldy + r], exact, Tolerance(p, c.type, t, r).float_sum)
                << GgmlTypeName(c.type) << " level " << SimdLevelName(level) << " t " << t << " r "
                << r;
          }
        }
      }
      per_level.push_back(y);
    }
    // Levels share the quantised activations and the exact int32 block sums; they differ only in
    // float summation order, so they must agree within the float allowance alone (for integer
    // types far tighter than the activation-rounding allowance against float64).
    for (size_t l = 1; l < per_level.size(); ++l) {
      for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t r = 0; r < c.rows; ++r) {
          const int64_t i = t * (c.rows + 1) + r;
          ASSERT_NEAR(per_level[l][i], per_level[0][i], Tolerance(p, c.type, t, r).float_sum)
              << GgmlTypeName(c.type) << " level " << l << " t " << t << " r " << r;
        }
      }
    }
  }
}

// matmul.h's batch invariance: a token's y is the same bits whether it is computed alone or with
// others (a decode batch, a prefill chunk), at every level.
TEST_P(MatMulTest, EachTokenOfABatchEqualsTheTokenAlone) {
  const Case c = GetParam();
  for (int64_t n_tokens : {2, 5, 70}) {
    const Problem p = MakeProblem(c, n_tokens, static_cast<uint32_t>(c.rows * 17 + n_tokens));
    const int64_t ldy = c.rows + 1;
    for (SimdLevel level : SupportedSimdLevels()) {
      const std::vector<float> batch = RunMatMul(p, n_tokens, level);
      for (int64_t t = 0; t < n_tokens; ++t) {
        std::vector<float> alone(static_cast<size_t>(ldy), -7.0f);
        ASSERT_TRUE(MatMul(p.m, p.x.data() + t * p.ldx, p.ldx, 1, alone.data(), ldy, level).ok());
        for (int64_t r = 0; r < c.rows; ++r) {
          ASSERT_EQ(batch[t * ldy + r], alone[r])
              << GgmlTypeName(c.type) << " level " << SimdLevelName(level) << " tokens " << n_tokens
              << " t " << t << " r " << r;
        }
      }
    }
  }
}

TEST_P(MatMulTest, GetRowMatchesDequantizeRow) {
  const Case c = GetParam();
  const Problem p = MakeProblem(c, 1, 99);
  std::vector<float> row(static_cast<size_t>(c.cols));
  for (int64_t r : {int64_t{0}, c.rows / 2, c.rows - 1}) {
    ASSERT_TRUE(GetRow(p.m, r, row.data()).ok());
    for (int64_t k = 0; k < c.cols; ++k) ASSERT_EQ(row[k], p.w[r * c.cols + k]);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MatMulTest,
    ::testing::Values(Case{GgmlType::kQ4_0, 37, 576}, Case{GgmlType::kQ4_1, 37, 576},
                      Case{GgmlType::kQ4_1, 5, 96}, Case{GgmlType::kQ4_1, 6, 256},
                      Case{GgmlType::kQ5_0, 37, 576}, Case{GgmlType::kQ5_0, 3, 96},
                      Case{GgmlType::kQ5_1, 37, 576}, Case{GgmlType::kQ5_1, 5, 32},
                      Case{GgmlType::kQ8_0, 37, 576}, Case{GgmlType::kQ8_0, 300, 96},
                      Case{GgmlType::kQ8_0, 6, 256}, Case{GgmlType::kQ4_K, 13, 512},
                      Case{GgmlType::kQ4_K, 37, 1536}, Case{GgmlType::kQ4_K, 3, 256},
                      Case{GgmlType::kQ5_K, 13, 512}, Case{GgmlType::kQ5_K, 37, 1536},
                      Case{GgmlType::kQ6_K, 13, 768}, Case{GgmlType::kQ6_K, 37, 1536},
                      Case{GgmlType::kF32, 37, 576}, Case{GgmlType::kF32, 9, 37},
                      Case{GgmlType::kF16, 37, 576}, Case{GgmlType::kF16, 9, 45},
                      Case{GgmlType::kBF16, 37, 576}, Case{GgmlType::kBF16, 9, 13}),
    [](const auto& info) {
      return std::string(GgmlTypeName(info.param.type)) + "_" + std::to_string(info.param.rows) +
             "x" + std::to_string(info.param.cols);
    });

// Runs a (activations filled in, y and ldy not) over `rows` rows with and without VNNI and expects
// bit-identical outputs.
void ExpectVnniMatchesNonVnni(quant_internal::MatMulArgs a, int64_t rows) {
  std::vector<float> y1(a.n_tokens * rows), y2(a.n_tokens * rows);
  a.ldy = rows;
  a.y = y1.data();
  quant_internal::MatMulRowsAvx512(a, 0, rows, /*use_vnni=*/true);
  a.y = y2.data();
  quant_internal::MatMulRowsAvx512(a, 0, rows, /*use_vnni=*/false);
  for (size_t i = 0; i < y1.size(); ++i)
    ASSERT_EQ(y1[i], y2[i]) << GgmlTypeName(a.type) << " " << i;
}

// The activations of p's first n_tokens tokens in the AVX-512 kernels' layout (matmul_kernels.h).
struct Avx512Activations {
  std::vector<int8_t> q;
  std::vector<float> d, s;
};
Avx512Activations QuantizeForAvx512(const Problem& p, int64_t n_tokens) {
  const int64_t cols = p.m.cols, qs = quant_internal::Avx512QStride(cols),
                ds = quant_internal::Avx512DStride(cols), ss = quant_internal::Avx512SStride(cols);
  Avx512Activations a{std::vector<int8_t>(n_tokens * qs), std::vector<float>(n_tokens * ds),
                      std::vector<float>(n_tokens * ss)};
  for (int64_t t = 0; t < n_tokens; ++t) {
    quant_internal::QuantizeActivationRowAvx512(p.x.data() + t * p.ldx, cols, a.q.data() + t * qs,
                                                a.d.data() + t * ds, a.s.data() + t * ss);
  }
  return a;
}

// VNNI (vpdpbusd) and vpmaddubsw/vpmaddwd paths compute the same exact int32 sums and then do the
// same float operations in the same order, so their outputs must be bit-identical.
TEST(MatMulAvx512Test, VnniAndNonVnniAreBitIdentical) {
  if (DetectedSimdLevel() != SimdLevel::kAvx512 || !CpuHasAvx512Vnni()) {
    GTEST_SKIP() << "needs AVX512-VNNI";
  }
  using quant_internal::kActBlock;
  using quant_internal::kScaleRepeat;
  for (GgmlType type :
       {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0}) {
    // 1 token takes the 4-row decode kernel (Q4_1, Q8_0); 21 rows leave a partial quad.
    for (int64_t n_tokens : {1, 7}) {
      const int64_t cols = 608;  // 19 blocks: exercises the odd-block tail
      const Problem p = MakeProblem(Case{type, 21, cols}, n_tokens, 5);
      const Avx512Activations x = QuantizeForAvx512(p, n_tokens);
      quant_internal::MatMulArgs a;
      a.type = type;
      a.w = p.bytes.data();
      a.row_bytes = GgmlRowBytes(type, cols);
      a.cols = cols;
      a.n_tokens = n_tokens;
      a.xq = x.q.data();
      a.xd = x.d.data();
      a.xs = x.s.data();
      ExpectVnniMatchesNonVnni(a, 21);
    }
  }
}

TEST(MatMulAvx512Test, KQuantVnniAndNonVnniAreBitIdentical) {
  if (DetectedSimdLevel() != SimdLevel::kAvx512 || !CpuHasAvx512Vnni()) {
    GTEST_SKIP() << "needs AVX512-VNNI";
  }
  for (GgmlType type : {GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    for (int64_t n_tokens : {1, 7}) {
      const int64_t cols = 768, rows = 21, nsb = cols / 256;
      const Problem p = MakeProblem(Case{type, rows, cols}, n_tokens, 6);
      std::vector<int8_t> kq(n_tokens * cols);
      std::vector<float> kd(n_tokens * nsb);
      std::vector<int16_t> kbs(n_tokens * cols / 16);
      for (int64_t t = 0; t < n_tokens; ++t) {
        quant_internal::QuantizeActivationRowK(
            p.x.data() + t * p.ldx, cols, quant_internal::KActOrderFor(type, /*avx512=*/true),
            kq.data() + t * cols, kd.data() + t * nsb, kbs.data() + t * cols / 16);
      }
      quant_internal::MatMulArgs a;
      a.type = type;
      a.w = p.bytes.data();
      a.row_bytes = GgmlRowBytes(type, cols);
      a.cols = cols;
      a.n_tokens = n_tokens;
      a.kq = kq.data();
      a.kd = kd.data();
      a.kbs = kbs.data();
      ExpectVnniMatchesNonVnni(a, rows);
    }
  }
}

// The AVX-512 layout must hold exactly the values of the reference quantisation.
TEST(MatMulAvx512Test, QuantizationMatchesReference) {
  if (DetectedSimdLevel() != SimdLevel::kAvx512) GTEST_SKIP() << "needs AVX-512";
  using quant_internal::kScaleRepeat;
  for (int64_t cols : {32, 64, 96, 128, 576, 608, 1536}) {
    std::mt19937 rng(static_cast<uint32_t>(cols));
    std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
    std::vector<float> x(cols);
    for (float& v : x) v = dist(rng);
    for (int64_t k = 0; k < std::min<int64_t>(cols, 32); ++k) x[k] = 0.0f;  // all-zero block
    // Exact halves exercise round-half-to-even.
    if (cols >= 64) x[32] = 127.0f, x[33] = 0.5f, x[34] = 1.5f, x[35] = -2.5f;
    const int64_t nb = cols / 32;
    std::vector<int8_t> q(cols), q2(quant_internal::Avx512QStride(cols));
    std::vector<float> d(nb * kScaleRepeat), s(nb), d2(quant_internal::Avx512DStride(cols)),
        s2(quant_internal::Avx512SStride(cols));
    quant_internal::QuantizeActivationRow(x.data(), cols, q.data(), d.data(), s.data());
    quant_internal::QuantizeActivationRowAvx512(x.data(), cols, q2.data(), d2.data(), s2.data());
    for (int64_t b = 0; b < nb; ++b) {
      ASSERT_EQ(d2[4 * b], d[b * kScaleRepeat]) << cols << " " << b;
      ASSERT_EQ(s2[b], s[b]) << cols << " " << b;
      for (int64_t i = 0; i < 32; ++i) {
        ASSERT_EQ(q2[(b / 4) * 128 + (i / 16) * 64 + (b % 4) * 16 + i % 16], q[b * 32 + i])
            << cols << " " << b << " " << i;
      }
    }
  }
}

// The 16-row interleaved Q4_K layout (interleave.h) and its AVX-512 kernel.
Problem Rows16Copy(const Problem& p) {
  Problem q = p;
  EXPECT_TRUE(Interleave(q.m.type, q.bytes.data(), q.m.rows, q.m.cols).ok());
  q.m.data = q.bytes.data();
  q.m.layout = WeightLayout::kRows16;
  return q;
}

TEST(MatMulRows16Test, InterleavingIsLosslessAndInPlace) {
  for (const Case& c : {Case{GgmlType::kQ4_K, 16, 256}, Case{GgmlType::kQ4_K, 48, 1536},
                        Case{GgmlType::kQ6_K, 16, 256}, Case{GgmlType::kQ6_K, 48, 1536},
                        Case{GgmlType::kQ4_1, 16, 32}, Case{GgmlType::kQ4_1, 48, 576},
                        Case{GgmlType::kQ8_0, 16, 32}, Case{GgmlType::kQ8_0, 48, 576}}) {
    const Problem p = MakeProblem(c, 1, 5);
    const Problem q = Rows16Copy(p);
    ASSERT_EQ(q.bytes.size(), p.bytes.size());
    EXPECT_NE(q.bytes, p.bytes);
    const int64_t row_bytes = GgmlRowBytes(c.type, c.cols);
    std::vector<uint8_t> row(static_cast<size_t>(row_bytes));
    for (int64_t r = 0; r < c.rows; ++r) {
      DeinterleaveRow(c.type, q.bytes.data(), c.cols, r, row.data());
      ASSERT_TRUE(std::equal(row.begin(), row.end(), p.bytes.begin() + r * row_bytes)) << r;
    }
  }
}

TEST(MatMulRows16Test, MatchesFloat64TheRowMajorKernelAndIsBatchInvariant) {
  if (DetectedSimdLevel() != SimdLevel::kAvx512) GTEST_SKIP() << "needs AVX-512";
  for (const Case& c : {Case{GgmlType::kQ4_K, 272, 1536}, Case{GgmlType::kQ6_K, 272, 1536},
                        Case{GgmlType::kQ4_1, 272, 1536}, Case{GgmlType::kQ4_1, 48, 96},
                        Case{GgmlType::kQ8_0, 272, 1536}, Case{GgmlType::kQ8_0, 48, 96}})
    for (int64_t n_tokens : {1, 3, 7, 64, 70}) {  // 17 groups: split unevenly over threads
      const Problem p = MakeProblem(c, n_tokens, static_cast<uint32_t>(n_tokens + 900));
      const Problem q = Rows16Copy(p);
      const std::vector<float> y = RunMatMul(q, n_tokens, SimdLevel::kAvx512);
      const std::vector<float> y_rows = RunMatMul(p, n_tokens, SimdLevel::kAvx512);
      const std::vector<double> xdq = DequantizedActivations(p, n_tokens);
      const int64_t ldy = c.rows + 1;
      for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t r = 0; r < c.rows; ++r) {
          double exact = 0, exact_dq = 0;
          for (int64_t k = 0; k < c.cols; ++k) {
            exact += static_cast<double>(p.w[r * c.cols + k]) * p.x[t * p.ldx + k];
            exact_dq += static_cast<double>(p.w[r * c.cols + k]) * xdq[t * c.cols + k];
          }
          const Allowance tol = Tolerance(p, c.type, t, r);
          ASSERT_NEAR(y[t * ldy + r], exact, tol.activation_rounding + tol.float_sum)
              << GgmlTypeName(c.type) << " " << t << " " << r;
          ASSERT_NEAR(y[t * ldy + r], exact_dq, tol.float_sum)
              << GgmlTypeName(c.type) << " " << t << " " << r;
          ASSERT_NEAR(y[t * ldy + r], y_rows[t * ldy + r], tol.float_sum)
              << GgmlTypeName(c.type) << " " << t << " " << r;
        }
      }
      for (int64_t t = 0; t < n_tokens; t += 5) {
        std::vector<float> alone(static_cast<size_t>(ldy));
        ASSERT_TRUE(
            MatMul(q.m, q.x.data() + t * q.ldx, q.ldx, 1, alone.data(), ldy, SimdLevel::kAvx512)
                .ok());
        for (int64_t r = 0; r < c.rows; ++r) {
          ASSERT_EQ(y[t * ldy + r], alone[r]) << GgmlTypeName(c.type) << " " << t << " " << r;
        }
      }
    }
}

// y of an interleaved matrix straight from its AVX-512 kernel (KQuantRows16Avx512 or
// Block32Rows16Avx512), with or without VNNI, the activations quantised as MatMul would.
std::vector<float> Rows16KernelOutput(const Problem& q, int64_t n_tokens, bool vnni) {
  const int64_t rows = q.m.rows, cols = q.m.cols;
  quant_internal::MatMulArgs a;
  a.type = q.m.type;
  a.w = q.bytes.data();
  a.row_bytes = GgmlRowBytes(a.type, cols);
  a.cols = cols;
  a.n_tokens = n_tokens;
  a.ldy = rows;
  std::vector<float> y(n_tokens * rows);
  a.y = y.data();
  if (quant_internal::IsKQuant(a.type)) {
    const int64_t nsb = cols / 256;
    std::vector<int8_t> kq(n_tokens * cols);
    std::vector<float> kd(n_tokens * nsb);
    std::vector<int16_t> kbs(n_tokens * cols / 16);
    for (int64_t t = 0; t < n_tokens; ++t) {
      quant_internal::QuantizeActivationRowK(
          q.x.data() + t * q.ldx, cols, quant_internal::KActOrder::kNatural, kq.data() + t * cols,
          kd.data() + t * nsb, kbs.data() + t * cols / 16);
    }
    a.kq = kq.data();
    a.kd = kd.data();
    a.kbs = kbs.data();
    quant_internal::KQuantRows16Avx512(a, 0, rows, vnni);
  } else {
    const Avx512Activations x = QuantizeForAvx512(q, n_tokens);
    a.xq = x.q.data();
    a.xd = x.d.data();
    a.xs = x.s.data();
    quant_internal::Block32Rows16Avx512(a, 0, rows, vnni);
  }
  return y;
}

TEST(MatMulRows16Test, VnniAndNonVnniAreBitIdentical) {
  if (DetectedSimdLevel() != SimdLevel::kAvx512 || !CpuHasAvx512Vnni()) {
    GTEST_SKIP() << "needs AVX512-VNNI";
  }
  const int64_t n_tokens = 6;
  // Q4_1 / Q8_0 at 7 blocks: the last activation group is padded.
  for (const Case& c : {Case{GgmlType::kQ4_K, 32, 768}, Case{GgmlType::kQ6_K, 32, 768},
                        Case{GgmlType::kQ4_1, 32, 224}, Case{GgmlType::kQ8_0, 32, 224}}) {
    const Problem q = Rows16Copy(MakeProblem(c, n_tokens, 8));
    const std::vector<float> y1 = Rows16KernelOutput(q, n_tokens, /*vnni=*/true);
    const std::vector<float> y2 = Rows16KernelOutput(q, n_tokens, /*vnni=*/false);
    for (size_t i = 0; i < y1.size(); ++i)
      ASSERT_EQ(y1[i], y2[i]) << GgmlTypeName(c.type) << " " << i;
  }
}

TEST(MatMulRows16Test, GetRowAndFloatActivationsReadTheLayout) {
  for (const Case& c : {Case{GgmlType::kQ4_K, 32, 512}, Case{GgmlType::kQ6_K, 32, 512},
                        Case{GgmlType::kQ4_1, 32, 160}, Case{GgmlType::kQ8_0, 32, 160}}) {
    const Problem p = MakeProblem(c, 3, 77);
    const Problem q = Rows16Copy(p);
    std::vector<float> row(static_cast<size_t>(c.cols));
    for (int64_t r : {0, 15, 16, 31}) {
      ASSERT_TRUE(GetRow(q.m, r, row.data()).ok());
      for (int64_t k = 0; k < c.cols; ++k) ASSERT_EQ(row[k], p.w[r * c.cols + k]) << r << " " << k;
    }
    std::vector<float> y_rows(3 * c.rows), y_16(3 * c.rows);
    ASSERT_TRUE(
        MatMulFloatActivations(p.m, p.x.data(), p.ldx, 3, y_rows.data(), c.rows, SimdLevel::kScalar)
            .ok());
    ASSERT_TRUE(
        MatMulFloatActivations(q.m, q.x.data(), q.ldx, 3, y_16.data(), c.rows, SimdLevel::kScalar)
            .ok());
    EXPECT_EQ(y_rows, y_16);
  }
}

TEST(MatMulRows16Test, RejectsOtherLevelsTypesAndShapes) {
  const Problem q = Rows16Copy(MakeProblem(Case{GgmlType::kQ4_K, 16, 256}, 1, 3));
  std::vector<float> y(16);
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2}) {
    const absl::Status s = MatMul(q.m, q.x.data(), q.ldx, 1, y.data(), 16, level);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("AVX-512"), std::string::npos) << s.message();
  }
  QuantMatrix odd = q.m;
  odd.rows = 8;  // not a whole group
  EXPECT_EQ(MatMul(odd, q.x.data(), q.ldx, 1, y.data(), 16).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<uint8_t> bytes(4096);
  EXPECT_EQ(Interleave(GgmlType::kQ5_K, bytes.data(), 16, 256).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Interleave(GgmlType::kQ4_K, bytes.data(), 15, 256).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Interleave(GgmlType::kQ4_1, bytes.data(), 16, 48).code(),  // not whole blocks
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Interleave(GgmlType::kQ8_0, bytes.data(), 16, 40).code(),  // not whole blocks
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Interleave(GgmlType::kQ4_0, bytes.data(), 16, 32).code(),
            absl::StatusCode::kInvalidArgument);
  QuantMatrix wrong_type{GgmlType::kQ5_K, bytes.data(), 16, 256, WeightLayout::kRows16};
  float row[256];
  EXPECT_EQ(GetRow(wrong_type, 0, row).code(), absl::StatusCode::kInvalidArgument);
}

TEST(MatMulBadInputTest, ReturnsInvalidArgument) {
  std::vector<uint8_t> data(4096);
  std::vector<float> x(1024), y(1024);
  auto code = [&](QuantMatrix m, int64_t ldx, int64_t n, int64_t ldy) {
    return MatMul(m, x.data(), ldx, n, y.data(), ldy).code();
  };
  EXPECT_EQ(code({GgmlType::kQ2_K, data.data(), 2, 256}, 256, 1, 2),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({GgmlType::kQ4_0, data.data(), 2, 33}, 33, 1, 2),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({GgmlType::kQ4_K, data.data(), 2, 32}, 32, 1, 2),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({static_cast<GgmlType>(4), data.data(), 2, 32}, 32, 1, 2),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({GgmlType::kQ8_0, data.data(), 2, 64}, 32, 1, 2),  // ldx < cols
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({GgmlType::kQ8_0, data.data(), 2, 64}, 64, -1, 2),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({GgmlType::kQ8_0, data.data(), 4, 64}, 64, 1, 2),  // ldy < rows
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({GgmlType::kQ8_0, nullptr, 2, 64}, 64, 1, 2), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MatMul({GgmlType::kQ8_0, data.data(), 2, 64}, x.data(), 64, 0, y.data(), 2).ok());
  float row[64];
  EXPECT_EQ(GetRow({GgmlType::kQ8_0, data.data(), 2, 64}, 2, row).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetRow({GgmlType::kQ2_K, data.data(), 2, 256}, 0, row).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace magicpig
