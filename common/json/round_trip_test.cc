// Parse(Serialize(v)) == v on seeded random values, and serialization as a fixed point.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>

#include "common/json/parse.h"
#include "common/json/serialize.h"
#include "common/json/test_printing.h"
#include "common/text/utf8.h"
#include "gtest/gtest.h"

namespace magicpig::json {
namespace {

class RandomValues {
 public:
  explicit RandomValues(uint64_t seed) : rng_(seed) {}

  Value Make(int depth) {
    const int kind = Uniform(0, depth > 0 ? 8 : 5);
    switch (kind) {
      case 0:
        return Value();
      case 1:
        return Value(Uniform(0, 1) == 1);
      case 2:
        return Value(RandomInt());
      case 3:
        return Value(RandomDouble());
      case 4:
      case 5:
        return Value(RandomString());
      case 6:
      case 7: {
        Value a = Value::Array();
        const int n = Uniform(0, 6);
        for (int i = 0; i < n; ++i) a.Push(Make(depth - 1));
        return a;
      }
      default: {
        Value o = Value::Object();
        const int n = Uniform(0, 6);
        for (int i = 0; i < n; ++i) o.Set(RandomString(), Make(depth - 1));
        return o;
      }
    }
  }

  // A random valid UTF-8 string: ASCII (quotes, backslashes and control characters included),
  // 2-, 3- and 4-byte characters, never a surrogate.
  std::string RandomString() {
    std::string s;
    const int n = Uniform(0, 3) == 0 ? Uniform(0, 40) : Uniform(0, 6);
    for (int i = 0; i < n; ++i) {
      uint32_t cp;
      switch (Uniform(0, 5)) {
        case 0:
          cp = static_cast<uint32_t>(Uniform(0, 0x1F));
          break;
        case 1:
          cp = "\"\\/ aZ"[Uniform(0, 5)];
          break;
        case 2:
          cp = static_cast<uint32_t>(Uniform(0x20, 0x7F));
          break;
        case 3:
          cp = static_cast<uint32_t>(Uniform(0x80, 0x7FF));
          break;
        case 4:
          cp = static_cast<uint32_t>(Uniform(0x800, 0xFFFF - 0x800));
          if (cp >= 0xD800) cp += 0x800;  // skip the surrogates
          break;
        default:
          cp = static_cast<uint32_t>(Uniform(0x10000, 0x10FFFF));
      }
      text::AppendUtf8(cp, &s);
    }
    return s;
  }

  int64_t RandomInt() {
    switch (Uniform(0, 4)) {
      case 0:
        return Uniform(-100, 100);
      case 1:
        return INT64_MAX - Uniform(0, 3);
      case 2:
        return INT64_MIN + Uniform(0, 3);
      default:
        return static_cast<int64_t>(rng_());
    }
  }

  // Finite doubles: any bit pattern (subnormals included), simple decimals, integral values.
  double RandomDouble() {
    switch (Uniform(0, 3)) {
      case 0: {
        double d;
        do {
          const uint64_t bits = rng_();
          std::memcpy(&d, &bits, sizeof(d));
        } while (!std::isfinite(d));
        return d;
      }
      case 1:
        return Uniform(-100000, 100000) / 1000.0;
      case 2:
        return static_cast<double>(Uniform(-1000, 1000));
      default:
        return std::ldexp(static_cast<double>(Uniform(1, 1 << 20)), Uniform(-1074, 1000));
    }
  }

  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

 private:
  std::mt19937_64 rng_;
};

TEST(RoundTripTest, RandomValues) {
  RandomValues gen(20240611);
  for (int i = 0; i < 5000; ++i) {
    const Value v = gen.Make(gen.Uniform(0, 6));
    const std::string text = Serialize(v);
    absl::StatusOr<Value> back = Parse(text);
    ASSERT_TRUE(back.ok()) << text << "\n" << back.status();
    ASSERT_EQ(*back, v) << text;
    // Serialization is a fixed point after one trip (member order and number text included).
    ASSERT_EQ(Serialize(*back), text);
  }
}

TEST(RoundTripTest, DoublesRoundTripExactly) {
  RandomValues gen(7);
  for (int i = 0; i < 100000; ++i) {
    const double d = gen.RandomDouble();
    const std::string text = Serialize(Value(d));
    absl::StatusOr<Value> back = Parse(text);
    ASSERT_TRUE(back.ok()) << text;
    ASSERT_EQ(back->as_double(), d) << text;
    ASSERT_EQ(std::signbit(back->as_double()), std::signbit(d)) << text;
  }
}

TEST(RoundTripTest, IntegersRoundTripExactly) {
  RandomValues gen(8);
  for (int i = 0; i < 100000; ++i) {
    const int64_t n = gen.RandomInt();
    absl::StatusOr<Value> back = Parse(Serialize(Value(n)));
    ASSERT_TRUE(back.ok());
    ASSERT_TRUE(back->is_int());
    ASSERT_EQ(back->as_int(), n);
  }
}

TEST(RoundTripTest, ArbitraryBytesSerializeToValidJson) {
  // A producer may hand over any bytes; the output must parse (so it is valid UTF-8) and keep
  // every valid part of the input.
  std::mt19937_64 rng(99);
  for (int i = 0; i < 20000; ++i) {
    std::string bytes(rng() % 24, '\0');
    for (char& c : bytes) {
      // Bias towards the interesting high bytes.
      const uint64_t r = rng();
      c = static_cast<char>(r % 3 == 0 ? static_cast<unsigned char>(r >> 8)
                                       : static_cast<unsigned char>(0x80 + (r >> 8) % 0x80));
    }
    const std::string quoted = Quote(bytes);
    absl::StatusOr<Value> back = Parse(quoted);
    ASSERT_TRUE(back.ok()) << back.status();
    // Re-quoting the result changes nothing; valid input comes back unchanged.
    ASSERT_EQ(Quote(back->as_string()), quoted);
    bool valid = true;
    const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
    const auto* end = p + bytes.size();
    while (valid && p < end) {
      const int n = text::Utf8SequenceLength(p, end, nullptr);
      valid = n > 0;
      p += n;
    }
    if (valid) {
      ASSERT_EQ(back->as_string(), bytes);
    }
  }
}

}  // namespace
}  // namespace magicpig::json
