// json::Serialize: compact JSON text from a json::Value, always valid JSON and valid UTF-8.
//
// - Integers (is_int) print exactly; other numbers print the shortest text that parses back to the
//   same double (std::to_chars); NaN and infinities, which JSON cannot express, print as null.
// - Strings escape '"', '\\' and control characters (\b \f \n \r \t, others as \u00XX); everything
//   else, non-ASCII included, is written as UTF-8. Bytes that are not valid UTF-8 (a producer may
//   hand us raw bytes, e.g. a token cut in the middle of a character) become U+FFFD, one per
//   maximal ill-formed subpart as the Unicode Standard recommends.
// - Object members keep their order; no whitespace is added.
//
//   std::string body = json::Serialize(response);
//   // A hand-built streaming chunk:
//   absl::StrAppend(&chunk, "{\"delta\":{\"content\":", json::Quote(piece), "}}");
//
// Serialization recurses once per nesting level; a parsed value is bounded by
// ParseOptions::max_depth.
//
// Thread-safety: pure functions.
#ifndef MAGICPIG_COMMON_JSON_SERIALIZE_H_
#define MAGICPIG_COMMON_JSON_SERIALIZE_H_

#include <string>
#include <string_view>

#include "common/json/value.h"

namespace magicpig::json {

std::string Serialize(const Value& value);

// Appends the serialization of `value` to *out.
void AppendSerialized(const Value& value, std::string* out);

// A JSON string literal (with the quotes) for `text`, escaped as Serialize escapes strings.
std::string Quote(std::string_view text);

// Appends Quote(text) to *out.
void AppendQuoted(std::string_view text, std::string* out);

}  // namespace magicpig::json

#endif  // MAGICPIG_COMMON_JSON_SERIALIZE_H_
