#include "gpu_node/remote/attention_node_pool.h"

#include <array>
#include <set>
#include <string>

#include "absl/strings/ascii.h"
#include "gtest/gtest.h"

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

TEST(AttentionNodePoolTest, EmptyPool) {
  AttentionNodePool pool({}, {});
  EXPECT_TRUE(pool.empty());
}

}  // namespace
}  // namespace magicpig::remote
