// Accept/reject cases in the spirit of JSONTestSuite (y_: must parse, n_: must be rejected), value
// checks, and the located error messages.
#include "common/json/parse.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json/test_printing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace magicpig::json {
namespace {

using std::string_literals::operator""s;
using ::testing::HasSubstr;

std::string Nested(int depth, char open, char close, const std::string& inner = "") {
  return std::string(depth, open) + inner + std::string(depth, close);
}

std::string NestedObjects(int depth) {
  std::string s;
  for (int i = 0; i < depth; ++i) s += "{\"k\":";
  s += "1";
  s += std::string(depth, '}');
  return s;
}

// --- y_: documents that must be accepted ------------------------------------------------------

const std::vector<std::string>& AcceptedDocuments() {
  static const auto* docs = new std::vector<std::string>{
      // structure and whitespace
      "[]", "{}", "[[]]", "[{}]", "{\"a\":{}}", " [1] ", "\t\n\r 1 \n\r\t", "[1,[2,[3,[4]]]]",
      "{ \"a\" : [ 1 , 2 ] , \"b\" : { } }", "{\"\":0}", "[\"\",\"\"]", "[null,true,false]",
      "[1,\"a\",{\"b\":[]},null]", "{\"a\":1,\"a\":2}", "[ ]", "{ }", " \"x\" ",
      "{\"a\":[{\"b\":{\"c\":[null]}}]}", "[1.0e+10,2E-3,-0.5e-0]", "[\"\\u0022\",\"\\\\u0000\"]",
      "[[],{},[[{}]]]", "{\"a\":null,\"b\":true,\"c\":false,\"d\":\"\",\"e\":0}",
      // scalars at top level
      "0", "1", "-1", "true", "false", "null", "\"\"", "\"abc\"",
      // numbers
      "-0", "0.0", "-0.0", "0e0", "0E0", "0e+0", "0e-0", "1.5", "-1.5", "1e5", "1E5", "1e+5",
      "1e-5", "-1.5e-5", "123.456e78", "1e308", "1.7976931348623157e308", "-1.7976931348623157e308",
      "4.9e-324", "2.2250738585072014e-308", "1e-400", "-1e-400",
      "0.000000000000000000000000000000000000000000001", "9223372036854775807",
      "-9223372036854775808", "9223372036854775808", "-9223372036854775809",
      "123456789012345678901234567890", absl::StrCat("1", std::string(300, '0')), "1e00001",
      "[-0,0,-1e-0]",
      // escapes
      "\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"", "\"\\u0000\"", "\"\\u001f\"", "\"\\u0041\"", "\"\\u00e9\"",
      "\"\\u20AC\"", "\"\\uFFFF\"", "\"\\uD83D\\uDE00\"", "\"\\ud83d\\ude00\"",
      "\"\\uDBFF\\uDFFF\"", "\"\\uD800\\uDC00\"", "\"\\u2028\\u2029\"", "\"a\\u0062c\"",
      // raw UTF-8: 2, 3 and 4 bytes, boundaries of each range
      "\"\xC2\x80\"", "\"\xDF\xBF\"", "\"\xE0\xA0\x80\"", "\"\xED\x9F\xBF\"", "\"\xEE\x80\x80\"",
      "\"\xEF\xBF\xBF\"", "\"\xF0\x90\x80\x80\"", "\"\xF4\x8F\xBF\xBF\"", "\"\xF0\x9F\x98\x80\"",
      "\"\xE6\x97\xA5\xE6\x9C\xAC\"", "\"\x7F\"", "{\"\xC3\xA9\":\"\xC3\xA9\"}",
      // deep nesting at the limit
      Nested(64, '[', ']'), NestedObjects(64), Nested(63, '[', ']', "{\"a\":1}")};
  return *docs;
}

TEST(ParseTest, AcceptsValidDocuments) {
  for (const std::string& doc : AcceptedDocuments()) {
    absl::StatusOr<Value> v = Parse(doc);
    EXPECT_TRUE(v.ok()) << "document: " << doc << "\nstatus: " << v.status();
  }
}

// --- n_: documents that must be rejected ------------------------------------------------------

struct Rejected {
  std::string doc;
  std::string message;  // a substring of the error message
};

const std::vector<Rejected>& RejectedDocuments() {
  static const auto* docs = new std::vector<Rejected>{
      // structure
      {"", "empty input"},
      {" ", "unexpected end of input"},
      {"[", "unexpected end of input: expected a value"},
      {"]", "unexpected ']'"},
      {"{", "expected a string key"},
      {"[1", "expected ',' or ']' after an array element"},
      {"{\"a\":1", "expected ',' or '}' after an object member"},
      {"[1,]", "trailing comma before ']'"},
      {"[1,,2]", "unexpected ','"},
      {"[,1]", "unexpected ','"},
      {"{\"a\":1,}", "trailing comma before '}'"},
      {"{,}", "expected an object key"},
      {"{\"a\"}", "expected ':' after an object key"},
      {"{\"a\" 1}", "expected ':' after an object key"},
      {"{\"a\"::1}", "unexpected ':'"},
      {"{a:1}", "expected an object key"},
      {"{1:1}", "expected an object key"},
      {"{'a':1}", "single quotes"},
      {"['a']", "single quotes"},
      {"[1 2]", "expected ',' or ']'"},
      {"{\"a\":1 \"b\":2}", "expected ',' or '}'"},
      {"[\"a\"\"b\"]", "expected ',' or ']'"},
      {"[1]x", "unexpected 'x' after the JSON value"},
      {"[1]]", "unexpected ']' after the JSON value"},
      {"{\"a\":1}}", "after the JSON value"},
      {"1 2", "after the JSON value"},
      {"[1}", "expected ',' or ']'"},
      {"{\"a\":1]", "expected ',' or '}'"},
      {"[1]\0"s, "byte 0x00 after the JSON value"},
      {"\0"s, "byte 0x00"},
      {"\xEF\xBB\xBF[]", "byte order mark"},
      {"[\xC3\xA9]", "byte 0xC3"},
      {"\xC2\xA0"
       "1",
       "byte 0xC2"},  // NO-BREAK SPACE is not whitespace
      {"\f1", "byte 0x0C"},
      {"\v1", "byte 0x0B"},
      {"/* c */ 1", "comments are not allowed"},
      {"1 // c", "after the JSON value"},
      {"[1] # c", "after the JSON value"},
      // literals
      {"tru", "invalid literal"},
      {"True", "unexpected 'T'"},
      {"nul", "invalid literal"},
      {"nulls", "unexpected 's' after the JSON value"},
      {"[true false]", "expected ',' or ']'"},
      {"undefined", "unexpected 'u'"},
      // numbers
      {"01", "leading zeros"},
      {"-01", "leading zeros"},
      {"00", "leading zeros"},
      {"[012]", "leading zeros"},
      {"1.", "expected a digit after the decimal point"},
      {"1.e5", "expected a digit after the decimal point"},
      {".1", "must start with a digit or '-'"},
      {"+1", "must start with a digit or '-'"},
      {"-", "expected a digit after '-'"},
      {"- 1", "expected a digit after '-'"},
      {"--1", "expected a digit after '-'"},
      {"1e", "expected a digit in the exponent"},
      {"1e+", "expected a digit in the exponent"},
      {"1E-", "expected a digit in the exponent"},
      {"1e+-1", "expected a digit in the exponent"},
      {"0x10", "unexpected 'x'"},
      {"1.5.3", "unexpected '.'"},
      {"NaN", "NaN and Infinity"},
      {"-NaN", "expected a digit after '-'"},
      {"Infinity", "NaN and Infinity"},
      {"-Infinity", "NaN and Infinity"},
      {"[NaN]", "NaN and Infinity"},
      {"1e400", "out of range for a double"},
      {"-1e400", "out of range for a double"},
      {"1e309", "out of range for a double"},
      {"1.8e308", "out of range for a double"},
      {"[1e99999999999999999999]", "out of range for a double"},
      {absl::StrCat("1", std::string(400, '0')), "out of range for a double"},
      {"0.0000001e316", "out of range"},  // 1e309,
      // strings
      {"\"abc", "unterminated string"},
      {"\"abc\\", "unterminated string"},
      {"\"\\x41\"", "invalid escape \\'x'"},
      {"\"\\'\"", "invalid escape"},
      {"\"\\a\"", "invalid escape"},
      {"\"\\U0041\"", "invalid escape"},
      {"\"\\\xC3\xA9\"", "invalid escape \\byte 0xC3"},
      {"\"\\u12\"", "expected 4 hex digits"},
      {"\"\\u12G4\"", "expected 4 hex digits"},
      {"\"\\u", "expected 4 hex digits"},
      {"\"\\u-123\"", "expected 4 hex digits"},
      {"\"\\uD800\"", "lone high surrogate \\uD800"},
      {"\"\\uD800x\"", "lone high surrogate"},
      {"\"\\uD800\\n\"", "lone high surrogate"},
      {"\"\\uDBFF\\u0041\"", "not a \\uDC00-\\uDFFF low surrogate"},
      {"\"\\uD800\\uD800\"", "not a \\uDC00-\\uDFFF low surrogate"},
      {"\"\\uD800\\u00\"", "expected 4 hex digits"},
      {"\"\\uDC00\"", "lone low surrogate \\uDC00"},
      {"\"\\uDFFF\\uD800\"", "lone low surrogate"},
      {"\"\x01\"", "control character U+0001"},
      {"\"\t\"", "control character U+0009"},
      {"\"a\nb\"", "control character U+000A"},
      {"\"\x1F\"", "control character U+001F"},
      {"\"\0\""s, "control character U+0000"},
      {"[\"a\",\"\r\"]", "control character U+000D"},
      // invalid UTF-8 in strings (values and keys)
      {"\"\x80\"", "invalid UTF-8 (byte 0x80)"},
      {"\"\xBF\"", "invalid UTF-8"},
      {"\"\xC0\x80\"", "invalid UTF-8 (byte 0xC0)"},      // overlong NUL
      {"\"\xC1\xBF\"", "invalid UTF-8"},                  // overlong U+007F
      {"\"\xE0\x80\xAF\"", "invalid UTF-8"},              // overlong '/'
      {"\"\xE0\x9F\xBF\"", "invalid UTF-8"},              // overlong U+07FF
      {"\"\xF0\x80\x80\xAF\"", "invalid UTF-8"},          // overlong '/'
      {"\"\xF0\x8F\xBF\xBF\"", "invalid UTF-8"},          // overlong U+FFFF
      {"\"\xED\xA0\x80\"", "invalid UTF-8"},              // U+D800 encoded
      {"\"\xED\xBF\xBF\"", "invalid UTF-8"},              // U+DFFF encoded
      {"\"\xED\xA0\xBD\xED\xB8\x80\"", "invalid UTF-8"},  // CESU-8 pair
      {"\"\xF4\x90\x80\x80\"", "invalid UTF-8"},          // U+110000
      {"\"\xF5\x80\x80\x80\"", "invalid UTF-8"},
      {"\"\xF8\x88\x80\x80\x80\"", "invalid UTF-8"},  // 5-byte form
      {"\"\xFE\"", "invalid UTF-8"},
      {"\"\xFF\"", "invalid UTF-8"},
      {"\"\xC3\"", "invalid UTF-8"},          // truncated before the quote
      {"\"\xC3", "invalid UTF-8"},            // truncated at the end of input
      {"\"\xE2\x82\"", "invalid UTF-8"},      // truncated 3-byte
      {"\"\xF0\x9F\x98\"", "invalid UTF-8"},  // truncated 4-byte
      {"\"\xC3\x28\"", "invalid UTF-8"},
      {"\"\xE2\x28\xA1\"", "invalid UTF-8"},
      {"{\"\xFF\":1}", "invalid UTF-8"},
      {"[\"ok\",\"\xC0\xAF\"]", "invalid UTF-8"},
      // depth
      {Nested(65, '[', ']'), "nesting deeper than 64 levels"},
      {NestedObjects(65), "nesting deeper than 64 levels"},
      {Nested(100000, '[', ']'), "nesting deeper than 64 levels"},
      {std::string(100000, '['), "nesting deeper than 64 levels"},
  };
  return *docs;
}

TEST(ParseTest, RejectsInvalidDocuments) {
  for (const Rejected& r : RejectedDocuments()) {
    absl::StatusOr<Value> v = Parse(r.doc);
    ASSERT_FALSE(v.ok()) << "accepted: " << r.doc << " as " << ::testing::PrintToString(*v);
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(v.status().message());
    EXPECT_THAT(message, HasSubstr(r.message)) << "document: " << r.doc;
    EXPECT_THAT(message, HasSubstr("invalid JSON at line ")) << r.doc;
  }
}

TEST(ParseTest, CaseCounts) {
  // Keeps the suites from shrinking unnoticed.
  EXPECT_GE(AcceptedDocuments().size(), 85u);
  EXPECT_GE(RejectedDocuments().size(), 120u);
}

// --- values -----------------------------------------------------------------------------------

Value MustParse(std::string_view text) {
  absl::StatusOr<Value> v = Parse(text);
  EXPECT_TRUE(v.ok()) << text << ": " << v.status();
  return v.ok() ? *std::move(v) : Value();
}

TEST(ParseTest, Scalars) {
  EXPECT_TRUE(MustParse("null").is_null());
  EXPECT_TRUE(MustParse("true").as_bool());
  EXPECT_FALSE(MustParse("false").as_bool());
  EXPECT_EQ(MustParse("\"hi\"").as_string(), "hi");
  EXPECT_EQ(MustParse(" \"\" ").as_string(), "");
}

TEST(ParseTest, IntegersAreExact) {
  EXPECT_EQ(MustParse("50256").as_int(), 50256);
  EXPECT_EQ(MustParse("0").as_int(), 0);
  EXPECT_EQ(MustParse("-7").as_int(), -7);
  EXPECT_EQ(MustParse("4611686018427387904").as_int(), int64_t{1} << 62);
  EXPECT_EQ(MustParse("4611686018427387905").as_int(), (int64_t{1} << 62) + 1);
  EXPECT_EQ(MustParse("9007199254740993").as_int(), 9007199254740993);  // 2^53 + 1
  EXPECT_EQ(MustParse("9223372036854775807").as_int(), INT64_MAX);
  EXPECT_EQ(MustParse("-9223372036854775808").as_int(), INT64_MIN);
  EXPECT_EQ(MustParse("1000000000000000000").as_int(), 1000000000000000000);
  EXPECT_EQ(MustParse("-1000000000000000000").as_int(), -1000000000000000000);
  // The double alongside is the nearest one.
  EXPECT_EQ(MustParse("9007199254740993").as_double(), 9007199254740992.0);
}

TEST(ParseTest, NonIntegerNumbers) {
  for (const char* text : {"9223372036854775808", "-9223372036854775809", "1.0", "1e2", "1E2",
                           "0.5", "-0", "-0.0", "10000000000000000000", "99999999999999999999"}) {
    const Value v = MustParse(text);
    EXPECT_TRUE(v.is_number()) << text;
    EXPECT_FALSE(v.is_int()) << text;
  }
  EXPECT_EQ(MustParse("9223372036854775808").as_double(), 9223372036854775808.0);
  EXPECT_EQ(MustParse("1.5").as_double(), 1.5);
  EXPECT_EQ(MustParse("-1.5e-5").as_double(), -1.5e-5);
  EXPECT_EQ(MustParse("1E+2").as_double(), 100.0);
  EXPECT_EQ(MustParse("0.1").as_double(), 0.1);
  EXPECT_EQ(MustParse("123456789012345678901234567890").as_double(), 1.2345678901234568e29);
  EXPECT_EQ(MustParse("1.7976931348623157e308").as_double(), 1.7976931348623157e308);
  EXPECT_EQ(MustParse("4.9e-324").as_double(), 4.9e-324);
  EXPECT_EQ(MustParse("2.2250738585072011e-308").as_double(), 2.2250738585072011e-308);
  // Correct rounding of a long mantissa (the classic halfway case 2^53 + 1).
  EXPECT_EQ(MustParse("9007199254740993.0").as_double(), 9007199254740992.0);
  EXPECT_EQ(MustParse("9007199254740993.0000000000001").as_double(), 9007199254740994.0);
}

TEST(ParseTest, NegativeZeroAndUnderflow) {
  for (const char* text : {"-0", "-0.0", "-0e10", "-1e-400", "-0.0000001e-320"}) {
    const Value v = MustParse(text);
    EXPECT_EQ(v.as_double(), 0.0) << text;
    EXPECT_TRUE(std::signbit(v.as_double())) << text;
  }
  for (const char* text : {"0", "0.0", "1e-400", "0.0000001e-320", "1e-99999999999999999999"}) {
    const Value v = MustParse(text);
    EXPECT_EQ(v.as_double(), 0.0) << text;
    EXPECT_FALSE(std::signbit(v.as_double())) << text;
  }
  // Zero with a huge exponent is still zero, not an overflow.
  EXPECT_EQ(MustParse("0e99999999999").as_double(), 0.0);
  EXPECT_EQ(MustParse("0.000e400").as_double(), 0.0);
  // Subnormals are kept.
  EXPECT_EQ(MustParse("4e-320").as_double(), 4e-320);
}

TEST(ParseTest, Escapes) {
  EXPECT_EQ(MustParse(R"("\"\\\/\b\f\n\r\t")").as_string(), "\"\\/\b\f\n\r\t");
  EXPECT_EQ(MustParse(R"("\u0000")").as_string(), "\0"s);
  EXPECT_EQ(MustParse(R"("a\u0000b")").as_string(), "a\0b"s);
  EXPECT_EQ(MustParse(R"("\u0041\u00e9\u00E9\u20ac")").as_string(),
            "A\xC3\xA9\xC3\xA9\xE2\x82\xAC");
  EXPECT_EQ(MustParse(R"("\u07FF\u0800\uFFFF")").as_string(), "\xDF\xBF\xE0\xA0\x80\xEF\xBF\xBF");
  // Surrogate pairs: U+1F600, U+10000, U+10FFFF.
  EXPECT_EQ(MustParse(R"("\uD83D\uDE00")").as_string(), "\xF0\x9F\x98\x80");
  EXPECT_EQ(MustParse(R"("\ud83d\ude00")").as_string(), "\xF0\x9F\x98\x80");
  EXPECT_EQ(MustParse(R"("\uD800\uDC00")").as_string(), "\xF0\x90\x80\x80");
  EXPECT_EQ(MustParse(R"("\uDBFF\uDFFF")").as_string(), "\xF4\x8F\xBF\xBF");
  EXPECT_EQ(MustParse(R"("x\uD83D\uDE00y")").as_string(), "x\xF0\x9F\x98\x80y");
  // Raw UTF-8 passes through unchanged.
  EXPECT_EQ(MustParse("\"\xF0\x9F\x98\x80 \xE6\x97\xA5\"").as_string(),
            "\xF0\x9F\x98\x80 \xE6\x97\xA5");
}

TEST(ParseTest, EveryAsciiEscapeAndControlCharacter) {
  for (int c = 0; c < 128; ++c) {
    const std::string esc = absl::StrFormat("\"\\u%04x\"", c);
    EXPECT_EQ(MustParse(esc).as_string(), std::string(1, static_cast<char>(c))) << esc;
    const std::string raw = {'"', static_cast<char>(c), '"'};
    absl::StatusOr<Value> v = Parse(raw);
    const bool must_accept = c >= 0x20 && c != '"' && c != '\\';
    EXPECT_EQ(v.ok(), must_accept) << "raw byte " << c;
  }
}

TEST(ParseTest, LongStringsCrossTheEightByteBlocks) {
  // Specials at every offset relative to the 8-byte scan.
  for (int prefix = 0; prefix < 20; ++prefix) {
    const std::string pad(prefix, 'a');
    EXPECT_EQ(MustParse("\"" + pad + "\\n" + pad + "\"").as_string(), pad + "\n" + pad);
    EXPECT_EQ(MustParse("\"" + pad + "\xC3\xA9" + pad + "\"").as_string(), pad + "\xC3\xA9" + pad);
    EXPECT_FALSE(Parse("\"" + pad + "\x01" + pad + "\"").ok()) << prefix;
    EXPECT_FALSE(Parse("\"" + pad + "\xFF" + pad + "\"").ok()) << prefix;
    EXPECT_FALSE(Parse("\"" + pad).ok()) << prefix;
  }
}

TEST(ParseTest, Containers) {
  const Value v = MustParse(R"( {"model": "x", "messages": [{"role": "user", "content": "hi"}],
                                 "max_tokens": 16, "temperature": 0.7, "stream": false,
                                 "stop": null} )");
  ASSERT_TRUE(v.is_object());
  EXPECT_EQ(v.size(), 6u);
  EXPECT_EQ(v.as_object()[0].first, "model");
  EXPECT_EQ(v.as_object()[5].first, "stop");
  EXPECT_EQ(v.Find("max_tokens")->as_int(), 16);
  EXPECT_EQ(v.Find("temperature")->as_double(), 0.7);
  EXPECT_FALSE(v.Find("stream")->as_bool());
  EXPECT_TRUE(v.Find("stop")->is_null());
  const Value& messages = *v.Find("messages");
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_EQ(messages.as_array()[0].Find("content")->as_string(), "hi");
  EXPECT_EQ(MustParse("[1,[2,[3]]]"), Value::Array({1, Value::Array({2, Value::Array({3})})}));
}

TEST(ParseTest, DuplicateKeysLastValueWinsAtFirstPosition) {
  const Value v = MustParse(R"({"a":1,"b":2,"a":3})");
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v.as_object()[0].first, "a");
  EXPECT_EQ(v.as_object()[0].second.as_int(), 3);
  EXPECT_EQ(v.as_object()[1].first, "b");
  // Keys compare after unescaping.
  const Value w = MustParse(R"({"a":1,"\u0061":2})");
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w.Find("a")->as_int(), 2);
}

TEST(ParseTest, DuplicateKeysInLargeObjects) {
  // Beyond the pairwise limit the hash path runs; same semantics.
  std::string doc = "{";
  for (int i = 0; i < 1000; ++i) absl::StrAppend(&doc, "\"k", i % 300, "\":", i, ",");
  doc += "\"last\":true}";
  const Value v = MustParse(doc);
  ASSERT_EQ(v.size(), 301u);
  for (int k = 0; k < 300; ++k) {
    EXPECT_EQ(v.as_object()[k].first, absl::StrCat("k", k));
    // The last occurrence of k is the largest i < 1000 with i % 300 == k.
    const int last = k < 100 ? 900 + k : 600 + k;
    EXPECT_EQ(v.as_object()[k].second.as_int(), last);
  }
  EXPECT_TRUE(v.Find("last")->as_bool());
  // Many distinct keys with long (heap-allocated) names.
  std::string wide = "{";
  for (int i = 0; i < 200; ++i) {
    absl::StrAppend(&wide, "\"a-fairly-long-key-name-", i, "\":", i, ",");
  }
  wide += "\"a-fairly-long-key-name-7\":-1}";
  const Value w = MustParse(wide);
  ASSERT_EQ(w.size(), 200u);
  EXPECT_EQ(w.Find("a-fairly-long-key-name-7")->as_int(), -1);
  EXPECT_EQ(w.Find("a-fairly-long-key-name-199")->as_int(), 199);
}

TEST(ParseTest, DepthLimit) {
  EXPECT_TRUE(Parse(Nested(64, '[', ']')).ok());
  EXPECT_FALSE(Parse(Nested(65, '[', ']')).ok());
  ParseOptions shallow;
  shallow.max_depth = 2;
  EXPECT_TRUE(Parse("[{\"a\":1}]", shallow).ok());
  EXPECT_FALSE(Parse("[{\"a\":[]}]", shallow).ok());
  EXPECT_TRUE(Parse("[[],[],{}]", shallow).ok());  // siblings do not add up
  ParseOptions scalars_only;
  scalars_only.max_depth = 0;
  EXPECT_TRUE(Parse("1", scalars_only).ok());
  EXPECT_FALSE(Parse("[]", scalars_only).ok());
  // The parser is iterative: a large limit and deep input cost no stack.
  ParseOptions deep;
  deep.max_depth = 1000000;
  absl::StatusOr<Value> v = Parse(Nested(200000, '[', ']'), deep);
  ASSERT_TRUE(v.ok()) << v.status();
  // Taking the value apart iteratively (its recursive destructor would use ~200000 frames).
  Value cur = *std::move(v);
  int depth = 0;
  while (cur.is_array() && cur.size() == 1) {
    Value next = std::move(cur.mutable_array()[0]);
    cur = std::move(next);
    ++depth;
  }
  EXPECT_EQ(depth, 199999);
}

// --- error locations --------------------------------------------------------------------------

std::string ErrorOf(std::string_view text) {
  absl::StatusOr<Value> v = Parse(text);
  EXPECT_FALSE(v.ok()) << text;
  return v.ok() ? "" : std::string(v.status().message());
}

TEST(ParseTest, ErrorMessagesNameLineColumnAndByte) {
  // Line 2 is 39 bytes, so line 3 starts at byte 41.
  const std::string doc =
      "{\n"
      "  \"model\": \"smollm2-135m-instruct-q4\",\n"
      "  \"stream\": tru,\n";
  EXPECT_EQ(ErrorOf(doc),
            "invalid JSON at line 3, column 13 (byte 53): invalid literal: "
            "expected true, false or null");
  const std::string doc2 =
      "{\n"
      "  \"model\": \"smollm2-135m-instruct-q4\",\n"
      "  \"stream\": 12 \"x\": 1}";
  EXPECT_EQ(ErrorOf(doc2),
            "invalid JSON at line 3, column 16 (byte 56): expected ',' or '}' "
            "after an object member");
  EXPECT_EQ(ErrorOf("[1,]"),
            "invalid JSON at line 1, column 4 (byte 3): trailing comma before ']'");
  EXPECT_EQ(ErrorOf(""),
            "invalid JSON at line 1, column 1 (byte 0): empty input: expected a "
            "JSON value");
  EXPECT_EQ(
      ErrorOf("[1,\n2,\n\n  3 x]"),
      "invalid JSON at line 4, column 5 (byte 12): expected ',' or ']' after an array element");
  // Columns count characters: each "é" is two bytes, one column.
  EXPECT_EQ(
      ErrorOf("[\"\xC3\xA9\xC3\xA9\" x]"),
      "invalid JSON at line 1, column 7 (byte 8): expected ',' or ']' after an array element");
  // String errors point at the offending byte; unterminated strings at their opening quote.
  EXPECT_THAT(ErrorOf("{\"a\":\n \"ab\\qc\"}"), HasSubstr("line 2, column 5 (byte 10)"));
  EXPECT_THAT(ErrorOf("[\"ok\",\n  \"never closed]"), HasSubstr("line 2, column 3 (byte 9)"));
  EXPECT_THAT(ErrorOf("\"ab\xFF\""), HasSubstr("line 1, column 4 (byte 3)"));
  EXPECT_THAT(ErrorOf("[1, 01]"), HasSubstr("line 1, column 5 (byte 4): invalid number: leading"));
  // CRLF line ends count one line each.
  EXPECT_THAT(ErrorOf("[\r\n1,\r\n]"), HasSubstr("line 3, column 1 (byte 7)"));
  // Depth errors point at the bracket that goes too deep.
  EXPECT_THAT(ErrorOf(Nested(65, '[', ']')), HasSubstr("line 1, column 65 (byte 64)"));
}

}  // namespace
}  // namespace magicpig::json
