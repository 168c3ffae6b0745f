// json::Parse: strict RFC 8259 parsing of untrusted text (HTTP request bodies) into a json::Value.
//
// Accepted: exactly one JSON value with optional surrounding whitespace (space, tab, LF, CR).
// Rejected, with INVALID_ARGUMENT: trailing commas, comments, NaN/Infinity, leading zeros, '+'
// signs, single quotes, unescaped control characters (< 0x20) in strings, invalid UTF-8 anywhere
// (overlong forms, UTF-8-encoded surrogates, code points above U+10FFFF, truncated sequences), a
// byte order mark, lone or mismatched \u surrogate escapes, numbers whose magnitude overflows a
// double (1e400; a tiny magnitude such as 1e-400 rounds to 0 as in every other parser), nesting
// deeper than ParseOptions::max_depth, and anything after the value. Duplicate object keys are
// accepted and the last value wins (at the position of the first), as in Python's json.
//
// Error messages say what is wrong and where, with a 1-based line and column (columns count
// characters, i.e. UTF-8 sequences) and the 0-based byte offset:
//
//   invalid JSON at line 3, column 14 (byte 52): expected ',' or '}' after an object member
//
//   MAGICPIG_ASSIGN_OR_RETURN(json::Value body, json::Parse(request_text));
//
// The parser is iterative (no recursion), so max_depth bounds memory, not stack use; cost is
// linear in the input (duplicate keys in large objects are found with a hash map).
//
// Thread-safety: a pure function.
#ifndef MAGICPIG_COMMON_JSON_PARSE_H_
#define MAGICPIG_COMMON_JSON_PARSE_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "common/json/value.h"

namespace magicpig::json {

struct ParseOptions {
  // Most arrays/objects open at once: "[[1]]" has depth 2, a scalar 0.
  int max_depth = 64;
};

absl::StatusOr<Value> Parse(std::string_view text, const ParseOptions& options = {});

}  // namespace magicpig::json

#endif  // MAGICPIG_COMMON_JSON_PARSE_H_
