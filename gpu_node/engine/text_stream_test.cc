#include "gpu_node/engine/text_stream.h"

#include <string>

#include "gtest/gtest.h"

namespace magicpig::engine {
namespace {

TEST(TextStreamTest, ReleasesEverythingWithoutStops) {
  TextStream s({});
  EXPECT_EQ(s.Append("Hello"), "Hello");
  EXPECT_EQ(s.Append(" world"), " world");
  EXPECT_EQ(s.Flush(), "");
  EXPECT_EQ(s.text(), "Hello world");
}

TEST(TextStreamTest, StopStringSplitAcrossTokensIsCut) {
  TextStream s({"STOP"});
  std::string out;
  out += s.Append("abc S");
  EXPECT_EQ(out, "abc ");  // "S" is held: it may start "STOP"
  out += s.Append("TO");
  EXPECT_FALSE(s.stopped());
  out += s.Append("P and more");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(out, "abc ");
  EXPECT_EQ(s.text(), "abc ");
}

TEST(TextStreamTest, HeldPrefixReleasedWhenItDiverges) {
  TextStream s({"\n\n"});
  EXPECT_EQ(s.Append("line\n"), "line");
  EXPECT_EQ(s.Append("next"), "\nnext");
  EXPECT_FALSE(s.stopped());
}

TEST(TextStreamTest, IncompleteUtf8IsHeldBack) {
  TextStream s({});
  const std::string euro = "\xE2\x82\xAC";
  EXPECT_EQ(s.Append(euro.substr(0, 1)), "");
  EXPECT_EQ(s.Append(euro.substr(1, 1)), "");
  EXPECT_EQ(s.Append(euro.substr(2, 1) + "x"), euro + "x");
}

TEST(TextStreamTest, CompleteUtf8PrefixLength) {
  EXPECT_EQ(CompleteUtf8PrefixLength("abc"), 3u);
  EXPECT_EQ(CompleteUtf8PrefixLength("ab\xF0\x9F"), 2u);
  EXPECT_EQ(CompleteUtf8PrefixLength("ab\xF0\x9F\x98\x80"), 6u);
  EXPECT_EQ(CompleteUtf8PrefixLength("\x80\x80"), 2u);  // stray continuation bytes pass through
  EXPECT_EQ(CompleteUtf8PrefixLength(""), 0u);
}

TEST(TextStreamTest, StopAtVeryStart) {
  TextStream s({"<end>"});
  EXPECT_EQ(s.Append("<end>tail"), "");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.text(), "");
}

}  // namespace
}  // namespace magicpig::engine
