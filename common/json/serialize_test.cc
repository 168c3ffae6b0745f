#include "common/json/serialize.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "common/json/parse.h"
#include "common/json/string_scan.h"
#include "common/json/test_printing.h"
#include "gtest/gtest.h"

namespace magicpig::json {
namespace {

using std::string_literals::operator""s;

TEST(SerializeTest, Scalars) {
  EXPECT_EQ(Serialize(Value()), "null");
  EXPECT_EQ(Serialize(Value(true)), "true");
  EXPECT_EQ(Serialize(Value(false)), "false");
  EXPECT_EQ(Serialize(Value("")), "\"\"");
  EXPECT_EQ(Serialize(Value("hi")), "\"hi\"");
}

TEST(SerializeTest, Integers) {
  EXPECT_EQ(Serialize(Value(0)), "0");
  EXPECT_EQ(Serialize(Value(50256)), "50256");
  EXPECT_EQ(Serialize(Value(-7)), "-7");
  EXPECT_EQ(Serialize(Value(int64_t{1} << 62)), "4611686018427387904");
  EXPECT_EQ(Serialize(Value((int64_t{1} << 62) + 1)), "4611686018427387905");
  EXPECT_EQ(Serialize(Value(INT64_MAX)), "9223372036854775807");
  EXPECT_EQ(Serialize(Value(INT64_MIN)), "-9223372036854775808");
}

TEST(SerializeTest, Doubles) {
  EXPECT_EQ(Serialize(Value(0.1)), "0.1");
  EXPECT_EQ(Serialize(Value(1.5)), "1.5");
  EXPECT_EQ(Serialize(Value(-2.25)), "-2.25");
  EXPECT_EQ(Serialize(Value(2.0)), "2");
  EXPECT_EQ(Serialize(Value(0.0)), "0");
  EXPECT_EQ(Serialize(Value(-0.0)), "-0");
  EXPECT_EQ(Serialize(Value(1e20)), "1e+20");
  EXPECT_EQ(Serialize(Value(1e-7)), "1e-07");
  EXPECT_EQ(Serialize(Value(1e300)), "1e+300");
  EXPECT_EQ(Serialize(Value(0.7)), "0.7");
  EXPECT_EQ(Serialize(Value(1.0 / 3)), "0.3333333333333333");
  EXPECT_EQ(Serialize(Value(std::numeric_limits<double>::max())), "1.7976931348623157e+308");
  EXPECT_EQ(Serialize(Value(std::numeric_limits<double>::denorm_min())), "5e-324");
  EXPECT_EQ(Serialize(Value(std::numeric_limits<uint64_t>::max())), "18446744073709551616");
  // JSON has no NaN or infinity.
  EXPECT_EQ(Serialize(Value(std::numeric_limits<double>::quiet_NaN())), "null");
  EXPECT_EQ(Serialize(Value(std::numeric_limits<double>::infinity())), "null");
  EXPECT_EQ(Serialize(Value(-std::numeric_limits<double>::infinity())), "null");
  // Large integral doubles print all their digits when that is shorter than the exponent form.
  // Parsed numbers keep their form: integers exact, the rest shortest.
  EXPECT_EQ(Serialize(*Parse("[9223372036854775807,1.0,1e2,-0,0.10,123456789012345678901]")),
            "[9223372036854775807,1,100,-0,0.1,123456789012345683968]");
}

TEST(SerializeTest, Escaping) {
  EXPECT_EQ(Quote("a\"b\\c/d"), R"("a\"b\\c/d")");
  EXPECT_EQ(Quote("\b\f\n\r\t"), R"("\b\f\n\r\t")");
  EXPECT_EQ(Quote("\0\x01\x1f"s), R"("\u0000\u0001\u001f")");
  EXPECT_EQ(Quote("\x7f"), "\"\x7f\"");  // DEL needs no escape
  EXPECT_EQ(Quote("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"),
            "\"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\"");
  EXPECT_EQ(Quote("\xE2\x80\xA8"), "\"\xE2\x80\xA8\"");  // U+2028 is valid JSON as is
  for (int c = 0; c < 0x20; ++c) {
    const std::string q = Quote(std::string(1, static_cast<char>(c)));
    EXPECT_EQ(q.size() == 4 || q.size() == 8, true) << c;  // "\n" or "\u00XX" in quotes
    absl::StatusOr<Value> back = Parse(q);
    ASSERT_TRUE(back.ok()) << q;
    EXPECT_EQ(back->as_string(), std::string(1, static_cast<char>(c)));
  }
  std::string out = "prefix:";
  AppendQuoted("x", &out);
  EXPECT_EQ(out, "prefix:\"x\"");
}

TEST(SerializeTest, InvalidUtf8BecomesReplacementCharacters) {
  const std::string kFffd = "\xEF\xBF\xBD";
  struct Case {
    std::string in;
    std::string out;  // between the quotes
  };
  // One U+FFFD per maximal ill-formed subpart (Unicode Standard, section 3.9).
  const Case cases[] = {
      {"\x80", kFffd},
      {"a\xFF"
       "b",
       "a" + kFffd + "b"},
      {"\xC0\x80", kFffd + kFffd},                          // overlong: C0 is never valid
      {"\xE0\x80\xAF", kFffd + kFffd + kFffd},              // overlong 3-byte
      {"\xED\xA0\x80", kFffd + kFffd + kFffd},              // encoded surrogate
      {"\xF4\x90\x80\x80", kFffd + kFffd + kFffd + kFffd},  // above U+10FFFF
      {"\xE2\x82", kFffd},                                  // truncated at the end
      {"\xE2\x82"
       "A",
       kFffd + "A"},            // truncated before ASCII
      {"\xF0\x9F\x98", kFffd},  // truncated 4-byte
      {"\xF0\x9F\x98\xF0\x9F\x98\x80", kFffd + "\xF0\x9F\x98\x80"},
      {"\xC3\x28", kFffd + "("},
      {"\xC3\"", kFffd + "\\\""},
      {"ok\xC3\xA9\xFE\xC3\xA9", "ok\xC3\xA9" + kFffd + "\xC3\xA9"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(Quote(c.in), "\"" + c.out + "\"");
    // And the output parses.
    EXPECT_TRUE(Parse(Quote(c.in)).ok());
  }
}

TEST(SerializeTest, ContainersKeepOrder) {
  Value v = Value::Object();
  v.Set("z", 1);
  v.Set("a", Value::Array({1, "two", nullptr, true, 2.5, Value::Object()}));
  v.Set("m", Value::Object({{"k\n", "v\t"}}));
  EXPECT_EQ(Serialize(v), R"({"z":1,"a":[1,"two",null,true,2.5,{}],"m":{"k\n":"v\t"}})");
  EXPECT_EQ(Serialize(Value::Array()), "[]");
  EXPECT_EQ(Serialize(Value::Object()), "{}");
  std::string out = "data: ";
  AppendSerialized(v, &out);
  EXPECT_EQ(out, "data: " + Serialize(v));
}

TEST(SerializeTest, HasSpecialByteIsExact) {
  // Every byte value at every position of an otherwise plain block.
  for (int pos = 0; pos < 8; ++pos) {
    for (int b = 0; b < 256; ++b) {
      unsigned char bytes[8];
      for (unsigned char& x : bytes) x = 'a';
      bytes[pos] = static_cast<unsigned char>(b);
      uint64_t block;
      std::memcpy(&block, bytes, 8);
      const bool special = b < 0x20 || b >= 0x80 || b == '"' || b == '\\';
      EXPECT_EQ(internal::HasSpecialByte(block), special) << pos << " " << b;
    }
  }
  // Neighbours of the thresholds together (borrows between bytes must not fool the test).
  for (int b0 = 0x1E; b0 <= 0x23; ++b0) {
    for (int b1 = 0x1E; b1 <= 0x23; ++b1) {
      unsigned char bytes[8] = {'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x'};
      bytes[3] = static_cast<unsigned char>(b0);
      bytes[4] = static_cast<unsigned char>(b1);
      uint64_t block;
      std::memcpy(&block, bytes, 8);
      const auto special = [](int c) { return c < 0x20 || c == '"'; };
      EXPECT_EQ(internal::HasSpecialByte(block), special(b0) || special(b1)) << b0 << " " << b1;
    }
  }
}

}  // namespace
}  // namespace magicpig::json
