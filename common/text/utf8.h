// UTF-8 encoding, validation and decoding shared by the JSON parser and serializer, the tokenizer's
// byte-level alphabet and streaming text output.
//
// Well-formed UTF-8 is Table 3-7 of the Unicode Standard (RFC 3629): no overlong forms, no
// encoded surrogates (U+D800..U+DFFF), nothing above U+10FFFF, no truncated sequences. The
// validation and encoding functions are inline because the JSON string scanners call them per
// character.
//
// Thread-safety: every function is pure (no shared state) and safe to call from any thread.
#ifndef MAGICPIG_COMMON_TEXT_UTF8_H_
#define MAGICPIG_COMMON_TEXT_UTF8_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace magicpig::text {

// The encoding of U+FFFD REPLACEMENT CHARACTER.
inline constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";

// The length (1..4) of the sequence that lead byte `b` starts, or 0 when `b` cannot start a
// well-formed sequence (a continuation byte 80..BF, C0/C1, F5..FF). Only the lead byte is looked
// at: the bytes after it may still make the sequence ill-formed (see Utf8SequenceLength).
inline int Utf8LeadLength(unsigned char b) {
  if (b < 0x80) return 1;
  if (b < 0xC2) return 0;
  if (b < 0xE0) return 2;
  if (b < 0xF0) return 3;
  if (b < 0xF5) return 4;
  return 0;
}

// The length (1..4) of the well-formed sequence starting at p (p < end), or 0 when the bytes there
// are ill-formed. In that case *bad_length (if not null) is the length of the maximal ill-formed
// subpart (>= 1): the bytes one U+FFFD replaces under the Unicode "substitution of maximal
// subparts" practice, after which decoding resumes. A sequence cut short by `end` whose bytes are
// all allowed so far (so more bytes could complete it) has p + *bad_length == end and
// Utf8LeadLength(*p) > *bad_length.
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

// Appends the UTF-8 encoding of a scalar value (cp <= 0x10FFFF, not a surrogate) to *out.
inline void AppendUtf8(char32_t cp, std::string* out) {
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

// Decodes the well-formed sequence starting at p (p < end): returns its length (1..4) and stores
// the scalar value in *cp, or returns 0 (leaving *cp alone) when the bytes are ill-formed, with
// *bad_length (if not null) set as by Utf8SequenceLength.
int DecodeUtf8(const unsigned char* p, const unsigned char* end, char32_t* cp,
               int* bad_length = nullptr);

// DecodeUtf8 of s[pos..] (pos < s.size()).
int DecodeUtf8(std::string_view s, size_t pos, char32_t* cp, int* bad_length = nullptr);

}  // namespace magicpig::text

#endif  // MAGICPIG_COMMON_TEXT_UTF8_H_
