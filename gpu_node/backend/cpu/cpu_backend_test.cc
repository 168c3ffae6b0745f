#include "gpu_node/backend/cpu/cpu_backend.h"

#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "common/half.h"
#include "gtest/gtest.h"
#include "tests/testing/attention_reference.h"

namespace magicpig::backend {
namespace {

std::vector<float> Random(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

struct AttentionCase {
  int64_t n_head, n_head_kv, head_dim, first_pos, n_tokens;
};

class AttentionTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(AttentionTest, MatchesFloat64AtEverySimdLevel) {
  const AttentionCase c = GetParam();
  const int64_t rows = c.first_pos + c.n_tokens, kv_row = c.n_head_kv * c.head_dim;
  // Scale 2 makes some softmaxes peaked, so the online max-rescaling path is exercised.
  std::vector<float> kf = Random(rows * kv_row, 1, 2.0f), vf = Random(rows * kv_row, 2);
  std::vector<float> q = Random(c.n_tokens * c.n_head * c.head_dim, 3, 2.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  for (SimdLevel level : SupportedSimdLevels()) {
    CpuBackend backend(2, level);
    std::vector<uint16_t> k(rows * kv_row), v(rows * kv_row);
    KvLayerView view{k.data(), v.data(), rows, c.n_head_kv, c.head_dim};
    std::vector<float> out(q.size(), NAN);
    ASSERT_TRUE(backend
                    .Execute([&] {
                      // Fill the prefix as earlier calls would have, then this call's rows.
                      backend.StoreKv(kf.data(), vf.data(), rows, 0, view);
                      backend.CausalAttention(q.data(), c.n_tokens, c.first_pos, c.n_head, scale,
                                              view, out.data());
                      return absl::OkStatus();
                    })
                    .ok());
    for (int64_t i = 0; i < rows * kv_row; ++i) {
      ASSERT_EQ(k[i], FloatToFp16(kf[i]));
      ASSERT_EQ(v[i], FloatToFp16(vf[i]));
    }
    const std::vector<double> expected =
        testing::CausalAttentionReference(q.data(), c.n_tokens, c.first_pos, c.n_head, scale,
                                          testing::Fp16Cache{&k, &v, c.n_head_kv, c.head_dim});
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_NEAR(out[i], expected[i], 2e-5 + 2e-5 * std::fabs(expected[i]))
          << "level " << SimdLevelName(level) << " index " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionTest,
    ::testing::Values(
        AttentionCase{9, 3, 64, 0, 1},     // first token
        AttentionCase{9, 3, 64, 0, 70},    // prefill: several query and key tiles
        AttentionCase{9, 3, 64, 200, 1},   // decode at depth
        AttentionCase{9, 3, 64, 1500, 1},  // decode split into key segments
        // Decode steps whose value pass runs register blocks of 1-4 rows x 1-4 vectors (and
        // head_dim 128 as two blocks of 4 vectors); depths that end in a partial key tile.
        AttentionCase{4, 4, 64, 33, 1},     // group 1, head_dim 64
        AttentionCase{2, 1, 64, 40, 1},     // group 2
        AttentionCase{8, 2, 64, 300, 1},    // group 4
        AttentionCase{4, 4, 128, 77, 1},    // group 1, head_dim 128
        AttentionCase{4, 2, 128, 95, 1},    // group 2, head_dim 128
        AttentionCase{32, 8, 128, 70, 1},   // group 4, head_dim 128
        AttentionCase{4, 2, 32, 50, 1},     // group 2, head_dim 32
        AttentionCase{4, 2, 128, 1300, 5},  // a few tokens, key segments
        AttentionCase{4, 4, 128, 31, 33},   // MHA, chunk straddling a key tile
        AttentionCase{8, 1, 16, 5, 17},     // MQA, smallest head_dim
        AttentionCase{2, 2, 256, 64, 3},    // largest head_dim
        // Wide tiles (16+ query rows): padded row vectors, rows before the diagonal skipped.
        AttentionCase{9, 3, 64, 1500, 16},   // one query tile, key segments
        AttentionCase{32, 8, 128, 100, 40},  // Llama-style group of 4
        AttentionCase{6, 2, 48, 37, 21},     // head_dim 48, tiles off the diagonal
        AttentionCase{2, 2, 64, 0, 130},     // MHA, 16 rows per tile
        AttentionCase{16, 1, 32, 3, 33}));   // MQA, 256 rows per tile

// RangeAttention over disjoint ranges vs float64 softmax over exactly those keys (and its lse).
TEST(CpuBackendTest, RangeAttentionMatchesFloat64OverTheRanges) {
  const int64_t n_head = 6, n_kv = 2, hd = 64, rows = 700, kv_row = n_kv * hd;
  const std::vector<float> kf = Random(rows * kv_row, 4, 2.0f), vf = Random(rows * kv_row, 5);
  const std::vector<float> q = Random(n_head * hd, 6, 2.0f);
  const float scale = 0.125f;
  const std::vector<std::vector<std::pair<int64_t, int64_t>>> cases = {
      {{0, 4}, {613, 700}}, {{0, 4}, {37, 38}, {100, 699}}, {{5, 5}}, {{0, 1}}};
  for (SimdLevel level : SupportedSimdLevels()) {
    CpuBackend backend(2, level);
    std::vector<uint16_t> k(rows * kv_row), v(rows * kv_row);
    KvLayerView view{k.data(), v.data(), rows, n_kv, hd};
    for (const auto& ranges : cases) {
      std::vector<float> out(n_head * hd, NAN), lse(n_head, NAN);
      ASSERT_TRUE(backend
                      .Execute([&] {
                        backend.StoreKv(kf.data(), vf.data(), rows, 0, view);
                        backend.RangeAttention(q.data(), n_head, scale, view, ranges, out.data(),
                                               lse.data());
                        return absl::OkStatus();
                      })
                      .ok());
      const testing::ReferenceAttention ref = testing::RangeAttentionReference(
          q.data(), n_head, scale, testing::Fp16Cache{&k, &v, n_kv, hd}, ranges);
      for (int64_t h = 0; h < n_head; ++h) {
        if (std::isinf(ref.lse[h])) {  // no key: o = 0, lse = -inf
          EXPECT_EQ(lse[h], -INFINITY) << SimdLevelName(level);
          for (int64_t d = 0; d < hd; ++d) EXPECT_EQ(out[h * hd + d], 0.0f);
          continue;
        }
        EXPECT_NEAR(lse[h], ref.lse[h], 1e-4 * (1 + std::fabs(ref.lse[h]))) << SimdLevelName(level);
        for (int64_t d = 0; d < hd; ++d) {
          const double o = ref.o[h * hd + d];
          ASSERT_NEAR(out[h * hd + d], o, 2e-5 + 2e-5 * std::fabs(o)) << SimdLevelName(level);
        }
      }
    }
  }
}

// A view with a gap (positions dropped from the cache): StoreKv and RangeAttention address
// positions, and give exactly what the whole cache gives.
TEST(CpuBackendTest, GappedViewMatchesTheWholeCache) {
  const int64_t n_head = 4, n_kv = 2, hd = 32, rows = 300, kv_row = n_kv * hd;
  const int64_t gap_begin = 4, gap_end = 250;
  const std::vector<float> kf = Random(rows * kv_row, 7, 2.0f), vf = Random(rows * kv_row, 8);
  const std::vector<float> q = Random(n_head * hd, 9, 2.0f);
  CpuBackend backend(2);
  std::vector<uint16_t> k(rows * kv_row), v(rows * kv_row);
  const KvLayerView whole{k.data(), v.data(), rows, n_kv, hd};
  const int64_t kept = rows - (gap_end - gap_begin);
  std::vector<uint16_t> ck(kept * kv_row), cv(kept * kv_row);
  KvLayerView gapped{ck.data(), cv.data(), kept, n_kv, hd};
  gapped.gap_begin = gap_begin;
  gapped.gap_end = gap_end;
  EXPECT_EQ(gapped.Row(3), 3);
  EXPECT_EQ(gapped.Row(250), 4);
  EXPECT_EQ(gapped.Row(299), 53);
  const std::pair<int64_t, int64_t> across[1] = {{2, 260}};
  EXPECT_EQ(RangesAsRows(gapped, across),
            (std::vector<std::pair<int64_t, int64_t>>{{2, 4}, {4, 14}}));
  const std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 4}, {270, 300}};
  std::vector<float> o1(n_head * hd), l1(n_head), o2(n_head * hd), l2(n_head);
  ASSERT_TRUE(
      backend
          .Execute([&] {
            backend.StoreKv(kf.data(), vf.data(), rows, 0, whole);
            // The gapped cache is filled in two stores on either side of the gap.
            backend.StoreKv(kf.data(), vf.data(), gap_begin, 0, gapped);
            backend.StoreKv(kf.data() + gap_end * kv_row, vf.data() + gap_end * kv_row,
                            rows - gap_end, gap_end, gapped);
            backend.RangeAttention(q.data(), n_head, 0.2f, whole, ranges, o1.data(), l1.data());
            backend.RangeAttention(q.data(), n_head, 0.2f, gapped, ranges, o2.data(), l2.data());
            return absl::OkStatus();
          })
          .ok());
  EXPECT_EQ(o1, o2);
  EXPECT_EQ(l1, l2);
}

TEST(CpuBackendTest, RopePairings) {
  // One head of 8 dims, n_rot 6 (the last two dims are not rotated), position 3, base 100.
  const int32_t pos = 3;
  for (RopePairing pairing : {RopePairing::kAdjacent, RopePairing::kHalfOffset}) {
    std::vector<float> x = Random(8, 9);
    std::vector<float> y = x;
    CpuBackend backend(1);
    backend.Rope(y.data(), 1, 1, 8, &pos, RopeParams{pairing, 6, 100.0});
    for (int i = 0; i < 3; ++i) {
      const double theta = pos * std::pow(100.0, -2.0 * i / 6);
      const int a = pairing == RopePairing::kAdjacent ? 2 * i : i;
      const int b = pairing == RopePairing::kAdjacent ? 2 * i + 1 : i + 3;
      EXPECT_NEAR(y[a], x[a] * std::cos(theta) - x[b] * std::sin(theta), 1e-6);
      EXPECT_NEAR(y[b], x[a] * std::sin(theta) + x[b] * std::cos(theta), 1e-6);
    }
    EXPECT_EQ(y[6], x[6]);
    EXPECT_EQ(y[7], x[7]);
  }
}

TEST(CpuBackendTest, RmsNormAndSwiGlu) {
  CpuBackend backend(1);
  std::vector<float> x = {1, -2, 3, -4, 0.5f, 0.25f}, w = {1, 2, 3}, out(6);
  backend.RmsNorm(x.data(), w.data(), 2, 3, 1e-5f, out.data());
  for (int t = 0; t < 2; ++t) {
    double ms = 0;
    for (int i = 0; i < 3; ++i) ms += x[t * 3 + i] * x[t * 3 + i] / 3.0;
    for (int i = 0; i < 3; ++i) {
      EXPECT_NEAR(out[t * 3 + i], x[t * 3 + i] / std::sqrt(ms + 1e-5) * w[i], 1e-6);
    }
  }
  std::vector<float> g = {-30, -1, 0, 2, 30}, u = {1, 2, 3, 4, 5}, s(5);
  backend.SwiGlu(g.data(), u.data(), 5, s.data());
  for (int i = 0; i < 5; ++i) {
    EXPECT_NEAR(s[i], g[i] / (1 + std::exp(-static_cast<double>(g[i]))) * u[i], 1e-5);
  }
}

TEST(CpuBackendTest, EmbedRejectsOutOfVocabularyIds) {
  CpuBackend backend(1);
  std::vector<float> table = Random(4 * 32, 5), out(32);
  QuantMatrix m{GgmlType::kF32, table.data(), 4, 32};
  const int32_t bad[1] = {4};
  EXPECT_EQ(backend.Embed(m, bad, out.data()).code(), absl::StatusCode::kInvalidArgument);
  const int32_t good[1] = {2};
  ASSERT_TRUE(backend.Embed(m, good, out.data()).ok());
  for (int i = 0; i < 32; ++i) EXPECT_EQ(out[i], table[2 * 32 + i]);
}

}  // namespace
}  // namespace magicpig::backend
