// Tests for the leveled logger: level names, filtering, the line format, KeyValues quoting and
// whole lines under concurrent logging.
#include "common/logging/logger.h"

#include <algorithm>
#include <regex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace magicpig::logging {
namespace {

TEST(LogLevelTest, NamesRoundTrip) {
  for (LogLevel level :
       {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarning, LogLevel::kError, LogLevel::kOff}) {
    absl::StatusOr<LogLevel> parsed = ParseLogLevel(LogLevelName(level));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, level);
  }
  EXPECT_EQ(LogLevelName(LogLevel::kWarning), "warning");
}

TEST(LogLevelTest, UnknownNamesAreErrorsThatListTheAcceptedValues) {
  for (const char* name : {"", "INFO", "warn", "verbose", "info ", "3"}) {
    absl::StatusOr<LogLevel> parsed = ParseLogLevel(name);
    ASSERT_FALSE(parsed.ok()) << name;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find("debug, info, warning, error, off"),
              std::string_view::npos)
        << parsed.status();
    EXPECT_NE(parsed.status().message().find(absl::StrCat("\"", name, "\"")),
              std::string_view::npos)
        << parsed.status();
  }
}

TEST(LoggerTest, WritesOnlyLevelsAtOrAboveTheMinimum) {
  MemoryLogSink sink;
  Logger logger("api", LogLevel::kWarning, &sink);
  EXPECT_FALSE(logger.Enabled(LogLevel::kDebug));
  EXPECT_FALSE(logger.Enabled(LogLevel::kInfo));
  EXPECT_TRUE(logger.Enabled(LogLevel::kWarning));
  EXPECT_TRUE(logger.Enabled(LogLevel::kError));
  EXPECT_FALSE(logger.Enabled(LogLevel::kOff));
  logger.Log(LogLevel::kDebug, "d");
  logger.Log(LogLevel::kInfo, "i");
  logger.Log(LogLevel::kWarning, "w");
  logger.Log(LogLevel::kError, "e");
  logger.Log(LogLevel::kOff, "never");
  std::vector<std::string> lines = sink.lines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_TRUE(lines[0].ends_with(" W api w")) << lines[0];
  EXPECT_TRUE(lines[1].ends_with(" E api e")) << lines[1];

  logger.set_min_level(LogLevel::kDebug);
  EXPECT_EQ(logger.min_level(), LogLevel::kDebug);
  logger.Log(LogLevel::kDebug, "d2");
  logger.set_min_level(LogLevel::kOff);
  logger.Log(LogLevel::kError, "dropped");
  lines = sink.lines();
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_TRUE(lines[2].ends_with(" D api d2")) << lines[2];
}

TEST(LoggerTest, LineFormat) {
  MemoryLogSink sink;
  Logger logger("attn", LogLevel::kDebug, &sink);
  const absl::Time before = absl::Now();
  logger.Log(LogLevel::kInfo, "sequence=7 tokens=12");
  const absl::Time after = absl::Now();
  const std::vector<std::string> lines = sink.lines();
  ASSERT_EQ(lines.size(), 1u);
  const std::regex kLine(
      R"(^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z) I attn sequence=7 tokens=12$)");
  std::smatch m;
  ASSERT_TRUE(std::regex_match(lines[0], m, kLine)) << lines[0];
  absl::Time t;
  std::string error;
  ASSERT_TRUE(absl::ParseTime("%Y-%m-%dT%H:%M:%E3SZ", m[1].str(), absl::UTCTimeZone(), &t, &error))
      << error;
  // The stamp is truncated to milliseconds.
  EXPECT_GE(t, absl::FromUnixMillis(absl::ToUnixMillis(before)));
  EXPECT_LE(t, after);
}

TEST(LoggerTest, LevelLetters) {
  MemoryLogSink sink;
  Logger logger("x", LogLevel::kDebug, &sink);
  logger.Log(LogLevel::kDebug, "m");
  logger.Log(LogLevel::kInfo, "m");
  logger.Log(LogLevel::kWarning, "m");
  logger.Log(LogLevel::kError, "m");
  const std::vector<std::string> lines = sink.lines();
  ASSERT_EQ(lines.size(), 4u);
  const char kLetters[] = {'D', 'I', 'W', 'E'};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(lines[i].substr(25), std::string(1, kLetters[i]) + " x m") << lines[i];
  }
}

TEST(LoggerTest, LineBreaksInTheMessageStayOnOneLine) {
  MemoryLogSink sink;
  Logger logger("api", LogLevel::kInfo, &sink);
  logger.Log(LogLevel::kInfo, "a\nb\r\nc");
  const std::vector<std::string> lines = sink.lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(lines[0].ends_with(" I api a\\nb\\r\\nc")) << lines[0];
}

TEST(LoggerTest, NullLoggerHelpers) {
  EXPECT_FALSE(ShouldLog(nullptr, LogLevel::kError));
  LogIf(nullptr, LogLevel::kError, "nothing happens");
  MemoryLogSink sink;
  Logger logger("api", LogLevel::kInfo, &sink);
  EXPECT_TRUE(ShouldLog(&logger, LogLevel::kInfo));
  EXPECT_FALSE(ShouldLog(&logger, LogLevel::kDebug));
  LogIf(&logger, LogLevel::kInfo, "one");
  LogIf(&logger, LogLevel::kDebug, "filtered");
  EXPECT_EQ(sink.lines().size(), 1u);
}

TEST(LoggerTest, ConcurrentLinesStayWhole) {
  MemoryLogSink sink;
  Logger logger("api", LogLevel::kInfo, &sink);
  constexpr int kThreads = 8;
  constexpr int kLines = 1000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&logger, t] {
      for (int i = 0; i < kLines; ++i) {
        logger.Log(LogLevel::kInfo,
                   KeyValues({{"thread", absl::StrCat(t)},
                              {"line", absl::StrCat(i)},
                              {"pad", std::string(40, static_cast<char>('a' + t))}}));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const std::vector<std::string> lines = sink.lines();
  ASSERT_EQ(lines.size(), static_cast<size_t>(kThreads * kLines));
  const std::regex kLine(R"(^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z )"
                         R"(I api thread=(\d) line=(\d+) pad=([a-h]{40})$)");
  absl::flat_hash_set<std::pair<int, int>> seen;
  std::vector<int> next(kThreads, 0);
  for (const std::string& line : lines) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, kLine)) << line;
    const int t = std::stoi(m[1].str());
    const int i = std::stoi(m[2].str());
    ASSERT_EQ(m[3].str(), std::string(40, static_cast<char>('a' + t)));
    ASSERT_TRUE(seen.insert({t, i}).second) << line;
    // Each thread's lines arrive in the order it wrote them.
    ASSERT_EQ(i, next[t]) << line;
    ++next[t];
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kThreads * kLines));
}

TEST(LoggerTest, StderrSinkWritesWholeLines) {
  // The default sink: the line and its '\n' reach file descriptor 2.
  testing::internal::CaptureStderr();
  {
    Logger logger("api", LogLevel::kInfo);
    logger.Log(LogLevel::kInfo, "to stderr");
    logger.Log(LogLevel::kDebug, "not written");
  }
  const std::string captured = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(captured.ends_with(" I api to stderr\n")) << captured;
  EXPECT_EQ(captured.find("not written"), std::string::npos);
  EXPECT_EQ(std::count(captured.begin(), captured.end(), '\n'), 1);
}

TEST(KeyValuesTest, QuotesOnlyWhenNeeded) {
  EXPECT_EQ(KeyValues({}), "");
  EXPECT_EQ(KeyValues({{"id", "chatcmpl-1"}, {"status", "200"}}), "id=chatcmpl-1 status=200");
  EXPECT_EQ(KeyValues({{"error", "bad request"}}), "error=\"bad request\"");
  EXPECT_EQ(KeyValues({{"e", ""}}), "e=\"\"");
  EXPECT_EQ(KeyValues({{"e", "say \"hi\""}}), "e=\"say \\\"hi\\\"\"");
  EXPECT_EQ(KeyValues({{"e", "a\"b"}}), "e=\"a\\\"b\"");
  EXPECT_EQ(KeyValues({{"e", "back\\slash"}}), "e=\"back\\\\slash\"");
  EXPECT_EQ(KeyValues({{"e", "two\nlines\t\x01"}}), "e=\"two\\nlines\\t\\x01\"");
  EXPECT_EQ(KeyValues({{"path", "/v1/chat/completions"}, {"k", "a=b"}}),
            "path=/v1/chat/completions k=a=b");
  EXPECT_EQ(KeyValues({{"text", "caf\xC3\xA9"}}), "text=caf\xC3\xA9");  // UTF-8 passes through
}

TEST(TruncatedTest, CutsLongTextAtACharacterBoundary) {
  EXPECT_EQ(Truncated("short", 10), "short");
  EXPECT_EQ(Truncated("exactly10!", 10), "exactly10!");
  EXPECT_EQ(Truncated("0123456789abc", 10), "0123456789...");
  EXPECT_EQ(Truncated("", 0), "");
  EXPECT_EQ(Truncated("abc", 0), "...");
  // "caf\xC3\xA9s": a cut inside the two-byte e-acute backs off before it.
  EXPECT_EQ(Truncated("caf\xC3\xA9s", 4), "caf...");
  EXPECT_EQ(Truncated("caf\xC3\xA9s", 5), "caf\xC3\xA9...");
  // A four-byte character cut after its first, second or third byte.
  for (size_t max = 2; max <= 4; ++max) {
    EXPECT_EQ(Truncated("a\xF0\x9F\x98\x80"
                        "b",
                        max),
              "a...")
        << max;
  }
}

}  // namespace
}  // namespace magicpig::logging
