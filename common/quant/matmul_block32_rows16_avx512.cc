// AVX-512 (F/BW/VL/DQ, optionally VNNI) kernels for Q4_1 and Q8_0 matrices (32-value blocks) in the
// 16-row interleaved layout (interleave.h) against the block activations in the AVX-512 layout
// (matmul_kernels.h); the -m flags are set on this file only.
//
// Why: SmolLM2's decode step streams ~61 MB of Q4_1 layers and a ~30 MB Q8_0 head, and the
// row-major kernels spent about as long on each byte as the memory did (docs/kernels.md, "Dense
// decode from memory"): per 4 rows x 4 blocks they unpack nibbles and scales with shuffles and
// reduce across lanes. Here lane r of every 512-bit register belongs to row r of the group: one
// 64-byte load holds 4 bytes of each of 16 rows, and a vpdpbusd against 4 broadcast activation
// bytes does 64 multiply-adds. Per block and token, 8 vpdpbusd and one conversion, then
//   Q4_1: y_r += (d_r dx) sum_i q_ri x_i + m_r (dx sum_i x_i)   (the second factor is s)
//   Q8_0: y_r += (d_r dx) sum_i q_ri x_i, the weights stored + 128 (vpdpbusd's unsigned operand),
//         the dot started at -128 sum_i x_i. Without VNNI (vpmaddubsw would saturate on 255 x
//         127 pairs) the stored bytes are unbiased and multiplied as |q| with x negated where q <
//         0: the same exact int32.
// Every token gets the single-token arithmetic (batch invariance, matmul.h).
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "common/quant/interleave.h"
#include "common/quant/matmul_kernels.h"

namespace magicpig::quant_internal {
namespace {

#include "common/quant/matmul_rows16_avx512-inl.h"  // NOLINT(build/include): per-unit copy

#define MAGICPIG_INLINE inline __attribute__((always_inline))

constexpr int64_t kQ41GroupBlockBytes = kInterleaveRows * Block<GgmlType::kQ4_1>::kBytes;  // 320
constexpr int64_t kQ80GroupBlockBytes = kInterleaveRows * Block<GgmlType::kQ8_0>::kBytes;  // 544

// acc + the exact int32 dot of 4 signed weights, stored + 128, with 4 signed activations per lane,
// minus 128 x the activations' sum when kVnni (the caller starts acc at -128 sum x for the block).
template <bool kVnni>
MAGICPIG_INLINE __m512i Dot4Biased(__m512i acc, __m512i biased, __m512i x) {
  if constexpr (kVnni) {
    return _mm512_dpbusd_epi32(acc, biased, x);
  } else {
    const __m512i w = _mm512_xor_si512(biased, _mm512_set1_epi8(static_cast<char>(0x80)));
    const __m512i xs = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
    // |w| <= 128 and |x| <= 127: pair sums <= 2 x 128 x 127 < 2^15.
    return _mm512_add_epi32(
        acc, _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(w), xs), _mm512_set1_epi16(1)));
  }
}

// Sum of the 16 int8 at p and the 16 at p + 64 (one block's activations).
MAGICPIG_INLINE int32_t BlockSum(const int8_t* p) {
  const __m128i bias = _mm_set1_epi8(static_cast<char>(0x80));
  const __m128i a = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), bias);
  const __m128i b = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 64)), bias);
  const __m128i s =
      _mm_add_epi64(_mm_sad_epu8(a, _mm_setzero_si128()), _mm_sad_epu8(b, _mm_setzero_si128()));
  return static_cast<int32_t>(_mm_cvtsi128_si64(s) + _mm_extract_epi64(s, 1)) - 32 * 128;
}

// Rows of group `base` (16 rows, first row r0) for tokens t0..t0 + NT - 1.
template <GgmlType T, bool kVnni, int NT>
void GroupTokens(const MatMulArgs& a, const uint8_t* base, int64_t r0, int64_t t0) {
  constexpr bool kQ8 = T == GgmlType::kQ8_0;
  constexpr int64_t kBlockBytes = kQ8 ? kQ80GroupBlockBytes : kQ41GroupBlockBytes;
  const int64_t nb = a.cols / kActBlock;
  const int64_t q_stride = Avx512QStride(a.cols), d_stride = Avx512DStride(a.cols),
                s_stride = Avx512SStride(a.cols);
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = base + b * kBlockBytes;
    // w[k]: values 4k..4k+3 of the 16 rows for k < 4, values 16 + 4(k-4).. for k >= 4.
    __m512i w[8];
    if constexpr (kQ8) {
      for (int k = 0; k < 8; ++k) w[k] = _mm512_loadu_si512(blk + 32 + 64 * k);
    } else {
      for (int k = 0; k < 4; ++k) {
        const __m512i c = _mm512_loadu_si512(blk + 64 + 64 * k);
        w[k] = _mm512_and_si512(c, nibble);
        w[4 + k] = _mm512_and_si512(_mm512_srli_epi16(c, 4), nibble);
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    // Q4_1's minima of the 16 rows (unused for Q8_0).
    const __m512 m =
        kQ8 ? _mm512_setzero_ps()
            : _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
    // Block b's activations: values 0..15 at xq[0..16), values 16..31 at xq[64..80).
    const int64_t q_off = (b / 4) * 128 + (b % 4) * 16, d_off = (b / 4) * 16 + (b % 4) * 4;
    for (int t = 0; t < NT; ++t) {
      const int8_t* xq = a.xq + (t0 + t) * q_stride + q_off;
      const __m512 dx = _mm512_set1_ps(a.xd[(t0 + t) * d_stride + d_off]);
      if constexpr (kQ8) {
        __m512i dot = kVnni ? _mm512_set1_epi32(-128 * BlockSum(xq)) : _mm512_setzero_si512();
        for (int k = 0; k < 8; ++k) {
          dot = Dot4Biased<kVnni>(dot, w[k], Broadcast4(xq + (k < 4 ? 4 * k : 64 + 4 * (k - 4))));
        }
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, dx), acc[t]);
      } else {
        __m512i dot = _mm512_setzero_si512();
        for (int k = 0; k < 4; ++k) {
          dot = Dot4<kVnni>(dot, w[k], Broadcast4(xq + 4 * k));
          dot = Dot4<kVnni>(dot, w[4 + k], Broadcast4(xq + 64 + 4 * k));
        }
        const __m512 sx = _mm512_set1_ps(a.xs[(t0 + t) * s_stride + b]);
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, dx), acc[t]);
        acc[t] = _mm512_fmadd_ps(m, sx, acc[t]);
      }
    }
  }
  for (int t = 0; t < NT; ++t) _mm512_storeu_ps(a.y + (t0 + t) * a.ldy + r0, acc[t]);
}

template <GgmlType T, bool kVnni>
void Groups(const MatMulArgs& a, int64_t r0, int64_t r1) {
  ForGroupsAndTokens(a, r0, r1, [&](const uint8_t* base, int64_t r, int64_t t, auto nt) {
    GroupTokens<T, kVnni, decltype(nt)::value>(a, base, r, t);
  });
}

#undef MAGICPIG_INLINE

}  // namespace

void Block32Rows16Avx512(const MatMulArgs& args, int64_t row_begin, int64_t row_end,
                         bool use_vnni) {
  if (args.type == GgmlType::kQ8_0) {
    (use_vnni ? Groups<GgmlType::kQ8_0, true> : Groups<GgmlType::kQ8_0, false>)(args, row_begin,
                                                                                row_end);
  } else {
    (use_vnni ? Groups<GgmlType::kQ4_1, true> : Groups<GgmlType::kQ4_1, false>)(args, row_begin,
                                                                                row_end);
  }
}

}  // namespace magicpig::quant_internal
