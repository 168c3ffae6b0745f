// Bit packing of SimHash codes for the wire (proto/magicpig/v1/attention.proto, "Conventions").
//
// A sequence of `count` codes of K bits each (1 <= K <= 16, each code < 2^K) is packed into
// ceil(count * K / 8) bytes: bit b of code i sits at bit position i * K + b of the byte string,
// LSB-first within each byte (bit position p is bit p % 8 of byte p / 8). Unused high bits of the
// last byte are 0. For codes laid out [row][table] (SimHash::Codes), code i = row * L + table,
// which is the proto's layout.
//
//   std::string packed;
//   MAGICPIG_RETURN_IF_ERROR(PackCodes(codes.data(), n * l, k, &packed));
//   std::vector<uint16_t> back(n * l);
//   MAGICPIG_RETURN_IF_ERROR(UnpackCodes(packed, n * l, k, back.data()));
//
// Thread-safety: pure functions.
#ifndef MAGICPIG_COMMON_ATTENTION_CODE_PACKING_H_
#define MAGICPIG_COMMON_ATTENTION_CODE_PACKING_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace magicpig::attention {

// ceil(count * k / 8): the packed size in bytes (count >= 0, 1 <= k <= 16).
int64_t PackedCodeBytes(int64_t count, int k);

// Replaces *out with the packed codes[0 .. count). INVALID_ARGUMENT (and *out untouched) for k not
// in [1, 16], count < 0, a null out (or null codes with count > 0), or a code >= 2^k.
absl::Status PackCodes(const uint16_t* codes, int64_t count, int k, std::string* out);

// Writes out[0 .. count) from the packed bytes. INVALID_ARGUMENT for k not in [1, 16], count < 0,
// bytes.size() != PackedCodeBytes(count, k), or non-zero padding bits in the last byte (a sign of
// a misaligned or corrupt buffer). Every code written is < 2^k by construction. On error the
// contents of out are unspecified.
absl::Status UnpackCodes(std::string_view bytes, int64_t count, int k, uint16_t* out);

}  // namespace magicpig::attention

#endif  // MAGICPIG_COMMON_ATTENTION_CODE_PACKING_H_
