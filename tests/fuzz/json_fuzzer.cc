// libFuzzer target for common/json: arbitrary bytes must never crash the parser; whatever parses
// must serialize to text that parses back to an equal value and serializes identically; and any
// bytes quoted as a JSON string must parse back (the serializer's output is always valid JSON).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/json/parse.h"
#include "common/json/serialize.h"
#include "common/json/value.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using magicpig::json::Parse;
  using magicpig::json::Quote;
  using magicpig::json::Serialize;
  using magicpig::json::Value;
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  absl::StatusOr<Value> v = Parse(text);
  if (v.ok()) {
    const std::string once = Serialize(*v);
    absl::StatusOr<Value> back = Parse(once);
    if (!back.ok()) __builtin_trap();                // our own output must parse
    if (!(*back == *v)) __builtin_trap();            // to the same value
    if (Serialize(*back) != once) __builtin_trap();  // and serialization is a fixed point
  } else if (v.status().message().find("invalid JSON at line ") != 0) {
    __builtin_trap();  // every error is located
  }

  const std::string quoted = Quote(text);
  absl::StatusOr<Value> s = Parse(quoted);
  if (!s.ok() || !s->is_string()) __builtin_trap();
  if (Quote(s->as_string()) != quoted) __builtin_trap();
  return 0;
}
