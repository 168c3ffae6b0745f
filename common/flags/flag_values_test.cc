#include "common/flags/flag_values.h"

#include "gtest/gtest.h"

namespace magicpig::flags {
namespace {

TEST(FlagValuesTest, ByteSizes) {
  EXPECT_EQ(*ParseByteSize("0"), 0);
  EXPECT_EQ(*ParseByteSize("1234"), 1234);
  EXPECT_EQ(*ParseByteSize("64K"), 64 << 10);
  EXPECT_EQ(*ParseByteSize("512m"), int64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("8G"), int64_t{8} << 30);
  EXPECT_EQ(*ParseByteSize("8GiB"), int64_t{8} << 30);
  EXPECT_EQ(*ParseByteSize("2TB"), int64_t{2} << 40);
  for (const char* bad : {"", "G", "-1", "1.5G", "12X", "99999999999T", "1 G"}) {
    EXPECT_EQ(ParseByteSize(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(FlagValuesTest, FormatByteSizeReadsBack) {
  EXPECT_EQ(FormatByteSize(8 << 20), "8M");
  EXPECT_EQ(FormatByteSize(int64_t{6} << 30), "6G");
  EXPECT_EQ(FormatByteSize(1536), "1536");
  EXPECT_EQ(FormatByteSize(0), "0");
  for (int64_t v : {int64_t{0}, int64_t{1}, int64_t{1023}, int64_t{1024}, int64_t{3} << 20,
                    (int64_t{1} << 40) + 1024, int64_t{5} << 40}) {
    EXPECT_EQ(*ParseByteSize(FormatByteSize(v)), v) << v;
  }
}

TEST(FlagValuesTest, HostPort) {
  EXPECT_EQ(ParseHostPort("127.0.0.1:0")->host, "127.0.0.1");
  EXPECT_EQ(ParseHostPort("[::1]:9100")->host, "::1");
  EXPECT_EQ(ParseHostPort("[::1]:9100")->port, 9100);
  for (const char* bad : {"9091", "host:port", "host:70000", ":80", "host:-1", ""}) {
    EXPECT_EQ(ParseHostPort(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace magicpig::flags
