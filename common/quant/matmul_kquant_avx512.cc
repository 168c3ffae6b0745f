// AVX-512 (F/BW/VL/DQ, optionally VNNI) kernels for the K-quant types Q4_K, Q5_K and Q6_K against
// super-block activations (matmul_kernels.h); the -m flags are set on this file only.
//
// A super-block of one row is unpacked once into four registers of 64 unsigned weights, in the
// order the activations were stored in (KActOrderFor), and four registers holding the int16 scale
// of every weight pair. Per token: vpmaddubsw (u8 weights x s8 activations -> int16 pair sums,
// at most 2 * 63 * 127, no saturation) and vpmaddwd/vpdpwssd with the scales give exact int32
// lanes; one convert and one FMA with d_w * d_x per super-block, and the minima (Q4_K/Q5_K) or
// the offset of 32 (Q6_K) as one vpmaddwd of the 16 activation bsums. The unpacked block serves
// up to kMaxTokens tokens, each with the single-token arithmetic (batch invariance, matmul.h).
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "common/quant/matmul_kernels.h"

namespace magicpig::quant_internal {
namespace {

constexpr int kMaxTokens = 4;

#include "common/quant/matmul_isa_common-inl.h"  // NOLINT(build/include): per-ISA copy

// One row's super-block, unpacked.
struct KUnpacked {
  __m512i w[4];    // 64 unsigned weights each, in activation order (256 values)
  __m512i sc[4];   // int16 scale of each weight pair of w[k]
  __m256i off;     // int16 offset coefficient of each of the 16 bsums (stored order)
  float d;         // unit of sc
  float off_unit;  // unit of off (subtracted)
};

// Lane i of a 32 x int16 register covers values 2i, 2i + 1 of a 64-value register.
// Index vectors for vpermw: the scale of lane i of register k, from 8 (Q4_K/Q5_K: per 32 values,
// slot order) or 16 (Q6_K: per 16 values) int16 scales.
struct KConsts {
  __m512i scale_idx[4];
  __m256i off_idx;  // Q4_K/Q5_K: the min of bsum l (stored order) from the 8 mins
  __m512i q5_bits[4];
};

template <GgmlType T>
KConsts MakeKConsts() {
  KConsts k;
  alignas(64) int16_t idx[32];
  for (int r = 0; r < 4; ++r) {
    for (int i = 0; i < 32; ++i) {
      if constexpr (T == GgmlType::kQ6_K) {
        idx[i] = static_cast<int16_t>(4 * r + i / 8);  // natural order, one scale per 16 values
      } else {
        idx[i] = static_cast<int16_t>(kPairedNibbleOrder[2 * r + i / 16]);
      }
    }
    k.scale_idx[r] = _mm512_load_si512(idx);
  }
  alignas(32) int16_t off[16];
  for (int l = 0; l < 16; ++l) off[l] = static_cast<int16_t>(kPairedNibbleOrder[l / 2]);
  k.off_idx = _mm256_load_si256(reinterpret_cast<const __m256i*>(off));
  // Q5_K: register r holds slots 2r, 2r + 1 (bytes 0..31, 32..63) = sub-blocks
  // kPairedNibbleOrder[2r], [2r + 1]; the fifth bit of value l of sub-block j is bit j of qh[l].
  alignas(64) uint8_t bits[64];
  for (int r = 0; r < 4; ++r) {
    for (int i = 0; i < 64; ++i) {
      bits[i] = static_cast<uint8_t>(1u << kPairedNibbleOrder[2 * r + i / 32]);
    }
    k.q5_bits[r] = _mm512_load_si512(bits);
  }
  return k;
}

// The constants of type T, built once per process.
template <GgmlType T>
const KConsts& Consts() {
  static const KConsts k = MakeKConsts<T>();
  return k;
}

// Inlined so that the unpacked registers stay registers (a call passes them through memory).
#define MAGICPIG_INLINE inline __attribute__((always_inline))

template <GgmlType T>
MAGICPIG_INLINE void Unpack(const uint8_t* b, const KConsts& k, KUnpacked* u) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  if constexpr (T == GgmlType::kQ6_K) {
    u->d = LoadF16(b + 208);
    u->off_unit = 32.0f * u->d;
    const __m512i three = _mm512_set1_epi8(0x03);
    // Per 16-bit word: lower 256 bits shift qh by a, upper by b (a 64-value register spans two
    // quarters of the half: bits 0-1 / 2-3 for the low nibbles, 4-5 / 6-7 for the high ones).
    const __m512i cnt_lo = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
    const __m512i cnt_hi = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = _mm512_loadu_si512(b + 64 * h);
      const __m512i qh = _mm512_broadcast_i64x4(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h)));
      const __m512i hl =
          _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, cnt_lo), three), 4);
      const __m512i hh =
          _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, cnt_hi), three), 4);
      u->w[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, nibble), hl);
      u->w[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), nibble), hh);
    }
    const __m256i s16 =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)));
    const __m512i s = _mm512_castsi256_si512(s16);
    for (int r = 0; r < 4; ++r) u->sc[r] = _mm512_permutexvar_epi16(k.scale_idx[r], s);
    u->off = s16;
  } else {
    u->d = LoadF16(b);
    u->off_unit = LoadF16(b + 2);
    // The 8 six-bit scales and mins (ggml's packing: bytes 0-3 scales 0-3, 4-7 mins 0-3, 8-11
    // the low nibbles of scales/mins 4-7 whose top two bits sit in bits 6-7 of bytes 0-7).
    const uint32_t u0 = LoadU32(b + 4), u1 = LoadU32(b + 8), u2 = LoadU32(b + 12);
    const uint64_t sc = (u0 & 0x3f3f3f3fu) |
                        static_cast<uint64_t>((u2 & 0x0f0f0f0fu) | ((u0 >> 6) & 0x03030303u) << 4)
                            << 32;
    const uint64_t mn =
        (u1 & 0x3f3f3f3fu) |
        static_cast<uint64_t>(((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 6) & 0x03030303u) << 4) << 32;
    const __m512i s = _mm512_castsi128_si512(
        _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(sc))));  // NOLINT(runtime/int)
    for (int r = 0; r < 4; ++r) u->sc[r] = _mm512_permutexvar_epi16(k.scale_idx[r], s);
    u->off = _mm256_permutexvar_epi16(
        k.off_idx, _mm256_castsi128_si256(_mm_cvtepu8_epi16(
                       _mm_cvtsi64_si128(static_cast<long long>(mn)))));  // NOLINT(runtime/int)
    const uint8_t* qs = b + (T == GgmlType::kQ5_K ? 48 : 16);
    const __m512i z0 = _mm512_loadu_si512(qs), z1 = _mm512_loadu_si512(qs + 64);
    u->w[0] = _mm512_and_si512(z0, nibble);
    u->w[1] = _mm512_and_si512(_mm512_srli_epi16(z0, 4), nibble);
    u->w[2] = _mm512_and_si512(z1, nibble);
    u->w[3] = _mm512_and_si512(_mm512_srli_epi16(z1, 4), nibble);
    if constexpr (T == GgmlType::kQ5_K) {
      const __m512i qh =
          _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16)));
      const __m512i bit4 = _mm512_set1_epi8(0x10);
      for (int r = 0; r < 4; ++r) {
        const __mmask64 m = _mm512_test_epi8_mask(qh, k.q5_bits[r]);
        u->w[r] = _mm512_mask_add_epi8(u->w[r], m, u->w[r], bit4);
      }
    }
  }
}

// Exact int32 lane sums of s16 * s16 pairs added to acc.
template <bool kVnni>
MAGICPIG_INLINE __m512i DotS16(__m512i acc, __m512i a, __m512i b) {
  if constexpr (kVnni) {
    return _mm512_dpwssd_epi32(acc, a, b);
  } else {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
  }
}

// Adds one super-block of token t to acc (d_w * d_x * the scaled dot) and to acc_off (the
// offset term, subtracted at the end). Two independent integer chains and two float accumulators
// keep the dependency chains short: one row at a time leaves little else to overlap.
template <bool kVnni>
MAGICPIG_INLINE void AddSuperBlock(const KUnpacked& u, const int8_t* xq, const int16_t* bs,
                                   float dx, __m512* acc, __m256* acc_off) {
  const __m512i p0 = _mm512_maddubs_epi16(u.w[0], _mm512_loadu_si512(xq));
  const __m512i p1 = _mm512_maddubs_epi16(u.w[1], _mm512_loadu_si512(xq + 64));
  const __m512i p2 = _mm512_maddubs_epi16(u.w[2], _mm512_loadu_si512(xq + 128));
  const __m512i p3 = _mm512_maddubs_epi16(u.w[3], _mm512_loadu_si512(xq + 192));
  const __m512i s0 = DotS16<kVnni>(_mm512_madd_epi16(p0, u.sc[0]), p2, u.sc[2]);
  const __m512i s1 = DotS16<kVnni>(_mm512_madd_epi16(p1, u.sc[1]), p3, u.sc[3]);
  const __m256i off =
      _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs)), u.off);
  *acc =
      _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), _mm512_set1_ps(u.d * dx), *acc);
  *acc_off = _mm256_fmadd_ps(_mm256_cvtepi32_ps(off), _mm256_set1_ps(u.off_unit * dx), *acc_off);
}

template <GgmlType T, bool kVnni, int NT>
void RowTokens(const MatMulArgs& a, const KConsts& k, int64_t r, int64_t t0) {
  constexpr int64_t kBlockBytes = Block<T>::kBytes;
  const int64_t nsb = a.cols / kSuperBlock;
  const uint8_t* row = a.w + r * a.row_bytes;
  __m512 acc[NT];
  __m256 acc_off[NT];
  for (int t = 0; t < NT; ++t) {
    acc[t] = _mm512_setzero_ps();
    acc_off[t] = _mm256_setzero_ps();
  }
  for (int64_t sb = 0; sb < nsb; ++sb) {
    KUnpacked u;
    Unpack<T>(row + sb * kBlockBytes, k, &u);
    for (int t = 0; t < NT; ++t) {
      const int64_t tok = t0 + t;
      AddSuperBlock<kVnni>(u, a.kq + tok * a.cols + sb * kSuperBlock,
                           a.kbs + (tok * nsb + sb) * kBsumsPerSuperBlock, a.kd[tok * nsb + sb],
                           &acc[t], &acc_off[t]);
    }
  }
  for (int t = 0; t < NT; ++t) {
    const __m512 diff = _mm512_sub_ps(acc[t], _mm512_zextps256_ps512(acc_off[t]));
    a.y[(t0 + t) * a.ldy + r] = _mm512_reduce_add_ps(diff);
  }
}

template <GgmlType T, bool kVnni>
void Rows(const MatMulArgs& a, int64_t r0, int64_t r1) {
  const KConsts& k = Consts<T>();
  ForTokenBlocks(a.n_tokens, [&](int64_t tb, int64_t te) {
    for (int64_t r = r0; r < r1; ++r) {
      ForTokenChunks(tb, te, [&](int64_t t, auto nt) {
        RowTokens<T, kVnni, decltype(nt)::value>(a, k, r, t);
      });
    }
  });
}

template <bool kVnni>
void Dispatch(const MatMulArgs& a, int64_t r0, int64_t r1) {
  switch (a.type) {
    case GgmlType::kQ4_K:
      return Rows<GgmlType::kQ4_K, kVnni>(a, r0, r1);
    case GgmlType::kQ5_K:
      return Rows<GgmlType::kQ5_K, kVnni>(a, r0, r1);
    default:
      return Rows<GgmlType::kQ6_K, kVnni>(a, r0, r1);
  }
}

#undef MAGICPIG_INLINE

}  // namespace

void KQuantRowsAvx512(const MatMulArgs& args, int64_t row_begin, int64_t row_end, bool use_vnni) {
  if (use_vnni) {
    Dispatch<true>(args, row_begin, row_end);
  } else {
    Dispatch<false>(args, row_begin, row_end);
  }
}

}  // namespace magicpig::quant_internal
