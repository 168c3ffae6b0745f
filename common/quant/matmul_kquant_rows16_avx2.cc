// AVX2 kernels for Q4_K and Q6_K matrices in the 16-row interleaved layout (interleave.h), the
// 256-bit sibling of matmul_kquant_rows16_avx512.cc: the same arithmetic per row lane, run for
// rows 0-7 and then rows 8-15 of a group (16 rows of accumulators per token would not fit in
// AVX2's 16 registers). vpmaddubsw + vpmaddwd give the exact int32 dots (no VNNI), and every
// float operation of a row lane is the AVX-512 kernel's, in its order, so the two levels give
// bit-identical results. The -m flags are set on this file only.
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "common/quant/interleave.h"
#include "common/quant/matmul_kernels.h"

namespace magicpig::quant_internal {
namespace {

constexpr int kMaxTokens = 4;

#include "common/quant/matmul_isa_common-inl.h"  // NOLINT(build/include): per-ISA copy

#define MAGICPIG_INLINE inline __attribute__((always_inline))

constexpr int64_t kGroupSbBytes = kInterleaveRows * Block<GgmlType::kQ4_K>::kBytes;    // 2304
constexpr int64_t kQ6GroupSbBytes = kInterleaveRows * Block<GgmlType::kQ6_K>::kBytes;  // 3360

// acc + the exact int32 dot of 4 unsigned weights with 4 signed activations per lane (pair sums
// are at most 2 * 63 * 127: no saturation).
MAGICPIG_INLINE __m256i Dot4(__m256i acc, __m256i w, __m256i x) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
}

MAGICPIG_INLINE __m256i Broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm256_set1_epi32(v);
}

MAGICPIG_INLINE __m256i LoadU8x8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// Q4_K rows h * 8 .. h * 8 + 7 of group `base` for tokens t0..t0 + NT - 1.
template <int NT>
void HalfTokensQ4(const MatMulArgs& a, const uint8_t* base, int h, int64_t r0, int64_t t0) {
  const int64_t nsb = a.cols / kSuperBlock;
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i low4 = _mm256_set1_epi32(0x0F), two = _mm256_set1_epi32(3);
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* blk = base + sb * kGroupSbBytes;
    __m256i isum[NT], msum[NT];
    for (int t = 0; t < NT; ++t) isum[t] = msum[t] = _mm256_setzero_si256();
    for (int p = 0; p < 4; ++p) {
      const __m256i lo_a = LoadU8x8(blk + 64 + 32 * p + 8 * h);
      const __m256i lo_b = LoadU8x8(blk + 80 + 32 * p + 8 * h);
      const __m256i hi = LoadU8x8(blk + 192 + 16 * p + 8 * h);
      const __m256i sc_a = _mm256_or_si256(_mm256_and_si256(lo_a, low4),
                                           _mm256_slli_epi32(_mm256_and_si256(hi, two), 4));
      const __m256i mn_a =
          _mm256_or_si256(_mm256_srli_epi32(lo_a, 4),
                          _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hi, 2), two), 4));
      const __m256i sc_b =
          _mm256_or_si256(_mm256_and_si256(lo_b, low4),
                          _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hi, 4), two), 4));
      const __m256i mn_b = _mm256_or_si256(_mm256_srli_epi32(lo_b, 4),
                                           _mm256_slli_epi32(_mm256_srli_epi32(hi, 6), 4));
      __m256i da[NT], db[NT];
      for (int t = 0; t < NT; ++t) da[t] = db[t] = _mm256_setzero_si256();
      for (int g = 0; g < 8; ++g) {
        const __m256i c = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(blk + 256 + 64 * (8 * p + g) + 32 * h));
        const __m256i wl = _mm256_and_si256(c, nibble);
        const __m256i wh = _mm256_and_si256(_mm256_srli_epi16(c, 4), nibble);
        for (int t = 0; t < NT; ++t) {
          const int8_t* xq = a.kq + (t0 + t) * a.cols + sb * kSuperBlock + 64 * p + 4 * g;
          da[t] = Dot4(da[t], wl, Broadcast4(xq));
          db[t] = Dot4(db[t], wh, Broadcast4(xq + 32));
        }
      }
      for (int t = 0; t < NT; ++t) {
        const int16_t* bs = a.kbs + ((t0 + t) * nsb + sb) * kBsumsPerSuperBlock + 4 * p;
        isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(_mm256_mullo_epi32(da[t], sc_a),
                                                             _mm256_mullo_epi32(db[t], sc_b)));
        msum[t] = _mm256_add_epi32(
            msum[t], _mm256_add_epi32(_mm256_mullo_epi32(mn_a, _mm256_set1_epi32(bs[0] + bs[1])),
                                      _mm256_mullo_epi32(mn_b, _mm256_set1_epi32(bs[2] + bs[3]))));
      }
    }
    const __m256 d =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * h)));
    const __m256 dmin =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 32 + 16 * h)));
    for (int t = 0; t < NT; ++t) {
      const __m256 dx = _mm256_set1_ps(a.kd[(t0 + t) * nsb + sb]);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(d, dx), acc[t]);
      acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum[t]), _mm256_mul_ps(dmin, dx), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) _mm256_storeu_ps(a.y + (t0 + t) * a.ldy + r0 + 8 * h, acc[t]);
}

// Q6_K rows h * 8 .. h * 8 + 7 of group `base` for tokens t0..t0 + NT - 1.
template <int NT>
void HalfTokensQ6(const MatMulArgs& a, const uint8_t* base, int h, int64_t r0, int64_t t0) {
  const int64_t nsb = a.cols / kSuperBlock;
  const __m256i nibble = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30);
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* blk = base + sb * kQ6GroupSbBytes;
    __m256i isum[NT];
    for (int t = 0; t < NT; ++t) isum[t] = _mm256_setzero_si256();
    for (int j = 0; j < 16; ++j) {
      const uint8_t* c = blk + 288 + 192 * j + 32 * h;
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64));
      const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 128));
      const __m256i w0 = _mm256_or_si256(_mm256_and_si256(l0, nibble),
                                         _mm256_and_si256(_mm256_slli_epi16(hb, 4), top));
      const __m256i w1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), nibble),
                                         _mm256_and_si256(_mm256_slli_epi16(hb, 2), top));
      const __m256i w2 = _mm256_or_si256(_mm256_and_si256(l1, nibble), _mm256_and_si256(hb, top));
      const __m256i w3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), nibble),
                                         _mm256_and_si256(_mm256_srli_epi16(hb, 2), top));
      const __m256i sc = _mm256_cvtepi8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 32 + 16 * j + 8 * h)));
      for (int t = 0; t < NT; ++t) {
        const int8_t* xq = a.kq + (t0 + t) * a.cols + sb * kSuperBlock + 16 * j;
        const int16_t bs = a.kbs[((t0 + t) * nsb + sb) * kBsumsPerSuperBlock + j];
        __m256i dot = _mm256_set1_epi32(-32 * static_cast<int32_t>(bs));
        dot = Dot4(dot, w0, Broadcast4(xq));
        dot = Dot4(dot, w1, Broadcast4(xq + 4));
        dot = Dot4(dot, w2, Broadcast4(xq + 8));
        dot = Dot4(dot, w3, Broadcast4(xq + 12));
        isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(dot, sc));
      }
    }
    const __m256 d =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * h)));
    for (int t = 0; t < NT; ++t) {
      const __m256 dx = _mm256_set1_ps(a.kd[(t0 + t) * nsb + sb]);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(d, dx), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) _mm256_storeu_ps(a.y + (t0 + t) * a.ldy + r0 + 8 * h, acc[t]);
}

// Tokens per cache block: their activations stay in L1/L2 while the task's groups pass over them.
constexpr int64_t kTokenBlock = 64;

template <GgmlType T>
void Groups(const MatMulArgs& a, int64_t r0, int64_t r1) {
  for (int64_t tb = 0; tb < a.n_tokens; tb += kTokenBlock) {
    const int64_t te = a.n_tokens < tb + kTokenBlock ? a.n_tokens : tb + kTokenBlock;
    for (int64_t r = r0; r < r1; r += kInterleaveRows) {
      const uint8_t* base = a.w + r * a.row_bytes;  // the group occupies its rows' byte range
      for (int h = 0; h < 2; ++h) {
        ForTokenChunks(tb, te, [&](int64_t t, auto nt) {
          if constexpr (T == GgmlType::kQ6_K) {
            HalfTokensQ6<decltype(nt)::value>(a, base, h, r, t);
          } else {
            HalfTokensQ4<decltype(nt)::value>(a, base, h, r, t);
          }
        });
      }
    }
  }
}

#undef MAGICPIG_INLINE

}  // namespace

void KQuantRows16Avx2(const MatMulArgs& args, int64_t row_begin, int64_t row_end) {
  if (args.type == GgmlType::kQ6_K) {
    Groups<GgmlType::kQ6_K>(args, row_begin, row_end);
  } else {
    Groups<GgmlType::kQ4_K>(args, row_begin, row_end);
  }
}

}  // namespace magicpig::quant_internal
