#include "common/flags/flag_values.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <utility>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace magicpig::flags {

absl::StatusOr<int64_t> ParseByteSize(absl::string_view text) {
  std::string s = absl::AsciiStrToUpper(text);
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("byte size '", text,
                     "': expected a non-negative integer with an optional K, M, G or T suffix"));
  };
  for (std::string_view unit : {"IB", "B"}) {
    if (s.size() > unit.size() && s.compare(s.size() - unit.size(), unit.size(), unit) == 0) {
      s.resize(s.size() - unit.size());
      break;
    }
  }
  int shift = 0;
  if (!s.empty()) {
    switch (s.back()) {
      case 'K':
        shift = 10;
        break;
      case 'M':
        shift = 20;
        break;
      case 'G':
        shift = 30;
        break;
      case 'T':
        shift = 40;
        break;
      default:
        break;
    }
    if (shift > 0) s.pop_back();
  }
  if (s.empty() || !std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(c); })) {
    return bad();
  }
  uint64_t value = 0;
  if (!absl::SimpleAtoi(s, &value)) return bad();
  if (value > (static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) >> shift)) return bad();
  return static_cast<int64_t>(value << shift);
}

std::string FormatByteSize(int64_t bytes) {
  for (auto [shift, suffix] : {std::pair{40, 'T'}, {30, 'G'}, {20, 'M'}, {10, 'K'}}) {
    if (bytes > 0 && bytes % (int64_t{1} << shift) == 0) {
      return absl::StrCat(bytes >> shift, std::string(1, suffix));
    }
  }
  return absl::StrCat(bytes);
}

absl::StatusOr<HostPort> ParseHostPort(absl::string_view address) {
  const std::string a(address);
  const size_t colon = a.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(a.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("address '", a, "': expected HOST:PORT"));
  }
  HostPort out{a.substr(0, colon), port};
  if (out.host.size() >= 2 && out.host.front() == '[' && out.host.back() == ']') {
    out.host = out.host.substr(1, out.host.size() - 2);
  }
  return out;
}

}  // namespace magicpig::flags
