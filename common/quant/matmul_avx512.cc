// AVX-512 (F/BW/VL/DQ, optionally VNNI) MatMul kernels; the -m flags are set on this file only.
//
// Integer types: two 32-value weight blocks fill one 512-bit register; products with the 8-bit
// activations use vpdpbusd when the CPU has VNNI (chosen by the caller, once per call), otherwise
// vpmaddubsw + vpmaddwd. Both give the same exact int32 lane sums. Float types: FMA with masked
// tails.
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "common/quant/dequantize.h"
#include "common/quant/matmul_kernels.h"

namespace magicpig::quant_internal {
namespace {

constexpr int kMaxTokens = 4;  // tokens per pass over a weight row

float LoadF16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return _cvtsh_ss(h);
}

template <GgmlType T>
struct Block;
template <>
struct Block<GgmlType::kQ4_0> {
  static constexpr int kBytes = 18, kQs = 2;
};
template <>
struct Block<GgmlType::kQ4_1> {
  static constexpr int kBytes = 20, kQs = 4;
};
template <>
struct Block<GgmlType::kQ5_0> {
  static constexpr int kBytes = 22, kQs = 6, kQh = 2;
};
template <>
struct Block<GgmlType::kQ5_1> {
  static constexpr int kBytes = 24, kQs = 8, kQh = 4;
};
template <>
struct Block<GgmlType::kQ8_0> {
  static constexpr int kBytes = 34, kQs = 2;
};

// 16 packed bytes -> 32 values in block order (low nibbles first), as a 256-bit half.
__m256i Nibbles(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0F));
}

uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Weights of blocks b0 (low half) and b1 (high half); unsigned except Q8_0 (signed).
template <GgmlType T>
__m512i UnpackPair(const uint8_t* b0, const uint8_t* b1) {
  if constexpr (T == GgmlType::kQ8_0) {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + Block<T>::kQs));
    const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b1 + Block<T>::kQs));
    return _mm512_inserti64x4(_mm512_zextsi256_si512(lo), hi, 1);
  } else {
    __m512i w = _mm512_inserti64x4(_mm512_zextsi256_si512(Nibbles(b0 + Block<T>::kQs)),
                                   Nibbles(b1 + Block<T>::kQs), 1);
    if constexpr (T == GgmlType::kQ5_0 || T == GgmlType::kQ5_1) {
      // Bit i of the 64-bit mask is the fifth bit of value i of the pair.
      const __mmask64 high = static_cast<__mmask64>(LoadU32(b0 + Block<T>::kQh)) |
                             (static_cast<__mmask64>(LoadU32(b1 + Block<T>::kQh)) << 32);
      w = _mm512_or_si512(w, _mm512_maskz_mov_epi8(high, _mm512_set1_epi8(0x10)));
    }
    return w;
  }
}

template <GgmlType T>
float OffsetCoef(const uint8_t* b, float d) {
  if constexpr (T == GgmlType::kQ4_0) return -8.0f * d;
  if constexpr (T == GgmlType::kQ5_0) return -16.0f * d;
  if constexpr (T == GgmlType::kQ4_1 || T == GgmlType::kQ5_1) return LoadF16(b + 2);
  return 0.0f;
}

// Exact int32 lane sums of u8 * s8 (4 products per lane).
template <bool kVnni>
__m512i DotU8S8(__m512i u, __m512i s) {
  if constexpr (kVnni) {
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
  } else {
    return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
  }
}

template <GgmlType T, bool kVnni, int NT>
void IntegerRow(const MatMulArgs& a, int64_t r, int64_t t0) {
  const int64_t nb = a.cols / kActBlock;
  const uint8_t* row = a.w + r * a.row_bytes;
  __m512 acc[NT];
  float offset[NT];
  const int8_t* xq[NT];
  const float* xd[NT];
  const float* xs[NT];
  for (int t = 0; t < NT; ++t) {
    acc[t] = _mm512_setzero_ps();
    offset[t] = 0.0f;
    xq[t] = a.xq + (t0 + t) * a.cols;
    xd[t] = a.xd + (t0 + t) * nb * kScaleRepeat;
    xs[t] = a.xs + (t0 + t) * nb;
  }
  for (int64_t b = 0; b < nb; b += 2) {
    // An odd last block is paired with itself and its second half masked to zero below.
    const bool pair = b + 1 < nb;
    const uint8_t* blk0 = row + b * Block<T>::kBytes;
    const uint8_t* blk1 = pair ? blk0 + Block<T>::kBytes : blk0;
    __m512i w = UnpackPair<T>(blk0, blk1);
    __mmask64 negative = 0;
    if constexpr (T == GgmlType::kQ8_0) {
      negative = _mm512_movepi8_mask(w);
      w = _mm512_abs_epi8(w);  // -128 becomes 0x80 = 128 as unsigned: still exact
    }
    const __mmask64 lanes = pair ? ~__mmask64{0} : __mmask64{0xFFFFFFFFu};
    const float d0 = LoadF16(blk0), d1 = LoadF16(blk1);
    const __m512 dv = _mm512_insertf32x8(_mm512_zextps256_ps512(_mm256_set1_ps(d0)),
                                         _mm256_set1_ps(pair ? d1 : 0.0f), 1);
    const float c0 = OffsetCoef<T>(blk0, d0), c1 = pair ? OffsetCoef<T>(blk1, d1) : 0.0f;
    for (int t = 0; t < NT; ++t) {
      __m512i xv = _mm512_maskz_loadu_epi8(lanes, xq[t] + b * kActBlock);
      if constexpr (T == GgmlType::kQ8_0) {
        xv = _mm512_mask_sub_epi8(xv, negative, _mm512_setzero_si512(), xv);
      }
      const __m512 xdv = _mm512_maskz_loadu_ps(pair ? 0xFFFF : 0x00FF, xd[t] + b * kScaleRepeat);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(DotU8S8<kVnni>(w, xv)), _mm512_mul_ps(dv, xdv),
                               acc[t]);
      if constexpr (T != GgmlType::kQ8_0) {
        offset[t] += c0 * xs[t][b];
        if (pair) offset[t] += c1 * xs[t][b + 1];
      }
    }
  }
  for (int t = 0; t < NT; ++t) a.y[(t0 + t) * a.ldy + r] = _mm512_reduce_add_ps(acc[t]) + offset[t];
}

template <GgmlType T, bool kVnni>
void IntegerRows(const MatMulArgs& a, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    int64_t t = 0;
    for (; t + kMaxTokens <= a.n_tokens; t += kMaxTokens) {
      IntegerRow<T, kVnni, kMaxTokens>(a, r, t);
    }
    switch (a.n_tokens - t) {
      case 3:
        IntegerRow<T, kVnni, 3>(a, r, t);
        break;
      case 2:
        IntegerRow<T, kVnni, 2>(a, r, t);
        break;
      case 1:
        IntegerRow<T, kVnni, 1>(a, r, t);
        break;
      default:
        break;
    }
  }
}

// Masked loads of 16 weights starting at index k as floats.
struct F32Loader {
  static __m512 Load(const uint8_t* w, int64_t k, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(w) + k);
  }
};
struct F16Loader {
  static __m512 Load(const uint8_t* w, int64_t k, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, w + 2 * k));
  }
};
struct Bf16Loader {
  static __m512 Load(const uint8_t* w, int64_t k, __mmask16 m) {
    const __m256i raw = _mm256_maskz_loadu_epi16(m, w + 2 * k);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
  }
};

template <typename L, int NT>
void FloatRow(const uint8_t* row, int64_t cols, const float* const* x, float* out) {
  __m512 acc0[NT], acc1[NT];
  for (int t = 0; t < NT; ++t) acc0[t] = acc1[t] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= cols; k += 32) {
    const __m512 w0 = L::Load(row, k, 0xFFFF), w1 = L::Load(row, k + 16, 0xFFFF);
    for (int t = 0; t < NT; ++t) {
      acc0[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x[t] + k), acc0[t]);
      acc1[t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x[t] + k + 16), acc1[t]);
    }
  }
  for (; k < cols; k += 16) {
    const int64_t left = cols - k;
    const __mmask16 m = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    const __m512 w0 = L::Load(row, k, m);
    for (int t = 0; t < NT; ++t) {
      acc0[t] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m, x[t] + k), acc0[t]);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[t], acc1[t]));
}

template <typename L>
void FloatRowAllTokens(const MatMulArgs& a, const uint8_t* row, int64_t r) {
  const float* x[kMaxTokens];
  float out[kMaxTokens];
  for (int64_t t = 0; t < a.n_tokens; t += kMaxTokens) {
    const int nt = static_cast<int>(a.n_tokens - t < kMaxTokens ? a.n_tokens - t : kMaxTokens);
    for (int i = 0; i < nt; ++i) x[i] = a.x + (t + i) * a.ldx;
    switch (nt) {
      case 4:
        FloatRow<L, 4>(row, a.cols, x, out);
        break;
      case 3:
        FloatRow<L, 3>(row, a.cols, x, out);
        break;
      case 2:
        FloatRow<L, 2>(row, a.cols, x, out);
        break;
      default:
        FloatRow<L, 1>(row, a.cols, x, out);
        break;
    }
    for (int i = 0; i < nt; ++i) a.y[(t + i) * a.ldy + r] = out[i];
  }
}

template <typename L>
void FloatRows(const MatMulArgs& a, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) FloatRowAllTokens<L>(a, a.w + r * a.row_bytes, r);
}

// K-quants: reference dequantisation of each row once, then the F32 kernel for all tokens.
void DequantizedRows(const MatMulArgs& a, int64_t r0, int64_t r1) {
  std::vector<float> buf(static_cast<size_t>(a.cols));
  for (int64_t r = r0; r < r1; ++r) {
    (void)DequantizeRow(a.type, a.w + r * a.row_bytes, buf.data(), a.cols);
    FloatRowAllTokens<F32Loader>(a, reinterpret_cast<const uint8_t*>(buf.data()), r);
  }
}

template <bool kVnni>
void Rows(const MatMulArgs& args, int64_t r0, int64_t r1) {
  switch (args.type) {
    case GgmlType::kQ4_0:
      return IntegerRows<GgmlType::kQ4_0, kVnni>(args, r0, r1);
    case GgmlType::kQ4_1:
      return IntegerRows<GgmlType::kQ4_1, kVnni>(args, r0, r1);
    case GgmlType::kQ5_0:
      return IntegerRows<GgmlType::kQ5_0, kVnni>(args, r0, r1);
    case GgmlType::kQ5_1:
      return IntegerRows<GgmlType::kQ5_1, kVnni>(args, r0, r1);
    case GgmlType::kQ8_0:
      return IntegerRows<GgmlType::kQ8_0, kVnni>(args, r0, r1);
    case GgmlType::kF32:
      return FloatRows<F32Loader>(args, r0, r1);
    case GgmlType::kF16:
      return FloatRows<F16Loader>(args, r0, r1);
    case GgmlType::kBF16:
      return FloatRows<Bf16Loader>(args, r0, r1);
    default:
      return DequantizedRows(args, r0, r1);
  }
}

}  // namespace

void MatMulRowsAvx512(const MatMulArgs& args, int64_t row_begin, int64_t row_end, bool use_vnni) {
  if (use_vnni) {
    Rows<true>(args, row_begin, row_end);
  } else {
    Rows<false>(args, row_begin, row_end);
  }
}

}  // namespace magicpig::quant_internal
