// Tests for Utf8StreamDecoder: partial sequences are held back, invalid bytes become U+FFFD, and
// feeding a valid string in any chunking reproduces it.
#include "gpu_node/model/utf8_stream.h"

#include <random>
#include <string>

#include "gtest/gtest.h"

namespace magicpig::model {
namespace {

TEST(Utf8StreamDecoderTest, HoldsBackPartialSequences) {
  Utf8StreamDecoder dec;
  EXPECT_EQ(dec.Push("a\xE6"), "a");  // first byte of 日 (E6 97 A5)
  EXPECT_EQ(dec.pending(), 1u);
  EXPECT_EQ(dec.Push("\x97"), "");
  EXPECT_EQ(dec.pending(), 2u);
  EXPECT_EQ(dec.Push("\xA5!"), "\xE6\x97\xA5!");
  EXPECT_EQ(dec.pending(), 0u);
  EXPECT_EQ(dec.Push("\xF0\x9F"), "");  // emoji prefix
  EXPECT_EQ(dec.Push("\x98\x80"), "\xF0\x9F\x98\x80");
}

TEST(Utf8StreamDecoderTest, InvalidBytesBecomeReplacementCharacters) {
  Utf8StreamDecoder dec;
  EXPECT_EQ(dec.Push("\xFF"
                     "a"),
            "\xEF\xBF\xBD"
            "a");
  // A lead byte followed by a non-continuation byte can never complete.
  EXPECT_EQ(dec.Push("\xE6"
                     "b"),
            "\xEF\xBF\xBD"
            "b");
  // E0 80 would be overlong, ED A0 a surrogate: rejected at the second byte.
  EXPECT_EQ(dec.Push("\xE0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(dec.Push("\xED\xA0"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(dec.pending(), 0u);
}

TEST(Utf8StreamDecoderTest, FlushReplacesWhatIsLeft) {
  Utf8StreamDecoder dec;
  EXPECT_EQ(dec.Push("x\xE6\x97"), "x");
  EXPECT_EQ(dec.Flush(), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(dec.pending(), 0u);
  EXPECT_EQ(dec.Flush(), "");
}

TEST(Utf8StreamDecoderTest, AnyChunkingOfValidTextReproducesIt) {
  const std::string text = "héllo 日本語 🙂 עברית ok\n";
  std::mt19937 rng(3);
  for (int iter = 0; iter < 200; ++iter) {
    Utf8StreamDecoder dec;
    std::string out;
    size_t pos = 0;
    while (pos < text.size()) {
      size_t n = 1 + rng() % 4;
      out += dec.Push(std::string_view(text).substr(pos, n));
      pos += n;
    }
    out += dec.Flush();
    ASSERT_EQ(out, text);
  }
}

}  // namespace
}  // namespace magicpig::model
