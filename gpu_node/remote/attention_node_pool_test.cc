#include "gpu_node/remote/attention_node_pool.h"

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

TEST(AttentionNodePoolTest, EmptyPool) {
  AttentionNodePool pool({}, {});
  EXPECT_TRUE(pool.empty());
}

}  // namespace
}  // namespace magicpig::remote
