#include "common/json/value.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "common/json/test_printing.h"
#include "gtest/gtest.h"

namespace magicpig::json {
namespace {

TEST(ValueTest, ConstructorsSetTheType) {
  EXPECT_TRUE(Value().is_null());
  EXPECT_TRUE(Value(nullptr).is_null());
  EXPECT_TRUE(Value(true).is_bool());
  EXPECT_FALSE(Value(false).as_bool());
  EXPECT_TRUE(Value(7).is_int());
  EXPECT_EQ(Value(7).as_int(), 7);
  EXPECT_EQ(Value(int64_t{1} << 62).as_int(), int64_t{1} << 62);
  EXPECT_EQ(Value(std::numeric_limits<int64_t>::min()).as_int(),
            std::numeric_limits<int64_t>::min());
  EXPECT_TRUE(Value(2.5).is_number());
  EXPECT_FALSE(Value(2.5).is_int());
  EXPECT_FALSE(Value(2.0).is_int());  // a double stays a double
  EXPECT_EQ(Value(2.5).as_double(), 2.5);
  EXPECT_EQ(Value(7).as_double(), 7.0);
  EXPECT_EQ(Value("abc").as_string(), "abc");
  EXPECT_EQ(Value(std::string("abc")).as_string(), "abc");
  EXPECT_EQ(Value(std::string_view("abc")).as_string(), "abc");
  EXPECT_TRUE(Value::Array().is_array());
  EXPECT_TRUE(Value::Object().is_object());
  EXPECT_EQ(Value::Array().size(), 0u);
  EXPECT_EQ(Value("abc").size(), 0u);
}

TEST(ValueTest, UnsignedIntegers) {
  EXPECT_EQ(Value(uint64_t{123}).as_int(), 123);
  EXPECT_EQ(Value(size_t{5}).as_int(), 5);
  EXPECT_EQ(Value(static_cast<uint64_t>(INT64_MAX)).as_int(), INT64_MAX);
  // Above int64: a double.
  const Value big(std::numeric_limits<uint64_t>::max());
  EXPECT_TRUE(big.is_number());
  EXPECT_FALSE(big.is_int());
  EXPECT_EQ(big.as_double(), 18446744073709551616.0);
}

TEST(ValueTest, TypeNames) {
  EXPECT_EQ(TypeName(Value().type()), "null");
  EXPECT_EQ(TypeName(Value(true).type()), "boolean");
  EXPECT_EQ(TypeName(Value(1).type()), "number");
  EXPECT_EQ(TypeName(Value(1.5).type()), "number");
  EXPECT_EQ(TypeName(Value("").type()), "string");
  EXPECT_EQ(TypeName(Value::Array().type()), "array");
  EXPECT_EQ(TypeName(Value::Object().type()), "object");
}

TEST(ValueTest, SetKeepsOrderAndReplacesInPlace) {
  Value o = Value::Object();
  o.Set("b", 1);
  o.Set("a", 2);
  o.Set("c", 3);
  o.Set("a", "x");
  ASSERT_EQ(o.size(), 3u);
  const Value::Members& m = o.as_object();
  EXPECT_EQ(m[0].first, "b");
  EXPECT_EQ(m[1].first, "a");
  EXPECT_EQ(m[1].second.as_string(), "x");
  EXPECT_EQ(m[2].first, "c");
  ASSERT_NE(o.Find("c"), nullptr);
  EXPECT_EQ(o.Find("c")->as_int(), 3);
  EXPECT_EQ(o.Find("d"), nullptr);
  EXPECT_EQ(o.Find(""), nullptr);
  EXPECT_EQ(Value(1).Find("a"), nullptr);        // not an object
  EXPECT_EQ(Value::Array().Find("a"), nullptr);  // not an object
  // Set returns the stored value, and the non-const Find allows edits.
  o.Set("n", Value::Array()).Push(1);
  o.Find("n")->Push(2);
  EXPECT_EQ(o.Find("n")->size(), 2u);
}

TEST(ValueTest, ObjectFactoryDeduplicates) {
  Value o = Value::Object({{"a", 1}, {"b", 2}, {"a", 3}});
  ASSERT_EQ(o.size(), 2u);
  EXPECT_EQ(o.as_object()[0].first, "a");
  EXPECT_EQ(o.as_object()[0].second.as_int(), 3);
}

TEST(ValueTest, PushAndArrayFactory) {
  Value a = Value::Array({1, "two", nullptr});
  a.Push(true);
  ASSERT_EQ(a.size(), 4u);
  EXPECT_EQ(a.as_array()[1].as_string(), "two");
  EXPECT_TRUE(a.as_array()[2].is_null());
  EXPECT_TRUE(a.as_array()[3].as_bool());
  a.mutable_array().pop_back();
  EXPECT_EQ(a.size(), 3u);
}

TEST(ValueTest, NumberEqualityIsMathematical) {
  EXPECT_EQ(Value(2), Value(2.0));
  EXPECT_EQ(Value(2.0), Value(2));
  EXPECT_NE(Value(2), Value(2.5));
  EXPECT_EQ(Value(0), Value(-0.0));
  // 2^62 + 1 is not representable as a double: the nearest double is 2^62, which is not equal.
  const int64_t big = (int64_t{1} << 62) + 1;
  EXPECT_NE(Value(big), Value(static_cast<double>(big)));
  EXPECT_EQ(Value(int64_t{1} << 62), Value(static_cast<double>(int64_t{1} << 62)));
  EXPECT_NE(Value(INT64_MAX), Value(9223372036854775808.0));  // 2^63 is outside int64
  EXPECT_EQ(Value(INT64_MIN), Value(-9223372036854775808.0));
  EXPECT_NE(Value(1), Value(std::nan("")));
  EXPECT_NE(Value(std::nan("")), Value(std::nan("")));  // as for doubles
  EXPECT_NE(Value(1), Value(true));
  EXPECT_NE(Value(0), Value());
}

TEST(ValueTest, ContainerEquality) {
  EXPECT_EQ(Value::Array({1, 2}), Value::Array({1, 2}));
  EXPECT_NE(Value::Array({1, 2}), Value::Array({2, 1}));
  EXPECT_NE(Value::Array({1}), Value::Array({1, 1}));
  // Member order does not matter; values and key sets do.
  EXPECT_EQ(Value::Object({{"a", 1}, {"b", 2}}), Value::Object({{"b", 2}, {"a", 1}}));
  EXPECT_NE(Value::Object({{"a", 1}, {"b", 2}}), Value::Object({{"a", 1}, {"c", 2}}));
  EXPECT_NE(Value::Object({{"a", 1}}), Value::Object({{"a", 2}}));
  EXPECT_NE(Value::Object({{"a", 1}}), Value::Object({{"a", 1}, {"b", 1}}));
  EXPECT_NE(Value::Object(), Value::Array());
  EXPECT_EQ(Value("x"), Value("x"));
  EXPECT_NE(Value("x"), Value("y"));
}

TEST(ValueTest, CopyAndMove) {
  Value a = Value::Object({{"k", Value::Array({1, 2, 3})}});
  Value b = a;
  EXPECT_EQ(a, b);
  b.Find("k")->Push(4);
  EXPECT_NE(a, b);
  Value c = std::move(b);
  EXPECT_EQ(c.Find("k")->size(), 4u);
}

TEST(ValueDeathTest, AccessorsCheckTheType) {
  EXPECT_DEATH((void)Value("s").as_int(), "as_int called on a value of type string");
  EXPECT_DEATH((void)Value(1.5).as_int(), "as_int called on a value of type number");
  EXPECT_DEATH((void)Value().as_bool(), "as_bool called on a value of type null");
  EXPECT_DEATH((void)Value(1).as_string(), "as_string called on a value of type number");
  EXPECT_DEATH((void)Value::Object().as_array(), "as_array called on a value of type object");
  Value arr = Value::Array();
  EXPECT_DEATH(arr.Set("a", 1), "mutable_object called on a value of type array");
  Value obj = Value::Object();
  EXPECT_DEATH(obj.Push(1), "mutable_array called on a value of type object");
}

}  // namespace
}  // namespace magicpig::json
