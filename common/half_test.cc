#include "common/half.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace magicpig {
namespace {

// Independent reference: the hardware's _Float16 conversion (GCC on x86-64 supports it in software
// or with F16C), compared over every 16-bit pattern.
TEST(HalfTest, Fp16ToFloatMatchesCompilerForAllPatterns) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    _Float16 h;
    uint16_t b = static_cast<uint16_t>(bits);
    std::memcpy(&h, &b, 2);
    float expected = static_cast<float>(h);
    float got = Fp16ToFloat(b);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << bits;
    } else {
      EXPECT_EQ(expected, got) << bits;
    }
  }
}

TEST(HalfTest, FloatToFp16MatchesCompilerRounding) {
  // Sweep float bit patterns with a stride that covers every exponent and many mantissas,
  // including halfway cases (stride is odd so low bits vary).
  for (uint64_t bits = 0; bits < (1ull << 32); bits += 65521) {
    uint32_t b = static_cast<uint32_t>(bits);
    float f;
    std::memcpy(&f, &b, 4);
    _Float16 h = static_cast<_Float16>(f);
    uint16_t expected;
    std::memcpy(&expected, &h, 2);
    uint16_t got = FloatToFp16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Fp16ToFloat(got)));
    } else {
      ASSERT_EQ(expected, got) << "float bits " << std::hex << b;
    }
  }
  // Exact halfway cases between fp16 neighbours round to even.
  EXPECT_EQ(FloatToFp16(1.0f + 1.0f / 2048), 0x3c00);  // tie -> even (1.0)
  EXPECT_EQ(FloatToFp16(1.0f + 3.0f / 2048), 0x3c02);  // tie -> even (1+2/1024)
  EXPECT_EQ(FloatToFp16(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToFp16(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -25)), 0x0000);  // tie below min subnormal -> 0
  EXPECT_EQ(FloatToFp16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp -> 2
}

TEST(HalfTest, Bf16RoundTripAndRounding) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even -> 1.0.
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1+2^-7 and 1+2^-6: ties to even -> 1+2^-6 (0x3f82).
  EXPECT_EQ(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  uint16_t nan_bits = FloatToBf16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(Bf16ToFloat(nan_bits)));
  EXPECT_TRUE(nan_bits & 0x40);
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    float f = Bf16ToFloat(static_cast<uint16_t>(bits));
    if (!std::isnan(f)) {
      EXPECT_EQ(FloatToBf16(f), bits);
    }
  }
}

}  // namespace
}  // namespace magicpig
