#include "common/attention/code_packing.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace magicpig::attention {

namespace {

absl::Status CheckArgs(int64_t count, int k) {
  if (k < 1 || k > 16) {
    return absl::InvalidArgumentError(absl::StrCat("code bits K must be in [1, 16], got ", k));
  }
  // count * k must not overflow int64 (k <= 16).
  if (count < 0 || count > std::numeric_limits<int64_t>::max() / 16) {
    return absl::InvalidArgumentError(absl::StrCat("code count must be >= 0, got ", count));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t PackedCodeBytes(int64_t count, int k) { return (count * k + 7) / 8; }

absl::Status PackCodes(const uint16_t* codes, int64_t count, int k, std::string* out) {
  if (absl::Status s = CheckArgs(count, k); !s.ok()) return s;
  if (out == nullptr || (codes == nullptr && count > 0)) {
    return absl::InvalidArgumentError("PackCodes: null codes or output");
  }
  const uint32_t limit = uint32_t{1} << k;
  for (int64_t i = 0; i < count; ++i) {
    if (codes[i] >= limit) {
      return absl::InvalidArgumentError(
          absl::StrCat("PackCodes: code ", i, " = ", codes[i], " is not < 2^K = ", limit));
    }
  }
  std::string packed(static_cast<size_t>(PackedCodeBytes(count, k)), '\0');
  // Little-endian bit stream through a 64-bit accumulator: append k bits, flush whole bytes.
  uint64_t acc = 0;
  int bits = 0;
  size_t at = 0;
  for (int64_t i = 0; i < count; ++i) {
    acc |= static_cast<uint64_t>(codes[i]) << bits;
    bits += k;
    while (bits >= 8) {
      packed[at++] = static_cast<char>(acc & 0xffu);
      acc >>= 8;
      bits -= 8;
    }
  }
  if (bits > 0) packed[at++] = static_cast<char>(acc & 0xffu);
  *out = std::move(packed);
  return absl::OkStatus();
}

absl::Status UnpackCodes(std::string_view bytes, int64_t count, int k, uint16_t* out) {
  if (absl::Status s = CheckArgs(count, k); !s.ok()) return s;
  const int64_t expected = PackedCodeBytes(count, k);
  if (static_cast<int64_t>(bytes.size()) != expected) {
    return absl::InvalidArgumentError(absl::StrCat("packed codes: expected ", expected,
                                                   " bytes for ", count, " codes of ", k,
                                                   " bits, got ", bytes.size()));
  }
  if (out == nullptr && count > 0) return absl::InvalidArgumentError("UnpackCodes: null output");
  const auto* in = reinterpret_cast<const unsigned char*>(bytes.data());
  const uint64_t mask = (uint64_t{1} << k) - 1;
  uint64_t acc = 0;
  int bits = 0;
  size_t at = 0;
  for (int64_t i = 0; i < count; ++i) {
    while (bits < k) {
      acc |= static_cast<uint64_t>(in[at++]) << bits;
      bits += 8;
    }
    out[i] = static_cast<uint16_t>(acc & mask);
    acc >>= k;
    bits -= k;
  }
  // Whatever is left of the last byte is padding and must be zero.
  if (acc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("packed codes: non-zero padding bits after code ", count - 1));
  }
  return absl::OkStatus();
}

}  // namespace magicpig::attention
