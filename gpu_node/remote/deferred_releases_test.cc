#include "gpu_node/remote/deferred_releases.h"

#include <chrono>
#include <thread>

#include "attn_node/service/attention_server.h"
#include "gtest/gtest.h"
#include "tests/testing/service_test_util.h"

namespace magicpig::remote {
namespace {

// Waits up to `limit` for pred().
template <typename Pred>
bool Eventually(Pred pred, std::chrono::seconds limit = std::chrono::seconds(10)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

// A release that is added is made in the background: the node frees the sequence; an unknown
// id (NOT_FOUND: a restarted node, or a lease that ran out) also ends it.
TEST(DeferredReleasesTest, ReleasesWhenTheNodeAnswers) {
  AttentionServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.memory_budget_bytes = int64_t{64} << 20;
  options.threads = 1;
  auto server = AttentionServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  testing::Client client((*server)->address());
  ASSERT_TRUE(client
                  .Create(testing::MakeCreate("s", {0}, 2, 2, 16, 4, 6, v1::KV_DTYPE_F32,
                                              v1::ESTIMATOR_FULL, 0, 100))
                  .ok());
  ASSERT_EQ((*server)->store().Stats().sequences, 1);
  AttentionNodeClient node((*server)->address(), nullptr);
  DeferredReleases deferred(std::chrono::milliseconds(50));
  deferred.Add(&node, "s");
  deferred.Add(&node, "never-created");
  EXPECT_TRUE(Eventually([&] { return deferred.pending() == 0; }));
  EXPECT_EQ((*server)->store().Stats().sequences, 0);
  EXPECT_EQ((*server)->store().Stats().memory_used_bytes, 0);
}

// A node that does not answer keeps the release pending (until give_up_after).
TEST(DeferredReleasesTest, KeepsTryingANodeThatDoesNotAnswer) {
  AttentionNodeClient node("127.0.0.1:1", nullptr);  // nothing listens on port 1
  DeferredReleases deferred(std::chrono::milliseconds(50), std::chrono::seconds(600));
  deferred.Add(&node, "s");
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ(deferred.pending(), 1);
  DeferredReleases giving_up(std::chrono::milliseconds(50), std::chrono::seconds(0));
  giving_up.Add(&node, "s");
  EXPECT_TRUE(Eventually([&] { return giving_up.pending() == 0; }));
}

}  // namespace
}  // namespace magicpig::remote
