// UTF-8 validation and encoding shared by the JSON parser and serializer (internal to common/json).
//
// Well-formed UTF-8 is Table 3-7 of the Unicode Standard (RFC 3629): no overlong forms, no
// encoded surrogates (U+D800..U+DFFF), nothing above U+10FFFF, no truncated sequences.
#ifndef MAGICPIG_COMMON_JSON_UTF8_H_
#define MAGICPIG_COMMON_JSON_UTF8_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace magicpig::json::internal {

// Utf8SequenceLength: the length (1..4) of the well-formed sequence starting at p (p < end), or 0
// when the bytes there are ill-formed. In that case *bad_length (if not null) is the length of the
// maximal ill-formed subpart (>= 1): the bytes one U+FFFD replaces under the Unicode
// "substitution of maximal subparts" practice, after which decoding resumes.
inline int Utf8SequenceLength(const unsigned char* p, const unsigned char* end, int* bad_length) {
  const unsigned char b0 = p[0];
  if (b0 < 0x80) return 1;
  int length;
  unsigned char lo = 0x80;  // allowed range of the second byte
  unsigned char hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    length = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    length = 3;
    if (b0 == 0xE0) lo = 0xA0;  // overlong below U+0800
    if (b0 == 0xED) hi = 0x9F;  // surrogates U+D800..U+DFFF
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    length = 4;
    if (b0 == 0xF0) lo = 0x90;  // overlong below U+10000
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    // A continuation byte, C0/C1 (always overlong) or F5..FF.
    if (bad_length != nullptr) *bad_length = 1;
    return 0;
  }
  int valid = 1;  // bytes of the sequence checked so far
  for (; valid < length; ++valid) {
    if (p + valid >= end) break;
    const unsigned char b = p[valid];
    const unsigned char min = valid == 1 ? lo : 0x80;
    const unsigned char max = valid == 1 ? hi : 0xBF;
    if (b < min || b > max) break;
  }
  if (valid == length) return length;
  if (bad_length != nullptr) *bad_length = valid;
  return 0;
}

// Appends the UTF-8 encoding of a scalar value (cp <= 0x10FFFF, not a surrogate).
inline void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    const char b[2] = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    out->append(b, 2);
  } else if (cp < 0x10000) {
    const char b[3] = {static_cast<char>(0xE0 | (cp >> 12)),
                       static_cast<char>(0x80 | ((cp >> 6) & 0x3F)),
                       static_cast<char>(0x80 | (cp & 0x3F))};
    out->append(b, 3);
  } else {
    const char b[4] = {
        static_cast<char>(0xF0 | (cp >> 18)), static_cast<char>(0x80 | ((cp >> 12) & 0x3F)),
        static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), static_cast<char>(0x80 | (cp & 0x3F))};
    out->append(b, 4);
  }
}

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

#endif  // MAGICPIG_COMMON_JSON_UTF8_H_
