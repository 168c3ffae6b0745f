// Tests for MergePartials: merging parts equals one softmax over the union (float64 reference),
// empty parts (lse = -inf, with o = 0 or o empty), all-empty and no parts, extreme lse gaps.
#include "common/attention/partial_attention.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace magicpig::attention {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Exact part over logits x[begin, end) with values v ([n][d]), in float64.
PartialAttention ExactPart(const std::vector<double>& x, const std::vector<double>& v, int d,
                           int begin, int end) {
  PartialAttention p;
  p.o.assign(d, 0.0f);
  p.n_touched = end - begin;
  if (begin == end) return p;
  double m = -INFINITY;
  for (int i = begin; i < end; ++i) m = std::max(m, x[i]);
  double z = 0;
  for (int i = begin; i < end; ++i) z += std::exp(x[i] - m);
  std::vector<double> o(d, 0.0);
  for (int i = begin; i < end; ++i) {
    for (int t = 0; t < d; ++t) o[t] += std::exp(x[i] - m) / z * v[i * d + t];
  }
  for (int t = 0; t < d; ++t) p.o[t] = static_cast<float>(o[t]);
  p.lse = static_cast<float>(m + std::log(z));
  return p;
}

void ExpectClose(const PartialAttention& got, const PartialAttention& want, double tol) {
  ASSERT_EQ(got.o.size(), want.o.size());
  double scale = 0;
  for (float x : want.o) scale = std::max(scale, std::fabs(static_cast<double>(x)));
  for (size_t t = 0; t < want.o.size(); ++t) {
    EXPECT_NEAR(got.o[t], want.o[t], tol * std::max(scale, 1e-30)) << "t=" << t;
  }
  EXPECT_NEAR(got.lse, want.lse, tol * std::max(1.0, std::fabs(static_cast<double>(want.lse))));
  EXPECT_EQ(got.n_touched, want.n_touched);
}

TEST(PartialAttentionTest, MergeOfSplitsEqualsWhole) {
  std::mt19937 rng(3);
  std::normal_distribution<double> nd(0.0, 1.0);
  const int n = 200, d = 16;
  std::vector<double> x(n), v(n * d);
  for (auto& e : x) e = 4.0 * nd(rng);
  for (auto& e : v) e = nd(rng);
  const PartialAttention whole = ExactPart(x, v, d, 0, n);
  for (int parts = 1; parts <= 8; ++parts) {
    std::vector<PartialAttention> ps;
    for (int p = 0; p < parts; ++p)
      ps.push_back(ExactPart(x, v, d, p * n / parts, (p + 1) * n / parts));
    ExpectClose(MergePartials(ps), whole, 1e-6);
  }
}

TEST(PartialAttentionTest, EmptyPartsContributeNothing) {
  std::mt19937 rng(5);
  std::normal_distribution<double> nd(0.0, 1.0);
  const int n = 50, d = 8;
  std::vector<double> x(n), v(n * d);
  for (auto& e : x) e = nd(rng);
  for (auto& e : v) e = nd(rng);
  const PartialAttention whole = ExactPart(x, v, d, 0, n);
  PartialAttention empty_sized = EmptyPartial(d);
  EXPECT_TRUE(empty_sized.empty());
  EXPECT_EQ(empty_sized.lse, kNegInf);
  PartialAttention empty_unsized;  // o empty, lse = -inf
  std::vector<PartialAttention> ps = {empty_sized,
                                      ExactPart(x, v, d, 0, 20),
                                      empty_unsized,
                                      ExactPart(x, v, d, 20, 20),
                                      ExactPart(x, v, d, 20, n),
                                      empty_sized};
  ExpectClose(MergePartials(ps), whole, 1e-6);
}

TEST(PartialAttentionTest, AllEmptyAndNoParts) {
  std::vector<PartialAttention> ps = {EmptyPartial(4), EmptyPartial(4), PartialAttention{}};
  ps[1].n_touched = 0;
  const PartialAttention m = MergePartials(ps);
  EXPECT_EQ(m.lse, kNegInf);
  ASSERT_EQ(m.o.size(), 4u);
  for (float x : m.o) EXPECT_EQ(x, 0.0f);
  EXPECT_EQ(m.n_touched, 0);

  const PartialAttention none = MergePartials({});
  EXPECT_EQ(none.lse, kNegInf);
  EXPECT_TRUE(none.o.empty());
  EXPECT_EQ(none.n_touched, 0);
}

TEST(PartialAttentionTest, SinglePartIsIdentity) {
  PartialAttention p;
  p.o = {1.5f, -2.0f, 0.25f};
  p.lse = 3.75f;
  p.n_touched = 7;
  const PartialAttention m = MergePartials(std::vector<PartialAttention>{p});
  EXPECT_EQ(m.o, p.o);
  EXPECT_FLOAT_EQ(m.lse, p.lse);
  EXPECT_EQ(m.n_touched, 7);
}

TEST(PartialAttentionTest, ExtremeLseGapNoOverflow) {
  PartialAttention a{{1.0f, 0.0f}, 1000.0f, 1};
  PartialAttention b{{0.0f, 1.0f}, -1000.0f, 1};
  const PartialAttention m = MergePartials(std::vector<PartialAttention>{a, b});
  EXPECT_FLOAT_EQ(m.lse, 1000.0f);
  EXPECT_FLOAT_EQ(m.o[0], 1.0f);
  EXPECT_EQ(m.o[1], 0.0f);
  EXPECT_EQ(m.n_touched, 2);
  // Equal lse: equal weights, lse + ln 2.
  PartialAttention c{{1.0f, 0.0f}, 500.0f, 1};
  PartialAttention e{{0.0f, 1.0f}, 500.0f, 1};
  const PartialAttention m2 = MergePartials(std::vector<PartialAttention>{c, e});
  EXPECT_NEAR(m2.lse, 500.0 + std::log(2.0), 1e-4);
  EXPECT_FLOAT_EQ(m2.o[0], 0.5f);
  EXPECT_FLOAT_EQ(m2.o[1], 0.5f);
}

}  // namespace
}  // namespace magicpig::attention
