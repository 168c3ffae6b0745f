// Tests for the pre-tokenizers: documented splits per name, digit grouping, the \s+(?!\S)
// lookahead, and lossless splitting of arbitrary (including invalid UTF-8) bytes.
#include "gpu_node/model/pretokenizer.h"

#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace magicpig::model {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> SplitWith(std::string_view name, std::string_view text) {
  auto pt = PreTokenizer::Create(name);
  EXPECT_TRUE(pt.ok()) << pt.status();
  if (!pt.ok()) return {};
  std::vector<std::string> out;
  for (std::string_view piece : (*pt)->Split(text)) out.emplace_back(piece);
  return out;
}

TEST(PreTokenizerTest, SmollmWorkedExample) {
  EXPECT_THAT(SplitWith("smollm", "Hello world! 123"),
              ElementsAre("Hello", " world", "!", " ", "1", "2", "3"));
}

TEST(PreTokenizerTest, SmollmLookaheadLeavesLastSpaceToTheWord) {
  EXPECT_THAT(SplitWith("smollm", "a   b"), ElementsAre("a", "  ", " b"));
  // Trailing whitespace: the lookahead succeeds at the end of the text.
  EXPECT_THAT(SplitWith("smollm", "a   "), ElementsAre("a", "   "));
  // A lone newline before a word needs the final plain \s+ alternative.
  EXPECT_THAT(SplitWith("smollm", "a\nb"), ElementsAre("a", "\n", "b"));
  EXPECT_THAT(SplitWith("smollm", "x \t\n  y"), ElementsAre("x", " \t\n ", " y"));
}

TEST(PreTokenizerTest, SmollmContractionsAreLowerCaseOnly) {
  EXPECT_THAT(SplitWith("smollm", "don't"), ElementsAre("don", "'t"));
  EXPECT_THAT(SplitWith("smollm", "DON'T"), ElementsAre("DON", "'", "T"));
  EXPECT_THAT(SplitWith("smollm", "we'll"), ElementsAre("we", "'ll"));
}

TEST(PreTokenizerTest, SmollmDigitsAreSplitBeforeTheWordPattern) {
  // Digits are isolated first, so the space before a number stays alone.
  EXPECT_THAT(SplitWith("smollm", " 12a"), ElementsAre(" ", "1", "2", "a"));
  // \p{N} includes non-ASCII digits and numerals (Nd, Nl, No).
  EXPECT_THAT(SplitWith("smollm", "\u0663\u00B2\u2164"), ElementsAre("\u0663", "\u00B2", "\u2164"));
}

TEST(PreTokenizerTest, AliasesShareTheSmollmRules) {
  for (const char* name : {"starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}) {
    EXPECT_THAT(SplitWith(name, "Hello world! 123"),
                ElementsAre("Hello", " world", "!", " ", "1", "2", "3"))
        << name;
  }
}

TEST(PreTokenizerTest, DigitGroupingPerPreTokenizer) {
  EXPECT_THAT(SplitWith("llama-bpe", "1234567"), ElementsAre("123", "456", "7"));
  EXPECT_THAT(SplitWith("qwen2", "1234"), ElementsAre("1", "2", "3", "4"));
  EXPECT_THAT(SplitWith("smollm", "1234"), ElementsAre("1", "2", "3", "4"));
}

TEST(PreTokenizerTest, Llama3Rules) {
  EXPECT_THAT(SplitWith("llama-bpe", "DON'T"), ElementsAre("DON", "'T"));
  EXPECT_THAT(SplitWith("llama-bpe", "a   b"), ElementsAre("a", "  ", " b"));
  EXPECT_THAT(SplitWith("llama-bpe", "hello\n\nworld"), ElementsAre("hello", "\n\n", "world"));
  // A non-letter, non-digit prefix character attaches to the following letters.
  EXPECT_THAT(SplitWith("llama-bpe", "(hi)"), ElementsAre("(hi", ")"));
  EXPECT_THAT(SplitWith("llama-bpe", "x = 1;\n"), ElementsAre("x", " =", " ", "1", ";\n"));
}

TEST(PreTokenizerTest, UnicodeLettersStayTogether) {
  EXPECT_THAT(SplitWith("smollm", "日本語 café"), ElementsAre("日本語", " café"));
  // A combining mark is not \p{L}: it is punctuation-like for the pattern.
  EXPECT_THAT(SplitWith("smollm", "e\u0301x"), ElementsAre("e", "\u0301", "x"));
  // Non-breaking space and ideographic space are whitespace.
  // Only an ASCII space may prefix a word.
  EXPECT_THAT(SplitWith("smollm", "a\u00A0\u3000b"), ElementsAre("a", "\u00A0", "\u3000", "b"));
}

TEST(PreTokenizerTest, InvalidUtf8BytesBecomeTheirOwnPieces) {
  EXPECT_THAT(SplitWith("smollm",
                        "ab\xFF\xFE"
                        "cd"),
              ElementsAre("ab", "\xFF\xFE", "cd"));
  EXPECT_THAT(SplitWith("smollm", "\xE6\x97"), ElementsAre("\xE6\x97"));  // truncated 日
}

TEST(PreTokenizerTest, PiecesConcatenateToRandomInput) {
  std::mt19937 rng(42);
  for (const char* name : {"smollm", "llama-bpe", "qwen2"}) {
    auto pt = PreTokenizer::Create(name);
    ASSERT_TRUE(pt.ok());
    for (int iter = 0; iter < 500; ++iter) {
      std::string text(rng() % 64, '\0');
      for (char& c : text) {
        // Bias towards interesting bytes: ASCII, spaces, digits and UTF-8 lead/continuation bytes.
        uint32_t r = rng();
        c = static_cast<char>((r & 3) == 0 ? " 1\n\xC3\xA9\xE6"[r % 7] : (r >> 8) & 0xFF);
      }
      std::string joined;
      for (std::string_view piece : (*pt)->Split(text)) {
        ASSERT_FALSE(piece.empty());
        joined += piece;
      }
      ASSERT_EQ(joined, text) << name;
    }
  }
}

TEST(PreTokenizerTest, UnknownNameIsRejectedByName) {
  auto pt = PreTokenizer::Create("gpt-4o");
  ASSERT_FALSE(pt.ok());
  EXPECT_EQ(pt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(pt.status().message(), HasSubstr("gpt-4o"));
}

}  // namespace
}  // namespace magicpig::model
