#include "gpu_node/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace magicpig::engine {
namespace {

TEST(SamplerTest, GreedyPicksArgmaxLowestIdOnTies) {
  Sampler s(SamplingParams{});
  EXPECT_EQ(s.Sample(std::vector<float>{0.1f, 3.0f, -1.0f, 3.0f}), 1);
  EXPECT_EQ(Argmax(std::vector<float>{-5.0f}), 0);
  // Against the one-pass scan on random vectors with ties, NaNs, infinities and signed zeros.
  std::mt19937 rng(3);
  const float specials[] = {std::nanf(""), INFINITY, -INFINITY, 0.0f, -0.0f, 2.5f};
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<float> v(1 + rng() % 300);
    for (float& x : v) {
      x = rng() % 4 == 0 ? specials[rng() % 6]
                         : static_cast<float>(static_cast<int>(rng() % 7) - 3);
    }
    int32_t expected = 0;
    for (size_t i = 1; i < v.size(); ++i) {
      if (v[i] > v[expected]) expected = static_cast<int32_t>(i);
    }
    ASSERT_EQ(Argmax(v), expected) << "trial " << trial;
  }
}

// Monte Carlo: empirical frequencies match the exact truncated, tempered softmax computed here in
// double precision, within 5 standard errors per candidate.
void ExpectDistribution(const SamplingParams& p, const std::vector<float>& logits,
                        const std::vector<double>& expected) {
  Sampler s(p);
  const int draws = 200000;
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < draws; ++i) counts[s.Sample(logits)]++;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double f = static_cast<double>(counts[i]) / draws;
    const double se = std::sqrt(std::max(expected[i] * (1 - expected[i]), 1e-12) / draws);
    EXPECT_NEAR(f, expected[i], 5 * se + 1e-9) << "token " << i;
  }
}

std::vector<double> Softmax(const std::vector<float>& logits, double temperature,
                            const std::vector<bool>& keep) {
  std::vector<double> p(logits.size(), 0.0);
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (keep[i]) sum += p[i] = std::exp(logits[i] / temperature);
  }
  for (double& x : p) x /= sum;
  return p;
}

TEST(SamplerTest, TemperatureMatchesSoftmax) {
  std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f};
  SamplingParams p;
  p.temperature = 0.7f;
  p.seed = 42;
  ExpectDistribution(p, logits, Softmax(logits, 0.7, std::vector<bool>(5, true)));
}

TEST(SamplerTest, TopKKeepsOnlyKLargest) {
  std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 2;
  p.seed = 7;
  ExpectDistribution(p, logits, Softmax(logits, 1.0, {false, true, false, false, true}));
}

TEST(SamplerTest, TopPKeepsSmallestPrefixReachingMass) {
  std::vector<float> logits = {2.0f, 1.0f, 0.0f, -1.0f};
  // Probabilities at T=1: 0.6439, 0.2369, 0.0871, 0.0321. top_p 0.85 keeps the first two (0.8808).
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.85f;
  p.seed = 3;
  ExpectDistribution(p, logits, Softmax(logits, 1.0, {true, true, false, false}));
}

// A vocabulary-sized case: the top-p prefix spans several of the sampler's sorting rounds (it sorts
// 64 candidates, then 512, ...), with and without top_k, and the full distribution (drawn in id
// order). Expected: the exact truncated softmax from a full sort here.
std::vector<double> Nucleus(const std::vector<float>& logits, double temperature, int top_k,
                            double top_p) {
  std::vector<int> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>(i);
  std::sort(ids.begin(), ids.end(), [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  if (top_k > 0) ids.resize(static_cast<size_t>(top_k));
  double total = 0;
  for (int id : ids) total += std::exp(logits[id] / temperature);
  std::vector<bool> keep(logits.size(), false);
  double mass = 0;
  for (int id : ids) {
    keep[id] = true;
    mass += std::exp(logits[id] / temperature) / total;
    if (mass >= top_p) break;
  }
  return Softmax(logits, temperature, keep);
}

TEST(SamplerTest, LargeVocabularyTopPTopKAndFull) {
  std::vector<float> logits(600);
  for (size_t i = 0; i < logits.size(); ++i) {
    logits[i] = 2.0f * std::sin(0.37f * static_cast<float>(i)) - 0.001f * static_cast<float>(i);
  }
  struct Case {
    int top_k;
    float top_p;
  };
  for (const Case& c : {Case{0, 0.95f}, Case{300, 0.9f}, Case{0, 1.0f}}) {
    SamplingParams p;
    p.temperature = 0.8f;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.seed = 99;
    const std::vector<double> want = Nucleus(logits, 0.8, c.top_k, c.top_p);
    int support = 0;
    for (double w : want) support += w > 0 ? 1 : 0;
    if (c.top_p < 1.0f) {
      EXPECT_GT(support, 64) << "the prefix must need more than the first sorting round";
    }
    ExpectDistribution(p, logits, want);
  }
}

TEST(SamplerTest, SameSeedSameSequence) {
  std::vector<float> logits = {0.0f, 0.1f, 0.2f, 0.3f, 0.4f, 0.5f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 1234;
  Sampler a(p), b(p);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.Sample(logits), b.Sample(logits));
}

TEST(SamplerTest, ValidationNamesTheField) {
  SamplingParams p;
  p.temperature = -1;
  EXPECT_NE(ValidateSamplingParams(p).message().find("temperature"), std::string::npos);
  p = SamplingParams{};
  p.top_p = 0;
  EXPECT_NE(ValidateSamplingParams(p).message().find("top_p"), std::string::npos);
  p = SamplingParams{};
  p.top_k = -2;
  EXPECT_NE(ValidateSamplingParams(p).message().find("top_k"), std::string::npos);
  EXPECT_TRUE(ValidateSamplingParams(SamplingParams{}).ok());
}

}  // namespace
}  // namespace magicpig::engine
