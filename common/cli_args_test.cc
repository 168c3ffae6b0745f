#include "common/cli_args.h"

#include "gtest/gtest.h"

namespace magicpig {
namespace {

TEST(CliArgsTest, ParsesValuesBoolsAndRepeats) {
  auto a = CliArgs::Parse({"--model", "m.gguf", "--stop=x", "--stop", "y", "--chat", "--seed=5"},
                          {"model", "stop", "seed"}, {"chat"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->Get("model"), "m.gguf");
  EXPECT_EQ(a->GetAll("stop"), (std::vector<std::string>{"x", "y"}));
  EXPECT_TRUE(a->Has("chat"));
  EXPECT_EQ(*a->GetInt("seed", 0), 5);
  EXPECT_EQ(*a->GetInt("missing", 9), 9);
}

TEST(CliArgsTest, ErrorsNameTheFlag) {
  auto unknown = CliArgs::Parse({"--bogus", "1"}, {"model"}, {});
  EXPECT_NE(unknown.status().message().find("--bogus"), std::string::npos);
  auto missing = CliArgs::Parse({"--model"}, {"model"}, {});
  EXPECT_NE(missing.status().message().find("needs a value"), std::string::npos);
  auto a = CliArgs::Parse({"--seed", "abc"}, {"seed"}, {});
  ASSERT_TRUE(a.ok());
  EXPECT_NE(a->GetInt("seed", 0).status().message().find("--seed"), std::string::npos);
}

}  // namespace
}  // namespace magicpig
