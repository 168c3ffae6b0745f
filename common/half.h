// IEEE binary16 (fp16) and bfloat16 conversions, scalar and exact.
//
// Fp16ToFloat/FloatToFp16 follow IEEE 754 (round to nearest even, subnormals, inf, NaN).
// Bf16 conversions follow ggml: round to nearest even; NaN keeps its high bits with the quiet bit
// forced on.
#ifndef MAGICPIG_COMMON_HALF_H_
#define MAGICPIG_COMMON_HALF_H_

#include <cstdint>
#include <cstring>

namespace magicpig {

float Fp16ToFloat(uint16_t h);
uint16_t FloatToFp16(float f);

inline float Bf16ToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN
    return static_cast<uint16_t>((bits >> 16) | 0x40u);
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace magicpig

#endif  // MAGICPIG_COMMON_HALF_H_
