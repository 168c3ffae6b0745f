// AVX2 + FMA + F16C kernels for the K-quant types Q4_K, Q5_K and Q6_K against super-block
// activations in value order (matmul_kernels.h); the -m flags are set on this file only.
//
// A super-block is walked in 4 pieces of 64 values; each piece is unpacked once into two
// registers of 32 unsigned weights plus their int16 pair scales and used for up to kMaxTokens
// tokens: vpmaddubsw (u8 x s8 -> int16 pair sums, no saturation) and vpmaddwd with the scales give
// exact int32 lanes; per super-block one convert and one FMA with d_w * d_x, and the minima
// (Q4_K/Q5_K) or the offset of 32 (Q6_K) as one vpmaddwd of the 16 activation bsums.
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "common/quant/matmul_kernels.h"

namespace magicpig::quant_internal {
namespace {

constexpr int kMaxTokens = 4;

#include "common/quant/matmul_isa_common-inl.h"  // NOLINT(build/include): per-ISA copy

__m256i Load256(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// A super-block's per-block data: the scales (Q4_K/Q5_K: 8, one per 32 values; Q6_K: 16, one per
// 16) and the int16 offset coefficient of each of the 16 bsums, with their float units.
struct KHeader {
  int16_t scale[16];
  __m256i off;
  float d, off_unit;
};

#define MAGICPIG_INLINE inline __attribute__((always_inline))

template <GgmlType T>
MAGICPIG_INLINE void ReadHeader(const uint8_t* b, KHeader* h) {
  if constexpr (T == GgmlType::kQ6_K) {
    h->d = LoadF16(b + 208);
    h->off_unit = 32.0f * h->d;
    for (int j = 0; j < 16; ++j) h->scale[j] = static_cast<int8_t>(b[192 + j]);
    h->off = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)));
  } else {
    h->d = LoadF16(b);
    h->off_unit = LoadF16(b + 2);
    // ggml's 6-bit packing of 8 scales and 8 mins in 12 bytes (see matmul_kquant_avx512.cc).
    const uint32_t u0 = LoadU32(b + 4), u1 = LoadU32(b + 8), u2 = LoadU32(b + 12);
    const uint32_t sc[2] = {u0 & 0x3f3f3f3fu, (u2 & 0x0f0f0f0fu) | ((u0 >> 6) & 0x03030303u) << 4};
    const uint32_t mn[2] = {u1 & 0x3f3f3f3fu, ((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 6) & 0x03030303u)
                                                                              << 4};
    uint8_t s8[8], m8[8];
    std::memcpy(s8, sc, 8);
    std::memcpy(m8, mn, 8);
    for (int j = 0; j < 8; ++j) h->scale[j] = s8[j];
    // bsum l covers values 16l..16l+15, in sub-block l / 2: each min twice.
    const __m128i m = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(m8)));
    h->off = _mm256_set_m128i(_mm_unpackhi_epi16(m, m), _mm_unpacklo_epi16(m, m));
  }
}

// Piece c (values 64c..64c+63) as two registers of 32 unsigned weights and their pair scales.
template <GgmlType T>
MAGICPIG_INLINE void UnpackPiece(const uint8_t* b, const KHeader& h, int c, __m256i w[2],
                                 __m256i sc[2]) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  if constexpr (T == GgmlType::kQ6_K) {
    // Half c / 2 of 128 values; the piece is its quarters 2(c % 2), +1 ... stored as: ql byte l
    // (l < 32) low nibble = value l, byte l + 32 low = value l + 32, high nibbles values + 64;
    // qh byte l bits 2q..2q+1 = high bits of value l + 32q.
    const int half = c / 2, hi = c % 2;  // hi: the high-nibble quarters (values 64..127)
    const uint8_t* ql = b + 64 * half;
    const __m256i qh = Load256(b + 128 + 32 * half);
    const __m256i three = _mm256_set1_epi8(0x03);
    for (int i = 0; i < 2; ++i) {
      const __m256i l = Load256(ql + 32 * i);
      const __m256i n =
          hi ? _mm256_and_si256(_mm256_srli_epi16(l, 4), nibble) : _mm256_and_si256(l, nibble);
      const int q = 2 * hi + i;  // quarter of the half: bits 2q..2q+1 of qh
      const __m256i hb = _mm256_slli_epi16(
          _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * q)), three), 4);
      w[i] = _mm256_or_si256(n, hb);
      const int s = 8 * half + 2 * q;  // scale of values 16s..16s+15 of the super-block
      sc[i] = _mm256_set_m128i(_mm_set1_epi16(h.scale[s + 1]), _mm_set1_epi16(h.scale[s]));
    }
  } else {
    const uint8_t* qs = b + (T == GgmlType::kQ5_K ? 48 : 16) + 32 * c;
    const __m256i z = Load256(qs);
    w[0] = _mm256_and_si256(z, nibble);
    w[1] = _mm256_and_si256(_mm256_srli_epi16(z, 4), nibble);
    if constexpr (T == GgmlType::kQ5_K) {
      // Bit j of qh[l] is the fifth bit of value l of sub-block j.
      const __m256i qh = Load256(b + 16);
      for (int i = 0; i < 2; ++i) {
        const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << (2 * c + i)));
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
        w[i] = _mm256_or_si256(w[i], _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
      }
    }
    sc[0] = _mm256_set1_epi16(h.scale[2 * c]);
    sc[1] = _mm256_set1_epi16(h.scale[2 * c + 1]);
  }
}

template <GgmlType T, int NT>
void RowTokens(const MatMulArgs& a, int64_t r, int64_t t0) {
  constexpr int64_t kBlockBytes = Block<T>::kBytes;
  const int64_t nsb = a.cols / kSuperBlock;
  const uint8_t* row = a.w + r * a.row_bytes;
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* b = row + sb * kBlockBytes;
    KHeader h;
    ReadHeader<T>(b, &h);
    __m256i s[NT];
    for (int t = 0; t < NT; ++t) s[t] = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      __m256i w[2], sc[2];
      UnpackPiece<T>(b, h, c, w, sc);
      for (int t = 0; t < NT; ++t) {
        const int8_t* xq = a.kq + (t0 + t) * a.cols + sb * kSuperBlock + 64 * c;
        for (int i = 0; i < 2; ++i) {
          const __m256i p = _mm256_maddubs_epi16(
              w[i], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * i)));
          s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(p, sc[i]));
        }
      }
    }
    for (int t = 0; t < NT; ++t) {
      const int64_t tok = t0 + t;
      const float dx = a.kd[tok * nsb + sb];
      const __m256i bs = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(a.kbs + (tok * nsb + sb) * kBsumsPerSuperBlock));
      const __m256i off = _mm256_madd_epi16(bs, h.off);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), _mm256_set1_ps(h.d * dx), acc[t]);
      acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(off), _mm256_set1_ps(h.off_unit * dx), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) a.y[(t0 + t) * a.ldy + r] = HorizontalSum(acc[t]);
}

template <GgmlType T>
void Rows(const MatMulArgs& a, int64_t r0, int64_t r1) {
  ForTokenBlocks(a.n_tokens, [&](int64_t tb, int64_t te) {
    for (int64_t r = r0; r < r1; ++r) {
      ForTokenChunks(tb, te,
                     [&](int64_t t, auto nt) { RowTokens<T, decltype(nt)::value>(a, r, t); });
    }
  });
}

#undef MAGICPIG_INLINE

}  // namespace

void KQuantRowsAvx2(const MatMulArgs& args, int64_t row_begin, int64_t row_end) {
  switch (args.type) {
    case GgmlType::kQ4_K:
      return Rows<GgmlType::kQ4_K>(args, row_begin, row_end);
    case GgmlType::kQ5_K:
      return Rows<GgmlType::kQ5_K>(args, row_begin, row_end);
    default:
      return Rows<GgmlType::kQ6_K>(args, row_begin, row_end);
  }
}

}  // namespace magicpig::quant_internal
