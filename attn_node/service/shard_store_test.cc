// ShardStore without gRPC: two-phase appends racing on one layer (the second commit is refused and
// changes nothing), a commit after release, concurrent Attend and Commit, and the budget check of
// an append.
#include "attn_node/service/shard_store.h"

#include <atomic>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/attention/simhash.h"
#include "gtest/gtest.h"
#include "tests/testing/service_test_util.h"

namespace magicpig {

using ::magicpig::attention::EstimatorKind;
using ::magicpig::attention::KvStorage;
using ::magicpig::attention::SimHash;
namespace {

using testing::LayerData;

constexpr int kKv = 2, kGroup = 2, kD = 16, kK = 4, kL = 6;

SequenceSpec Spec(const std::string& id, int64_t max_tokens,
                  EstimatorKind estimator = EstimatorKind::kFull) {
  SequenceSpec s;
  s.id = id;
  s.layers = {0, 1};
  s.n_kv_heads = kKv;
  s.group = kGroup;
  s.head_dim = kD;
  s.lsh_k = kK;
  s.lsh_l = kL;
  s.storage = KvStorage::kF32;
  s.estimator = estimator;
  s.max_tokens = max_tokens;
  return s;
}

// Views into a chunk message built by the test helpers.
ChunkView View(const v1::KvChunk& c) {
  ChunkView v;
  v.sequence_id = c.sequence_id();
  v.layer = c.layer();
  v.first_pos = c.first_pos();
  v.n_tokens = c.n_tokens();
  v.keys = c.keys();
  v.values = c.values();
  v.codes = c.codes();
  return v;
}

int64_t KeysHeld(ShardStore& store, const std::string& id, int layer, const SimHash& hash) {
  std::mt19937 rng(1);
  const std::vector<float> q = testing::Randn(kKv * kGroup * kD, rng);
  v1::SequenceQuery m = testing::MakeQuery(id, q, hash, nullptr);
  QueryView qv{m.sequence_id(), m.q(), m.codes()};
  std::vector<SequencePartialResult> out;
  absl::Status s = store.Attend(layer, 0.25f, {&qv, 1}, &out);
  EXPECT_TRUE(s.ok()) << s;
  return out.empty() ? -1 : out[0].n_keys;
}

TEST(ShardStoreTest, RacingAppendsToOneLayerCommitOnce) {
  auto hash = SimHash::Create(kD, kK, kL, 5);
  ASSERT_TRUE(hash.ok());
  const LayerData data = testing::MakeLayer(*hash, kKv, 40, 2);
  ShardStore store(int64_t{1} << 30);
  ASSERT_TRUE(store.CreateSequence(Spec("s", 100)).ok());
  AppendStaging a, b;
  const v1::KvChunk chunk = testing::MakeChunk("s", 1, data, 0, 0, 20);
  ASSERT_TRUE(store.Stage(View(chunk), &a).ok());
  ASSERT_TRUE(store.Stage(View(chunk), &b).ok());  // both expect position 0
  auto first = store.Commit(&a);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->tokens, 20);
  auto second = store.Commit(&b);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(second.status().message().find("first_pos"), std::string::npos);
  EXPECT_EQ(KeysHeld(store, "s", 1, *hash), 20);
  EXPECT_EQ(KeysHeld(store, "s", 0, *hash), 0);
  EXPECT_EQ(a.chunks(), 0);  // a commit empties the staging

  // Staging then release: the commit finds nothing to commit to.
  AppendStaging c;
  ASSERT_TRUE(store.Stage(View(testing::MakeChunk("s", 1, data, 0, 20, 20)), &c).ok());
  ASSERT_TRUE(store.ReleaseSequence("s").ok());
  EXPECT_EQ(store.Commit(&c).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Stats().memory_used_bytes, 0);
}

TEST(ShardStoreTest, AppendPastNodeBudgetIsRefused) {
  auto hash = SimHash::Create(kD, kK, kL, 5);
  ASSERT_TRUE(hash.ok());
  const LayerData data = testing::MakeLayer(*hash, kKv, 40, 2);
  // Admit with a reservation for 1 token, then shrink the room by admitting a second sequence:
  // the estimate for 40 tokens no longer fits.
  const int64_t small = EstimateSequenceBytes(Spec("a", 1));
  const int64_t big = EstimateSequenceBytes(Spec("a", 40));
  ShardStore store(small + big - 1);
  ASSERT_TRUE(store.CreateSequence(Spec("a", 40)).ok());
  EXPECT_EQ(store.CreateSequence(Spec("b", 40)).status().code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(store.ReleaseSequence("a").ok());
  ASSERT_TRUE(store.CreateSequence(Spec("a", 1)).ok());
  // "a" may hold 1 token per layer: 2 tokens are past its max_tokens.
  AppendStaging s;
  EXPECT_EQ(store.Stage(View(testing::MakeChunk("a", 0, data, 0, 0, 2)), &s).code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(store.Stage(View(testing::MakeChunk("a", 0, data, 0, 0, 1)), &s).ok());
  ASSERT_TRUE(store.Commit(&s).ok());
  EXPECT_EQ(store.Stats().memory_used_bytes, small);
}

TEST(ShardStoreTest, StatsCountTokensAndSplitBytes) {
  auto hash = SimHash::Create(kD, kK, kL, 5);
  ASSERT_TRUE(hash.ok());
  const LayerData data = testing::MakeLayer(*hash, kKv, 40, 2);
  ShardStore store(int64_t{1} << 30);
  EXPECT_EQ(store.Stats().kv_tokens, 0);
  EXPECT_EQ(store.Stats().kv_bytes, 0);
  EXPECT_EQ(store.Stats().table_bytes, 0);
  ASSERT_TRUE(store.CreateSequence(Spec("s", 100)).ok());
  ASSERT_TRUE(store.CreateSequence(Spec("t", 50)).ok());
  for (const auto& [id, layer, count] :
       std::vector<std::tuple<std::string, int, int>>{{"s", 1, 20}, {"s", 0, 10}, {"t", 0, 5}}) {
    AppendStaging st;
    ASSERT_TRUE(store.Stage(View(testing::MakeChunk(id, layer, data, 0, 0, count)), &st).ok());
    ASSERT_TRUE(store.Commit(&st).ok());
  }
  const StoreStats stats = store.Stats();
  EXPECT_EQ(stats.sequences, 2);
  EXPECT_EQ(stats.kv_tokens, 20 + 5);  // per sequence: its fullest layer
  EXPECT_EQ(stats.kv_bytes + stats.table_bytes, stats.memory_actual_bytes);
  // Rows are reserved for max_tokens at the build (f32): keys, values, norms, and the center.
  const auto rows = [](int64_t max_tokens) { return (2 * max_tokens * kD + max_tokens + kD) * 4; };
  EXPECT_EQ(stats.kv_bytes, kKv * (2 * rows(100) + rows(50)));
  // Tables: L * (2^K + 1) offsets and L indices per key, of 2 bytes each (n < 65536), per
  // (layer, kv head).
  const auto tables = [](int64_t n) { return kL * (((int64_t{1} << kK) + 1) * 2 + n * 2); };
  EXPECT_EQ(stats.table_bytes, kKv * (tables(20) + tables(10) + tables(5)));
  ASSERT_TRUE(store.ReleaseSequence("s").ok());
  EXPECT_EQ(store.Stats().kv_tokens, 5);
}

TEST(ShardStoreTest, ConcurrentAttendAndAppend) {
  auto hash = SimHash::Create(kD, kK, kL, 5);
  ASSERT_TRUE(hash.ok());
  const int n = 2000;
  const LayerData data = testing::MakeLayer(*hash, kKv, n, 2);
  ShardStore store(int64_t{1} << 30);
  ASSERT_TRUE(store.CreateSequence(Spec("s", n, EstimatorKind::kMagicPig)).ok());
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int begin = 0; begin < n; begin += 100) {
      AppendStaging s;
      EXPECT_TRUE(store.Stage(View(testing::MakeChunk("s", 0, data, 0, begin, 100)), &s).ok());
      EXPECT_TRUE(store.Commit(&s).ok());
    }
    done = true;
  });
  int64_t last = 0;
  while (!done) {
    const int64_t held = KeysHeld(store, "s", 0, *hash);
    EXPECT_GE(held, last);
    EXPECT_EQ(held % 100, 0);
    last = held;
  }
  writer.join();
  EXPECT_EQ(KeysHeld(store, "s", 0, *hash), n);
}

// AppendKV staging counts against the node budget: a sequence is charged max(reserved, actual +
// staged), so streams that stage and never commit first use the sequence's reservation, then the
// free budget, and are refused past it; what they staged comes back when they end (committed or
// dropped), without double counting when a staging object moves.
TEST(ShardStoreTest, StagingCountsAgainstTheBudget) {
  auto hash = SimHash::Create(kD, kK, kL, 5);
  ASSERT_TRUE(hash.ok());
  const int n = 200;
  const LayerData data = testing::MakeLayer(*hash, kKv, n, 2);
  // One chunk of 100 tokens: 2 kv heads x 100 x 16 dims x (K, V) x 4 bytes + codes 2 x 100 x 6 x 2.
  const int64_t chunk = 2 * 100 * 16 * 2 * 4 + 2 * 100 * 6 * 2;
  ShardStore probe(int64_t{1} << 30);
  ASSERT_TRUE(probe.CreateSequence(Spec("s", n)).ok());
  const int64_t reserved = probe.Stats().memory_used_bytes;
  const int64_t budget = reserved + chunk * 5 / 2;  // the reservation and 2.5 chunks free
  ShardStore store(budget);
  ASSERT_TRUE(store.CreateSequence(Spec("s", n)).ok());
  // Streams that each stage one chunk and wait: as many as reserved + 2.5 chunks hold.
  const int64_t fit = (reserved + chunk * 5 / 2) / chunk;
  std::vector<AppendStaging> open;
  absl::Status status;
  while (status.ok() && static_cast<int64_t>(open.size()) <= fit + 1) {
    open.emplace_back();
    status = store.Stage(View(testing::MakeChunk("s", 0, data, 0, 0, 100)), &open.back());
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_EQ(static_cast<int64_t>(open.size()) - 1, fit);
  EXPECT_EQ(open.back().chunks(), 0);
  StoreStats stats = store.Stats();
  EXPECT_EQ(stats.staging_bytes, fit * chunk);
  EXPECT_LE(stats.memory_used_bytes, budget);
  EXPECT_EQ(stats.memory_used_bytes, fit * chunk);  // past the reservation: charged as staged
  AppendStaging moved = std::move(open[0]);         // moving does not count twice
  EXPECT_EQ(store.Stats().staging_bytes, fit * chunk);
  open[1] = AppendStaging();  // a dropped stream gives its bytes back
  EXPECT_EQ(store.Stats().staging_bytes, (fit - 1) * chunk);
  ASSERT_TRUE(store.Commit(&moved).ok());  // so does a committed one
  EXPECT_EQ(store.Stats().staging_bytes, (fit - 2) * chunk);
  open.clear();
  stats = store.Stats();
  EXPECT_EQ(stats.staging_bytes, 0);
  EXPECT_EQ(stats.memory_used_bytes, reserved);  // back to the reservation
}

// Leases: a sequence that no call names for the TTL is released with its charge; a call (here
// Attend) renews it. The clock is passed in, so nothing sleeps.
TEST(ShardStoreTest, IdleSequencesExpireAndCallsRenewThem) {
  auto hash = SimHash::Create(kD, kK, kL, 5);
  ASSERT_TRUE(hash.ok());
  ShardStore store(int64_t{1} << 30);
  ASSERT_TRUE(store.CreateSequence(Spec("idle", 100)).ok());
  ASSERT_TRUE(store.CreateSequence(Spec("busy", 100)).ok());
  const auto ttl = std::chrono::seconds(10);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(store.ReleaseIdle(ttl, t0 + std::chrono::seconds(5)).empty());
  // "busy" is named by a call now; "idle" was last named at creation, before t0.
  KeysHeld(store, "busy", 0, *hash);
  const std::vector<SequenceSummary> expired =
      store.ReleaseIdle(ttl, std::chrono::steady_clock::now() + std::chrono::seconds(9));
  ASSERT_EQ(expired.size(), 0u);
  const std::vector<SequenceSummary> later = store.ReleaseIdle(ttl, t0 + std::chrono::seconds(10));
  ASSERT_EQ(later.size(), 1u);
  EXPECT_EQ(later[0].id, "idle");
  EXPECT_GT(later[0].bytes, 0);
  const StoreStats stats = store.Stats();
  EXPECT_EQ(stats.sequences, 1);
  EXPECT_EQ(stats.memory_used_bytes, store.HeldSequences()[0].bytes);  // the charge went back
  EXPECT_EQ(store.ReleaseSequence("idle").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.ReleaseIdle(ttl, std::chrono::steady_clock::now() + ttl * 2).size(), 1u);
  EXPECT_EQ(store.Stats().sequences, 0);
  EXPECT_EQ(store.Stats().memory_used_bytes, 0);
}

}  // namespace
}  // namespace magicpig
