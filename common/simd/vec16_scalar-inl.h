// A 16-float "vector" in plain C++ for the baseline (x86-64) kernel units (see vec16_math-inl.h).
#ifndef MAGICPIG_COMMON_SIMD_VEC16_SCALAR_INL_H_
#define MAGICPIG_COMMON_SIMD_VEC16_SCALAR_INL_H_

#include <cstdint>

#include "common/half.h"

namespace magicpig::simd16::scalar {
constexpr int64_t kLanes = 16;
struct V {
  float x[16];
};
inline V Zero() {
  V v;
  for (float& f : v.x) f = 0.0f;
  return v;
}
inline V Set1(float a) {
  V v;
  for (float& f : v.x) f = a;
  return v;
}
inline V LoadF32(const float* p) {
  V v;
  for (int i = 0; i < 16; ++i) v.x[i] = p[i];
  return v;
}
inline V LoadF16(const uint16_t* p) {
  V v;
  for (int i = 0; i < 16; ++i) v.x[i] = Fp16ToFloat(p[i]);
  return v;
}
inline V LoadBf16(const uint16_t* p) {
  V v;
  for (int i = 0; i < 16; ++i) v.x[i] = Bf16ToFloat(p[i]);
  return v;
}
inline void Store(float* p, V v) {
  for (int i = 0; i < 16; ++i) p[i] = v.x[i];
}
inline V Fma(V a, V b, V c) {
  for (int i = 0; i < 16; ++i) c.x[i] += a.x[i] * b.x[i];
  return c;
}
inline V Mul(V a, V b) {
  for (int i = 0; i < 16; ++i) a.x[i] *= b.x[i];
  return a;
}
inline V Add(V a, V b) {
  for (int i = 0; i < 16; ++i) a.x[i] += b.x[i];
  return a;
}
inline V Max(V a, V b) {
  for (int i = 0; i < 16; ++i) a.x[i] = a.x[i] > b.x[i] ? a.x[i] : b.x[i];
  return a;
}
inline V Sub(V a, V b) {
  for (int i = 0; i < 16; ++i) a.x[i] -= b.x[i];
  return a;
}
inline V Floor(V a) {
  for (int i = 0; i < 16; ++i) a.x[i] = __builtin_floorf(a.x[i]);
  return a;
}
inline V ScaleByPow2(V p, V e) {
  for (int i = 0; i < 16; ++i) p.x[i] = __builtin_ldexpf(p.x[i], static_cast<int>(e.x[i]));
  return p;
}
inline float ReduceMax(V v) {
  float m = v.x[0];
  for (int i = 1; i < 16; ++i) m = m > v.x[i] ? m : v.x[i];
  return m;
}
inline float ReduceAdd(V v) {
  float s = 0.0f;
  for (float f : v.x) s += f;
  return s;
}
// 16 bf16 values in the order of Bf16ShuffledSource (here the natural order).
inline V LoadBf16Shuffled(const uint16_t* p) { return LoadBf16(p); }
inline int Bf16ShuffledSource(int lane) { return lane; }
inline void Prefetch(const void* p) { __builtin_prefetch(p); }
inline void PrefetchL2(const void* p) { __builtin_prefetch(p, 0, 2); }
// Bit i = lane i > 0 (strict; NaN gives 0).
inline uint32_t PositiveMask(V v) {
  uint32_t m = 0;
  for (int i = 0; i < 16; ++i) m |= static_cast<uint32_t>(v.x[i] > 0.0f) << i;
  return m;
}
}  // namespace magicpig::simd16::scalar

#define MAGICPIG_SIMD16_NS scalar
#include "common/simd/vec16_math-inl.h"
#undef MAGICPIG_SIMD16_NS

#endif  // MAGICPIG_COMMON_SIMD_VEC16_SCALAR_INL_H_
