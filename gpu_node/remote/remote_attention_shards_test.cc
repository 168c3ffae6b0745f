// RemoteAttentionShards against two in-process attention nodes (AttentionServer on loopback): the
// compute node's per-node RPC metrics count what was done — one latency observation per Attend
// round trip per range, bytes up and down at least the payloads sent and received — and a stopped
// node's failed calls are counted by gRPC status code name. Without a registry nothing is counted.
#include "gpu_node/remote/remote_attention_shards.h"

#include <chrono>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attn_node/service/attention_server.h"
#include "common/attention/simhash.h"
#include "common/metrics/metrics.h"
#include "gtest/gtest.h"
#include "tests/testing/exposition.h"
#include "tests/testing/service_test_util.h"

namespace magicpig::remote {

using ::magicpig::attention::PartialAttention;
using ::magicpig::attention::SimHash;
namespace {

constexpr int kKv = 2, kGroup = 2, kD = 32, kK = 5, kL = 12, kTokens = 256, kBlock = 64;
constexpr int kHeads = kKv * kGroup;

// The value of the sample line `series` in the registry's exposition; NaN if absent.
double Sample(const prometheus::Registry& registry, const std::string& series) {
  return magicpig::testing::ExpositionSample(metrics::Render(registry), series);
}

// Sum of every sample of `name` whose labels contain `label` (e.g. node="127.0.0.1:5").
double SumOf(const prometheus::Registry& registry, const std::string& name,
             const std::string& label) {
  const std::string text = metrics::Render(registry);
  double sum = 0;
  size_t at = 0;
  while ((at = text.find("\n" + name + "{", at)) != std::string::npos) {
    const size_t end = text.find('\n', at + 1);
    const std::string line = text.substr(at + 1, end - at - 1);
    if (line.find(label) != std::string::npos) {
      sum += std::stod(line.substr(line.rfind(' ') + 1));
    }
    at = end;
  }
  return sum;
}

v1::ShardShape Shape() {
  return magicpig::testing::MakeCreate("", {0}, kKv, kGroup, kD, kK, kL, v1::KV_DTYPE_F32,
                                       v1::ESTIMATOR_MAGICPIG, 0, 0)
      .shape();
}

class RemoteShardsMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 2; ++i) {
      nodes_.push_back(magicpig::testing::StartServer(int64_t{256} << 20, 1));
      ASSERT_NE(nodes_.back(), nullptr);
    }
    auto hash = SimHash::Create(kD, kK, kL, 11);
    ASSERT_TRUE(hash.ok());
    hash_ = std::make_unique<SimHash>(std::move(*hash));
    data_ = magicpig::testing::MakeLayer(*hash_, kKv, kTokens, 3);
    std::mt19937 rng(4);
    q_ = magicpig::testing::Randn(static_cast<size_t>(kHeads) * kD, rng);
    q_codes_.resize(static_cast<size_t>(kHeads) * kL);
    ASSERT_TRUE(hash_->Codes(q_.data(), kHeads, kD, q_codes_.data()).ok());
  }

  absl::Status Attend(RemoteAttentionShards& shards) {
    std::vector<PartialAttention> out(kHeads);
    return shards.Attend(0, q_.data(), q_codes_.data(), 1.0f / std::sqrt(static_cast<float>(kD)),
                         out.data());
  }

  std::vector<std::unique_ptr<AttentionServer>> nodes_;
  std::unique_ptr<SimHash> hash_;
  magicpig::testing::LayerData data_;
  std::vector<float> q_;
  std::vector<uint16_t> q_codes_;
};

TEST_F(RemoteShardsMetricsTest, RoundTripsBytesAndErrorsPerNode) {
  prometheus::Registry registry;  // outlives the clients
  std::vector<std::unique_ptr<AttentionNodeClient>> clients;
  for (const auto& n : nodes_) {
    clients.push_back(std::make_unique<AttentionNodeClient>(n->address(), &registry));
  }
  std::vector<std::string> labels;
  for (const auto& n : nodes_) labels.push_back("node=\"" + n->address() + "\"");
  {
    RemoteAttentionShards shards({clients[0].get(), clients[1].get()}, "seq", Shape(), 16, kBlock);
    ASSERT_TRUE(
        shards.Append(0, 0, kTokens, data_.keys.data(), data_.values.data(), data_.codes.data())
            .ok());
    std::vector<int> ranges_on(2, 0);
    for (const auto& r : shards.ranges()) ++ranges_on[static_cast<size_t>(r.node)];
    ASSERT_GT(ranges_on[0], 0);  // both nodes hold blocks
    ASSERT_GT(ranges_on[1], 0);
    // Before any Attend: no round trip yet (the rows may still be on their way: appends are
    // asynchronous, and the first Attend waits for them).
    EXPECT_EQ(Sample(registry, "magicpig_attn_rpc_latency_seconds_count{" + labels[0] + "}"), 0);

    const int steps = 3;
    for (int s = 0; s < steps; ++s) ASSERT_TRUE(Attend(shards).ok());
    const int64_t rows_bytes = int64_t{2} * kKv * kTokens * kD * 4;  // keys + values
    EXPECT_GE(SumOf(registry, "magicpig_attn_rpc_bytes_total", "direction=\"up\""), rows_bytes);
    for (int i = 0; i < 2; ++i) {
      const std::string& node = labels[static_cast<size_t>(i)];
      // One round trip per step per range held by the node.
      EXPECT_EQ(Sample(registry, "magicpig_attn_rpc_latency_seconds_count{" + node + "}"),
                steps * ranges_on[static_cast<size_t>(i)])
          << node;
      EXPECT_GT(Sample(registry, "magicpig_attn_rpc_latency_seconds_sum{" + node + "}"), 0);
      const double up =
          Sample(registry, "magicpig_attn_rpc_bytes_total{direction=\"up\"," + node + "}");
      const double down =
          Sample(registry, "magicpig_attn_rpc_bytes_total{direction=\"down\"," + node + "}");
      // Up: at least this node's KV rows and each step's q; down: each step's o per range.
      EXPECT_GE(up, rows_bytes * ranges_on[static_cast<size_t>(i)] * kBlock / kTokens +
                        steps * ranges_on[static_cast<size_t>(i)] * kHeads * kD * 4)
          << node;
      EXPECT_GE(down, steps * ranges_on[static_cast<size_t>(i)] * kHeads * kD * 4) << node;
      EXPECT_EQ(SumOf(registry, "magicpig_attn_rpc_errors_total", node), 0) << node;
    }

    // Node 1 stops: the next step fails (recoverably) and the failure is counted for node 1 only.
    nodes_[1]->Shutdown(std::chrono::system_clock::now());
    nodes_[1].reset();
    const absl::Status failed = Attend(shards);
    ASSERT_FALSE(failed.ok());
    EXPECT_TRUE(shards.IsRecoverable(failed)) << failed;
    EXPECT_GE(SumOf(registry, "magicpig_attn_rpc_errors_total", labels[1]), 1);
    EXPECT_EQ(SumOf(registry, "magicpig_attn_rpc_errors_total", labels[0]), 0);
    const std::string text = metrics::Render(registry);
    const bool named = text.find("code=\"UNAVAILABLE\"," + labels[1]) != std::string::npos ||
                       text.find("code=\"CANCELLED\"," + labels[1]) != std::string::npos;
    EXPECT_TRUE(named) << "no UNAVAILABLE / CANCELLED error series for node 1:\n" << text;
  }
}

// Appends are asynchronous: an append the node refuses (rows that do not continue the layer)
// returns OK, and the refusal, with the node's message, comes from the next call that waits for
// it; it is not a node failure (not recoverable), and the shards answered before are unchanged.
TEST_F(RemoteShardsMetricsTest, RefusedAsyncAppendIsReportedByTheNextCall) {
  AttentionNodeClient client(nodes_[0]->address());
  RemoteAttentionShards shards({&client}, "seq", Shape(), 16, kBlock);
  ASSERT_TRUE(
      shards.Append(0, 0, kTokens, data_.keys.data(), data_.values.data(), data_.codes.data())
          .ok());
  ASSERT_TRUE(Attend(shards).ok());
  // Positions 0..7 again: the node holds them already.
  ASSERT_TRUE(
      shards.Append(0, 0, 8, data_.keys.data(), data_.values.data(), data_.codes.data()).ok());
  const absl::Status refused = Attend(shards);
  ASSERT_FALSE(refused.ok());
  // The node's INVALID_ARGUMENT is this compute node's defect: INTERNAL, so the API answers 500.
  EXPECT_TRUE(absl::IsInternal(refused)) << refused;
  EXPECT_NE(refused.message().find("AppendKV"), std::string::npos) << refused;
  EXPECT_FALSE(shards.IsRecoverable(refused));
  EXPECT_TRUE(Attend(shards).ok());
}

TEST_F(RemoteShardsMetricsTest, NoRegistryCountsNothing) {
  AttentionNodeClient client(nodes_[0]->address());
  EXPECT_EQ(client.metrics().latency, nullptr);
  RemoteAttentionShards shards({&client}, "seq", Shape(), 16, kBlock);
  ASSERT_TRUE(
      shards.Append(0, 0, kTokens, data_.keys.data(), data_.values.data(), data_.codes.data())
          .ok());
  EXPECT_TRUE(Attend(shards).ok());
}

// Largest remainders against a brute-force reference: of every way to give each node the floor or
// the ceiling of its share with the right total, the one that rounds up the largest fractions
// (ties: more free memory, then the lower index); plus hand-checked cases.
TEST(ApportionBlocksTest, LargestRemaindersWithTies) {
  EXPECT_EQ(ApportionBlocks(1, {100, 100}), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(ApportionBlocks(1, {50, 100}), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(ApportionBlocks(2, {100, 100}), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(ApportionBlocks(4, {330, 70}), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(ApportionBlocks(7, {1, 1, 1}), (std::vector<int64_t>{3, 2, 2}));
  EXPECT_EQ(ApportionBlocks(5, {0, 10}), (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(ApportionBlocks(3, {0, 0}), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(ApportionBlocks(0, {5, 5}), (std::vector<int64_t>{0, 0}));
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const int nodes = 1 + static_cast<int>(rng() % 4);
    const int64_t n_blocks = static_cast<int64_t>(rng() % 9);
    std::vector<int64_t> free(static_cast<size_t>(nodes));
    for (int64_t& f : free) f = static_cast<int64_t>(rng() % 4) * 100;  // ties and zeros
    int64_t total = 0;
    for (int64_t f : free) total += f;
    const std::vector<int64_t> got = ApportionBlocks(n_blocks, free);
    if (total == 0) {
      EXPECT_EQ(got, std::vector<int64_t>(static_cast<size_t>(nodes), 0));
      continue;
    }
    // Brute force over floor/ceil choices; keep the best by (sum of rounded-up fractions, then
    // free memory of the rounded-up nodes, then lower indices first).
    std::vector<int64_t> best;
    std::vector<double> best_key;
    for (int mask = 0; mask < (1 << nodes); ++mask) {
      std::vector<int64_t> c(static_cast<size_t>(nodes));
      std::vector<std::pair<double, int64_t>> up;
      int64_t sum = 0;
      for (int i = 0; i < nodes; ++i) {
        const double share = static_cast<double>(n_blocks) * free[i] / total;
        const int64_t lo = static_cast<int64_t>(share);
        const bool ceil = (mask >> i) & 1;
        c[i] = lo + (ceil ? 1 : 0);
        if (ceil) up.push_back({share - lo, free[i]});
        sum += c[i];
      }
      if (sum != n_blocks) continue;
      // Compare lexicographically: sorted rounded-up fractions (desc), then their free memory,
      // then the mask read from node 0 (lower indices first).
      std::sort(up.rbegin(), up.rend());
      std::vector<double> key;
      for (const auto& [f, m] : up) key.push_back(f);
      for (const auto& [f, m] : up) key.push_back(static_cast<double>(m));
      for (int i = 0; i < nodes; ++i) key.push_back((mask >> i) & 1);
      if (best.empty() || key > best_key) {
        best = c;
        best_key = key;
      }
    }
    ASSERT_FALSE(best.empty());
    EXPECT_EQ(got, best) << "trial " << trial;
  }
}

// One-block regions are spread by free memory: the first sequence goes to a node (both are empty:
// the first), its reservation makes the other node the freer one, and the second goes there.
TEST_F(RemoteShardsMetricsTest, OneBlockRegionsGoToTheFreerNode) {
  AttentionNodeClient a(nodes_[0]->address()), b(nodes_[1]->address());
  RemoteAttentionShards first({&a, &b}, "first", Shape(), 16, kTokens);
  RemoteAttentionShards second({&a, &b}, "second", Shape(), 16, kTokens);
  for (RemoteAttentionShards* s : {&first, &second}) {
    ASSERT_TRUE(
        s->Append(0, 0, kTokens, data_.keys.data(), data_.values.data(), data_.codes.data()).ok());
    ASSERT_EQ(s->ranges().size(), 1u);
    EXPECT_TRUE(Attend(*s).ok());
  }
  EXPECT_EQ(first.ranges()[0].node, 0);
  EXPECT_EQ(second.ranges()[0].node, 1);
}

// A node that failed for a sequence (here: avoided from the start, as a rebuilt sequence avoids
// the nodes its predecessor lost) is tried again when no other node can take the region: it may
// have come back. Unreachable nodes give UNAVAILABLE, not "no room".
TEST_F(RemoteShardsMetricsTest, FailedNodesAreTriedAgainWhenNoOtherNodeCanTakeTheRegion) {
  AttentionNodeClient a(nodes_[0]->address()), b(nodes_[1]->address());
  RemoteAttentionShards shards({&a, &b}, "back", Shape(), 16, kTokens);
  shards.AvoidNodes({0, 1});
  ASSERT_TRUE(
      shards.Append(0, 0, kTokens, data_.keys.data(), data_.values.data(), data_.codes.data())
          .ok());
  ASSERT_EQ(shards.ranges().size(), 1u);
  EXPECT_TRUE(shards.failed().empty()) << "the node that took the region is no longer avoided";
  EXPECT_TRUE(Attend(shards).ok());

  AttentionNodeClient nowhere("127.0.0.1:1");
  RemoteAttentionShards lost({&nowhere}, "lost", Shape(), 16, kTokens);
  lost.AvoidNodes({0});
  const absl::Status s =
      lost.Append(0, 0, kTokens, data_.keys.data(), data_.values.data(), data_.codes.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("no attention node answered"), std::string::npos) << s;
  EXPECT_EQ(lost.failed(), std::vector<int>{0}) << "still avoided after the failed retry";
}

// Placement::kPack: a sequence of several blocks goes whole to the freest node (so two such
// sequences take one node each); where no node admits all of it, it is spread over both instead.
TEST_F(RemoteShardsMetricsTest, PackedSequencesTakeOneNodeEachAndSpreadWhenTooBig) {
  AttentionNodeClient a(nodes_[0]->address()), b(nodes_[1]->address());
  RemoteAttentionShards first({&a, &b}, "first", Shape(), 16, kBlock);
  RemoteAttentionShards second({&a, &b}, "second", Shape(), 16, kBlock);
  for (RemoteAttentionShards* s : {&first, &second}) {
    s->set_placement(Placement::kPack);
    ASSERT_TRUE(
        s->Append(0, 0, kTokens, data_.keys.data(), data_.values.data(), data_.codes.data()).ok());
    ASSERT_EQ(s->ranges().size(), static_cast<size_t>(kTokens / kBlock));
    EXPECT_TRUE(Attend(*s).ok());
  }
  for (const auto& r : first.ranges()) EXPECT_EQ(r.node, 0);
  for (const auto& r : second.ranges()) EXPECT_EQ(r.node, 1);
  // What one whole sequence reserves on a node.
  grpc::ClientContext ctx;
  v1::NodeStatusRequest req;
  v1::NodeStatusResponse st;
  ASSERT_TRUE(a.stub().NodeStatus(&ctx, req, &st).ok());
  const int64_t whole = st.memory_used_bytes();
  ASSERT_GT(whole, 0);

  // Two nodes with room for 80% of it each: the whole sequence is refused, the split fits.
  std::vector<std::unique_ptr<AttentionServer>> small;
  for (int i = 0; i < 2; ++i) {
    small.push_back(magicpig::testing::StartServer(whole * 4 / 5, 1));
    ASSERT_NE(small.back(), nullptr);
  }
  AttentionNodeClient c(small[0]->address()), d(small[1]->address());
  RemoteAttentionShards packed({&c, &d}, "packed", Shape(), 16, kBlock);
  packed.set_placement(Placement::kPack);
  ASSERT_TRUE(
      packed.Append(0, 0, kTokens, data_.keys.data(), data_.values.data(), data_.codes.data())
          .ok());
  std::vector<int> on(2, 0);
  for (const auto& r : packed.ranges()) ++on[static_cast<size_t>(r.node)];
  EXPECT_GT(on[0], 0);
  EXPECT_GT(on[1], 0);
  // Same partials as the packed sequence on the large nodes (blocks merge in order wherever they
  // are).
  std::vector<PartialAttention> got(kHeads), want(kHeads);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kD));
  ASSERT_TRUE(packed.Attend(0, q_.data(), q_codes_.data(), scale, got.data()).ok());
  ASSERT_TRUE(first.Attend(0, q_.data(), q_codes_.data(), scale, want.data()).ok());
  for (int h = 0; h < kHeads; ++h) {
    EXPECT_EQ(got[h].lse, want[h].lse) << h;
    EXPECT_EQ(got[h].o, want[h].o) << h;
  }
}

}  // namespace
}  // namespace magicpig::remote
