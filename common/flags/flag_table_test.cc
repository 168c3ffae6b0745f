#include "common/flags/flag_table.h"

#include <stdlib.h>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace magicpig::flags {
namespace {

using ::testing::HasSubstr;

enum class Mode { kA, kB };

// A table over every kind of flag, as a command declares it.
struct Options {
  std::string model;
  int threads = 0;
  double grace = 30;
  int64_t budget = 1 << 20;
  Mode mode = Mode::kB;
  bool verbose = false;
  std::vector<std::string> nodes;
  std::vector<std::string> stops;
};

struct Fixture {
  Options o;
  FlagTable table{"prog sub", "does a thing"};
  Fixture() {
    table.Section("Model");
    table.Text("model", &o.model, "FILE", "the model");
    table.Require("model");
    table.Section("Run");
    table.Number("threads", &o.threads, "threads", 0, 64);
    table.Number("grace", &o.grace, "seconds", 0.0, 1e9);
    table.Bytes("budget", &o.budget, "bytes to use");
    table.Choice("mode", &o.mode, "which mode", {{"a", Mode::kA}, {"b", Mode::kB}});
    table.Switch("verbose", &o.verbose, "say more");
    table.List("nodes", &o.nodes, "A,B", "the nodes");
    table.Repeated("stop", &o.stops, "TEXT", "stop string");
  }
};

TEST(FlagTableTest, ParsesEveryKindAndKeepsDefaults) {
  Fixture f;
  ASSERT_TRUE(
      f.table
          .Parse({"--model", "m.gguf", "--threads=3", "--grace", "1.5", "--budget", "2G", "--mode",
                  "a", "--verbose", "--nodes", "x:1,,y:2", "--stop", "a", "--stop=b"})
          .ok());
  EXPECT_EQ(f.o.model, "m.gguf");
  EXPECT_EQ(f.o.threads, 3);
  EXPECT_DOUBLE_EQ(f.o.grace, 1.5);
  EXPECT_EQ(f.o.budget, int64_t{2} << 30);
  EXPECT_EQ(f.o.mode, Mode::kA);
  EXPECT_TRUE(f.o.verbose);
  EXPECT_EQ(f.o.nodes, (std::vector<std::string>{"x:1", "y:2"}));
  EXPECT_EQ(f.o.stops, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(f.table.Given("threads"));
  EXPECT_FALSE(f.table.help_requested());

  Fixture d;
  ASSERT_TRUE(d.table.Parse({"--model=m"}).ok());
  EXPECT_EQ(d.o.threads, 0);
  EXPECT_EQ(d.o.budget, 1 << 20);
  EXPECT_EQ(d.o.mode, Mode::kB);
  EXPECT_FALSE(d.o.verbose);
  EXPECT_FALSE(d.table.Given("threads"));
}

TEST(FlagTableTest, LastValueWins) {
  Fixture f;
  ASSERT_TRUE(f.table.Parse({"--model", "a", "--threads", "1", "--threads", "2"}).ok());
  EXPECT_EQ(f.o.threads, 2);
}

TEST(FlagTableTest, ErrorsNameTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--model", "m", "--bogus", "1"}, "--bogus"},
      {{"--model", "m", "stray"}, "stray"},
      {{"--model"}, "--model"},
      {{}, "--model"},  // required
      {{"--model", "m", "--threads", "x"}, "--threads: expected an integer, got 'x'"},
      {{"--model", "m", "--threads", "65"}, "--threads: must be in [0, 64], got 65"},
      {{"--model", "m", "--threads", "-1"}, "--threads"},
      {{"--model", "m", "--grace", "nan"}, "--grace: expected a number"},
      {{"--model", "m", "--budget", "lots"}, "--budget: byte size 'lots'"},
      {{"--model", "m", "--mode", "c"}, "--mode: expected one of a|b, got 'c'"},
  };
  for (const auto& [args, message] : cases) {
    Fixture f;
    absl::Status s = f.table.Parse(args);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_THAT(std::string(s.message()), HasSubstr(message));
  }
}

TEST(FlagTableTest, EnvironmentSetsAbsentFlagsAndIsChecked) {
  ASSERT_EQ(EnvName("lsh-k"), "MAGICPIG_LSH_K");
  setenv("MAGICPIG_THREADS", "7", 1);
  setenv("MAGICPIG_MODEL", "env.gguf", 1);
  setenv("MAGICPIG_VERBOSE", "true", 1);
  {
    Fixture f;
    ASSERT_TRUE(f.table.Parse({}).ok());  // the required --model comes from the environment
    EXPECT_EQ(f.o.model, "env.gguf");
    EXPECT_EQ(f.o.threads, 7);
    EXPECT_TRUE(f.o.verbose);
    EXPECT_TRUE(f.table.Given("threads"));
  }
  {
    Fixture f;  // the command line wins over the environment
    ASSERT_TRUE(f.table.Parse({"--threads", "2"}).ok());
    EXPECT_EQ(f.o.threads, 2);
  }
  setenv("MAGICPIG_THREADS", "999", 1);
  {
    Fixture f;
    EXPECT_THAT(std::string(f.table.Parse({}).message()), HasSubstr("--threads: must be in"));
  }
  unsetenv("MAGICPIG_THREADS");
  unsetenv("MAGICPIG_MODEL");
  unsetenv("MAGICPIG_VERBOSE");
}

TEST(FlagTableTest, HelpSkipsRequiredChecks) {
  Fixture f;
  ASSERT_TRUE(f.table.Parse({"--help"}).ok());
  EXPECT_TRUE(f.table.help_requested());
}

TEST(FlagTableTest, HelpAndMarkdownListEveryFlagWithDefaultAndEnv) {
  Fixture f;
  const std::string help = f.table.Help();
  const std::string md = f.table.Markdown();
  EXPECT_THAT(help, HasSubstr("usage: prog sub [options]"));
  EXPECT_THAT(help, HasSubstr("Model:\n  --model FILE"));
  EXPECT_THAT(help, HasSubstr("threads [0, 64] (default 0) [MAGICPIG_THREADS]"));
  EXPECT_THAT(help, HasSubstr("--mode a|b"));
  EXPECT_THAT(help, HasSubstr("(default b)"));
  EXPECT_THAT(md, HasSubstr("## `prog sub`"));
  EXPECT_THAT(md, HasSubstr("| `--model FILE` | `MAGICPIG_MODEL` | required | the model |"));
  EXPECT_THAT(md, HasSubstr("| `--mode a\\|b` | `MAGICPIG_MODE` | b | which mode |"));
  for (const FlagInfo& info : f.table.flags()) {
    EXPECT_THAT(help, HasSubstr("--" + info.name)) << info.name;
    EXPECT_THAT(md, HasSubstr("`--" + info.name)) << info.name;
  }
  for (absl::string_view line : absl::StrSplit(help, '\n')) {
    EXPECT_LE(line.size(), 100u) << line;
  }
}

}  // namespace
}  // namespace magicpig::flags
