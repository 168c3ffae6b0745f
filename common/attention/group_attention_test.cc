// Tests for the fast path (Estimator::AttendGroup on the SIMD group kernel) at every SIMD level
// this CPU supports, against the scalar float64 reference (Estimator::Attend): full attention, the
// MagicPIG estimator (exact sample sets, interpolated correction), top-k and oracle sampling on
// the kernel's logits, the union-of-samples gather for
// GQA groups (including groups larger than one kernel call), bf16 and fp32 storage, empty and
// ragged row counts; and the append segment (KvShard::Append / LshTables::Append) against shards
// and tables built in one go.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/attention/estimators.h"
#include "common/attention/group_kernel_runner.h"
#include "common/attention/kv_shard.h"
#include "common/attention/lsh_tables.h"
#include "common/attention/partial_attention.h"
#include "common/attention/simhash.h"
#include "common/cpu_features.h"
#include "gtest/gtest.h"

namespace magicpig::attention {
namespace {

std::vector<float> Randn(size_t count, std::mt19937& rng, float sigma = 1.0f, float offset = 0.0f) {
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<float> v(count);
  for (auto& x : v) x = nd(rng) + offset;
  return v;
}

// Relative L2 distance of o, and |lse difference|.
void ExpectNear(const PartialAttention& got, const PartialAttention& want, double rel_tol,
                double lse_tol, const std::string& what) {
  ASSERT_EQ(got.n_touched, want.n_touched) << what;
  if (want.empty()) {
    EXPECT_TRUE(got.empty()) << what;
    for (float x : got.o) EXPECT_EQ(x, 0.0f) << what;
    return;
  }
  ASSERT_EQ(got.o.size(), want.o.size()) << what;
  double num = 0, den = 0;
  for (size_t t = 0; t < want.o.size(); ++t) {
    num += std::pow(static_cast<double>(got.o[t]) - want.o[t], 2);
    den += std::pow(static_cast<double>(want.o[t]), 2);
  }
  EXPECT_LE(std::sqrt(num / std::max(den, 1e-30)), rel_tol) << what;
  EXPECT_NEAR(got.lse, want.lse, lse_tol) << what;
}

struct Case {
  int64_t n, d;
  int g;
  KvStorage storage;
};

class GroupAttentionTest : public ::testing::TestWithParam<SimdLevel> {};

// Keys in a loose cone (so some keys collide often) plus noise, queries near the cone.
TEST_P(GroupAttentionTest, EveryEstimatorMatchesTheReference) {
  const SimdLevel level = GetParam();
  const std::vector<Case> cases = {
      {0, 64, 3, KvStorage::kBf16},
      {1, 64, 1, KvStorage::kF32},
      {63, 128, 4, KvStorage::kBf16},
      {64, 128, 4, KvStorage::kF32},
      {65, 48, 2, KvStorage::kBf16},
      {700, 64, 3, KvStorage::kBf16},
      {700, 128, 4, KvStorage::kF32},
      {300, 32, 35, KvStorage::kBf16},
      // Groups of 4 heads score two rows at a time: odd tiles, 8 heads, d = 48 (3 chunks).
      {129, 64, 8, KvStorage::kBf16},
      {701, 128, 4, KvStorage::kBf16},
      {77, 48, 4, KvStorage::kF32},
  };
  std::mt19937 rng(11);
  for (const Case& c : cases) {
    for (int variant = 0; variant < 2; ++variant) {
      const int k = variant == 0 ? 6 : 3, l = variant == 0 ? 20 : 12;
      const std::string what = absl::StrCat("level=", std::string(SimdLevelName(level)), " n=", c.n,
                                            " d=", c.d, " g=", c.g, " K=", k, " L=", l);
      auto hash = SimHash::Create(c.d, k, l, 5 + variant);
      ASSERT_TRUE(hash.ok());
      const std::vector<float> dir = Randn(c.d, rng);
      std::vector<float> keys = Randn(c.n * c.d, rng, 0.7f);
      for (int64_t i = 0; i < c.n; ++i)
        for (int64_t t = 0; t < c.d; ++t) keys[i * c.d + t] += dir[t];
      const std::vector<float> values = Randn(c.n * c.d, rng);
      const std::vector<float> center = Randn(c.d, rng, 0.05f);
      auto shard =
          KvShard::Create(*hash, keys.data(), center.data(), values.data(), c.n, c.storage);
      ASSERT_TRUE(shard.ok()) << shard.status();
      std::vector<float> q = Randn(c.g * c.d, rng, 0.8f);
      for (int h = 0; h < c.g; ++h)
        for (int64_t t = 0; t < c.d; ++t) q[h * c.d + t] += 1.5f * dir[t];
      std::vector<uint16_t> codes(static_cast<size_t>(c.g * l));
      ASSERT_TRUE(hash->Codes(q.data(), c.g, c.d, codes.data()).ok());
      const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
      EstimatorScratch fast_scratch, ref_scratch;
      std::vector<PartialAttention> got(static_cast<size_t>(c.g));

      const FullEstimator full(level);
      ASSERT_TRUE(
          full.AttendGroup(*shard, q.data(), codes.data(), c.g, scale, &fast_scratch, got.data())
              .ok());
      for (int h = 0; h < c.g; ++h) {
        auto want = full.Attend(*shard, q.data() + h * c.d, nullptr, scale, &ref_scratch);
        ASSERT_TRUE(want.ok());
        ExpectNear(got[h], *want, 2e-5, 2e-5 * (1 + std::abs(want->lse)),
                   absl::StrCat(what, " full head ", h));
      }
      // Same sample sets, exact logits: equal to the reference to float rounding.
      const MagicPigEstimator exact(k, l, {.force_unit_inclusion = true}, level);
      ASSERT_TRUE(
          exact.AttendGroup(*shard, q.data(), codes.data(), c.g, scale, &fast_scratch, got.data())
              .ok());
      for (int h = 0; h < c.g; ++h) {
        auto want =
            exact.Attend(*shard, q.data() + h * c.d, codes.data() + h * l, scale, &ref_scratch);
        ASSERT_TRUE(want.ok());
        ExpectNear(got[h], *want, 2e-5, 2e-5 * (1 + std::abs(want->lse)),
                   absl::StrCat(what, " magicpig(u=1) head ", h));
      }
      // The real estimator: the correction comes from the interpolated table (<= 1e-3 in ln u).
      const MagicPigEstimator pig(k, l, {}, level);
      ASSERT_TRUE(
          pig.AttendGroup(*shard, q.data(), codes.data(), c.g, scale, &fast_scratch, got.data())
              .ok());
      int64_t sampled = 0, most = 0;
      for (int h = 0; h < c.g; ++h) {
        auto want =
            pig.Attend(*shard, q.data() + h * c.d, codes.data() + h * l, scale, &ref_scratch);
        ASSERT_TRUE(want.ok());
        sampled += want->n_touched;
        most = std::max(most, want->n_touched);
        ExpectNear(got[h], *want, 2e-3, 2e-3 * (1 + std::abs(want->lse)),
                   absl::StrCat(what, " magicpig head ", h));
      }
      if (c.n >= 300) {
        EXPECT_GT(sampled, 0) << what;  // the comparison saw sampled keys
      }
      if (c.n >= 700 && variant == 1) {
        // A union of 256+ rows: AttendGroup ran the kernel as two halves merged by LSE.
        EXPECT_GE(most, 256) << what;
      }
      // The scratch is left clean: every group collision counter is 0 again.
      for (uint32_t m : fast_scratch.lsh.group_counter) ASSERT_EQ(m, 0u) << what;
      // Top-k from the kernel's fp32 logits: the same keys as the float64 reference (no near-ties
      // in this data), so the same output to float rounding; a budget above n keeps every key.
      for (const int64_t budget : {c.n / 8 + 1, c.n + 3}) {
        const TopKEstimator topk(budget, level);
        ASSERT_TRUE(
            topk.AttendGroup(*shard, q.data(), nullptr, c.g, scale, &fast_scratch, got.data())
                .ok());
        for (int h = 0; h < c.g; ++h) {
          auto want = topk.Attend(*shard, q.data() + h * c.d, nullptr, scale, &ref_scratch);
          ASSERT_TRUE(want.ok());
          ExpectNear(got[h], *want, 2e-5, 2e-5 * (1 + std::abs(want->lse)),
                     absl::StrCat(what, " topk(", budget, ") head ", h));
        }
      }
      // Oracle sampling: the same seeded draws from the kernel's logits. A draw may flip to the
      // neighbouring key when its target lies within float rounding of a CDF step, so allow two
      // flipped draws per head (each moves o by at most 2 max|v| / B); lse is exact over all keys.
      double max_v = 0.0;
      for (float v : values) max_v = std::max(max_v, static_cast<double>(std::abs(v)));
      const int64_t budget = c.n / 4 + 1;
      const OracleEstimator oracle(budget, 99, level);
      ASSERT_TRUE(
          oracle.AttendGroup(*shard, q.data(), nullptr, c.g, scale, &fast_scratch, got.data())
              .ok());
      int64_t distinct_differ = 0;
      for (int h = 0; h < c.g; ++h) {
        auto want = oracle.Attend(*shard, q.data() + h * c.d, nullptr, scale, &ref_scratch);
        ASSERT_TRUE(want.ok());
        const std::string head = absl::StrCat(what, " oracle head ", h);
        ASSERT_EQ(got[h].empty(), want->empty()) << head;
        if (want->empty()) continue;
        EXPECT_NEAR(got[h].lse, want->lse, 2e-5 * (1 + std::abs(want->lse))) << head;
        EXPECT_LE(std::abs(got[h].n_touched - want->n_touched), 2) << head;
        distinct_differ += got[h].n_touched != want->n_touched;
        const double tol = 4.0 * max_v / static_cast<double>(budget) + 1e-4;
        for (size_t t = 0; t < want->o.size(); ++t) {
          ASSERT_NEAR(got[h].o[t], want->o[t], tol) << head << " t=" << t;
        }
      }
      EXPECT_LE(distinct_differ, (c.g + 3) / 4) << what << ": draws should rarely flip";
    }
  }
}

// The kernel's sums-only mode (no values; vattention's spread): ln sum exp(x) and ln sum exp(2x)
// per head over a row list with head masks, against float64, bf16 and fp32 rows.
TEST_P(GroupAttentionTest, ExpSumsMatchFloat64) {
  std::mt19937 rng(17);
  for (KvStorage storage : {KvStorage::kBf16, KvStorage::kF32}) {
    const int64_t n = 700, d = 64;
    const int g = 5;
    const std::vector<float> keys = Randn(n * d, rng, 0.4f), values = Randn(n * d, rng);
    auto hash = SimHash::Create(d, 4, 4, 1);
    ASSERT_TRUE(hash.ok());
    auto shard = KvShard::Create(*hash, keys.data(), nullptr, values.data(), n, storage);
    ASSERT_TRUE(shard.ok());
    const std::vector<float> q = Randn(g * d, rng);
    std::vector<int32_t> rows;
    std::vector<uint32_t> masks;
    for (int32_t r = 3; r < n; r += 3) {
      rows.push_back(r);
      masks.push_back(static_cast<uint32_t>(rng()) & 0x1f);
    }
    EstimatorScratch scratch;
    float lse[5], lse2[5];
    internal::GroupExpSums(internal::SelectGroupKernel(GetParam()), *shard, q.data(), g, 0.3f,
                           rows.data(), static_cast<int64_t>(rows.size()), masks.data(), &scratch,
                           lse, lse2);
    for (int h = 0; h < g; ++h) {
      double s1 = 0, s2 = 0;
      for (size_t j = 0; j < rows.size(); ++j) {
        if (!((masks[j] >> h) & 1)) continue;
        const double x = 0.3 * shard->KeyDot(rows[j], q.data() + h * d);
        s1 += std::exp(x);
        s2 += std::exp(2 * x);
      }
      EXPECT_NEAR(lse[h], std::log(s1), 1e-4) << "head " << h;
      EXPECT_NEAR(lse2[h], std::log(s2), 1e-4) << "head " << h;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, GroupAttentionTest, ::testing::ValuesIn(SupportedSimdLevels()),
                         [](const auto& info) { return std::string(SimdLevelName(info.param)); });

// The union of sorted per-head lists against a bitmap built key by key: every key in some list
// once, in increasing order, with exactly the bits of the lists that hold it (empty lists, a
// single list, duplicates across lists, up to kMaxGroup lists).
TEST(UnionWithMasksTest, MatchesABitmapOfTheLists) {
  std::mt19937_64 rng(7);
  for (int lists_count : {1, 2, 3, 4, 7, internal::kMaxGroup}) {
    for (int64_t n : {1, 50, 3000}) {
      std::vector<std::vector<int32_t>> lists(static_cast<size_t>(lists_count));
      std::vector<uint32_t> expected(static_cast<size_t>(n), 0);
      for (int h = 0; h < lists_count; ++h) {
        // Densities from empty to every key.
        const double p = h % 5 == 4 ? 0.0 : (h % 5 == 3 ? 1.0 : 0.1 * (h % 5 + 1));
        std::bernoulli_distribution take(p);
        for (int32_t i = 0; i < n; ++i) {
          if (take(rng)) {
            lists[static_cast<size_t>(h)].push_back(i);
            expected[static_cast<size_t>(i)] |= uint32_t{1} << h;
          }
        }
      }
      std::vector<int32_t> rows;
      std::vector<uint32_t> masks;
      internal::UnionWithMasks(lists, &rows, &masks);
      std::vector<int32_t> want_rows;
      std::vector<uint32_t> want_masks;
      for (int32_t i = 0; i < n; ++i) {
        if (expected[static_cast<size_t>(i)] != 0) {
          want_rows.push_back(i);
          want_masks.push_back(expected[static_cast<size_t>(i)]);
        }
      }
      EXPECT_EQ(rows, want_rows) << lists_count << " lists, n = " << n;
      EXPECT_EQ(masks, want_masks) << lists_count << " lists, n = " << n;
    }
  }
  std::vector<int32_t> rows = {5};
  std::vector<uint32_t> masks = {1};
  internal::UnionWithMasks({}, &rows, &masks);
  EXPECT_TRUE(rows.empty());
  EXPECT_TRUE(masks.empty());
}

TEST(GroupAttentionValidationTest, RejectsBadGroupsAndDims) {
  std::mt19937 rng(1);
  auto hash = SimHash::Create(24, 4, 4, 1);  // d = 24 is not a multiple of 16
  ASSERT_TRUE(hash.ok());
  const std::vector<float> kv = Randn(10 * 24, rng);
  auto shard = KvShard::Create(*hash, kv.data(), nullptr, kv.data(), 10);
  ASSERT_TRUE(shard.ok());
  EstimatorScratch scratch;
  std::vector<PartialAttention> out(2);
  const std::vector<float> q = Randn(2 * 24, rng);
  const std::vector<uint16_t> codes(8, 0);
  EXPECT_EQ(
      FullEstimator().AttendGroup(*shard, q.data(), nullptr, 2, 1.0f, &scratch, out.data()).code(),
      absl::StatusCode::kInvalidArgument);
  auto hash16 = SimHash::Create(16, 4, 4, 1);
  auto shard16 = KvShard::Create(*hash16, kv.data(), nullptr, kv.data(), 10);
  ASSERT_TRUE(shard16.ok());
  EXPECT_EQ(FullEstimator()
                .AttendGroup(*shard16, q.data(), nullptr, 0, 1.0f, &scratch, out.data())
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MagicPigEstimator(4, 4)
                .AttendGroup(*shard16, q.data(), nullptr, 2, 1.0f, &scratch, out.data())
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MagicPigEstimator(5, 4)
                .AttendGroup(*shard16, q.data(), codes.data(), 2, 1.0f, &scratch, out.data())
                .code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<uint16_t> bad = codes;
  bad[5] = 16;  // >= 2^K
  EXPECT_EQ(MagicPigEstimator(4, 4)
                .AttendGroup(*shard16, q.data(), bad.data(), 2, 1.0f, &scratch, out.data())
                .code(),
            absl::StatusCode::kInvalidArgument);
  for (uint32_t m : scratch.lsh.group_counter) ASSERT_EQ(m, 0u);
}

// LshTables::Append leaves exactly the arrays Build over all codes gives.
TEST(AppendSegmentTest, TablesAppendEqualsBuild) {
  std::mt19937 rng(5);
  for (int k : {1, 4, 9}) {
    for (int64_t n0 : {0, 1, 37, 500}) {
      for (int64_t m : {0, 1, 64, 300}) {
        const int l = 7;
        std::uniform_int_distribution<int> code(0, (1 << k) - 1);
        std::vector<uint16_t> codes(static_cast<size_t>((n0 + m) * l));
        for (auto& c : codes) c = static_cast<uint16_t>(code(rng));
        auto all = LshTables::Build(codes.data(), n0 + m, k, l);
        auto part = LshTables::Build(codes.data(), n0, k, l);
        ASSERT_TRUE(all.ok() && part.ok());
        ASSERT_TRUE(part->Append(codes.data() + n0 * l, m).ok());
        ASSERT_EQ(part->size(), n0 + m);
        for (int t = 0; t < l; ++t) {
          ASSERT_EQ(all->TableOffsets(t), part->TableOffsets(t));
          ASSERT_EQ(all->TableIndices(t), part->TableIndices(t));
        }
      }
    }
  }
  auto t = LshTables::Build(nullptr, 0, 3, 2);
  ASSERT_TRUE(t.ok());
  const std::vector<uint16_t> bad = {1, 8};
  EXPECT_EQ(t->Append(bad.data(), 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t->size(), 0);
}

// Appending keys in pieces (crossing the merge threshold) gives the same retrieval sets, tables
// and attention as building the shard over all keys at once with the same center.
TEST(AppendSegmentTest, ShardAppendEqualsOneBuild) {
  std::mt19937 rng(8);
  const int64_t d = 32, n0 = 1000;
  const int k = 5, l = 16;
  auto hash = SimHash::Create(d, k, l, 3);
  ASSERT_TRUE(hash.ok());
  const std::vector<int64_t> pieces = {1, 50, 100, 7, 200, 3};  // 361 keys: merges after 256
  int64_t total = n0;
  for (int64_t p : pieces) total += p;
  const std::vector<float> keys = Randn(total * d, rng, 1.0f, 0.3f);
  const std::vector<float> values = Randn(total * d, rng);
  const std::vector<float> center = Randn(d, rng, 0.2f, 0.3f);
  auto grown = KvShard::Create(*hash, keys.data(), center.data(), values.data(), n0);
  ASSERT_TRUE(grown.ok());
  int64_t at = n0;
  bool merged = false;
  for (int64_t p : pieces) {
    ASSERT_TRUE(grown->Append(*hash, keys.data() + at * d, values.data() + at * d, p).ok());
    at += p;
    ASSERT_EQ(grown->size(), at);
    merged = merged || grown->indexed() > n0;
    auto once = KvShard::Create(*hash, keys.data(), center.data(), values.data(), at);
    ASSERT_TRUE(once.ok());
    LshScratch s1, s2;
    std::vector<int32_t> a, b;
    std::vector<float> qs = Randn(4 * d, rng, 1.0f, 0.3f);
    std::vector<uint16_t> codes(4 * l);
    ASSERT_TRUE(hash->Codes(qs.data(), 4, d, codes.data()).ok());
    for (int h = 0; h < 4; ++h) {
      ASSERT_TRUE(grown->Retrieve(codes.data() + h * l, &s1, &a).ok());
      ASSERT_TRUE(once->Retrieve(codes.data() + h * l, &s2, &b).ok());
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      ASSERT_EQ(a, b) << "after " << at << " keys, query " << h;
    }
    EstimatorScratch es;
    std::vector<PartialAttention> ga(4), gb(4);
    const MagicPigEstimator pig(k, l);
    ASSERT_TRUE(pig.AttendGroup(*grown, qs.data(), codes.data(), 4, 0.2f, &es, ga.data()).ok());
    ASSERT_TRUE(pig.AttendGroup(*once, qs.data(), codes.data(), 4, 0.2f, &es, gb.data()).ok());
    for (int h = 0; h < 4; ++h) ExpectNear(ga[h], gb[h], 1e-5, 1e-4, "append vs once");
    EXPECT_EQ(grown->bytes() > 0, true);
  }
  EXPECT_TRUE(merged) << "the merge threshold was never crossed";
  ASSERT_TRUE(grown->MergePending().ok());
  EXPECT_EQ(grown->pending(), 0);
  auto once = KvShard::Create(*hash, keys.data(), center.data(), values.data(), total);
  for (int t = 0; t < l; ++t) {
    ASSERT_EQ(once->tables().TableIndices(t), grown->tables().TableIndices(t));
  }
  // A hash with other parameters is rejected and changes nothing.
  auto other = SimHash::Create(d, k + 1, l, 3);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(grown->Append(*other, keys.data(), values.data(), 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(grown->Append(*hash, nullptr, nullptr, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(grown->size(), total);
}

// The service path (keys centred and hashed by the compute node) builds the same shard as Create.
TEST(AppendSegmentTest, CreateFromCodesEqualsCreate) {
  std::mt19937 rng(21);
  const int64_t d = 32, n = 600, m = 300;
  const int k = 6, l = 10;
  auto hash = SimHash::Create(d, k, l, 9);
  ASSERT_TRUE(hash.ok());
  const std::vector<float> keys = Randn((n + m) * d, rng, 1.0f, 0.4f);
  const std::vector<float> values = Randn((n + m) * d, rng);
  const std::vector<float> center = Randn(d, rng, 0.2f, 0.4f);
  std::vector<float> centred = keys;
  for (int64_t i = 0; i < n + m; ++i)
    for (int64_t t = 0; t < d; ++t) centred[i * d + t] -= center[t];
  std::vector<uint16_t> codes((n + m) * l);
  ASSERT_TRUE(hash->KeyCodes(centred.data(), n + m, d, codes.data()).ok());
  auto a = KvShard::Create(*hash, keys.data(), center.data(), values.data(), n);
  auto b = KvShard::CreateFromCodes(d, k, l, centred.data(), codes.data(), values.data(), n);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(a->Append(*hash, keys.data() + n * d, values.data() + n * d, m).ok());
  std::vector<uint16_t> bad(codes.begin() + n * l, codes.end());
  bad[7] = 64;  // >= 2^K
  EXPECT_EQ(b->AppendWithCodes(centred.data() + n * d, bad.data(), values.data() + n * d, m).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->size(), n);
  ASSERT_TRUE(
      b->AppendWithCodes(centred.data() + n * d, codes.data() + n * l, values.data() + n * d, m)
          .ok());
  ASSERT_EQ(a->size(), b->size());
  ASSERT_EQ(a->indexed(), b->indexed());
  for (int t = 0; t < l; ++t) {
    ASSERT_EQ(a->tables().TableIndices(t), b->tables().TableIndices(t));
  }
  const std::vector<float> q = Randn(2 * d, rng, 1.0f, 0.4f);
  std::vector<uint16_t> qc(2 * l);
  ASSERT_TRUE(hash->Codes(q.data(), 2, d, qc.data()).ok());
  EstimatorScratch scratch;
  std::vector<PartialAttention> pa(2), pb(2);
  const MagicPigEstimator pig(k, l);
  ASSERT_TRUE(pig.AttendGroup(*a, q.data(), qc.data(), 2, 0.2f, &scratch, pa.data()).ok());
  ASSERT_TRUE(pig.AttendGroup(*b, q.data(), qc.data(), 2, 0.2f, &scratch, pb.data()).ok());
  for (int h = 0; h < 2; ++h) {
    EXPECT_EQ(pa[h].o, pb[h].o);
    EXPECT_EQ(pa[h].lse, pb[h].lse);
  }
}

}  // namespace
}  // namespace magicpig::attention
