// A small leveled logger for the nodes' per-request and per-sequence lines.
//
// Each line is "<UTC time> <level letter> <component> <message>", e.g.
//   2026-11-27T09:31:02.123Z I api id=chatcmpl-7 endpoint=/v1/completions status=200
// There is no global logger: a process creates one Logger (per component) and passes a pointer to
// the parts that log; a null Logger* means "no logging" (see LogIf and ShouldLog).
//
//   logging::Logger logger("api", logging::LogLevel::kInfo);  // lines go to stderr
//   logging::LogIf(&logger, logging::LogLevel::kInfo,
//                  logging::KeyValues({{"id", id}, {"status", absl::StrCat(status)}}));
//
// Thread-safety: Logger is thread-safe: Enabled, Log and set_min_level may be called from any
// thread at the same time, and every line reaches the sink whole (never interleaved with another).
// LogSink implementations must accept concurrent Write calls; the ones here do.
#ifndef MAGICPIG_COMMON_LOGGING_LOGGER_H_
#define MAGICPIG_COMMON_LOGGING_LOGGER_H_

#include <atomic>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace magicpig::logging {

// In increasing severity; a Logger writes the lines at or above its minimum level. kOff as the
// minimum level writes nothing (and is not a level to log at).
enum class LogLevel { kDebug, kInfo, kWarning, kError, kOff };

// "debug", "info", "warning", "error" or "off" (exactly these, lower case) -> the level; anything
// else is InvalidArgument naming the accepted values.
absl::StatusOr<LogLevel> ParseLogLevel(std::string_view name);

// The name ParseLogLevel accepts for `level` ("info", ...).
std::string_view LogLevelName(LogLevel level);

// Every level with its name, least severe first (for a command-line choice, --log-level).
std::vector<std::pair<std::string, LogLevel>> LogLevelChoices();

// Where a Logger's lines go. Write receives one complete line ending in '\n' and may be called
// from several threads at once.
class LogSink {
 public:
  virtual ~LogSink() = default;
  virtual void Write(std::string_view line) = 0;
};

// Writes each line to stderr (file descriptor 2) with a single write(2) call, under a mutex, so
// lines from different threads never interleave. Write errors are ignored.
class StderrLogSink : public LogSink {
 public:
  void Write(std::string_view line) override;

 private:
  absl::Mutex mu_;
};

// Keeps the lines in memory (without their '\n'), for tests.
class MemoryLogSink : public LogSink {
 public:
  void Write(std::string_view line) override;
  // A copy of the lines written so far, in order.
  std::vector<std::string> lines() const;

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

class Logger {
 public:
  // Writes to stderr (through its own StderrLogSink). `component` names the process part in each
  // line, e.g. "api" or "attn".
  Logger(std::string component, LogLevel min_level);
  // Writes to `sink`, which is not owned and must outlive the logger (null: stderr, as above).
  Logger(std::string component, LogLevel min_level, LogSink* sink);

  Logger(const Logger&) = delete;
  Logger& operator=(const Logger&) = delete;

  // Whether a line at `level` would be written: one relaxed atomic load, so callers can skip
  // building a message nobody reads.
  bool Enabled(LogLevel level) const {
    return level != LogLevel::kOff && level >= min_level_.load(std::memory_order_relaxed);
  }

  // Writes "<time> <letter> <component> <message>\n" when Enabled(level). The time is UTC,
  // ISO 8601 with milliseconds ("2026-11-27T09:31:02.123Z"); the letter is D, I, W or E. Line
  // breaks in `message` are written as \n and \r so that one call is always one line.
  void Log(LogLevel level, std::string_view message) const;

  LogLevel min_level() const { return min_level_.load(std::memory_order_relaxed); }
  void set_min_level(LogLevel level) { min_level_.store(level, std::memory_order_relaxed); }
  const std::string& component() const { return component_; }

 private:
  const std::string component_;
  std::atomic<LogLevel> min_level_;
  std::unique_ptr<LogSink> owned_sink_;  // the stderr sink, when none was given
  LogSink* sink_;                        // set once in the constructor
};

// True when `logger` is not null and writes lines at `level`.
inline bool ShouldLog(const Logger* logger, LogLevel level) {
  return logger != nullptr && logger->Enabled(level);
}

// logger->Log(level, message) unless `logger` is null.
inline void LogIf(const Logger* logger, LogLevel level, std::string_view message) {
  if (logger != nullptr) logger->Log(level, message);
}

// "key=value key=value ..." in the given order. A value is written in double quotes, with '"',
// '\\' and control characters backslash-escaped, when it is empty or contains a space, '"', '\\'
// or a control character; otherwise as it is. Keys are written as they are.
std::string KeyValues(std::initializer_list<std::pair<std::string_view, std::string>> fields);

// `text` cut to at most `max_bytes` bytes (at a UTF-8 character boundary) with "..." appended when
// it was longer: for client-chosen values (ids, error messages quoting them) in log lines.
std::string Truncated(std::string_view text, size_t max_bytes);

}  // namespace magicpig::logging

#endif  // MAGICPIG_COMMON_LOGGING_LOGGER_H_
