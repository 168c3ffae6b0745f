// Tests for DequantizeRow: hand-built blocks for every supported type (expected values from the
// spec's formulas and hand-worked literals) and round trips through the test reference quantiser.
#include "common/quant/dequantize.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/quantize_reference.h"

namespace magicpig {
namespace {

void Put16(std::vector<uint8_t>& b, size_t at, uint16_t v) { std::memcpy(&b[at], &v, 2); }

std::vector<float> Dequant(GgmlType type, const std::vector<uint8_t>& bytes, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n), -12345.0f);
  EXPECT_TRUE(DequantizeRow(type, bytes.data(), y.data(), n).ok());
  return y;
}

TEST(DequantizeTest, F32IsCopied) {
  const float x[3] = {1.5f, -0.0f, 3e38f};
  std::vector<uint8_t> b(sizeof(x));
  std::memcpy(b.data(), x, sizeof(x));
  const std::vector<float> y = Dequant(GgmlType::kF32, b, 3);
  EXPECT_EQ(y[0], 1.5f);
  EXPECT_EQ(y[2], 3e38f);
}

TEST(DequantizeTest, F16HandValues) {
  std::vector<uint8_t> b(10);
  Put16(b, 0, 0x3C00);  // 1
  Put16(b, 2, 0xC000);  // -2
  Put16(b, 4, 0x0001);  // smallest subnormal 2^-24
  Put16(b, 6, 0x7C00);  // +inf
  Put16(b, 8, 0x3555);  // 2^-2 * (1 + 341/1024)
  const std::vector<float> y = Dequant(GgmlType::kF16, b, 5);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -2.0f);
  EXPECT_EQ(y[2], std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(y[3]) && y[3] > 0);
  EXPECT_EQ(y[4], 0.25f * (1.0f + 341.0f / 1024.0f));
}

TEST(DequantizeTest, Bf16HandValues) {
  std::vector<uint8_t> b(6);
  Put16(b, 0, 0x3F80);  // 1
  Put16(b, 2, 0xC040);  // -3
  Put16(b, 4, 0x4049);  // 2 * (1 + 0x49/128)
  const std::vector<float> y = Dequant(GgmlType::kBF16, b, 3);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -3.0f);
  EXPECT_EQ(y[2], 3.140625f);
}

TEST(DequantizeTest, Q4_0HandBlock) {
  std::vector<uint8_t> b(18);
  Put16(b, 0, 0x3800);  // d = 0.5
  for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const std::vector<float> y = Dequant(GgmlType::kQ4_0, b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * (j - 8)) << j;
    EXPECT_EQ(y[j + 16], 0.5f * (7 - j)) << j;
  }
  EXPECT_EQ(y[0], -4.0f);
  EXPECT_EQ(y[16], 3.5f);
  EXPECT_EQ(y[31], -4.0f);
}

TEST(DequantizeTest, Q4_1HandBlock) {
  std::vector<uint8_t> b(20);
  Put16(b, 0, 0x3800);  // d = 0.5
  Put16(b, 2, 0xBC00);  // m = -1
  for (int j = 0; j < 16; ++j) b[4 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const std::vector<float> y = Dequant(GgmlType::kQ4_1, b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * j - 1.0f) << j;
    EXPECT_EQ(y[j + 16], 0.5f * (15 - j) - 1.0f) << j;
  }
  EXPECT_EQ(y[16], 6.5f);
}

// qh = 0x80000001: only value 0 (low half) and value 31 (high half) get the fifth bit.
std::vector<uint8_t> Q5Block(bool with_min) {
  const size_t qh_at = with_min ? 4 : 2;
  std::vector<uint8_t> b(with_min ? 24 : 22);
  Put16(b, 0, 0x3400);                // d = 0.25
  if (with_min) Put16(b, 2, 0x3C00);  // m = 1
  const uint32_t h = 0x80000001u;
  std::memcpy(&b[qh_at], &h, 4);
  for (int j = 0; j < 16; ++j) b[qh_at + 4 + j] = static_cast<uint8_t>(j | (j << 4));
  return b;
}

TEST(DequantizeTest, Q5_0HandBlock) {
  const std::vector<float> y = Dequant(GgmlType::kQ5_0, Q5Block(false), 32);
  EXPECT_EQ(y[0], 0.0f);     // q = 0 | 16
  EXPECT_EQ(y[1], -3.75f);   // q = 1
  EXPECT_EQ(y[15], -0.25f);  // q = 15
  EXPECT_EQ(y[16], -4.0f);   // q = 0
  EXPECT_EQ(y[31], 3.75f);   // q = 15 | 16
  for (int j = 1; j < 15; ++j) {
    EXPECT_EQ(y[j], 0.25f * (j - 16));
    EXPECT_EQ(y[16 + j], 0.25f * (j - 16));
  }
}

TEST(DequantizeTest, Q5_1HandBlock) {
  const std::vector<float> y = Dequant(GgmlType::kQ5_1, Q5Block(true), 32);
  EXPECT_EQ(y[0], 5.0f);
  EXPECT_EQ(y[1], 1.25f);
  EXPECT_EQ(y[16], 1.0f);
  EXPECT_EQ(y[31], 8.75f);
  for (int j = 1; j < 15; ++j) EXPECT_EQ(y[16 + j], 0.25f * j + 1.0f);
}

TEST(DequantizeTest, Q8_0HandBlock) {
  std::vector<uint8_t> b(34);
  Put16(b, 0, 0x4000);  // d = 2
  for (int i = 0; i < 32; ++i) b[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(i - 16));
  b[2] = 0x80;  // -128
  const std::vector<float> y = Dequant(GgmlType::kQ8_0, b, 32);
  EXPECT_EQ(y[0], -256.0f);
  for (int i = 1; i < 32; ++i) EXPECT_EQ(y[i], 2.0f * (i - 16));
}

TEST(DequantizeTest, Q4_KHandBlock) {
  // Sub-block scales and mins chosen to exercise the 6-bit split packing; bytes packed by hand.
  const int sc[8] = {1, 2, 3, 4, 33, 40, 63, 17};
  const int mn[8] = {0, 1, 2, 3, 48, 5, 63, 20};
  std::vector<uint8_t> b(144);
  Put16(b, 0, 0x3C00);  // d = 1
  Put16(b, 2, 0x3800);  // dmin = 0.5
  const uint8_t scales[12] = {129, 130, 195, 68, 192, 1, 194, 67, 1, 88, 255, 65};
  std::memcpy(&b[4], scales, 12);
  for (int i = 0; i < 128; ++i) b[16 + i] = static_cast<uint8_t>((i * 7) & 0xFF);
  const std::vector<float> y = Dequant(GgmlType::kQ4_K, b, 256);
  for (int o = 0; o < 256; ++o) {
    const int c = o / 64, l = o % 32;
    const bool high = (o % 64) >= 32;
    const int j = 2 * c + (high ? 1 : 0);
    const int byte = (32 * (c) + l) * 7 & 0xFF;
    const int q = high ? byte >> 4 : byte & 0xF;
    EXPECT_EQ(y[o], 1.0f * sc[j] * q - 0.5f * mn[j]) << o;
  }
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[33], -0.5f);
  EXPECT_EQ(y[165], 557.5f);
  EXPECT_EQ(y[192], -31.5f);
  EXPECT_EQ(y[255], 109.0f);
}

TEST(DequantizeTest, Q5_KHandBlock) {
  // Q4_K's scales and mins (same packing), qh[32] then qs[128]; per the spec, 64 values at a time
  // with two bit masks u1, u2 that move up by two bits per 64 values.
  const int sc[8] = {1, 2, 3, 4, 33, 40, 63, 17};
  const int mn[8] = {0, 1, 2, 3, 48, 5, 63, 20};
  std::vector<uint8_t> b(176);
  Put16(b, 0, 0x3C00);  // d = 1
  Put16(b, 2, 0x3800);  // dmin = 0.5
  const uint8_t scales[12] = {129, 130, 195, 68, 192, 1, 194, 67, 1, 88, 255, 65};
  std::memcpy(&b[4], scales, 12);
  for (int i = 0; i < 32; ++i) b[16 + i] = static_cast<uint8_t>((i * 37 + 5) & 0xFF);
  for (int i = 0; i < 128; ++i) b[48 + i] = static_cast<uint8_t>((i * 7) & 0xFF);
  const std::vector<float> y = Dequant(GgmlType::kQ5_K, b, 256);
  int u1 = 1, u2 = 2;
  for (int c = 0; c < 4; ++c, u1 <<= 2, u2 <<= 2) {
    for (int l = 0; l < 32; ++l) {
      const int ql = b[48 + 32 * c + l], qh = b[16 + l];
      const int lo = (ql & 0xF) + ((qh & u1) ? 16 : 0);
      const int hi = (ql >> 4) + ((qh & u2) ? 16 : 0);
      EXPECT_EQ(y[64 * c + l], 1.0f * sc[2 * c] * lo - 0.5f * mn[2 * c]) << c << " " << l;
      EXPECT_EQ(y[64 * c + 32 + l], 1.0f * sc[2 * c + 1] * hi - 0.5f * mn[2 * c + 1]) << c << l;
    }
  }
  // By hand: value 0: ql 0, qh[0] = 5 (bit 0 set) -> q = 16, sc 1, mn 0 -> 16.
  EXPECT_EQ(y[0], 16.0f);
  // Value 255: sub-block 7, l = 31: qs[127] = 889 & 255 = 121, high nibble 7; qh[31] =
  // 1152 & 255 = 128 (bit 7) -> 23; 17 * 23 - 0.5 * 20 = 381.
  EXPECT_EQ(y[255], 381.0f);
}

TEST(DequantizeTest, Q6_KHandBlock) {
  std::vector<uint8_t> b(210);
  for (int i = 0; i < 128; ++i) b[i] = static_cast<uint8_t>((i * 13) & 0xFF);
  for (int i = 0; i < 64; ++i) b[128 + i] = static_cast<uint8_t>((i * 29 + 7) & 0xFF);
  int8_t sc[16];
  for (int j = 0; j < 16; ++j) sc[j] = static_cast<int8_t>((j % 2 == 0 ? 1 : -1) * (j + 1));
  std::memcpy(&b[192], sc, 16);
  Put16(b, 208, 0x3800);  // d = 0.5
  const std::vector<float> y = Dequant(GgmlType::kQ6_K, b, 256);
  // The spec's table, one row per quarter of each half.
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const int ql0 = b[64 * h + l], ql1 = b[64 * h + l + 32], qh = b[128 + 32 * h + l];
      const int q[4] = {(ql0 & 0xF) | ((qh & 3) << 4), (ql1 & 0xF) | (((qh >> 2) & 3) << 4),
                        (ql0 >> 4) | (((qh >> 4) & 3) << 4), (ql1 >> 4) | (((qh >> 6) & 3) << 4)};
      for (int k = 0; k < 4; ++k) {
        const int s = sc[8 * h + l / 16 + 2 * k];
        EXPECT_EQ(y[128 * h + 32 * k + l], 0.5f * s * (q[k] - 32)) << h << " " << l << " " << k;
      }
    }
  }
  EXPECT_EQ(y[0], 8.0f);
  EXPECT_EQ(y[255], 200.0f);
}

TEST(DequantizeTest, RejectsBadInput) {
  std::vector<uint8_t> b(1024);
  std::vector<float> y(1024);
  EXPECT_EQ(DequantizeRow(GgmlType::kQ4_0, b.data(), y.data(), 33).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeRow(GgmlType::kQ4_K, b.data(), y.data(), 128).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeRow(GgmlType::kQ2_K, b.data(), y.data(), 256).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeRow(static_cast<GgmlType>(5), b.data(), y.data(), 32).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(DequantizeRow(GgmlType::kQ8_0, b.data(), y.data(), 0).ok());
}

class RoundTripTest : public ::testing::TestWithParam<GgmlType> {};

TEST_P(RoundTripTest, ErrorWithinTheoreticalBound) {
  const GgmlType type = GetParam();
  constexpr int64_t kN = 1024;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uniform(0.5f, 3.0f);
  // Four regimes: centred, all positive with an offset, all negative, tiny values.
  for (int regime = 0; regime < 4; ++regime) {
    std::vector<float> x(kN);
    for (int64_t i = 0; i < kN; ++i) {
      const float v = normal(rng);
      x[i] = regime == 0   ? v * 2.0f
             : regime == 1 ? uniform(rng) + 0.1f * v
             : regime == 2 ? -uniform(rng)
                           : 1e-3f * v;
    }
    x[5] = 0.0f;
    absl::StatusOr<std::vector<uint8_t>> q = testing::QuantizeReference(type, x.data(), kN);
    ASSERT_TRUE(q.ok()) << q.status();
    const std::vector<float> y = Dequant(type, *q, kN);
    const std::vector<double> bound = testing::QuantizationErrorBound(type, x.data(), kN);
    for (int64_t i = 0; i < kN; ++i) {
      ASSERT_LE(std::fabs(static_cast<double>(y[i]) - x[i]), bound[i])
          << GgmlTypeName(type) << " regime " << regime << " i " << i << " x " << x[i];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, RoundTripTest,
                         ::testing::Values(GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16,
                                           GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                                           GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ4_K,
                                           GgmlType::kQ5_K, GgmlType::kQ6_K),
                         [](const auto& info) { return std::string(GgmlTypeName(info.param)); });

}  // namespace
}  // namespace magicpig
