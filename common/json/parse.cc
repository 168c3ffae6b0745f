// json::Parse: an iterative strict RFC 8259 parser with located error messages.
#include "common/json/parse.h"

#include <charconv>
#include <cstdint>
#include <cstring>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json/string_scan.h"
#include "common/text/utf8.h"

namespace magicpig::json {
namespace {

// Objects up to this many members are checked for duplicate keys pairwise; larger ones through a
// hash map, so a hostile object with many keys stays linear.
constexpr size_t kPairwiseDedupLimit = 16;

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A byte for an error message: 'x' when printable ASCII, otherwise 0xNN.
std::string DescribeByte(char c) {
  const auto b = static_cast<unsigned char>(c);
  if (b >= 0x21 && b < 0x7F) return std::string{'\'', c, '\''};
  return absl::StrFormat("byte 0x%02X", b);
}

// Applies "the last value wins, at the position of the first" to an object's members.
void RemoveDuplicateKeys(Value::Members& members) {
  const size_t n = members.size();
  if (n < 2) return;
  size_t out = 0;
  if (n <= kPairwiseDedupLimit) {
    for (size_t i = 0; i < n; ++i) {
      size_t j = 0;
      while (j < out && members[j].first != members[i].first) ++j;
      if (j < out) {
        members[j].second = std::move(members[i].second);
      } else {
        if (out != i) members[out] = std::move(members[i]);
        ++out;
      }
    }
  } else {
    // Views point into members[0, out), which do not move again.
    absl::flat_hash_map<std::string_view, size_t> index;
    index.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      auto it = index.find(members[i].first);
      if (it != index.end()) {
        members[it->second].second = std::move(members[i].second);
      } else {
        if (out != i) members[out] = std::move(members[i]);
        index.emplace(members[out].first, out);
        ++out;
      }
    }
  }
  members.resize(out);
}

class Parser {
 public:
  Parser(std::string_view text, const ParseOptions& options)
      : begin_(text.data()),
        p_(text.data()),
        end_(text.data() + text.size()),
        max_depth_(options.max_depth < 0 ? 0 : static_cast<size_t>(options.max_depth)) {}

  absl::StatusOr<Value> Run();

 private:
  // An array or object being filled.
  struct Frame {
    bool is_object;
    Value::Elements elements;
    Value::Members members;
    std::string key;  // the key of the member whose value is being parsed
  };

  // Records the first error; always returns false so callers can `return Fail(...)`.
  bool Fail(const char* at, std::string message) {
    error_at_ = at;
    error_ = std::move(message);
    return false;
  }
  absl::Status ErrorStatus() const;

  void SkipWhitespace() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  bool StartsWith(std::string_view s) const {
    return static_cast<size_t>(end_ - p_) >= s.size() && std::memcmp(p_, s.data(), s.size()) == 0;
  }

  bool ParseScalar(Value* out);
  bool ParseString(std::string* out);
  bool ParseEscape(std::string* out);
  bool ParseHex4(const char* at, uint32_t* out);
  bool ParseNumber(Value* out);
  bool ParseLiteral(Value* out);
  bool ParseKeyAndColon(std::string* key);
  bool FailExpectedValue();

  const char* const begin_;
  const char* p_;
  const char* const end_;
  const size_t max_depth_;
  const char* error_at_ = nullptr;
  std::string error_;
};

absl::Status Parser::ErrorStatus() const {
  int64_t line = 1;
  const char* line_start = begin_;
  for (const char* q = begin_; q < error_at_; ++q) {
    if (*q == '\n') {
      ++line;
      line_start = q + 1;
    }
  }
  int64_t column = 1;
  for (const char* q = line_start; q < error_at_; ++q) {
    if ((static_cast<unsigned char>(*q) & 0xC0) != 0x80) ++column;  // not a continuation byte
  }
  return absl::InvalidArgumentError(absl::StrCat("invalid JSON at line ", line, ", column ", column,
                                                 " (byte ", error_at_ - begin_, "): ", error_));
}

absl::StatusOr<Value> Parser::Run() {
  std::vector<Frame> stack;
  Value value;
  for (;;) {
    // Expecting a value.
    SkipWhitespace();
    if (p_ < end_ && (*p_ == '[' || *p_ == '{')) {
      const bool is_object = *p_ == '{';
      if (stack.size() >= max_depth_) {
        Fail(p_, absl::StrCat("nesting deeper than ", max_depth_, " levels (the parser's limit)"));
        return ErrorStatus();
      }
      ++p_;
      stack.push_back(Frame{is_object, {}, {}, {}});
      SkipWhitespace();
      const char close = is_object ? '}' : ']';
      if (p_ < end_ && *p_ == close) {
        ++p_;
        value = is_object ? Value::Object() : Value::Array();
        stack.pop_back();
      } else {
        if (is_object && !ParseKeyAndColon(&stack.back().key)) return ErrorStatus();
        continue;  // parse the first element / member value
      }
    } else if (!ParseScalar(&value)) {
      return ErrorStatus();
    }

    // `value` is complete: add it to the enclosing container, closing containers as they end.
    for (;;) {
      if (stack.empty()) {
        SkipWhitespace();
        if (p_ != end_) {
          Fail(p_, absl::StrCat("unexpected ", DescribeByte(*p_), " after the JSON value"));
          return ErrorStatus();
        }
        return value;
      }
      Frame& frame = stack.back();
      if (frame.is_object) {
        frame.members.emplace_back(std::move(frame.key), std::move(value));
      } else {
        frame.elements.push_back(std::move(value));
      }
      SkipWhitespace();
      const char close = frame.is_object ? '}' : ']';
      const char* what = frame.is_object ? "an object member" : "an array element";
      if (p_ == end_) {
        Fail(p_, absl::StrCat("unexpected end of input: expected ',' or '", std::string(1, close),
                              "' after ", what));
        return ErrorStatus();
      }
      if (*p_ == ',') {
        ++p_;
        SkipWhitespace();
        if (p_ < end_ && *p_ == close) {
          Fail(p_, absl::StrCat("trailing comma before '", std::string(1, close), "'"));
          return ErrorStatus();
        }
        if (frame.is_object && !ParseKeyAndColon(&frame.key)) return ErrorStatus();
        break;  // parse the next value
      }
      if (*p_ != close) {
        Fail(p_, absl::StrCat("expected ',' or '", std::string(1, close), "' after ", what));
        return ErrorStatus();
      }
      ++p_;
      if (frame.is_object) {
        RemoveDuplicateKeys(frame.members);
        value = Value::Object();
        value.mutable_object() = std::move(frame.members);
      } else {
        value = Value::Array(std::move(frame.elements));
      }
      stack.pop_back();
    }
  }
}

bool Parser::FailExpectedValue() {
  if (p_ == end_) {
    if (p_ == begin_) return Fail(p_, "empty input: expected a JSON value");
    return Fail(p_, "unexpected end of input: expected a value");
  }
  const char c = *p_;
  if (StartsWith("NaN") || StartsWith("Infinity") || StartsWith("-Infinity")) {
    return Fail(p_, "NaN and Infinity are not valid JSON numbers");
  }
  if (c == '\'') return Fail(p_, "strings must be in double quotes, not single quotes");
  if (c == '/') return Fail(p_, "comments are not allowed in JSON");
  if (c == '+' || c == '.') return Fail(p_, "invalid number: it must start with a digit or '-'");
  if (p_ == begin_ && StartsWith("\xEF\xBB\xBF")) {
    return Fail(p_, "a byte order mark is not allowed");
  }
  return Fail(p_, absl::StrCat("unexpected ", DescribeByte(c), ": expected a value"));
}

bool Parser::ParseScalar(Value* out) {
  if (p_ == end_) return FailExpectedValue();
  switch (*p_) {
    case '"': {
      std::string s;
      if (!ParseString(&s)) return false;
      *out = Value(std::move(s));
      return true;
    }
    case '-':
    case '0':
    case '1':
    case '2':
    case '3':
    case '4':
    case '5':
    case '6':
    case '7':
    case '8':
    case '9':
      return ParseNumber(out);
    case 't':
    case 'f':
    case 'n':
      return ParseLiteral(out);
    default:
      return FailExpectedValue();
  }
}

bool Parser::ParseLiteral(Value* out) {
  if (StartsWith("true")) {
    p_ += 4;
    *out = Value(true);
  } else if (StartsWith("false")) {
    p_ += 5;
    *out = Value(false);
  } else if (StartsWith("null")) {
    p_ += 4;
    *out = Value();
  } else {
    return Fail(p_, "invalid literal: expected true, false or null");
  }
  return true;
}

bool Parser::ParseKeyAndColon(std::string* key) {
  // Whitespace before the key has been skipped.
  if (p_ == end_) return Fail(p_, "unexpected end of input: expected a string key");
  if (*p_ != '"') {
    if (*p_ == '\'') return Fail(p_, "object keys must be in double quotes, not single quotes");
    return Fail(p_, absl::StrCat("unexpected ", DescribeByte(*p_),
                                 ": expected an object key in double quotes"));
  }
  key->clear();
  if (!ParseString(key)) return false;
  SkipWhitespace();
  if (p_ == end_) return Fail(p_, "unexpected end of input: expected ':' after an object key");
  if (*p_ != ':') return Fail(p_, "expected ':' after an object key");
  ++p_;
  return true;
}

bool Parser::ParseString(std::string* out) {
  const char* open = p_;
  ++p_;
  const char* run = p_;  // start of bytes copied verbatim
  for (;;) {
    while (end_ - p_ >= 8) {
      uint64_t block;
      std::memcpy(&block, p_, 8);
      if (internal::HasSpecialByte(block)) break;
      p_ += 8;
    }
    while (p_ < end_) {
      const auto b = static_cast<unsigned char>(*p_);
      if (b < 0x20 || b >= 0x80 || b == '"' || b == '\\') break;
      ++p_;
    }
    if (p_ == end_) return Fail(open, "unterminated string (no closing '\"')");
    const auto b = static_cast<unsigned char>(*p_);
    if (b == '"') {
      out->append(run, p_);
      ++p_;
      return true;
    }
    if (b == '\\') {
      out->append(run, p_);
      if (!ParseEscape(out)) return false;
      run = p_;
    } else if (b < 0x20) {
      return Fail(p_, absl::StrFormat("control character U+%04X in a string must be escaped", b));
    } else {
      const int n = text::Utf8SequenceLength(reinterpret_cast<const unsigned char*>(p_),
                                             reinterpret_cast<const unsigned char*>(end_), nullptr);
      if (n == 0) return Fail(p_, absl::StrFormat("invalid UTF-8 (byte 0x%02X) in a string", b));
      p_ += n;
    }
  }
}

bool Parser::ParseHex4(const char* at, uint32_t* out) {
  // at points at the 'u'.
  if (end_ - at < 5) return Fail(at - 1, "invalid \\u escape: expected 4 hex digits");
  uint32_t v = 0;
  for (int i = 1; i <= 4; ++i) {
    const int h = HexValue(at[i]);
    if (h < 0) return Fail(at - 1, "invalid \\u escape: expected 4 hex digits");
    v = v * 16 + static_cast<uint32_t>(h);
  }
  *out = v;
  return true;
}

bool Parser::ParseEscape(std::string* out) {
  const char* backslash = p_;
  if (end_ - p_ < 2) return Fail(p_, "unterminated string (input ends in an escape)");
  const char c = p_[1];
  p_ += 2;
  switch (c) {
    case '"':
      out->push_back('"');
      return true;
    case '\\':
      out->push_back('\\');
      return true;
    case '/':
      out->push_back('/');
      return true;
    case 'b':
      out->push_back('\b');
      return true;
    case 'f':
      out->push_back('\f');
      return true;
    case 'n':
      out->push_back('\n');
      return true;
    case 'r':
      out->push_back('\r');
      return true;
    case 't':
      out->push_back('\t');
      return true;
    case 'u':
      break;
    default:
      return Fail(backslash,
                  absl::StrCat("invalid escape \\", DescribeByte(c),
                               " in a string (valid: \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)"));
  }
  uint32_t cp;
  if (!ParseHex4(backslash + 1, &cp)) return false;
  p_ = backslash + 6;
  if (cp >= 0xDC00 && cp <= 0xDFFF) {
    return Fail(backslash, absl::StrFormat("lone low surrogate \\u%04X (it must follow a "
                                           "\\uD800-\\uDBFF high surrogate)",
                                           cp));
  }
  if (cp >= 0xD800 && cp <= 0xDBFF) {
    if (!(end_ - p_ >= 2 && p_[0] == '\\' && p_[1] == 'u')) {
      return Fail(backslash, absl::StrFormat("lone high surrogate \\u%04X (it must be followed by "
                                             "a \\uDC00-\\uDFFF low surrogate)",
                                             cp));
    }
    uint32_t low;
    if (!ParseHex4(p_ + 1, &low)) return false;
    if (low < 0xDC00 || low > 0xDFFF) {
      return Fail(backslash, absl::StrFormat("high surrogate \\u%04X followed by \\u%04X, which is "
                                             "not a \\uDC00-\\uDFFF low surrogate",
                                             cp, low));
    }
    p_ += 6;
    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
  }
  text::AppendUtf8(cp, out);
  return true;
}

bool Parser::ParseNumber(Value* out) {
  const char* start = p_;
  const bool negative = *p_ == '-';
  if (negative) ++p_;
  if (p_ == end_ || !IsDigit(*p_)) {
    if (StartsWith("Infinity")) return Fail(start, "NaN and Infinity are not valid JSON numbers");
    return Fail(p_, "invalid number: expected a digit after '-'");
  }
  const char* digits = p_;
  if (*p_ == '0') {
    ++p_;
    if (p_ < end_ && IsDigit(*p_))
      return Fail(start, "invalid number: leading zeros are not allowed");
  } else {
    while (p_ < end_ && IsDigit(*p_)) ++p_;
  }
  const char* int_end = p_;
  bool integer = true;
  if (p_ < end_ && *p_ == '.') {
    integer = false;
    ++p_;
    if (p_ == end_ || !IsDigit(*p_)) {
      return Fail(p_, "invalid number: expected a digit after the decimal point");
    }
    while (p_ < end_ && IsDigit(*p_)) ++p_;
  }
  const char* mantissa_end = p_;
  if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
    integer = false;
    ++p_;
    if (p_ < end_ && (*p_ == '+' || *p_ == '-')) ++p_;
    if (p_ == end_ || !IsDigit(*p_)) {
      return Fail(p_, "invalid number: expected a digit in the exponent");
    }
    while (p_ < end_ && IsDigit(*p_)) ++p_;
  }

  if (integer && int_end - digits <= 19) {
    uint64_t u = 0;
    for (const char* q = digits; q < int_end; ++q) u = u * 10 + static_cast<uint64_t>(*q - '0');
    constexpr uint64_t kMaxPositive = static_cast<uint64_t>(INT64_MAX);
    if (!negative && u <= kMaxPositive) {
      *out = Value(static_cast<int64_t>(u));
      return true;
    }
    if (negative && u != 0 && u <= kMaxPositive + 1) {
      *out = Value(u == kMaxPositive + 1 ? INT64_MIN : -static_cast<int64_t>(u));
      return true;
    }
    // "-0" and integers beyond int64 are plain doubles.
  }

  double d = 0;
  const auto [ptr, ec] = std::from_chars(start, p_, d);
  if (ec == std::errc::result_out_of_range) {
    // Overflow or underflow: the magnitude's decimal exponent is the literal's exponent plus the
    // position of the first non-zero digit. Out of range is only reported far from 10^0.
    int64_t exponent = 0;
    if (mantissa_end != p_) {
      const char* e = mantissa_end + 1;
      const bool negative_exponent = *e == '-';
      if (*e == '+' || *e == '-') ++e;
      for (; e < p_; ++e) {
        if (exponent < 1'000'000'000) exponent = exponent * 10 + (*e - '0');
      }
      if (negative_exponent) exponent = -exponent;
    }
    int64_t position = 0;  // 10^position is the first non-zero digit's place value
    const char* first = digits;
    while (first < mantissa_end && (*first == '0' || *first == '.')) ++first;
    if (first < int_end) {
      position = int_end - first - 1;
    } else {
      position = -(first - int_end);  // first - int_end counts the '.', so this is -(zeros + 1)
    }
    if (exponent + position < 0) {
      *out = Value(negative ? -0.0 : 0.0);
      return true;
    }
    return Fail(start, "number out of range for a double");
  }
  if (ec != std::errc() || ptr != p_) return Fail(start, "invalid number");  // not expected
  *out = Value(d);
  return true;
}

}  // namespace

absl::StatusOr<Value> Parse(std::string_view text, const ParseOptions& options) {
  return Parser(text, options).Run();
}

}  // namespace magicpig::json
