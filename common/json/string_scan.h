// Word-at-a-time scanning of JSON string bytes shared by the parser and serializer (internal to
// common/json). UTF-8 validation and encoding live in common/text/utf8.h.
#ifndef MAGICPIG_COMMON_JSON_STRING_SCAN_H_
#define MAGICPIG_COMMON_JSON_STRING_SCAN_H_

#include <cstdint>

namespace magicpig::json::internal {

// True when any of the 8 bytes of x (a little-endian load of string bytes) needs attention in a
// JSON string: < 0x20, '"', '\\' or >= 0x80. The parser and serializer skip plain 8-byte blocks.
inline bool HasSpecialByte(uint64_t x) {
  constexpr uint64_t kOnes = 0x0101010101010101ull;
  constexpr uint64_t kHighs = 0x8080808080808080ull;
  // Classic "has zero byte" / "has byte less than n" tests; exact for the any-byte question.
  const uint64_t less_than_space = (x - kOnes * 0x20) & ~x;
  const uint64_t q = x ^ (kOnes * '"');
  const uint64_t quote = (q - kOnes) & ~q;
  const uint64_t s = x ^ (kOnes * '\\');
  const uint64_t backslash = (s - kOnes) & ~s;
  return ((less_than_space | quote | backslash | x) & kHighs) != 0;
}

}  // namespace magicpig::json::internal

#endif  // MAGICPIG_COMMON_JSON_STRING_SCAN_H_
