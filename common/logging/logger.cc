// Leveled logger, sinks and key=value formatting (see logger.h).
#include "common/logging/logger.h"

#include <unistd.h>

#include <cerrno>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace magicpig::logging {
namespace {

constexpr char kAcceptedLevels[] = "debug, info, warning, error, off";

char LevelLetter(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return 'D';
    case LogLevel::kInfo:
      return 'I';
    case LogLevel::kWarning:
      return 'W';
    case LogLevel::kError:
      return 'E';
    case LogLevel::kOff:
      break;
  }
  return '?';
}

// Appends `c` as a backslash escape when it needs one inside a quoted value or a message; returns
// false (appending nothing) otherwise.
bool AppendEscaped(char c, std::string* out) {
  switch (c) {
    case '\n':
      out->append("\\n");
      return true;
    case '\r':
      out->append("\\r");
      return true;
    case '\t':
      out->append("\\t");
      return true;
    default:
      break;
  }
  const auto b = static_cast<unsigned char>(c);
  if (b < 0x20 || b == 0x7F) {
    absl::StrAppendFormat(out, "\\x%02X", b);
    return true;
  }
  return false;
}

bool NeedsQuotes(std::string_view value) {
  if (value.empty()) return true;
  for (char c : value) {
    const auto b = static_cast<unsigned char>(c);
    if (c == ' ' || c == '"' || c == '\\' || b < 0x20 || b == 0x7F) return true;
  }
  return false;
}

}  // namespace

std::vector<std::pair<std::string, LogLevel>> LogLevelChoices() {
  std::vector<std::pair<std::string, LogLevel>> choices;
  for (LogLevel level :
       {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarning, LogLevel::kError, LogLevel::kOff}) {
    choices.emplace_back(std::string(LogLevelName(level)), level);
  }
  return choices;
}

absl::StatusOr<LogLevel> ParseLogLevel(std::string_view name) {
  for (const auto& [text, level] : LogLevelChoices()) {
    if (name == text) return level;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown log level \"", std::string(name),
                                                 "\" (accepted: ", kAcceptedLevels, ")"));
}

std::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
    case LogLevel::kOff:
      return "off";
  }
  return "unknown";
}

void StderrLogSink::Write(std::string_view line) {
  absl::MutexLock lock(&mu_);
  // One write(2) per line; the loop only matters for a short write or a signal.
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

void MemoryLogSink::Write(std::string_view line) {
  if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
  absl::MutexLock lock(&mu_);
  lines_.emplace_back(line);
}

std::vector<std::string> MemoryLogSink::lines() const {
  absl::MutexLock lock(&mu_);
  return lines_;
}

Logger::Logger(std::string component, LogLevel min_level)
    : Logger(std::move(component), min_level, nullptr) {}

Logger::Logger(std::string component, LogLevel min_level, LogSink* sink)
    : component_(std::move(component)), min_level_(min_level), sink_(sink) {
  if (sink_ == nullptr) {
    owned_sink_ = std::make_unique<StderrLogSink>();
    sink_ = owned_sink_.get();
  }
}

void Logger::Log(LogLevel level, std::string_view message) const {
  if (!Enabled(level)) return;
  std::string line = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
  line.reserve(line.size() + component_.size() + message.size() + 5);
  line.push_back(' ');
  line.push_back(LevelLetter(level));
  line.push_back(' ');
  line.append(component_);
  line.push_back(' ');
  for (char c : message) {
    if (c == '\n' || c == '\r') {
      AppendEscaped(c, &line);
    } else {
      line.push_back(c);
    }
  }
  line.push_back('\n');
  sink_->Write(line);
}

std::string Truncated(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  size_t cut = max_bytes;
  // Back off over continuation bytes so that a multi-byte character is not split.
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  std::string out(text.substr(0, cut));
  out.append("...");
  return out;
}

std::string KeyValues(std::initializer_list<std::pair<std::string_view, std::string>> fields) {
  std::string out;
  for (const auto& [key, value] : fields) {
    if (!out.empty()) out.push_back(' ');
    out.append(key);
    out.push_back('=');
    if (!NeedsQuotes(value)) {
      out.append(value);
      continue;
    }
    out.push_back('"');
    for (char c : value) {
      if (c == '"' || c == '\\') {
        out.push_back('\\');
        out.push_back(c);
      } else if (!AppendEscaped(c, &out)) {
        out.push_back(c);
      }
    }
    out.push_back('"');
  }
  return out;
}

}  // namespace magicpig::logging
