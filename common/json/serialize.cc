// json::Serialize and json::Quote.
#include "common/json/serialize.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/json/string_scan.h"
#include "common/text/utf8.h"

namespace magicpig::json {
namespace {

void AppendNumber(const Value& value, std::string* out) {
  char buf[32];  // the longest shortest-round-trip double is 24 characters
  std::to_chars_result r;
  if (value.is_int()) {
    r = std::to_chars(buf, buf + sizeof(buf), value.as_int());
  } else {
    const double d = value.as_double();
    if (!std::isfinite(d)) {
      out->append("null");
      return;
    }
    r = std::to_chars(buf, buf + sizeof(buf), d);
  }
  out->append(buf, r.ptr);
}

void AppendEscapedControl(unsigned char b, std::string* out) {
  switch (b) {
    case '\b':
      out->append("\\b");
      return;
    case '\f':
      out->append("\\f");
      return;
    case '\n':
      out->append("\\n");
      return;
    case '\r':
      out->append("\\r");
      return;
    case '\t':
      out->append("\\t");
      return;
    default: {
      static constexpr char kHex[] = "0123456789abcdef";
      const char esc[6] = {'\\', 'u', '0', '0', kHex[b >> 4], kHex[b & 0xF]};
      out->append(esc, 6);
    }
  }
}

void AppendValue(const Value& value, std::string* out) {
  switch (value.type()) {
    case Value::Type::kNull:
      out->append("null");
      return;
    case Value::Type::kBool:
      out->append(value.as_bool() ? "true" : "false");
      return;
    case Value::Type::kNumber:
      AppendNumber(value, out);
      return;
    case Value::Type::kString:
      AppendQuoted(value.as_string(), out);
      return;
    case Value::Type::kArray: {
      out->push_back('[');
      bool first = true;
      for (const Value& e : value.as_array()) {
        if (!first) out->push_back(',');
        first = false;
        AppendValue(e, out);
      }
      out->push_back(']');
      return;
    }
    case Value::Type::kObject: {
      out->push_back('{');
      bool first = true;
      for (const Value::Member& m : value.as_object()) {
        if (!first) out->push_back(',');
        first = false;
        AppendQuoted(m.first, out);
        out->push_back(':');
        AppendValue(m.second, out);
      }
      out->push_back('}');
      return;
    }
  }
}

}  // namespace

void AppendQuoted(std::string_view text, std::string* out) {
  out->reserve(out->size() + text.size() + 2);
  out->push_back('"');
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = p + text.size();
  const auto* run = p;  // start of bytes copied verbatim
  for (;;) {
    while (end - p >= 8) {
      uint64_t block;
      std::memcpy(&block, p, 8);
      if (internal::HasSpecialByte(block)) break;
      p += 8;
    }
    while (p < end && *p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\') ++p;
    if (p == end) break;
    const unsigned char b = *p;
    if (b >= 0x80) {
      int bad = 0;
      const int n = text::Utf8SequenceLength(p, end, &bad);
      if (n > 0) {  // valid UTF-8 stays in the verbatim run
        p += n;
        continue;
      }
      out->append(reinterpret_cast<const char*>(run), p - run);
      out->append(text::kReplacementCharacter);
      p += bad;
    } else {
      out->append(reinterpret_cast<const char*>(run), p - run);
      if (b == '"' || b == '\\') {
        const char esc[2] = {'\\', static_cast<char>(b)};
        out->append(esc, 2);
      } else {
        AppendEscapedControl(b, out);
      }
      ++p;
    }
    run = p;
  }
  out->append(reinterpret_cast<const char*>(run), p - run);
  out->push_back('"');
}

std::string Quote(std::string_view text) {
  std::string out;
  AppendQuoted(text, &out);
  return out;
}

void AppendSerialized(const Value& value, std::string* out) { AppendValue(value, out); }

std::string Serialize(const Value& value) {
  std::string out;
  AppendValue(value, &out);
  return out;
}

}  // namespace magicpig::json
