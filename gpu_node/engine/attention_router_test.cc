// The router's overlapped offload (SparseAttentionOptions::overlap_offload): OnLayerStored returns
// before the shards have the rows, WaitStored (and any later call) waits for them and reports the
// offload's status; the shards receive the same rows, in the same order, with the offload
// overlapped or not.
#include "gpu_node/engine/attention_router.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <random>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/half.h"
#include "gtest/gtest.h"

namespace magicpig::engine {
namespace {

using ::magicpig::attention::PartialAttention;

// Records every Append (layer, first_pos, n, the keys' bits); can fail the next Append, or hold it
// until released (to see that OnLayerStored returned before it ran).
class RecordingShards : public attention::AttentionShards {
 public:
  struct Call {
    int64_t layer, first_pos, n;
    std::vector<float> keys;
    std::vector<uint16_t> codes;
  };
  absl::Status Append(int64_t layer, int64_t first_pos, int64_t n, const float* keys,
                      const float* /*values*/, const uint16_t* codes) override {
    if (hold_ != nullptr) hold_->WaitForNotification();
    if (fail_next_.exchange(false)) return absl::DataLossError("injected append failure");
    calls_.push_back({layer, first_pos, n, std::vector<float>(keys, keys + n * n_kv_ * d_),
                      std::vector<uint16_t>(codes, codes + n * n_kv_ * l_)});
    appended_.fetch_add(1);
    return absl::OkStatus();
  }
  absl::Status Attend(int64_t, const float*, const uint16_t*, float, PartialAttention*) override {
    return absl::UnimplementedError("not used");
  }
  int64_t size(int64_t) const override { return 0; }
  int64_t bytes() const override { return 0; }

  void Configure(int64_t n_kv, int64_t d, int64_t l) { n_kv_ = n_kv, d_ = d, l_ = l; }
  void FailNext() { fail_next_ = true; }
  void HoldAppends(absl::Notification* hold) { hold_ = hold; }
  int appended() const { return appended_.load(); }
  const std::vector<Call>& calls() const { return calls_; }

 private:
  int64_t n_kv_ = 0, d_ = 0, l_ = 0;
  std::atomic<bool> fail_next_{false};
  std::atomic<int> appended_{0};
  absl::Notification* hold_ = nullptr;
  std::vector<Call> calls_;
};

constexpr int64_t kLayers = 4, kKv = 2, kDim = 16, kTokens = 96;

model::ModelConfig Config() {
  model::ModelConfig c;
  c.n_layer = kLayers;
  c.n_head = 4;
  c.n_head_kv = kKv;
  c.head_dim = kDim;
  c.n_embd = c.n_head * kDim;
  return c;
}

SparseAttentionOptions Options(bool overlap) {
  SparseAttentionOptions o;
  o.lsh_k = 4;
  o.lsh_l = 6;
  o.n_local = 8;
  o.window_budget = 16;
  o.min_offload_keys = 1;
  o.dense_layers = {0};
  o.overlap_offload = overlap;
  return o;
}

// Random fp16 rows for every layer, [kTokens][kKv][kDim].
struct Cache {
  std::vector<std::vector<uint16_t>> k, v;
  Cache() {
    std::mt19937 rng(7);
    std::normal_distribution<float> x;
    for (int64_t l = 0; l < kLayers; ++l) {
      k.emplace_back(kTokens * kKv * kDim);
      v.emplace_back(kTokens * kKv * kDim);
      for (auto& h : k.back()) h = FloatToFp16(x(rng));
      for (auto& h : v.back()) h = FloatToFp16(x(rng));
    }
  }
  backend::KvLayerView view(int64_t l) {
    return {k[static_cast<size_t>(l)].data(), v[static_cast<size_t>(l)].data(), kTokens, kKv, kDim};
  }
};

// A router over recording shards and a random cache.
struct RouterOverRecordingShards {
  explicit RouterOverRecordingShards(bool overlap)
      : hash(*attention::SimHash::Create(kDim, 4, 6, 1)),
        router(Config(), Options(overlap), &hash, nullptr, &shards, nullptr) {
    shards.Configure(kKv, kDim, 6);
  }
  attention::SimHash hash;
  RecordingShards shards;
  Cache cache;
  SparseAttentionRouter router;
};

// A prefill of 64 tokens then single-token stores to 96 (three window overflows per sparse layer).
std::vector<RecordingShards::Call> OffloadAll(bool overlap) {
  RouterOverRecordingShards t(overlap);
  for (int64_t l = 0; l < kLayers; ++l) {
    EXPECT_TRUE(t.router.OnLayerStored(l, t.cache.view(l), 64).ok());
  }
  EXPECT_TRUE(t.router.WaitStored().ok());
  for (int64_t n = 65; n <= kTokens; ++n) {
    for (int64_t l = 0; l < kLayers; ++l) {
      EXPECT_TRUE(t.router.OnLayerStored(l, t.cache.view(l), n).ok());
    }
  }
  EXPECT_TRUE(t.router.WaitStored().ok());
  return t.shards.calls();
}

TEST(AttentionRouterTest, OverlappedOffloadHandsTheShardsTheSameRows) {
  const std::vector<RecordingShards::Call> sync = OffloadAll(false), overlapped = OffloadAll(true);
  ASSERT_EQ(sync.size(), overlapped.size());
  // 3 sparse layers: the prompt region [4, 56), then overflows at 73, 82 and 91 tokens each.
  EXPECT_EQ(sync.size(), 12u);
  for (size_t i = 0; i < sync.size(); ++i) {
    EXPECT_EQ(sync[i].layer, overlapped[i].layer) << i;
    EXPECT_EQ(sync[i].first_pos, overlapped[i].first_pos) << i;
    EXPECT_EQ(sync[i].n, overlapped[i].n) << i;
    EXPECT_EQ(sync[i].keys, overlapped[i].keys) << i;
    EXPECT_EQ(sync[i].codes, overlapped[i].codes) << i;
  }
}

TEST(AttentionRouterTest, OnLayerStoredReturnsBeforeTheOffloadAndWaitStoredWaits) {
  RouterOverRecordingShards t(true);
  SparseAttentionRouter& router = t.router;
  RecordingShards& shards = t.shards;
  absl::Notification release;
  shards.HoldAppends(&release);
  ASSERT_TRUE(router.OnLayerStored(1, t.cache.view(1), 64).ok());
  // Returned while the append is held: the region is already reported as leaving the cache.
  EXPECT_EQ(shards.appended(), 0);
  EXPECT_EQ(router.OffloadedPositions(1), (std::pair<int64_t, int64_t>{4, 56}));
  release.Notify();
  ASSERT_TRUE(router.WaitStored().ok());
  EXPECT_EQ(shards.appended(), 1);
}

TEST(AttentionRouterTest, AFailedOverlappedOffloadIsReportedOnceByTheNextCall) {
  RouterOverRecordingShards t(true);
  SparseAttentionRouter& router = t.router;
  RecordingShards& shards = t.shards;
  Cache& cache = t.cache;
  shards.FailNext();
  ASSERT_TRUE(router.OnLayerStored(1, cache.view(1), 64).ok());
  // The next call waits for the failed offload and returns its error, once.
  const absl::Status next = router.OnLayerStored(2, cache.view(2), 64);
  EXPECT_EQ(next.code(), absl::StatusCode::kDataLoss) << next;
  EXPECT_NE(next.message().find("injected append failure"), std::string::npos) << next;
  EXPECT_TRUE(router.WaitStored().ok());
  EXPECT_EQ(shards.appended(), 0);  // layer 2 was not started: its call failed first
  EXPECT_EQ(router.OffloadedPositions(1), (std::pair<int64_t, int64_t>{0, 0}));
  // Layer 1 did not commit: it offloads again at its next store.
  ASSERT_TRUE(router.OnLayerStored(1, cache.view(1), 64).ok());
  ASSERT_TRUE(router.WaitStored().ok());
  EXPECT_EQ(shards.appended(), 1);
  EXPECT_EQ(shards.calls()[0].layer, 1);
}

// sketch mode: each sparse layer's kv heads get a key sketch fitted on the first offloaded region
// (their centred keys), and the tokens that later leave the window are coded with that same sketch,
// not a refitted one; a dense layer offloads nothing.
TEST(AttentionRouterTest, SketchCodesComeFromTheFirstRegionsFit) {
  SparseAttentionOptions options = Options(false);
  options.mode = attention::EstimatorKind::kSketch;
  options.sketch_dims = 8;
  auto codes = ShardCodesFor(options, nullptr);
  ASSERT_TRUE(codes.ok()) << codes.status();
  EXPECT_EQ(codes->l, 4);
  EXPECT_EQ(codes->index, attention::KvIndex::kCodes);
  auto hash = attention::SimHash::Create(kDim, 4, 6, 1);
  RecordingShards shards;
  shards.Configure(kKv, kDim, 4);
  Cache cache;
  SparseAttentionRouter router(Config(), options, &*hash, nullptr, &shards, nullptr);
  for (int64_t n : {64, 80, 96}) {
    for (int64_t l = 0; l < kLayers; ++l)
      ASSERT_TRUE(router.OnLayerStored(l, cache.view(l), n).ok());
  }
  std::vector<std::vector<attention::KeySketch>> fitted(kLayers);
  int first_offloads = 0, later = 0;
  for (const RecordingShards::Call& call : shards.calls()) {
    ASSERT_NE(call.layer, 0);
    std::vector<attention::KeySketch>& sketches = fitted[static_cast<size_t>(call.layer)];
    if (sketches.empty()) {
      ++first_offloads;
      for (int64_t g = 0; g < kKv; ++g) {
        auto s = attention::KeySketch::Fit(call.keys.data() + g * call.n * kDim, call.n, kDim, 8);
        ASSERT_TRUE(s.ok());
        sketches.push_back(*std::move(s));
      }
    } else {
      ++later;
    }
    for (int64_t g = 0; g < kKv; ++g) {
      std::vector<uint16_t> want(static_cast<size_t>(call.n * 4));
      sketches[static_cast<size_t>(g)].KeyCodes(call.keys.data() + g * call.n * kDim, call.n,
                                                want.data());
      EXPECT_TRUE(std::equal(want.begin(), want.end(), call.codes.begin() + g * call.n * 4))
          << "layer " << call.layer << " first_pos " << call.first_pos << " kv head " << g;
    }
  }
  EXPECT_EQ(first_offloads, kLayers - 1);
  EXPECT_GT(later, 0);
  // An odd code length is refused before any sequence starts.
  options.sketch_dims = 7;
  EXPECT_EQ(ShardCodesFor(options, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace magicpig::engine
