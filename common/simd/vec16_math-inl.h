// Math shared by every 16-float vector ISA (vec16_{scalar,avx2,avx512}-inl.h): each of those
// headers defines, in magicpig::simd16::<isa>, kLanes == 16, a vector type V and Zero(),
// Set1(float), LoadF32, LoadF16, LoadBf16, LoadBf16Shuffled + Bf16ShuffledSource (16 elements in an
// ISA-chosen lane order), Store, Fma(a, b, c) = a*b + c, Mul, Add, Max, Sub, Floor, ScaleByPow2(p,
// e) = p * 2^e (e integral), ReduceAdd, ReduceMax, Prefetch (into L1), PrefetchL2 (into L2 only,
// for a far prefetch stage) (and ReduceAdd4 if it defines MAGICPIG_SIMD16_HAS_REDUCE_ADD4; DotAcc,
// DotAccZero, DotAccFma and DotAccReduce8 if it defines MAGICPIG_SIMD16_HAS_DOT_ACC), then
// includes this file with MAGICPIG_SIMD16_NS naming its namespace. No include guard on purpose.
#include <cstdint>
#include <cstring>

namespace magicpig::simd16::MAGICPIG_SIMD16_NS {

inline float MaxF(float a, float b) { return a > b ? a : b; }

#ifndef MAGICPIG_SIMD16_HAS_REDUCE_ADD4
// out[0..4) = the lane sums of a, b, c, d (an ISA with a cheaper joint reduction defines its own).
inline void ReduceAdd4(V a, V b, V c, V d, float* out) {
  out[0] = ReduceAdd(a);
  out[1] = ReduceAdd(b);
  out[2] = ReduceAdd(c);
  out[3] = ReduceAdd(d);
}
#endif

#ifndef MAGICPIG_SIMD16_HAS_DOT_ACC
// A dot-product accumulator: DotAccFma(a, b, c) adds the products of a and b's lanes to c in an
// ISA-chosen arrangement that keeps their sum; DotAccReduce8 gives 8 accumulators' sums (an ISA
// short of registers folds V into a narrower type).
using DotAcc = V;
inline DotAcc DotAccZero() { return Zero(); }
inline DotAcc DotAccFma(V a, V b, DotAcc c) { return Fma(a, b, c); }
inline void DotAccReduce8(const DotAcc* a, float* out) {
  ReduceAdd4(a[0], a[1], a[2], a[3], out);
  ReduceAdd4(a[4], a[5], a[6], a[7], out + 4);
}
#endif

// exp(x) for x <= 0 (and -inf -> ~0): 2^t by a degree-6 polynomial of the fraction; the argument
// is clamped at -87 so the exponent arithmetic never wraps (docs/architecture.md §16). Relative
// error < 2e-7.
inline float FastExp(float x) {
  x = MaxF(x, -87.0f);
  const float t = x * 1.44269504088896341f;  // log2(e)
  const float fi = __builtin_floorf(t);
  const float f = t - fi;  // [0, 1)
  float p = 1.535336188319500e-4f;
  p = p * f + 1.339887440266574e-3f;
  p = p * f + 9.618437357674640e-3f;
  p = p * f + 5.550332471162809e-2f;
  p = p * f + 2.402264791363012e-1f;
  p = p * f + 6.931472028550421e-1f;
  p = p * f + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &p, 4);
  bits += static_cast<int32_t>(fi) << 23;
  float r;
  std::memcpy(&r, &bits, 4);
  return r;
}

// FastExp on 16 lanes (same polynomial).
inline V ExpV(V x) {
  x = Max(x, Set1(-87.0f));
  const V t = Mul(x, Set1(1.44269504088896341f));
  const V fi = Floor(t);
  const V f = Sub(t, fi);
  V p = Set1(1.535336188319500e-4f);
  p = Fma(p, f, Set1(1.339887440266574e-3f));
  p = Fma(p, f, Set1(9.618437357674640e-3f));
  p = Fma(p, f, Set1(5.550332471162809e-2f));
  p = Fma(p, f, Set1(2.402264791363012e-1f));
  p = Fma(p, f, Set1(6.931472028550421e-1f));
  p = Fma(p, f, Set1(1.0f));
  return ScaleByPow2(p, fi);
}

}  // namespace magicpig::simd16::MAGICPIG_SIMD16_NS
