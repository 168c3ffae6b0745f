// Tests for common/text/utf8.h against references that do not share its code: the rows of Unicode
// Table 3-7 written out as data, the byte patterns of Unicode Table 3-6, worked examples from the
// standard, and the C library's own UTF-8 encoder (c32rtomb in the C.UTF-8 locale).
#include "common/text/utf8.h"

#include <algorithm>
#include <climits>
#include <clocale>
#include <cstdint>
#include <cuchar>
#include <cwchar>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace magicpig::text {
namespace {

// Unicode Table 3-7 "Well-Formed UTF-8 Byte Sequences", one row per line: the allowed range of
// each byte.
struct Range {
  unsigned char lo;
  unsigned char hi;
};
struct Row {
  int length;
  Range bytes[4];
};
constexpr Row kTable37[] = {
    {1, {{0x00, 0x7F}}},
    {2, {{0xC2, 0xDF}, {0x80, 0xBF}}},
    {3, {{0xE0, 0xE0}, {0xA0, 0xBF}, {0x80, 0xBF}}},
    {3, {{0xE1, 0xEC}, {0x80, 0xBF}, {0x80, 0xBF}}},
    {3, {{0xED, 0xED}, {0x80, 0x9F}, {0x80, 0xBF}}},
    {3, {{0xEE, 0xEF}, {0x80, 0xBF}, {0x80, 0xBF}}},
    {4, {{0xF0, 0xF0}, {0x90, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}}},
    {4, {{0xF1, 0xF3}, {0x80, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}}},
    {4, {{0xF4, 0xF4}, {0x80, 0x8F}, {0x80, 0xBF}, {0x80, 0xBF}}},
};

// True when the first k bytes of s match the first k ranges of `row` (k <= row.length).
bool RowPrefixMatches(const Row& row, const unsigned char* s, int k) {
  for (int i = 0; i < k; ++i) {
    if (s[i] < row.bytes[i].lo || s[i] > row.bytes[i].hi) return false;
  }
  return true;
}

// Reference Utf8SequenceLength over the n bytes at s: the length of the row that matches, else 0
// with *bad the longest k (at least 1) whose first k bytes start some row.
int ReferenceSequenceLength(const unsigned char* s, int n, int* bad) {
  for (const Row& row : kTable37) {
    if (row.length <= n && RowPrefixMatches(row, s, row.length)) return row.length;
  }
  *bad = 1;
  for (const Row& row : kTable37) {
    for (int k = std::min(row.length - 1, n); k > *bad; --k) {
      if (RowPrefixMatches(row, s, k)) {
        *bad = k;
        break;
      }
    }
  }
  return 0;
}

// The encoding of cp by the bit patterns of Unicode Table 3-6 (written independently of
// AppendUtf8: the payload bits are taken with masks from the top down).
std::string Table36Encoding(char32_t cp) {
  std::string s;
  if (cp <= 0x7F) {
    s.push_back(static_cast<char>(cp));
  } else if (cp <= 0x7FF) {
    s.push_back(static_cast<char>(0b11000000 | ((cp & 0x7C0) >> 6)));
    s.push_back(static_cast<char>(0b10000000 | (cp & 0x3F)));
  } else if (cp <= 0xFFFF) {
    s.push_back(static_cast<char>(0b11100000 | ((cp & 0xF000) >> 12)));
    s.push_back(static_cast<char>(0b10000000 | ((cp & 0xFC0) >> 6)));
    s.push_back(static_cast<char>(0b10000000 | (cp & 0x3F)));
  } else {
    s.push_back(static_cast<char>(0b11110000 | ((cp & 0x1C0000) >> 18)));
    s.push_back(static_cast<char>(0b10000000 | ((cp & 0x3F000) >> 12)));
    s.push_back(static_cast<char>(0b10000000 | ((cp & 0xFC0) >> 6)));
    s.push_back(static_cast<char>(0b10000000 | (cp & 0x3F)));
  }
  return s;
}

bool IsSurrogate(char32_t cp) { return cp >= 0xD800 && cp <= 0xDFFF; }

std::string Encode(char32_t cp) {
  std::string s;
  AppendUtf8(cp, &s);
  return s;
}

// Utf8SequenceLength over the bytes of s; *bad is -1 unless it was written.
int SequenceLength(const std::string& s, int* bad) {
  *bad = -1;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  return Utf8SequenceLength(p, p + s.size(), bad);
}

TEST(Utf8Test, ExamplesFromTheStandard) {
  // Unicode Table 3-4 and RFC 3629 section 7.
  EXPECT_EQ(Encode(0x004D), "\x4D");
  EXPECT_EQ(Encode(0x0430), "\xD0\xB0");
  EXPECT_EQ(Encode(0x4E8C), "\xE4\xBA\x8C");
  EXPECT_EQ(Encode(0x10302), "\xF0\x90\x8C\x82");
  EXPECT_EQ(Encode(0xD55C), "\xED\x95\x9C");
  EXPECT_EQ(Encode(0x233B4), "\xF0\xA3\x8E\xB4");
  EXPECT_EQ(Encode(0xFEFF), "\xEF\xBB\xBF");
  // The ends of each length.
  EXPECT_EQ(Encode(0x00), std::string(1, '\0'));
  EXPECT_EQ(Encode(0x7F), "\x7F");
  EXPECT_EQ(Encode(0x80), "\xC2\x80");
  EXPECT_EQ(Encode(0x7FF), "\xDF\xBF");
  EXPECT_EQ(Encode(0x800), "\xE0\xA0\x80");
  EXPECT_EQ(Encode(0xFFFF), "\xEF\xBF\xBF");
  EXPECT_EQ(Encode(0x10000), "\xF0\x90\x80\x80");
  EXPECT_EQ(Encode(0x10FFFF), "\xF4\x8F\xBF\xBF");
  EXPECT_EQ(Encode(0xFFFD), kReplacementCharacter);
}

TEST(Utf8Test, EveryScalarValueRoundTrips) {
  std::string appended;
  for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (IsSurrogate(cp)) continue;
    const std::string s = Encode(cp);
    ASSERT_EQ(s, Table36Encoding(cp)) << std::hex << cp;
    int bad;
    ASSERT_EQ(SequenceLength(s, &bad), static_cast<int>(s.size())) << std::hex << cp;
    ASSERT_EQ(bad, -1) << std::hex << cp;
    char32_t decoded = 0xFFFFFFFF;
    ASSERT_EQ(DecodeUtf8(s, 0, &decoded), static_cast<int>(s.size())) << std::hex << cp;
    ASSERT_EQ(static_cast<uint32_t>(decoded), cp);
    ASSERT_EQ(Utf8LeadLength(static_cast<unsigned char>(s[0])), static_cast<int>(s.size()));
    // AppendUtf8 appends (it does not overwrite).
    if (cp % 4093 == 0) {
      const size_t before = appended.size();
      AppendUtf8(cp, &appended);
      ASSERT_EQ(appended.substr(before), s);
    }
  }
}

TEST(Utf8Test, EncoderAgreesWithTheCLibrary) {
  // Skipped where the C library has no C.UTF-8 locale.
  const char* old = std::setlocale(LC_CTYPE, nullptr);
  const std::string saved = old != nullptr ? old : "C";
  if (std::setlocale(LC_CTYPE, "C.UTF-8") == nullptr) GTEST_SKIP() << "no C.UTF-8 locale";
  for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (IsSurrogate(cp)) continue;
    char buf[MB_LEN_MAX];
    std::mbstate_t state{};
    const size_t n = std::c32rtomb(buf, cp, &state);
    ASSERT_NE(n, static_cast<size_t>(-1)) << std::hex << cp;
    ASSERT_EQ(Encode(cp), std::string(buf, n)) << std::hex << cp;
  }
  std::setlocale(LC_CTYPE, saved.c_str());
}

TEST(Utf8Test, LeadLengthMatchesTable37) {
  for (int b = 0; b < 256; ++b) {
    int expected = 0;
    for (const Row& row : kTable37) {
      if (b >= row.bytes[0].lo && b <= row.bytes[0].hi) expected = row.length;
    }
    EXPECT_EQ(Utf8LeadLength(static_cast<unsigned char>(b)), expected) << b;
  }
}

// Checks Utf8SequenceLength and DecodeUtf8 on the n bytes at s against the reference.
void CheckAgainstReference(const unsigned char* s, int n) {
  int expected_bad = -1;
  const int expected = ReferenceSequenceLength(s, n, &expected_bad);
  int bad = -1;
  const int got = Utf8SequenceLength(s, s + n, &bad);
  ASSERT_EQ(got, expected) << std::hex << int{s[0]} << " " << (n > 1 ? int{s[1]} : -1) << " "
                           << (n > 2 ? int{s[2]} : -1) << " " << (n > 3 ? int{s[3]} : -1);
  if (expected == 0) {
    ASSERT_EQ(bad, expected_bad) << std::hex << int{s[0]} << " " << (n > 1 ? int{s[1]} : -1);
  } else {
    ASSERT_EQ(bad, -1);  // left alone for a well-formed sequence
  }
  // The null bad_length form and DecodeUtf8 agree.
  ASSERT_EQ(Utf8SequenceLength(s, s + n, nullptr), expected);
  char32_t cp = 0x12345678;
  int decode_bad = -1;
  ASSERT_EQ(DecodeUtf8(s, s + n, &cp, &decode_bad), expected);
  if (expected == 0) {
    ASSERT_EQ(static_cast<uint32_t>(cp), 0x12345678u);
    ASSERT_EQ(decode_bad, expected_bad);
  } else {
    ASSERT_EQ(Encode(cp), std::string(reinterpret_cast<const char*>(s), expected));
  }
}

TEST(Utf8Test, EveryInputOfUpToThreeBytesMatchesTable37) {
  unsigned char s[3];
  for (int b0 = 0; b0 < 256; ++b0) {
    s[0] = static_cast<unsigned char>(b0);
    ASSERT_NO_FATAL_FAILURE(CheckAgainstReference(s, 1));
    for (int b1 = 0; b1 < 256; ++b1) {
      s[1] = static_cast<unsigned char>(b1);
      ASSERT_NO_FATAL_FAILURE(CheckAgainstReference(s, 2));
      for (int b2 = 0; b2 < 256; ++b2) {
        s[2] = static_cast<unsigned char>(b2);
        ASSERT_NO_FATAL_FAILURE(CheckAgainstReference(s, 3));
      }
    }
  }
}

TEST(Utf8Test, FourByteInputsMatchTable37) {
  // Every lead and second byte; the last two bytes from the edges of the ranges.
  const unsigned char kEdges[] = {0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xFF};
  unsigned char s[4];
  for (int b0 = 0; b0 < 256; ++b0) {
    for (int b1 = 0; b1 < 256; ++b1) {
      for (unsigned char b2 : kEdges) {
        for (unsigned char b3 : kEdges) {
          s[0] = static_cast<unsigned char>(b0);
          s[1] = static_cast<unsigned char>(b1);
          s[2] = b2;
          s[3] = b3;
          ASSERT_NO_FATAL_FAILURE(CheckAgainstReference(s, 4));
        }
      }
    }
  }
}

struct Case {
  std::string bytes;
  int length;  // expected Utf8SequenceLength
  int bad;     // expected *bad_length when length == 0
};

TEST(Utf8Test, Table37Boundaries) {
  const Case kCases[] = {
      // C0 and C1 only start overlong 2-byte forms.
      {"\xC0\x80", 0, 1},
      {"\xC0\xAF", 0, 1},
      {"\xC1\xBF", 0, 1},
      {"\xC2\x80", 2, 0},
      {"\xDF\xBF", 2, 0},
      // E0 needs A0..BF (80..9F would be overlong).
      {"\xE0\x80\x80", 0, 1},
      {"\xE0\x9F\xBF", 0, 1},
      {"\xE0\xA0\x80", 3, 0},
      {"\xE0\xBF\xBF", 3, 0},
      // ED needs 80..9F (A0..BF would be surrogates U+D800..U+DFFF).
      {"\xED\x9F\xBF", 3, 0},
      {"\xED\xA0\x80", 0, 1},
      {"\xED\xAD\xBF", 0, 1},
      {"\xED\xB0\x80", 0, 1},
      {"\xED\xBF\xBF", 0, 1},
      {"\xEE\x80\x80", 3, 0},
      // F0 needs 90..BF (80..8F would be overlong).
      {"\xF0\x80\x80\x80", 0, 1},
      {"\xF0\x8F\xBF\xBF", 0, 1},
      {"\xF0\x90\x80\x80", 4, 0},
      // F4 needs 80..8F (90 and above would be past U+10FFFF).
      {"\xF4\x8F\xBF\xBF", 4, 0},
      {"\xF4\x90\x80\x80", 0, 1},
      {"\xF4\xBF\xBF\xBF", 0, 1},
      // F5..FF never start a sequence; nor does a continuation byte.
      {"\xF5\x80\x80\x80", 0, 1},
      {"\xF7\xBF\xBF\xBF", 0, 1},
      {"\xF8\x88\x80\x80\x80", 0, 1},
      {"\xFE", 0, 1},
      {"\xFF", 0, 1},
      {"\x80", 0, 1},
      {"\xBF\x80", 0, 1},
      // A later byte out of range ends the maximal subpart before it.
      {"\xC3\x41", 0, 1},
      {"\xE2\x82\x41", 0, 2},
      {"\xE2\xC0\x80", 0, 1},
      {"\xF0\x9F\x41\x80", 0, 2},
      {"\xF0\x9F\x98\x41", 0, 3},
      {"\xF4\x8F\xBF\xC0", 0, 3},
      // Truncated sequences: everything up to the end is a valid prefix.
      {"\xC3", 0, 1},
      {"\xE2", 0, 1},
      {"\xE2\x82", 0, 2},
      {"\xED\x9F", 0, 2},
      {"\xF0\x9F", 0, 2},
      {"\xF0\x9F\x98", 0, 3},
      {"\xF4\x8F\xBF", 0, 3},
  };
  for (const Case& c : kCases) {
    int bad;
    EXPECT_EQ(SequenceLength(c.bytes, &bad), c.length) << testing::PrintToString(c.bytes);
    EXPECT_EQ(bad, c.length == 0 ? c.bad : -1) << testing::PrintToString(c.bytes);
  }
}

TEST(Utf8Test, TruncatedSequencesAreRecognisable) {
  // The documented test for "more bytes could complete it": p + bad == end and a longer lead.
  const auto truncated = [](const std::string& s) {
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    int bad = 0;
    if (Utf8SequenceLength(p, p + s.size(), &bad) != 0) return false;
    return static_cast<size_t>(bad) == s.size() && Utf8LeadLength(p[0]) > bad;
  };
  EXPECT_TRUE(truncated("\xE2"));
  EXPECT_TRUE(truncated("\xE2\x82"));
  EXPECT_TRUE(truncated("\xF0\x9F\x98"));
  EXPECT_FALSE(truncated("\x80"));          // a lone continuation byte can never be completed
  EXPECT_FALSE(truncated("\xC0"));          // nor can C0
  EXPECT_FALSE(truncated("\xE0\x80"));      // E0 80 is overlong whatever follows
  EXPECT_FALSE(truncated("\xE2\x82\x41"));  // ill-formed before the end
  EXPECT_FALSE(truncated("\xE2\x82\xAC"));  // complete
}

TEST(Utf8Test, DecodeAtAnOffset) {
  const std::string s = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\xFF";
  std::vector<uint32_t> decoded;
  size_t pos = 0;
  while (pos < s.size()) {
    char32_t cp;
    int bad = 0;
    const int n = DecodeUtf8(s, pos, &cp, &bad);
    if (n == 0) {
      decoded.push_back(0xFFFD);
      pos += bad;
    } else {
      decoded.push_back(cp);
      pos += n;
    }
  }
  EXPECT_EQ(decoded, (std::vector<uint32_t>{'a', 0xE9, 0x20AC, 0x1F600, 0xFFFD}));
  char32_t cp = 0;
  EXPECT_EQ(DecodeUtf8(s, 3, &cp), 3);  // bad_length may be left out
  EXPECT_EQ(static_cast<uint32_t>(cp), 0x20ACu);
  EXPECT_EQ(DecodeUtf8(s, 4, &cp), 0);
}

}  // namespace
}  // namespace magicpig::text
