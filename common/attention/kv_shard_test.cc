// Tests for KvShard: stored keys are centred, norms are of the centred keys, the tables match the
// SimHash codes of the centred keys, accessors, memory accounting and validation; RetrieveGroup
// equals Retrieve per head with and without a pending (appended, not yet merged) segment.
#include "common/attention/kv_shard.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "common/attention/simhash.h"
#include "common/half.h"
#include "gtest/gtest.h"

namespace magicpig::attention {
namespace {

std::vector<float> Randn(size_t count, std::mt19937& rng, float offset = 0.0f) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(count);
  for (auto& x : v) x = nd(rng) + offset;
  return v;
}

TEST(KvShardTest, StoresCentredKeysNormsAndTables) {
  const int64_t n = 300, d = 32;
  const int k = 6, l = 20;
  auto hash = SimHash::Create(d, k, l, 42);
  ASSERT_TRUE(hash.ok());
  std::mt19937 rng(1);
  const std::vector<float> keys = Randn(n * d, rng, 2.0f);
  const std::vector<float> values = Randn(n * d, rng);
  const std::vector<float> center = Randn(d, rng, 2.0f);
  auto shard =
      KvShard::Create(*hash, keys.data(), center.data(), values.data(), n, KvStorage::kF32);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(shard->size(), n);
  EXPECT_EQ(shard->dim(), d);
  EXPECT_EQ(shard->k(), k);
  EXPECT_EQ(shard->l(), l);

  std::vector<float> centred(n * d);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) centred[i * d + j] = keys[i * d + j] - center[j];
  std::vector<uint16_t> codes(n * l);
  ASSERT_TRUE(hash->KeyCodes(centred.data(), n, d, codes.data()).ok());

  std::vector<float> row(d);
  const std::vector<float> q = Randn(d, rng);
  for (int64_t i = 0; i < n; ++i) {
    shard->CopyKey(i, row.data());
    double sq = 0, dot = 0;
    for (int64_t j = 0; j < d; ++j) {
      EXPECT_EQ(row[j], centred[i * d + j]);
      sq += static_cast<double>(centred[i * d + j]) * centred[i * d + j];
      dot += static_cast<double>(q[j]) * centred[i * d + j];
    }
    EXPECT_NEAR(shard->KeyNorm(i), std::sqrt(sq), 1e-6 * std::sqrt(sq));
    EXPECT_NEAR(shard->KeyDot(i, q.data()), dot, 1e-9 * (1 + std::fabs(dot)));
    shard->CopyValue(i, row.data());
    for (int64_t j = 0; j < d; ++j) EXPECT_EQ(row[j], values[i * d + j]);
  }
  std::vector<double> acc(d, 1.0);
  shard->AccumulateValue(3, 0.5, acc.data());
  for (int64_t j = 0; j < d; ++j) EXPECT_DOUBLE_EQ(acc[j], 1.0 + 0.5 * values[3 * d + j]);

  // Every key sits in the bucket of its code, in every table.
  for (int t = 0; t < l; ++t) {
    const std::vector<int32_t> off = shard->tables().TableOffsets(t);
    for (int64_t b = 0; b < shard->tables().num_buckets(); ++b) {
      for (int32_t p = off[b]; p < off[b + 1]; ++p) {
        EXPECT_EQ(codes[shard->tables().index(t, p) * l + t], b);
      }
    }
  }
  EXPECT_GE(shard->bytes(),
            static_cast<int64_t>((2 * n * d + n) * sizeof(float)) + shard->tables().bytes());
}

TEST(KvShardTest, NullCenterMeansAlreadyCentred) {
  const int64_t n = 10, d = 8;
  auto hash = SimHash::Create(d, 4, 4, 7);
  ASSERT_TRUE(hash.ok());
  std::mt19937 rng(2);
  const std::vector<float> keys = Randn(n * d, rng);
  const std::vector<float> values = Randn(n * d, rng);
  auto shard = KvShard::Create(*hash, keys.data(), nullptr, values.data(), n, KvStorage::kF32);
  ASSERT_TRUE(shard.ok());
  std::vector<float> row(d);
  shard->CopyKey(5, row.data());
  for (int64_t j = 0; j < d; ++j) EXPECT_EQ(row[j], keys[5 * d + j]);
}

TEST(KvShardTest, Bf16StorageRoundsKeysAndValuesKeepsFp32NormsAndTables) {
  const int64_t n = 200, d = 32;
  const int k = 6, l = 12;
  auto hash = SimHash::Create(d, k, l, 9);
  ASSERT_TRUE(hash.ok());
  std::mt19937 rng(3);
  const std::vector<float> keys = Randn(n * d, rng, 1.0f);
  const std::vector<float> values = Randn(n * d, rng);
  const std::vector<float> center = Randn(d, rng, 1.0f);
  auto f32 = KvShard::Create(*hash, keys.data(), center.data(), values.data(), n, KvStorage::kF32);
  auto bf = KvShard::Create(*hash, keys.data(), center.data(), values.data(), n, KvStorage::kBf16);
  ASSERT_TRUE(f32.ok() && bf.ok());
  EXPECT_EQ(f32->storage(), KvStorage::kF32);
  EXPECT_EQ(bf->storage(), KvStorage::kBf16);
  const std::vector<float> q = Randn(d, rng);
  std::vector<float> row(d);
  for (int64_t i = 0; i < n; ++i) {
    // Norms are of the fp32 centred keys: identical to the fp32 shard's.
    EXPECT_EQ(bf->KeyNorm(i), f32->KeyNorm(i));
    bf->CopyKey(i, row.data());
    double dot = 0;
    for (int64_t j = 0; j < d; ++j) {
      const float centred = keys[i * d + j] - center[j];
      const float rounded = Bf16ToFloat(FloatToBf16(centred));
      EXPECT_EQ(row[j], rounded);
      dot += static_cast<double>(q[j]) * rounded;
    }
    EXPECT_NEAR(bf->KeyDot(i, q.data()), dot, 1e-9 * (1 + std::fabs(dot)));
    bf->CopyValue(i, row.data());
    for (int64_t j = 0; j < d; ++j) EXPECT_EQ(row[j], Bf16ToFloat(FloatToBf16(values[i * d + j])));
  }
  std::vector<double> acc(d, 1.0);
  bf->AccumulateValue(7, 0.25, acc.data());
  for (int64_t j = 0; j < d; ++j)
    EXPECT_DOUBLE_EQ(acc[j], 1.0 + 0.25 * Bf16ToFloat(FloatToBf16(values[7 * d + j])));
  // Tables come from the fp32 centred keys: identical buckets to the fp32 shard.
  ASSERT_EQ(bf->tables().num_buckets(), f32->tables().num_buckets());
  for (int t = 0; t < l; ++t) {
    ASSERT_EQ(bf->tables().TableOffsets(t), f32->tables().TableOffsets(t));
    for (int64_t p = 0; p < n; ++p) ASSERT_EQ(bf->tables().index(t, p), f32->tables().index(t, p));
  }
  // Exact memory: 2 bytes per key / value element, 4 per norm and center element, plus the tables.
  EXPECT_EQ(bf->bytes(), 2 * 2 * n * d + 4 * n + 4 * d + bf->tables().bytes());
  EXPECT_EQ(f32->bytes(), 4 * 2 * n * d + 4 * n + 4 * d + f32->tables().bytes());
  // table_bytes: the tables, plus the pending segment's codes (2 bytes per code) after an append.
  EXPECT_EQ(bf->table_bytes(), bf->tables().bytes());
  ASSERT_TRUE(bf->Append(*hash, keys.data(), values.data(), 3).ok());
  ASSERT_EQ(bf->pending(), 3);
  EXPECT_GE(bf->table_bytes(), bf->tables().bytes() + 3 * l * 2);
  EXPECT_LE(bf->table_bytes(), bf->bytes());

  auto empty = KvShard::Create(*hash, nullptr, nullptr, nullptr, 0, KvStorage::kBf16);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->size(), 0);
  EXPECT_EQ(empty->bytes(), 4 * hash->dim() + empty->tables().bytes());
}

TEST(KvShardTest, EmptyAndInvalid) {
  auto hash = SimHash::Create(8, 4, 4, 7);
  ASSERT_TRUE(hash.ok());
  auto empty = KvShard::Create(*hash, nullptr, nullptr, nullptr, 0);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->size(), 0);
  EXPECT_EQ(empty->tables().size(), 0);
  EXPECT_FALSE(KvShard::Create(*hash, nullptr, nullptr, nullptr, -1).ok());
  EXPECT_FALSE(KvShard::Create(*hash, nullptr, nullptr, nullptr, 3).ok());
}

TEST(KvShardTest, RetrieveGroupEqualsRetrievePerHeadWithPendingKeys) {
  const int64_t n = 500, d = 32, m = 40;
  const int k = 3, l = 12, g = 5;
  auto hash = SimHash::Create(d, k, l, 9);
  ASSERT_TRUE(hash.ok());
  std::mt19937 rng(4);
  const std::vector<float> keys = Randn((n + m) * d, rng, 1.0f);
  const std::vector<float> values = Randn((n + m) * d, rng);
  auto shard = KvShard::Create(*hash, keys.data(), nullptr, values.data(), n);
  ASSERT_TRUE(shard.ok());
  const std::vector<float> q = Randn(g * d, rng, 1.0f);
  std::vector<uint16_t> codes(static_cast<size_t>(g * l));
  ASSERT_TRUE(hash->Codes(q.data(), g, d, codes.data()).ok());
  LshScratch scratch;
  for (int stage = 0; stage < 2; ++stage) {
    if (stage == 1) {  // m keys in the pending segment (fewer than kMinMergeRows: not merged)
      ASSERT_TRUE(shard->Append(*hash, keys.data() + n * d, values.data() + n * d, m).ok());
      ASSERT_EQ(shard->pending(), m);
    }
    std::vector<int32_t> rows;
    std::vector<uint32_t> masks;
    ASSERT_TRUE(shard->RetrieveGroup(codes.data(), g, &scratch, &rows, &masks).ok());
    for (size_t i = 1; i < rows.size(); ++i) ASSERT_LT(rows[i - 1], rows[i]);
    bool pending_hit = false;
    for (int h = 0; h < g; ++h) {
      std::vector<int32_t> want, got;
      ASSERT_TRUE(shard->Retrieve(codes.data() + h * l, &scratch, &want).ok());
      std::sort(want.begin(), want.end());
      for (size_t i = 0; i < rows.size(); ++i) {
        if ((masks[i] >> h) & 1u) got.push_back(rows[i]);
      }
      EXPECT_EQ(got, want) << "stage " << stage << " head " << h;
      for (int32_t j : got) pending_hit = pending_hit || j >= n;
    }
    if (stage == 1) {
      EXPECT_TRUE(pending_hit) << "no pending key was sampled: the test is vacuous";
    }
  }
}

// The pending segment is merged once it holds indexed / 8 keys, but never later than at
// kMaxMergeRows; before and after, retrieval equals the MagicPIG rule by brute force over every
// key's codes (L = 70: the pending scan's chunks of 32 tables, the last one partial).
TEST(KvShardTest, PendingSegmentIsCappedAndRetrievalMatchesBruteForce) {
  const int64_t n = 8000, d = 16, step = 100;
  const int k = 6, l = 70;
  auto hash = SimHash::Create(d, k, l, 5);
  ASSERT_TRUE(hash.ok());
  std::mt19937 rng(6);
  const int64_t total = n + 6 * step;
  const std::vector<float> keys = Randn(total * d, rng, 1.0f);
  const std::vector<float> values = Randn(total * d, rng);
  std::vector<uint16_t> key_codes(static_cast<size_t>(total * l));
  ASSERT_TRUE(hash->KeyCodes(keys.data(), total, d, key_codes.data()).ok());
  auto shard = KvShard::Create(*hash, keys.data(), nullptr, values.data(), n);
  ASSERT_TRUE(shard.ok());
  ASSERT_GT(n / 8, KvShard::kMaxMergeRows);  // the cap, not indexed / 8, decides here
  const std::vector<float> q = Randn(d, rng, 1.0f);
  std::vector<uint16_t> qc(static_cast<size_t>(l));
  ASSERT_TRUE(hash->Codes(q.data(), 1, d, qc.data()).ok());
  LshScratch scratch;
  for (int64_t added = 0; added <= 6 * step; added += step) {
    if (added > 0) {
      ASSERT_TRUE(shard
                      ->Append(*hash, keys.data() + (n + added - step) * d,
                               values.data() + (n + added - step) * d, step)
                      .ok());
    }
    const int64_t pending_want = added < 600 ? added : 0;  // 600 >= 512: merged at that append
    ASSERT_EQ(shard->pending(), pending_want) << "after " << added << " appended keys";
    std::vector<int32_t> want;
    for (int64_t j = 0; j < n + added; ++j) {
      int hits = 0;
      for (int t = 0; t < l; ++t) hits += key_codes[static_cast<size_t>(j * l + t)] == qc[t];
      if (hits >= 2) want.push_back(static_cast<int32_t>(j));
    }
    std::vector<int32_t> got;
    ASSERT_TRUE(shard->Retrieve(qc.data(), &scratch, &got).ok());
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, want) << "after " << added << " appended keys";
    ASSERT_LT(want.size(), static_cast<size_t>(n + added)) << "every key collides: vacuous";
  }
}

}  // namespace
}  // namespace magicpig::attention
