// Parsers for the value types of command-line flags that CLI11 does not know: byte sizes and
// HOST:PORT addresses. Pure functions.
#ifndef MAGICPIG_COMMON_FLAGS_FLAG_VALUES_H_
#define MAGICPIG_COMMON_FLAGS_FLAG_VALUES_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace magicpig::flags {

// "1234", "64K", "512M", "8G", "1T" (case-insensitive suffix, optional trailing "B" or "iB");
// INVALID_ARGUMENT for anything else, negative values or overflow.
absl::StatusOr<int64_t> ParseByteSize(absl::string_view text);

// The shortest exact form ParseByteSize reads back: 8388608 -> "8M", 1000 -> "1000".
std::string FormatByteSize(int64_t bytes);

// "HOST:PORT" or "[IPV6]:PORT" -> (HOST without brackets, PORT in 0..65535); INVALID_ARGUMENT
// naming the address otherwise.
struct HostPort {
  std::string host;
  int port = 0;
};
absl::StatusOr<HostPort> ParseHostPort(absl::string_view address);

}  // namespace magicpig::flags

#endif  // MAGICPIG_COMMON_FLAGS_FLAG_VALUES_H_
