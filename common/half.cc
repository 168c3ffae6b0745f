#include "common/half.h"

#include <cmath>

namespace magicpig {

float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    // Zero or subnormal: value = mantissa * 2^-24, exact in float.
    float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    std::memcpy(&bits, &magnitude, sizeof(bits));
    bits |= sign;
  } else if (exponent == 31) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t FloatToFp16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs_bits >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (abs_bits < 0x38800000u) {
    // Result is subnormal or zero: round(|f| * 2^24) with ties to even (nearbyint, default mode).
    float abs_f;
    std::memcpy(&abs_f, &abs_bits, sizeof(abs_f));
    return sign | static_cast<uint16_t>(std::nearbyint(std::ldexp(abs_f, 24)));
  }
  // Normal: rebias the exponent and round the 13 dropped mantissa bits to nearest even.
  uint32_t rebased = abs_bits - (112u << 23);
  rebased += 0xfffu + ((rebased >> 13) & 1u);
  return sign | static_cast<uint16_t>(rebased >> 13);
}

}  // namespace magicpig
