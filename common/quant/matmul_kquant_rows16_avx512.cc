// AVX-512 (F/BW/VL/DQ, optionally VNNI) kernels for Q4_K and Q6_K matrices in the 16-row
// interleaved layout (interleave.h) against super-block activations in natural order
// (matmul_kernels.h); the -m flags are set on this file only.
//
// Lane r of every 512-bit register belongs to row r of the group. A vpdpbusd (or vpmaddubsw +
// vpmaddwd without VNNI: the same exact int32) of 16 rows x 4 weights against 4 broadcast
// activation bytes is 64 multiply-adds; after a sub-block's dots one vpmulld applies the 16 rows'
// scales. Q4_K: the minima term (min_s x the sub-block's activation sum) is accumulated the same
// way. Q6_K: the offset of 32 enters as the dot's start value, -32 x the sub-block's activation
// sum. Per super-block one conversion and FMA per term with d (dmin) of the 16 rows times the
// token's scale. Every token gets the single-token arithmetic (batch invariance, matmul.h).
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "common/quant/interleave.h"
#include "common/quant/matmul_kernels.h"

namespace magicpig::quant_internal {
namespace {

#include "common/quant/matmul_rows16_avx512-inl.h"  // NOLINT(build/include): per-unit copy

#define MAGICPIG_INLINE inline __attribute__((always_inline))

constexpr int64_t kGroupSbBytes = kInterleaveRows * Block<GgmlType::kQ4_K>::kBytes;    // 2304
constexpr int64_t kQ6GroupSbBytes = kInterleaveRows * Block<GgmlType::kQ6_K>::kBytes;  // 3360

// Q4_K rows of group `base` (16 rows) for tokens t0..t0 + NT - 1.
template <bool kVnni, int NT>
void GroupTokensQ4(const MatMulArgs& a, const uint8_t* base, int64_t r0, int64_t t0) {
  const int64_t nsb = a.cols / kSuperBlock;
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m512i low4 = _mm512_set1_epi32(0x0F), two = _mm512_set1_epi32(3);
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* blk = base + sb * kGroupSbBytes;
    __m512i isum[NT], msum[NT];
    for (int t = 0; t < NT; ++t) isum[t] = msum[t] = _mm512_setzero_si512();
    for (int p = 0; p < 4; ++p) {
      // Scales and minima of sub-blocks 2p (a) and 2p + 1 (b) of the 16 rows.
      const __m512i lo_a = _mm512_cvtepu8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 64 + 32 * p)));
      const __m512i lo_b = _mm512_cvtepu8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 80 + 32 * p)));
      const __m512i hi = _mm512_cvtepu8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192 + 16 * p)));
      const __m512i sc_a = _mm512_or_si512(_mm512_and_si512(lo_a, low4),
                                           _mm512_slli_epi32(_mm512_and_si512(hi, two), 4));
      const __m512i mn_a =
          _mm512_or_si512(_mm512_srli_epi32(lo_a, 4),
                          _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hi, 2), two), 4));
      const __m512i sc_b =
          _mm512_or_si512(_mm512_and_si512(lo_b, low4),
                          _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hi, 4), two), 4));
      const __m512i mn_b = _mm512_or_si512(_mm512_srli_epi32(lo_b, 4),
                                           _mm512_slli_epi32(_mm512_srli_epi32(hi, 6), 4));
      __m512i da[NT], db[NT];
      for (int t = 0; t < NT; ++t) da[t] = db[t] = _mm512_setzero_si512();
      for (int g = 0; g < 8; ++g) {
        const __m512i c = _mm512_loadu_si512(blk + 256 + 64 * (8 * p + g));
        const __m512i wl = _mm512_and_si512(c, nibble);
        const __m512i wh = _mm512_and_si512(_mm512_srli_epi16(c, 4), nibble);
        for (int t = 0; t < NT; ++t) {
          const int8_t* xq = a.kq + (t0 + t) * a.cols + sb * kSuperBlock + 64 * p + 4 * g;
          da[t] = Dot4<kVnni>(da[t], wl, Broadcast4(xq));
          db[t] = Dot4<kVnni>(db[t], wh, Broadcast4(xq + 32));
        }
      }
      for (int t = 0; t < NT; ++t) {
        const int16_t* bs = a.kbs + ((t0 + t) * nsb + sb) * kBsumsPerSuperBlock + 4 * p;
        isum[t] = _mm512_add_epi32(isum[t], _mm512_add_epi32(_mm512_mullo_epi32(da[t], sc_a),
                                                             _mm512_mullo_epi32(db[t], sc_b)));
        msum[t] = _mm512_add_epi32(
            msum[t], _mm512_add_epi32(_mm512_mullo_epi32(mn_a, _mm512_set1_epi32(bs[0] + bs[1])),
                                      _mm512_mullo_epi32(mn_b, _mm512_set1_epi32(bs[2] + bs[3]))));
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    const __m512 dmin =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
    for (int t = 0; t < NT; ++t) {
      const __m512 dx = _mm512_set1_ps(a.kd[(t0 + t) * nsb + sb]);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(d, dx), acc[t]);
      acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum[t]), _mm512_mul_ps(dmin, dx), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) _mm512_storeu_ps(a.y + (t0 + t) * a.ldy + r0, acc[t]);
}

// Q6_K rows of group `base` (16 rows) for tokens t0..t0 + NT - 1.
template <bool kVnni, int NT>
void GroupTokensQ6(const MatMulArgs& a, const uint8_t* base, int64_t r0, int64_t t0) {
  const int64_t nsb = a.cols / kSuperBlock;
  const __m512i nibble = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* blk = base + sb * kQ6GroupSbBytes;
    __m512i isum[NT];
    for (int t = 0; t < NT; ++t) isum[t] = _mm512_setzero_si512();
    for (int j = 0; j < 16; ++j) {
      // Quants 16j + 4k + i (lane r, byte i) for k = 0..3: low nibbles from L0/L1, the top two
      // bits from H (16-bit shifts: the masks drop what crosses a byte).
      const uint8_t* c = blk + 288 + 192 * j;
      const __m512i l0 = _mm512_loadu_si512(c), l1 = _mm512_loadu_si512(c + 64),
                    h = _mm512_loadu_si512(c + 128);
      const __m512i w0 = _mm512_or_si512(_mm512_and_si512(l0, nibble),
                                         _mm512_and_si512(_mm512_slli_epi16(h, 4), top));
      const __m512i w1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), nibble),
                                         _mm512_and_si512(_mm512_slli_epi16(h, 2), top));
      const __m512i w2 = _mm512_or_si512(_mm512_and_si512(l1, nibble), _mm512_and_si512(h, top));
      const __m512i w3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), nibble),
                                         _mm512_and_si512(_mm512_srli_epi16(h, 2), top));
      const __m512i sc = _mm512_cvtepi8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 32 + 16 * j)));
      for (int t = 0; t < NT; ++t) {
        const int8_t* xq = a.kq + (t0 + t) * a.cols + sb * kSuperBlock + 16 * j;
        const int16_t bs = a.kbs[((t0 + t) * nsb + sb) * kBsumsPerSuperBlock + j];
        __m512i dot = _mm512_set1_epi32(-32 * static_cast<int32_t>(bs));
        dot = Dot4<kVnni>(dot, w0, Broadcast4(xq));
        dot = Dot4<kVnni>(dot, w1, Broadcast4(xq + 4));
        dot = Dot4<kVnni>(dot, w2, Broadcast4(xq + 8));
        dot = Dot4<kVnni>(dot, w3, Broadcast4(xq + 12));
        isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(dot, sc));
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    for (int t = 0; t < NT; ++t) {
      const __m512 dx = _mm512_set1_ps(a.kd[(t0 + t) * nsb + sb]);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(d, dx), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) _mm512_storeu_ps(a.y + (t0 + t) * a.ldy + r0, acc[t]);
}

template <GgmlType T, bool kVnni>
void Groups(const MatMulArgs& a, int64_t r0, int64_t r1) {
  ForGroupsAndTokens(a, r0, r1, [&](const uint8_t* base, int64_t r, int64_t t, auto nt) {
    if constexpr (T == GgmlType::kQ6_K) {
      GroupTokensQ6<kVnni, decltype(nt)::value>(a, base, r, t);
    } else {
      GroupTokensQ4<kVnni, decltype(nt)::value>(a, base, r, t);
    }
  });
}

#undef MAGICPIG_INLINE

}  // namespace

void KQuantRows16Avx512(const MatMulArgs& args, int64_t row_begin, int64_t row_end, bool use_vnni) {
  const bool q6 = args.type == GgmlType::kQ6_K;
  if (use_vnni) {
    (q6 ? Groups<GgmlType::kQ6_K, true> : Groups<GgmlType::kQ4_K, true>)(args, row_begin, row_end);
  } else {
    (q6 ? Groups<GgmlType::kQ6_K, false> : Groups<GgmlType::kQ4_K, false>)(args, row_begin,
                                                                           row_end);
  }
}

}  // namespace magicpig::quant_internal
