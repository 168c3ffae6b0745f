#include "gpu_node/remote/attention_node_pool.h"

#include <algorithm>
#include <array>
#include <set>
#include <string>

#include "absl/strings/ascii.h"
#include "gtest/gtest.h"
#include "tests/testing/service_test_util.h"

namespace magicpig::remote {
namespace {

// Channels connect lazily: a pool over addresses nobody serves is enough to check what MakeShards
// sets up before the first RPC.
TEST(AttentionNodePoolTest, MakesShardsThatAvoidFailedNodes) {
  AttentionNodePool pool({"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"},
                         {.coalesce_attend = true, .placement = Placement::kSpread});
  ASSERT_EQ(pool.nodes().size(), 3u);
  EXPECT_FALSE(pool.empty());
  magicpig::v1::ShardShape shape;
  shape.add_layers(1);
  auto fresh = pool.MakeShards(shape, 128, 64);
  EXPECT_TRUE(AttentionNodePool::FailedNodes(fresh.get()).empty());
  EXPECT_EQ(AttentionNodePool::NodeSet(fresh.get()), 0u);  // nothing placed yet
  auto again = pool.MakeShards(shape, 128, 64, {2, 0});
  EXPECT_EQ(AttentionNodePool::FailedNodes(again.get()), (std::vector<int>{2, 0}));
  EXPECT_EQ(AttentionNodePool::FailedNodes(nullptr), std::vector<int>{});
  EXPECT_EQ(AttentionNodePool::NodeSet(nullptr), 0u);
}

// Node-side ids carry 128 random bits: never repeated, nothing in common with the process or the
// pool that a client elsewhere could guess.
TEST(AttentionNodePoolTest, SequenceIdsAreRandom128Bit) {
  std::set<std::string> ids;
  std::array<int, 16> nibbles{};
  for (int i = 0; i < 2000; ++i) {
    const std::string id = AttentionNodePool::NewSequenceId();
    ASSERT_EQ(id.size(), 4u + 32u) << id;
    ASSERT_EQ(id.substr(0, 4), "seq-");
    for (char c : id.substr(4)) {
      ASSERT_TRUE(absl::ascii_isxdigit(c) && !absl::ascii_isupper(c)) << id;
      ++nibbles[c <= '9' ? c - '0' : c - 'a' + 10];
    }
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 2000u);
  // 64,000 nibbles: each of the 16 values 4,000 times on average (sd ~61); within 6 sd.
  for (int count : nibbles) EXPECT_NEAR(count, 4000, 370);
  AttentionNodePool pool({"127.0.0.1:1"}, {});
  magicpig::v1::ShardShape shape;
  auto a = pool.MakeShards(shape, 16, 16);
  auto b = pool.MakeShards(shape, 16, 16);
  EXPECT_NE(a->sequence_id(), b->sequence_id());
  EXPECT_EQ(a->sequence_id().size(), 36u);
}

// At start a pool asks every node to drop what a previous run of its instance (same owner, same
// instance name, another incarnation) left; other owners' and instances' sequences stay. A node
// that does not answer is counted and left to its lease.
TEST(AttentionNodePoolTest, StartDropsWhatThePreviousRunLeft) {
  auto node = testing::StartServer(int64_t{1} << 30, 1);
  ASSERT_NE(node, nullptr);
  auto create = [&](const std::string& token, const std::string& instance, const std::string& id) {
    testing::Client c(node->address(), {{fabric::kOwnerTokenKey, token},
                                        {fabric::kInstanceKey, instance},
                                        {fabric::kIncarnationKey, "before-the-crash"}});
    const grpc::Status s = c.Create(
        testing::MakeCreate(id, {0}, 1, 1, 16, 2, 2, v1::KV_DTYPE_F32, v1::ESTIMATOR_FULL, 0, 64));
    ASSERT_TRUE(s.ok()) << s.error_message();
  };
  create("t", "pod-a", "left-1");
  create("t", "pod-a", "left-2");
  create("t", "pod-b", "other-instance");
  create("u", "pod-a", "other-owner");
  ASSERT_EQ(node->store().Stats().sequences, 4);

  NodeConnection connection;
  connection.identity = std::make_shared<const fabric::CallIdentity>("t", "pod-a");
  AttentionNodePool pool({node->address(), "127.0.0.1:1"}, {.connection = connection});
  EXPECT_EQ(pool.stale_release().sequences, 2);
  EXPECT_GT(pool.stale_release().bytes, 0);
  EXPECT_EQ(pool.stale_release().unanswered, 1);
  std::vector<std::string> left;
  for (const SequenceSummary& s : node->store().HeldSequences()) left.push_back(s.id);
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"other-instance", "other-owner"}));
}

TEST(AttentionNodePoolTest, EmptyPool) {
  AttentionNodePool pool({}, {});
  EXPECT_TRUE(pool.empty());
}

}  // namespace
}  // namespace magicpig::remote
