// AVX2 + FMA + F16C MatMul kernels (compiled with those -m flags only in this file).
//
// Integer types: each 32-value weight block is unpacked once to 32 bytes and multiplied with the
// 8-bit activations of up to 4 tokens (vpmaddubsw + vpmaddwd -> 8 int32 lanes, exact), then scaled
// by d_w * d_x into float accumulators. Float types: FMA dot products, weights converted once per
// 8 values and used for up to 4 tokens.
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "common/half.h"
#include "common/quant/matmul_kernels.h"

namespace magicpig::quant_internal {
namespace {

constexpr int kMaxTokens = 4;  // tokens per pass over a weight row (4 accumulators stay in regs)

#include "common/quant/matmul_isa_common-inl.h"  // NOLINT(build/include): per-ISA copy

// 16 bytes of packed nibbles -> 32 bytes: low nibbles are values 0..15, high nibbles 16..31.
__m256i UnpackNibbles(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// Byte i = 0x10 if bit i of the little-endian u32 at qh is set, else 0.
__m256i HighBits(const uint8_t* qh) {
  uint32_t h;
  std::memcpy(&h, qh, sizeof(h));
  const __m256i shuffle = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                           2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  const __m256i spread =
      _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(h)), shuffle), bit);
  return _mm256_and_si256(_mm256_cmpeq_epi8(spread, bit), _mm256_set1_epi8(0x10));
}

// Unsigned weights as 32 bytes (Q8_0: signed bytes).
template <GgmlType T>
__m256i UnpackWeights(const uint8_t* b) {
  if constexpr (T == GgmlType::kQ8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + Block<T>::kQs));
  } else if constexpr (T == GgmlType::kQ5_0 || T == GgmlType::kQ5_1) {
    return _mm256_or_si256(UnpackNibbles(b + Block<T>::kQs), HighBits(b + Block<T>::kQh));
  } else {
    return UnpackNibbles(b + Block<T>::kQs);
  }
}

// c in "contribution = d_w * d_x * dot + c * s" (see matmul_scalar.cc).
template <GgmlType T>
float OffsetCoef(const uint8_t* b, float d) {
  if constexpr (T == GgmlType::kQ4_0) return -8.0f * d;
  if constexpr (T == GgmlType::kQ5_0) return -16.0f * d;
  if constexpr (T == GgmlType::kQ4_1 || T == GgmlType::kQ5_1) return LoadF16(b + 2);
  return 0.0f;
}

// Exact int32 partial sums (8 lanes) of u8 * s8 over 32 bytes; |pair sums| <= 2*31*127 fits int16.
__m256i DotU8S8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

template <GgmlType T, int NT>
void IntegerRow(const MatMulArgs& a, int64_t r, int64_t t0) {
  const int64_t nb = a.cols / kActBlock;
  const uint8_t* row = a.w + r * a.row_bytes;
  __m256 acc[NT];
  float offset[NT];
  const int8_t* xq[NT];
  const float* xd[NT];
  const float* xs[NT];
  for (int t = 0; t < NT; ++t) {
    acc[t] = _mm256_setzero_ps();
    offset[t] = 0.0f;
    xq[t] = a.xq + (t0 + t) * a.cols;
    xd[t] = a.xd + (t0 + t) * nb * kScaleRepeat;
    xs[t] = a.xs + (t0 + t) * nb;
  }
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * Block<T>::kBytes;
    __m256i w = UnpackWeights<T>(blk);
    __m256i w_sign = w;
    if constexpr (T == GgmlType::kQ8_0) w = _mm256_sign_epi8(w, w);  // |w|; sign goes onto x
    const float d = LoadF16(blk);
    const __m256 dv = _mm256_set1_ps(d);
    const float c = OffsetCoef<T>(blk, d);
    for (int t = 0; t < NT; ++t) {
      __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[t] + b * kActBlock));
      if constexpr (T == GgmlType::kQ8_0) xv = _mm256_sign_epi8(xv, w_sign);
      const __m256 scale = _mm256_mul_ps(dv, _mm256_loadu_ps(xd[t] + b * kScaleRepeat));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DotU8S8(w, xv)), scale, acc[t]);
      if constexpr (T != GgmlType::kQ8_0) offset[t] += c * xs[t][b];
    }
  }
  for (int t = 0; t < NT; ++t) a.y[(t0 + t) * a.ldy + r] = HorizontalSum(acc[t]) + offset[t];
}

template <GgmlType T>
void IntegerRows(const MatMulArgs& a, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    ForTokenChunks(0, a.n_tokens,
                   [&](int64_t t, auto nt) { IntegerRow<T, decltype(nt)::value>(a, r, t); });
  }
}

// Weight loaders for float rows: 8 values at index k as floats, and one value (for the tail).
struct F32Loader {
  static __m256 Load8(const uint8_t* w, int64_t k) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(w) + k);
  }
  static float Load1(const uint8_t* w, int64_t k) {
    float v;
    std::memcpy(&v, w + 4 * k, sizeof(v));
    return v;
  }
};
struct F16Loader {
  static __m256 Load8(const uint8_t* w, int64_t k) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * k)));
  }
  static float Load1(const uint8_t* w, int64_t k) { return LoadF16(w + 2 * k); }
};
struct Bf16Loader {
  static __m256 Load8(const uint8_t* w, int64_t k) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * k));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
  }
  static float Load1(const uint8_t* w, int64_t k) {
    uint16_t h;
    std::memcpy(&h, w + 2 * k, sizeof(h));
    return Bf16ToFloat(h);
  }
};

// y[t] = dot(row, x_t) for NT tokens; two accumulators per token hide the FMA latency.
template <typename L, int NT>
void FloatRow(const uint8_t* row, int64_t cols, const float* const* x, float* out) {
  __m256 acc0[NT], acc1[NT];
  for (int t = 0; t < NT; ++t) acc0[t] = acc1[t] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= cols; k += 16) {
    const __m256 w0 = L::Load8(row, k), w1 = L::Load8(row, k + 8);
    for (int t = 0; t < NT; ++t) {
      acc0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[t] + k), acc0[t]);
      acc1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[t] + k + 8), acc1[t]);
    }
  }
  for (; k + 8 <= cols; k += 8) {
    const __m256 w0 = L::Load8(row, k);
    for (int t = 0; t < NT; ++t) acc0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[t] + k), acc0[t]);
  }
  for (int t = 0; t < NT; ++t) out[t] = HorizontalSum(_mm256_add_ps(acc0[t], acc1[t]));
  for (; k < cols; ++k) {
    const float wk = L::Load1(row, k);
    for (int t = 0; t < NT; ++t) out[t] += wk * x[t][k];
  }
}

#include "common/quant/matmul_float_rows-inl.h"  // NOLINT(build/include): per-ISA copy

}  // namespace

void MatMulRowsAvx2(const MatMulArgs& args, int64_t row_begin, int64_t row_end) {
  switch (args.type) {
    case GgmlType::kQ4_0:
      return IntegerRows<GgmlType::kQ4_0>(args, row_begin, row_end);
    case GgmlType::kQ4_1:
      return IntegerRows<GgmlType::kQ4_1>(args, row_begin, row_end);
    case GgmlType::kQ5_0:
      return IntegerRows<GgmlType::kQ5_0>(args, row_begin, row_end);
    case GgmlType::kQ5_1:
      return IntegerRows<GgmlType::kQ5_1>(args, row_begin, row_end);
    case GgmlType::kQ8_0:
      return IntegerRows<GgmlType::kQ8_0>(args, row_begin, row_end);
    case GgmlType::kF32:
      return FloatRows<F32Loader>(args, row_begin, row_end);
    case GgmlType::kF16:
      return FloatRows<F16Loader>(args, row_begin, row_end);
    case GgmlType::kBF16:
      return FloatRows<Bf16Loader>(args, row_begin, row_end);
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      return KQuantRowsAvx2(args, row_begin, row_end);
    default:
      return;  // unreachable: MatMul accepts only the types above
  }
}

}  // namespace magicpig::quant_internal
