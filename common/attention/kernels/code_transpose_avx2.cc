// AVX2 build (compiled with the AVX2 flags only here) of the code transpose: 16 keys x 16 tables
// at a time, transposed in registers.
#include <immintrin.h>

#include "common/attention/kernels/code_transpose.h"

namespace magicpig::attention::internal {
namespace {

// r[k] holds the 16 codes of key k (tables t .. t+15) on entry and the 16 keys' codes of table
// t + k on return. Three rounds of interleaves (16-, 32- and 64-bit) inside each 128-bit lane,
// then one exchange of lanes.
inline void Transpose16x16(__m256i r[16]) {
  __m256i a[16];
  __m256i b[16];
  // a[2p], a[2p+1]: keys 2p and 2p+1 interleaved (tables 0-3 | 8-11, and 4-7 | 12-15).
  for (int k = 0; k < 16; k += 2) {
    a[k] = _mm256_unpacklo_epi16(r[k], r[k + 1]);
    a[k + 1] = _mm256_unpackhi_epi16(r[k], r[k + 1]);
  }
  // b[k + j] (k = 0, 4, 8, 12): keys k .. k+3, tables {2j, 2j+1} | {2j+8, 2j+9}.
  for (int k = 0; k < 16; k += 4) {
    for (int s = 0; s < 2; ++s) {
      b[k + 2 * s] = _mm256_unpacklo_epi32(a[k + s], a[k + 2 + s]);
      b[k + 2 * s + 1] = _mm256_unpackhi_epi32(a[k + s], a[k + 2 + s]);
    }
  }
  // a[c] (c < 8): keys 0-3, 8-11 of table c | table c+8; a[8 + c]: keys 4-7, 12-15 likewise.
  for (int k = 0; k < 8; k += 4) {
    for (int s = 0; s < 4; ++s) {
      a[2 * k + 2 * s] = _mm256_unpacklo_epi64(b[k + s], b[k + 8 + s]);
      a[2 * k + 2 * s + 1] = _mm256_unpackhi_epi64(b[k + s], b[k + 8 + s]);
    }
  }
  for (int c = 0; c < 8; ++c) {
    const __m256i lo = _mm256_unpacklo_epi64(a[c], a[8 + c]);  // keys 0-7 (c | c+8)
    const __m256i hi = _mm256_unpackhi_epi64(a[c], a[8 + c]);  // keys 8-15
    r[c] = _mm256_permute2x128_si256(lo, hi, 0x20);
    r[c + 8] = _mm256_permute2x128_si256(lo, hi, 0x31);
  }
}

}  // namespace

uint32_t TransposeCodesAvx2(const CodeTransposeArgs& a) {
  if (a.l < 16) return TransposeCodesScalar(a);
  // Blocks of 512 keys (150 KB of rows at L = 150: they stay in L2 while every table group
  // passes over them, and each table receives 1 KB runs that the prefetchers follow).
  constexpr int64_t kBlock = 512;
  __m256i seen = _mm256_setzero_si256();
  const int64_t full_end = a.begin + (a.end - a.begin) / 16 * 16;
  for (int64_t i0 = a.begin; i0 < full_end; i0 += kBlock) {
    const int64_t i1 = i0 + kBlock < full_end ? i0 + kBlock : full_end;
    for (int64_t g = 0; g < a.l; g += 16) {
      // The last group overlaps the one before when 16 does not divide L: those tables are
      // written twice with the same codes.
      const int64_t t = g + 16 <= a.l ? g : a.l - 16;
      for (int64_t i = i0; i < i1; i += 16) {
        __m256i r[16];
        for (int k = 0; k < 16; ++k) {
          r[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.codes + (i + k) * a.l + t));
          seen = _mm256_or_si256(seen, r[k]);
        }
        Transpose16x16(r);
        for (int j = 0; j < 16; ++j) {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.by_table + (t + j) * a.n + i), r[j]);
        }
      }
    }
  }
  alignas(32) uint16_t lanes[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), seen);
  uint32_t acc = 0;
  for (uint16_t v : lanes) acc |= v;
  if (full_end < a.end) {
    CodeTransposeArgs tail = a;
    tail.begin = full_end;
    acc |= TransposeCodesScalar(tail);
  }
  return acc;
}

}  // namespace magicpig::attention::internal
