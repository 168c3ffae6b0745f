#include "attn_node/service/node_flags.h"

#include "gtest/gtest.h"

namespace magicpig {
namespace {

TEST(NodeFlagsTest, ByteSizes) {
  EXPECT_EQ(*ParseByteSize("0"), 0);
  EXPECT_EQ(*ParseByteSize("1234"), 1234);
  EXPECT_EQ(*ParseByteSize("64K"), 64 << 10);
  EXPECT_EQ(*ParseByteSize("512m"), int64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("8G"), int64_t{8} << 30);
  EXPECT_EQ(*ParseByteSize("8GiB"), int64_t{8} << 30);
  EXPECT_EQ(*ParseByteSize("2TB"), int64_t{2} << 40);
  for (const char* bad : {"", "G", "-1", "1.5G", "12X", "99999999999T", "1 G"}) {
    EXPECT_EQ(ParseByteSize(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(NodeFlagsTest, Flags) {
  auto f = ParseNodeFlags(
      {"--listen", "127.0.0.1:0", "--memory-budget=2G", "--threads", "3", "--shutdown-grace=1.5"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->listen, "127.0.0.1:0");
  EXPECT_EQ(f->memory_budget_bytes, int64_t{2} << 30);
  EXPECT_EQ(f->threads, 3);
  EXPECT_DOUBLE_EQ(f->shutdown_grace_seconds, 1.5);
  EXPECT_FALSE(f->health);
  EXPECT_EQ(f->metrics_listen, "0.0.0.0:9091");

  auto d = ParseNodeFlags({});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->listen, "0.0.0.0:50051");
  EXPECT_EQ(d->memory_budget_bytes, DefaultMemoryBudget());
  EXPECT_GT(d->memory_budget_bytes, 0);
  EXPECT_TRUE(ParseNodeFlags({"--health"})->health);

  EXPECT_EQ(ParseNodeFlags({"--metrics-listen", "127.0.0.1:0"})->metrics_listen, "127.0.0.1:0");
  EXPECT_EQ(ParseNodeFlags({"--metrics-listen=[::]:9100"})->metrics_listen, "[::]:9100");
  EXPECT_EQ(ParseNodeFlags({"--metrics-listen", "off"})->metrics_listen, "");
  EXPECT_EQ(ParseNodeFlags({"--metrics-listen="})->metrics_listen, "");
  EXPECT_NE(NodeUsage().find("--metrics-listen"), std::string::npos);

  for (const std::vector<std::string>& bad :
       std::vector<std::vector<std::string>>{{"--bogus"},
                                             {"--threads"},
                                             {"--threads", "x"},
                                             {"--memory-budget", "lots"},
                                             {"--listen", "nohost"},
                                             {"--metrics-listen", "9091"},
                                             {"--metrics-listen", "host:port"},
                                             {"--metrics-listen", "host:70000"},
                                             {"--metrics-listen"},
                                             {"--health=1"},
                                             {"stray"}}) {
    auto r = ParseNodeFlags(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad[0];
  }
  EXPECT_NE(ParseNodeFlags({"--bogus"}).status().message().find("--bogus"), std::string::npos);
}

}  // namespace
}  // namespace magicpig
