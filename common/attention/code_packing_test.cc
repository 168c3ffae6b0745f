#include "common/attention/code_packing.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace magicpig::attention {
namespace {

// Independent reference: set bit i*k + b of a zeroed buffer one bit at a time.
std::string PackBitByBit(const std::vector<uint16_t>& codes, int k) {
  std::string out((codes.size() * k + 7) / 8, '\0');
  for (size_t i = 0; i < codes.size(); ++i) {
    for (int b = 0; b < k; ++b) {
      if ((codes[i] >> b) & 1) {
        const size_t pos = i * k + b;
        out[pos / 8] =
            static_cast<char>(static_cast<unsigned char>(out[pos / 8]) | (1u << (pos % 8)));
      }
    }
  }
  return out;
}

TEST(CodePackingTest, HandComputedExamples) {
  // K = 3: 5 | 2 << 3 | 7 << 6 = 0x1d5 -> bytes d5 01 (9 bits, 7 padding bits).
  std::string packed;
  const std::vector<uint16_t> three = {5, 2, 7};
  ASSERT_TRUE(PackCodes(three.data(), 3, 3, &packed).ok());
  EXPECT_EQ(packed, std::string("\xd5\x01", 2));
  // K = 10: 0x3ff | 1 << 10 = 0x7ff -> bytes ff 07 00 (20 bits in 3 bytes).
  const std::vector<uint16_t> ten = {0x3ff, 0x001};
  ASSERT_TRUE(PackCodes(ten.data(), 2, 10, &packed).ok());
  EXPECT_EQ(packed, std::string("\xff\x07\x00", 3));
  // K = 16: little-endian uint16.
  const std::vector<uint16_t> sixteen = {0x1234, 0xabcd};
  ASSERT_TRUE(PackCodes(sixteen.data(), 2, 16, &packed).ok());
  EXPECT_EQ(packed, std::string("\x34\x12\xcd\xab", 4));

  std::vector<uint16_t> back(3);
  ASSERT_TRUE(UnpackCodes(std::string("\xd5\x01", 2), 3, 3, back.data()).ok());
  EXPECT_EQ(back, three);
}

TEST(CodePackingTest, RoundTripsEveryKWithRaggedCounts) {
  std::mt19937 rng(7);
  for (int k = 1; k <= 16; ++k) {
    for (int64_t count : {0, 1, 2, 3, 7, 8, 9, 15, 17, 100, 1001}) {
      std::vector<uint16_t> codes(static_cast<size_t>(count));
      for (auto& c : codes) c = static_cast<uint16_t>(rng() & ((1u << k) - 1));
      std::string packed;
      ASSERT_TRUE(PackCodes(codes.data(), count, k, &packed).ok()) << k << " " << count;
      EXPECT_EQ(static_cast<int64_t>(packed.size()), (count * k + 7) / 8);
      EXPECT_EQ(static_cast<int64_t>(packed.size()), PackedCodeBytes(count, k));
      EXPECT_EQ(packed, PackBitByBit(codes, k)) << k << " " << count;
      std::vector<uint16_t> back(static_cast<size_t>(count), 0xffff);
      ASSERT_TRUE(UnpackCodes(packed, count, k, back.data()).ok()) << k << " " << count;
      EXPECT_EQ(back, codes) << k << " " << count;
    }
  }
}

TEST(CodePackingTest, RejectsBadArguments) {
  std::vector<uint16_t> out(8);
  std::string packed;
  const std::vector<uint16_t> codes = {1, 2, 3};
  EXPECT_EQ(PackCodes(codes.data(), 3, 0, &packed).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PackCodes(codes.data(), 3, 17, &packed).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PackCodes(codes.data(), -1, 4, &packed).code(), absl::StatusCode::kInvalidArgument);
  // 3 is not < 2^1.
  absl::Status s = PackCodes(codes.data(), 3, 1, &packed);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("code 1"), std::string_view::npos) << s;

  EXPECT_EQ(UnpackCodes("", 1, 0, out.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(UnpackCodes("\x01\x02", 1, 17, out.data()).code(), absl::StatusCode::kInvalidArgument);
  // 3 codes of 3 bits need 2 bytes: one short, one long.
  EXPECT_EQ(UnpackCodes("\xd5", 3, 3, out.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(UnpackCodes(std::string("\xd5\x01\x00", 3), 3, 3, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  // Non-zero padding (bit 9 set).
  s = UnpackCodes(std::string("\xd5\x03", 2), 3, 3, out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("padding"), std::string_view::npos) << s;
  // Zero codes: an empty string is the only valid encoding.
  EXPECT_TRUE(UnpackCodes("", 0, 5, nullptr).ok());
  EXPECT_EQ(UnpackCodes(std::string("\x00", 1), 0, 5, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace magicpig::attention
