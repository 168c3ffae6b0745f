// The block decoders the CUDA kernels run (block_decode.h), compiled for the host here and checked
// bit for bit against the reference dequantisation on random blocks of every type, including
// random (not only well-formed) bytes, whose fp16 scales may be subnormal, infinite or NaN.
#include "gpu_node/backend/cuda/block_decode.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/half.h"
#include "common/quant/dequantize.h"
#include "common/quant/ggml_type.h"
#include "gtest/gtest.h"
#include "tests/testing/quantize_reference.h"

namespace magicpig::backend::cuda_internal {
namespace {

const GgmlType kTypes[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ4_0,
                           GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0,
                           GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

// Equal bits, or both NaN (NaN payloads may differ between conversions).
bool SameValue(float a, float b) { return Bits(a) == Bits(b) || (std::isnan(a) && std::isnan(b)); }

std::vector<float> DecodeRow(GgmlType type, const std::vector<uint8_t>& bytes, int64_t n) {
  const int code = static_cast<int>(type);
  const int values = BlockValues(code), block_bytes = BlockBytes(code);
  std::vector<float> out(n, -12345.0f);
  for (int64_t b = 0; b < n / values; ++b) {
    float* dst = out.data() + b * values;
    EXPECT_TRUE(
        DecodeBlock(code, bytes.data() + b * block_bytes, [dst](int j, float x) { dst[j] = x; }));
  }
  return out;
}

TEST(BlockDecodeTest, SizesMatchTheTypeTable) {
  for (GgmlType type : kTypes) {
    EXPECT_EQ(BlockValues(static_cast<int>(type)), GgmlBlockSize(type)) << GgmlTypeName(type);
    EXPECT_EQ(BlockBytes(static_cast<int>(type)), GgmlRowBytes(type, GgmlBlockSize(type)))
        << GgmlTypeName(type);
  }
  // Every type the reference supports is decoded here, and nothing else claims to be.
  for (uint32_t code = 0; code < 64; ++code) {
    const auto info = LookupGgmlType(code);
    const bool supported = info.has_value() && info->supported;
    EXPECT_EQ(BlockValues(static_cast<int>(code)) != 0, supported) << "type code " << code;
  }
}

TEST(BlockDecodeTest, QuantisedRowsMatchTheReferenceBitForBit) {
  const int64_t n = 1024;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (GgmlType type : kTypes) {
    std::vector<float> x(n);
    for (float& v : x) v = nd(rng);
    auto bytes = testing::QuantizeReference(type, x.data(), n);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    std::vector<float> expected(n);
    ASSERT_TRUE(DequantizeRow(type, bytes->data(), expected.data(), n).ok());
    const std::vector<float> got = DecodeRow(type, *bytes, n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(SameValue(got[i], expected[i]))
          << GgmlTypeName(type) << " value " << i << ": " << got[i] << " vs " << expected[i];
    }
  }
}

TEST(BlockDecodeTest, ArbitraryBytesMatchTheReferenceBitForBit) {
  const int64_t n = 4096;
  std::mt19937 rng(11);
  for (GgmlType type : kTypes) {
    for (int trial = 0; trial < 8; ++trial) {
      std::vector<uint8_t> bytes(GgmlRowBytes(type, n));
      for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
      std::vector<float> expected(n);
      ASSERT_TRUE(DequantizeRow(type, bytes.data(), expected.data(), n).ok());
      const std::vector<float> got = DecodeRow(type, bytes, n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_TRUE(SameValue(got[i], expected[i]))
            << GgmlTypeName(type) << " trial " << trial << " value " << i;
      }
    }
  }
}

TEST(BlockDecodeTest, HalfConversionIsExactForEveryBitPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float expected = Fp16ToFloat(static_cast<uint16_t>(h));
    ASSERT_TRUE(SameValue(HalfBitsToFloat(static_cast<uint16_t>(h)), expected)) << "bits " << h;
  }
}

TEST(BlockDecodeTest, UnknownTypesAreRefused) {
  uint8_t block[256] = {};
  bool called = false;
  EXPECT_FALSE(DecodeBlock(static_cast<int>(GgmlType::kQ2_K), block,
                           [&called](int, float) { called = true; }));
  EXPECT_FALSE(called);
  EXPECT_EQ(BlockValues(static_cast<int>(GgmlType::kQ2_K)), 0);
}

}  // namespace
}  // namespace magicpig::backend::cuda_internal
