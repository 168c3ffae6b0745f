#include "attn_node/service/node_flags.h"

#include <stdlib.h>

#include "gtest/gtest.h"

namespace magicpig {
namespace {

TEST(NodeFlagsTest, Flags) {
  auto f = ParseNodeFlags({"--listen", "127.0.0.1:0", "--memory-budget=2G", "--threads", "3",
                           "--shutdown-grace=1.5", "--log-level", "warning"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->listen, "127.0.0.1:0");
  EXPECT_EQ(f->memory_budget_bytes, int64_t{2} << 30);
  EXPECT_EQ(f->threads, 3);
  EXPECT_DOUBLE_EQ(f->shutdown_grace_seconds, 1.5);
  EXPECT_EQ(f->log_level, logging::LogLevel::kWarning);
  EXPECT_FALSE(f->health);
  EXPECT_FALSE(f->help);
  EXPECT_EQ(f->metrics_listen, "0.0.0.0:9091");

  auto d = ParseNodeFlags({});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->listen, "0.0.0.0:50051");
  EXPECT_EQ(d->memory_budget_bytes, DefaultMemoryBudget());
  EXPECT_GT(d->memory_budget_bytes, 0);
  EXPECT_EQ(d->log_level, logging::LogLevel::kInfo);
  EXPECT_TRUE(ParseNodeFlags({"--health"})->health);
  EXPECT_TRUE(ParseNodeFlags({"--help"})->help);

  EXPECT_EQ(ParseNodeFlags({"--metrics-listen", "127.0.0.1:0"})->metrics_listen, "127.0.0.1:0");
  EXPECT_EQ(ParseNodeFlags({"--metrics-listen=[::]:9100"})->metrics_listen, "[::]:9100");
  EXPECT_EQ(ParseNodeFlags({"--metrics-listen", "off"})->metrics_listen, "");
  EXPECT_NE(NodeUsage().find("--metrics-listen"), std::string::npos);
  EXPECT_NE(NodeUsage().find("half the RAM"), std::string::npos);

  for (const std::vector<std::string>& bad :
       std::vector<std::vector<std::string>>{{"--bogus"},
                                             {"--threads"},
                                             {"--threads", "x"},
                                             {"--threads", "5000"},
                                             {"--memory-budget", "lots"},
                                             {"--listen", "nohost"},
                                             {"--shutdown-grace", "-1"},
                                             {"--metrics-listen", "9091"},
                                             {"--metrics-listen", "host:port"},
                                             {"--metrics-listen", "host:70000"},
                                             {"--metrics-listen"},
                                             {"--log-level", "loud"},
                                             {"stray"}}) {
    auto r = ParseNodeFlags(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad[0];
    EXPECT_NE(r.status().message().find(bad[0]), std::string::npos) << r.status();
  }
}

// Kubernetes passes the node's settings as MAGICPIG_* variables (deploy/base/attn-node.env).
TEST(NodeFlagsTest, Environment) {
  setenv("MAGICPIG_MEMORY_BUDGET", "6G", 1);
  setenv("MAGICPIG_SHUTDOWN_GRACE", "30", 1);
  auto f = ParseNodeFlags({});
  unsetenv("MAGICPIG_MEMORY_BUDGET");
  unsetenv("MAGICPIG_SHUTDOWN_GRACE");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->memory_budget_bytes, int64_t{6} << 30);
  EXPECT_DOUBLE_EQ(f->shutdown_grace_seconds, 30);
}

}  // namespace
}  // namespace magicpig
