// AVX-512 (F/BW/VL/DQ, optionally VNNI) MatMul kernels; the -m flags are set on this file only.
//
// Integer types: the activations are quantised into a layout (matmul_kernels.h) where two 512-bit
// registers hold 4 whole blocks with each 128-bit lane belonging to one block, so two vpdpbusd
// (VNNI; otherwise vpmaddubsw + vpmaddwd, the same exact int32 sums) give per-block int32 lanes
// that need one convert + one FMA per 4 blocks. A 2-row x 4-token register tile reuses every
// unpacked weight register 4 times and every activation load twice; fp16 block scales are
// converted once per row (Q4_0, Q5_0, Q5_1). Q4_1 and Q8_0, the types of the served model, use a
// 4-row kernel instead (QuadDot), 1.1-2.3x faster at 2-256 tokens (docs/kernels.md,
// Kernels), whose per-token arithmetic does not depend on the batch. Float types: FMA with masked
// tails.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "common/quant/matmul_kernels.h"

namespace magicpig::quant_internal {
namespace {

constexpr int kMaxTokens = 4;  // tokens per pass over a weight row

#include "common/quant/matmul_isa_common-inl.h"  // NOLINT(build/include): per-ISA copy

__m128i Load128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

// Weights of 4 blocks in the activation layout of matmul_kernels.h: lo holds values 0..15 of each
// block (one 128-bit lane per block), hi values 16..31. Unsigned except Q8_0, where the weights are
// made non-negative and their signs returned in neg_lo/neg_hi (to be moved onto the activations).
template <GgmlType T>
void UnpackQuad(const uint8_t* const* blk, __m512i* lo, __m512i* hi, __mmask64* neg_lo,
                __mmask64* neg_hi) {
  if constexpr (T == GgmlType::kQ8_0) {
    const __m512i z01 = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[0] + 2))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[1] + 2)), 1);
    const __m512i z23 = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[2] + 2))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[3] + 2)), 1);
    const __m512i l = _mm512_shuffle_i64x2(z01, z23, 0x88);  // 128-bit lanes 0, 2 of each
    const __m512i h = _mm512_shuffle_i64x2(z01, z23, 0xDD);  // lanes 1, 3
    *neg_lo = _mm512_movepi8_mask(l);
    *neg_hi = _mm512_movepi8_mask(h);
    *lo = _mm512_abs_epi8(l);  // -128 becomes 0x80 = 128 as unsigned: still exact
    *hi = _mm512_abs_epi8(h);
  } else {
    const __m256i q01 =
        _mm256_inserti128_si256(_mm256_castsi128_si256(Load128(blk[0] + Block<T>::kQs)),
                                Load128(blk[1] + Block<T>::kQs), 1);
    const __m256i q23 =
        _mm256_inserti128_si256(_mm256_castsi128_si256(Load128(blk[2] + Block<T>::kQs)),
                                Load128(blk[3] + Block<T>::kQs), 1);
    const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(q01), q23, 1);
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    __m512i l = _mm512_and_si512(z, nibble);
    __m512i h = _mm512_and_si512(_mm512_srli_epi16(z, 4), nibble);
    if constexpr (T == GgmlType::kQ5_0 || T == GgmlType::kQ5_1) {
      // Bit i of qh is the fifth bit of value i: bits 0..15 go to lo, 16..31 to hi.
      uint64_t ml = 0, mh = 0;
      for (int j = 0; j < 4; ++j) {
        const uint64_t qh = LoadU32(blk[j] + Block<T>::kQh);
        ml |= (qh & 0xFFFF) << (16 * j);
        mh |= (qh >> 16) << (16 * j);
      }
      const __m512i bit4 = _mm512_set1_epi8(0x10);
      l = _mm512_mask_add_epi8(l, ml, l, bit4);
      h = _mm512_mask_add_epi8(h, mh, h, bit4);
    }
    *lo = l;
    *hi = h;
  }
}

// Exact int32 lane sums of u8 * s8 (4 products per lane) added to acc.
template <bool kVnni>
__m512i DotU8S8(__m512i acc, __m512i u, __m512i s) {
  if constexpr (kVnni) {
    return _mm512_dpbusd_epi32(acc, u, s);
  } else {
    return _mm512_add_epi32(acc,
                            _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
  }
}

// Per-row constants, converted from fp16 once per row instead of once per (row, token): the
// weight scales replicated 4 times (matching the activation d layout; 0 in padding groups, so
// padded blocks contribute exactly 0) and the offset coefficients (0-padded to SStride).
struct RowConsts {
  const float* dw;
  const float* c;
};

// dw needs 4 * Avx512SStride(cols) floats and c Avx512SStride(cols): both are written in whole
// chunks of 16 blocks, zero beyond the last block. One gather of the 16 leading u32s of 16 blocks
// (d, and m for Q4_1/Q5_1) replaces 16 scalar loads and conversions; masked-off lanes read 0.
template <GgmlType T>
void PrepareRow(const uint8_t* row, int64_t cols, float* dw, float* c) {
  const int64_t nb = cols / kActBlock;
  const __m512i offsets =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(Block<T>::kBytes));
  for (int64_t b = 0; b < nb; b += 16) {
    const __mmask16 m = nb - b >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (nb - b)) - 1);
    const __m512i head = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, offsets,
                                                     row + b * Block<T>::kBytes, 1);
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
    for (int k = 0; k < 4; ++k) {
      const __m512i idx =
          _mm512_add_epi32(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                           _mm512_set1_epi32(4 * k));
      _mm512_storeu_ps(dw + 4 * b + 16 * k, _mm512_permutexvar_ps(idx, d));
    }
    if constexpr (T == GgmlType::kQ4_1 || T == GgmlType::kQ5_1) {
      _mm512_storeu_ps(c + b, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(head, 16))));
    } else if constexpr (T == GgmlType::kQ4_0) {
      _mm512_storeu_ps(c + b, _mm512_mul_ps(d, _mm512_set1_ps(-8.0f)));
    } else if constexpr (T == GgmlType::kQ5_0) {
      _mm512_storeu_ps(c + b, _mm512_mul_ps(d, _mm512_set1_ps(-16.0f)));
    }
  }
}

// y for R rows x NT tokens: each unpacked weight register is used for NT tokens and each
// activation load for R rows. Accumulators hold per-block float partial sums; the offset term
// (sum_b c[b] * s[b]) is a vector dot product added before the single horizontal reduction.
template <GgmlType T, bool kVnni, int R, int NT>
void IntegerTile(const MatMulArgs& a, int64_t r, const RowConsts* rc, int64_t t0) {
  const int64_t nb = a.cols / kActBlock;
  const int64_t ng = Avx512Groups(a.cols);
  const int64_t q_stride = Avx512QStride(a.cols), d_stride = Avx512DStride(a.cols);
  const uint8_t* row[R];
  for (int i = 0; i < R; ++i) row[i] = a.w + (r + i) * a.row_bytes;
  const int8_t* xq = a.xq + t0 * q_stride;
  const float* xd = a.xd + t0 * d_stride;
  __m512 acc[R][NT];
  for (int i = 0; i < R; ++i) {
    for (int t = 0; t < NT; ++t) acc[i][t] = _mm512_setzero_ps();
  }
  auto group = [&](int64_t g, bool tail) __attribute__((always_inline)) {
    __m512i lo[R], hi[R];
    __mmask64 neg_lo[R], neg_hi[R];
    __m512 dw[R];
    for (int i = 0; i < R; ++i) {
      const uint8_t* blk[4];
      for (int j = 0; j < 4; ++j) {
        // Padding blocks of the last group re-read a real block; their dw is 0.
        const int64_t b = tail ? std::min<int64_t>(4 * g + j, nb - 1) : 4 * g + j;
        blk[j] = row[i] + b * Block<T>::kBytes;
      }
      UnpackQuad<T>(blk, &lo[i], &hi[i], &neg_lo[i], &neg_hi[i]);
      dw[i] = _mm512_loadu_ps(rc[i].dw + 16 * g);
    }
    for (int t = 0; t < NT; ++t) {
      const int8_t* xp = xq + t * q_stride + 128 * g;
      const __m512i xl = _mm512_loadu_si512(xp), xh = _mm512_loadu_si512(xp + 64);
      const __m512 dx = _mm512_loadu_ps(xd + t * d_stride + 16 * g);
      for (int i = 0; i < R; ++i) {
        __m512i l = xl, h = xh;
        if constexpr (T == GgmlType::kQ8_0) {
          l = _mm512_mask_sub_epi8(xl, neg_lo[i], _mm512_setzero_si512(), xl);
          h = _mm512_mask_sub_epi8(xh, neg_hi[i], _mm512_setzero_si512(), xh);
        }
        const __m512i dot =
            DotU8S8<kVnni>(DotU8S8<kVnni>(_mm512_setzero_si512(), lo[i], l), hi[i], h);
        acc[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw[i], dx), acc[i][t]);
      }
    }
  };
  const int64_t full = nb / 4;
  for (int64_t g = 0; g < full; ++g) group(g, false);
  if (full < ng) group(full, true);
  if constexpr (T != GgmlType::kQ8_0) {
    const int64_t s_stride = Avx512SStride(a.cols);
    for (int64_t k = 0; k < s_stride; k += 16) {
      for (int t = 0; t < NT; ++t) {
        const __m512 s = _mm512_loadu_ps(a.xs + (t0 + t) * s_stride + k);
        for (int i = 0; i < R; ++i) {
          acc[i][t] = _mm512_fmadd_ps(_mm512_loadu_ps(rc[i].c + k), s, acc[i][t]);
        }
      }
    }
  }
  for (int t = 0; t < NT; ++t) {
    for (int i = 0; i < R; ++i) a.y[(t0 + t) * a.ldy + r + i] = _mm512_reduce_add_ps(acc[i][t]);
  }
}

// Q4_1 and Q8_0 by quads of rows. Through IntegerTile the per-row scale table of PrepareRow (a
// gather, permutes and stores) and the per-(row, token) horizontal reductions cost as much as the
// dot products at few tokens (a batch of 2 cost 2.5-3x one token). Instead 4 rows are processed
// together and their per-block int32 sums are transposed into one vector (lane 4j + i = row i,
// block j of the group), so that the fp16 scales of all 16 (row, block) pairs of a group are
// converted by one vcvtph2ps and applied by one FMA, and one reduction at the end yields 4 outputs.
// A group's bytes are read with two plain loads and rearranged into the activation layout with
// one two-table permute per register; the scales come from the same registers (word permute).
// The unpacked group serves up to kMaxTokens tokens, each with the single-token arithmetic, which
// makes every token's result independent of the batch it is computed in (matmul.h).
struct QuadConsts {
  __m512i idx_lo, idx_hi, idx_h;
};

template <GgmlType T>
QuadConsts MakeQuadConsts() {
  alignas(64) int32_t lo[16], hi[16];
  alignas(64) int16_t h[32];
  for (int j = 0; j < 4; ++j) {
    for (int w = 0; w < 4; ++w) {
      if constexpr (T == GgmlType::kQ4_1) {
        lo[4 * j + w] = 5 * j + 1 + w;  // qs dwords of block j: table (t0 = bytes 0..63, t1)
        hi[4 * j + w] = 0;              // unused
      } else {
        // Q8_0 words: values 0..15 of block j are words 17j+1.., read from tables at byte 0 and
        // 64; values 16..31 (words 17j+9..) from tables at byte 8 and 72 so that block 3 fits.
        const int16_t a = static_cast<int16_t>(17 * j + 1 + 2 * w);
        const int16_t b = static_cast<int16_t>(17 * j + 5 + 2 * w);
        lo[4 * j + w] = (a & 0xFFFF) | ((a + 1) << 16);
        hi[4 * j + w] = (b & 0xFFFF) | ((b + 1) << 16);
      }
    }
    for (int i = 0; i < 4; ++i) {
      // Words 4j + i: d of block j (for every row i; a per-row mask picks lanes); Q4_1 also has
      // words 16 + 4j + i: m of block j.
      const int hw = T == GgmlType::kQ4_1 ? 10 * j : 17 * j;
      h[4 * j + i] = static_cast<int16_t>(hw);
      h[16 + 4 * j + i] = static_cast<int16_t>(T == GgmlType::kQ4_1 ? hw + 1 : 0);
    }
  }
  return QuadConsts{_mm512_load_si512(lo), _mm512_load_si512(hi), _mm512_load_si512(h)};
}

// Bytes [0, n) of p as a 512-bit register, zero beyond n (never touches memory past p + n).
__m512i LoadBytes(const uint8_t* p, int64_t n) {
  if (n >= 64) return _mm512_loadu_si512(p);
  if (n <= 0) return _mm512_setzero_si512();
  return _mm512_maskz_loadu_epi8((uint64_t{1} << n) - 1, p);
}

// Sums lanes 4j..4j+3 of d[i] into lane 4j + i.
__m512i TransposeAdd4(const __m512i* d) {
  const __m512i s01 =
      _mm512_add_epi32(_mm512_unpacklo_epi32(d[0], d[1]), _mm512_unpackhi_epi32(d[0], d[1]));
  const __m512i s23 =
      _mm512_add_epi32(_mm512_unpacklo_epi32(d[2], d[3]), _mm512_unpackhi_epi32(d[2], d[3]));
  return _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
}

// y of rows row[0..3] (the same row may repeat) for the NT tokens t0.. (out[t][i]). A group's
// weights are unpacked once and used for every token; each token's arithmetic is exactly the
// single-token one, so a batch gets bit-identical results to one token at a time.
template <GgmlType T, bool kVnni, int NT>
void QuadDot(const MatMulArgs& a, const QuadConsts& k, const uint8_t* const* row, int64_t t0,
             float (*out)[4]) {
  constexpr int64_t kGroupBytes = 4 * Block<T>::kBytes;
  const int64_t nb = a.cols / kActBlock;
  const int64_t ng = Avx512Groups(a.cols);
  const int64_t q_stride = Avx512QStride(a.cols), d_stride = Avx512DStride(a.cols),
                s_stride = Avx512SStride(a.cols);
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m512i c80 = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < ng; ++g) {
    // Bytes of this group present in the row (the last group may be partial).
    const int64_t n = std::min<int64_t>(kGroupBytes, (nb - 4 * g) * Block<T>::kBytes);
    const bool full = n == kGroupBytes;
    // The 4 rows' weights in the activation layout: unsigned (Q4_1), offset by 128 (Q8_0 with
    // VNNI: vpdpbusd needs one unsigned operand) or absolute values with the signs in masks (Q8_0
    // without VNNI, the signs to be moved onto the activations: vpmaddubsw's first operand is
    // unsigned).
    __m512i lo[4], hi[4];
    __mmask64 neg_lo[4] = {}, neg_hi[4] = {};
    __m512i h = _mm512_setzero_si512();
    for (int i = 0; i < 4; ++i) {
      const uint8_t* base = row[i] + g * kGroupBytes;
      if constexpr (T == GgmlType::kQ4_1) {
        const __m512i t0b = full ? _mm512_loadu_si512(base) : LoadBytes(base, n);
        const __m512i t1b =
            full ? _mm512_zextsi128_si512(Load128(base + 64)) : LoadBytes(base + 64, n - 64);
        const __m512i q = _mm512_permutex2var_epi32(t0b, k.idx_lo, t1b);
        lo[i] = _mm512_and_si512(q, nibble);
        hi[i] = _mm512_and_si512(_mm512_srli_epi16(q, 4), nibble);
        h = _mm512_mask_permutexvar_epi16(h, 0x11111111u << i, k.idx_h, t0b);
      } else {
        const __m512i t0b = full ? _mm512_loadu_si512(base) : LoadBytes(base, n);
        const __m512i t1b = full ? _mm512_loadu_si512(base + 64) : LoadBytes(base + 64, n - 64);
        const __m512i t2b = full ? _mm512_loadu_si512(base + 8) : LoadBytes(base + 8, n - 8);
        const __m512i t3b = full ? _mm512_loadu_si512(base + 72) : LoadBytes(base + 72, n - 72);
        const __m512i l = _mm512_permutex2var_epi16(t0b, k.idx_lo, t1b);
        const __m512i hv = _mm512_permutex2var_epi16(t2b, k.idx_hi, t3b);
        h = _mm512_mask_mov_epi16(h, 0x1111u << i, _mm512_permutex2var_epi16(t0b, k.idx_h, t1b));
        if constexpr (kVnni) {
          lo[i] = _mm512_xor_si512(l, c80);
          hi[i] = _mm512_xor_si512(hv, c80);
        } else {
          neg_lo[i] = _mm512_movepi8_mask(l);
          neg_hi[i] = _mm512_movepi8_mask(hv);
          lo[i] = _mm512_abs_epi8(l);
          hi[i] = _mm512_abs_epi8(hv);
        }
      }
    }
    const __m512 dw = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    // Q4_1's offset term m_w * d_x * sum(q_x) = m_w * s: the weights' m of the 16 (row, block)
    // pairs, and where block 4g + j's s sits in the token's s layout (lanes 4j..4j+3 after the
    // permute). The same for every token.
    __m512 mw = _mm512_setzero_ps();
    __m512i idx_s = _mm512_setzero_si512();
    if constexpr (T == GgmlType::kQ4_1) {
      mw = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
      idx_s = _mm512_add_epi32(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                               _mm512_set1_epi32(static_cast<int>(4 * (g % 4))));
    }
    for (int t = 0; t < NT; ++t) {
      const int8_t* xp = a.xq + (t0 + t) * q_stride + 128 * g;
      const __m512i xl = _mm512_loadu_si512(xp);
      const __m512i xh = _mm512_loadu_si512(xp + 64);
      __m512i corr = _mm512_setzero_si512();
      if constexpr (T == GgmlType::kQ8_0 && kVnni) {
        // The weights' offset of 128 taken back out exactly: 128 * sum(x) per lane.
        corr = _mm512_sub_epi32(corr,
                                _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(corr, c80, xl), c80, xh));
      }
      __m512i dot[4];
      for (int i = 0; i < 4; ++i) {
        if constexpr (T == GgmlType::kQ8_0 && !kVnni) {
          const __m512i z = _mm512_setzero_si512();
          dot[i] =
              DotU8S8<false>(DotU8S8<false>(z, lo[i], _mm512_mask_sub_epi8(xl, neg_lo[i], z, xl)),
                             hi[i], _mm512_mask_sub_epi8(xh, neg_hi[i], z, xh));
        } else {
          dot[i] = DotU8S8<kVnni>(DotU8S8<kVnni>(corr, lo[i], xl), hi[i], xh);
        }
      }
      // Lane 4j + i: exact int32 sum of row i, block 4g + j; the activation scale of block 4g + j
      // is already in lanes 4j..4j+3 of the d layout.
      const __m512 sum = _mm512_cvtepi32_ps(TransposeAdd4(dot));
      const __m512 dx = _mm512_loadu_ps(a.xd + (t0 + t) * d_stride + 16 * g);
      acc[t] = _mm512_fmadd_ps(sum, _mm512_mul_ps(dw, dx), acc[t]);
      if constexpr (T == GgmlType::kQ4_1) {
        const __m512 s = _mm512_permutexvar_ps(
            idx_s, _mm512_loadu_ps(a.xs + (t0 + t) * s_stride + 16 * (g / 4)));
        acc[t] = _mm512_fmadd_ps(mw, s, acc[t]);
      }
    }
  }
  for (int t = 0; t < NT; ++t) {
    __m128 r = _mm_add_ps(_mm512_castps512_ps128(acc[t]), _mm512_extractf32x4_ps(acc[t], 1));
    r = _mm_add_ps(
        r, _mm_add_ps(_mm512_extractf32x4_ps(acc[t], 2), _mm512_extractf32x4_ps(acc[t], 3)));
    _mm_storeu_ps(out[t], r);
  }
}

// y of the quad of rows from r (those below r1) for the tokens [t0, t0 + NT).
template <GgmlType T, bool kVnni, int NT>
void QuadTokens(const MatMulArgs& a, const QuadConsts& k, const uint8_t* const* row, int64_t r,
                int64_t r1, int64_t t0) {
  float out[NT][4];
  QuadDot<T, kVnni, NT>(a, k, row, t0, out);
  for (int t = 0; t < NT; ++t) {
    for (int i = 0; i < 4 && r + i < r1; ++i) a.y[(t0 + t) * a.ldy + r + i] = out[t][i];
  }
}

constexpr int64_t kQuadPrefetch = 1;  // quads of rows fetched ahead

template <GgmlType T, bool kVnni>
void QuadRows(const MatMulArgs& a, int64_t r0, int64_t r1) {
  const QuadConsts k = MakeQuadConsts<T>();
  ForTokenBlocks(a.n_tokens, [&](int64_t tb, int64_t te) {
    for (int64_t r = r0; r < r1; r += 4) {
      // A partial last quad repeats its last row (the extra results are dropped).
      const uint8_t* row[4];
      for (int i = 0; i < 4; ++i) row[i] = a.w + std::min(r + i, r1 - 1) * a.row_bytes;
      // The 4 rows are read interleaved, which the hardware prefetcher follows poorly once the
      // matrix is far out of cache (the LM head): fetch a later quad ahead explicitly.
      const int64_t ahead = r + kQuadPrefetch * 4;
      if (ahead < r1) {
        const uint8_t* p = a.w + ahead * a.row_bytes;
        const int64_t bytes = std::min<int64_t>(4, r1 - ahead) * a.row_bytes;
        for (int64_t o = 0; o < bytes; o += 64)
          _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T0);
      }
      ForTokenChunks(tb, te, [&](int64_t t, auto nt) {
        QuadTokens<T, kVnni, decltype(nt)::value>(a, k, row, r, r1, t);
      });
    }
  });
}

constexpr int kTileRows = 2;

template <GgmlType T, bool kVnni, int R>
void IntegerTileTokens(const MatMulArgs& a, int64_t r, const RowConsts* rc, int64_t t0,
                       int64_t t1) {
  ForTokenChunks(t0, t1, [&](int64_t t, auto nt) {
    IntegerTile<T, kVnni, R, decltype(nt)::value>(a, r, rc, t);
  });
}

template <GgmlType T, bool kVnni>
void TileRows(const MatMulArgs& a, int64_t r0, int64_t r1) {
  const int64_t c_len = Avx512SStride(a.cols), dw_len = 4 * c_len;
  const int64_t per_row = dw_len + c_len;
  // Calls of few tokens prepare each row tile just before use (the constants stay in L1); larger
  // ones prepare all rows of the task once and walk token blocks in the outer loop.
  const bool all_rows = a.n_tokens > kTokenBlock;
  const int64_t buf_rows = all_rows ? r1 - r0 : kTileRows;
  std::vector<float> buf(static_cast<size_t>(buf_rows * per_row));
  auto consts = [&](int64_t k) {
    return RowConsts{buf.data() + k * per_row, buf.data() + k * per_row + dw_len};
  };
  auto prepare = [&](int64_t r, int64_t k) {
    float* p = buf.data() + k * per_row;
    PrepareRow<T>(a.w + r * a.row_bytes, a.cols, p, p + dw_len);
  };
  if (all_rows) {
    for (int64_t r = r0; r < r1; ++r) prepare(r, r - r0);
  }
  ForTokenBlocks(a.n_tokens, [&](int64_t tb, int64_t te) {
    int64_t r = r0;
    for (; r + kTileRows <= r1; r += kTileRows) {
      RowConsts rc[kTileRows];
      for (int i = 0; i < kTileRows; ++i) {
        if (!all_rows) prepare(r + i, i);
        rc[i] = consts(all_rows ? r + i - r0 : i);
      }
      IntegerTileTokens<T, kVnni, kTileRows>(a, r, rc, tb, te);
    }
    for (; r < r1; ++r) {
      if (!all_rows) prepare(r, 0);
      const RowConsts rc = consts(all_rows ? r - r0 : 0);
      IntegerTileTokens<T, kVnni, 1>(a, r, &rc, tb, te);
    }
  });
}

template <GgmlType T, bool kVnni>
void IntegerRows(const MatMulArgs& a, int64_t r0, int64_t r1) {
  if constexpr (T == GgmlType::kQ4_1 || T == GgmlType::kQ8_0) {
    QuadRows<T, kVnni>(a, r0, r1);
  } else {
    TileRows<T, kVnni>(a, r0, r1);
  }
}

}  // namespace

void QuantizeActivationRowAvx512(const float* x, int64_t cols, int8_t* q, float* d, float* s) {
  const int64_t nb = cols / kActBlock;
  const int64_t ng = Avx512Groups(cols);
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  const __m512 lim = _mm512_set1_ps(127.0f);
  for (int64_t b = 0; b < nb; ++b) {
    const __m512 x0 = _mm512_loadu_ps(x + b * kActBlock);
    const __m512 x1 = _mm512_loadu_ps(x + b * kActBlock + 16);
    // Same operations as QuantizeActivationRow: max is exact, 1/d and x*id are IEEE, and the
    // conversion rounds half to even like std::nearbyint in the default rounding mode. Clamping
    // before the rounding is equivalent since +-127 are integers.
    const float amax = _mm512_reduce_max_ps(
        _mm512_max_ps(_mm512_and_ps(x0, abs_mask), _mm512_and_ps(x1, abs_mask)));
    const float db = amax / 127.0f;
    const __m512 id = _mm512_set1_ps(db > 0.0f ? 1.0f / db : 0.0f);
    const __m512 neg_lim = _mm512_set1_ps(-127.0f);
    const __m512i q0 =
        _mm512_cvt_roundps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(x0, id), neg_lim), lim),
                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i q1 =
        _mm512_cvt_roundps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(x1, id), neg_lim), lim),
                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    int8_t* qg = q + (b / 4) * 128 + (b % 4) * 16;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qg), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qg + 64), _mm512_cvtepi32_epi8(q1));
    _mm_storeu_ps(d + 4 * b, _mm_set1_ps(db));
    s[b] = db * static_cast<float>(sum);
  }
  for (int64_t b = nb; b < 4 * ng; ++b) {
    int8_t* qg = q + (b / 4) * 128 + (b % 4) * 16;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qg), _mm_setzero_si128());
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qg + 64), _mm_setzero_si128());
    _mm_storeu_ps(d + 4 * b, _mm_setzero_ps());
  }
  for (int64_t b = nb; b < Avx512SStride(cols); ++b) s[b] = 0.0f;
}

namespace {

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

#include "common/quant/matmul_float_rows-inl.h"  // NOLINT(build/include): per-ISA copy

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
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      return KQuantRowsAvx512(args, r0, r1, kVnni);
    default:
      return;  // unreachable: MatMul accepts only the types above
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
