// AVX-512 BW build (compiled with those flags only here) of CountWindow and CollectNearest: 32
// distances per compare into a 32-bit lane mask (vpcmpuw), the last n % 32 read under a mask;
// counts kept per lane, the selected lanes' indices compressed (vpcompressd) and stored under a
// mask.
#include <immintrin.h>

#include <algorithm>

#include "common/attention/kernels/nearest_collect.h"

namespace magicpig::attention::internal {

WindowCounts CountWindowAvx512(const uint16_t* distances, int64_t n, int top, int lo) {
  // Per-lane 16-bit counters (a lane's count += 1 by subtracting -1 under the compare's mask),
  // added into the 64-bit totals every kFlush vectors, before a lane can overflow.
  constexpr int64_t kFlush = 65535;
  const __m512i vtop = _mm512_set1_epi16(static_cast<int16_t>(top));
  const __m512i vlo = _mm512_set1_epi16(static_cast<int16_t>(lo));
  const __m512i minus_one = _mm512_set1_epi16(-1);
  WindowCounts w;
  auto lane_sum = [](__m512i c) {
    // Sum of the 32 unsigned 16-bit lanes: pairs into 32-bit lanes, then a reduction.
    const __m512i lo16 = _mm512_and_si512(c, _mm512_set1_epi32(0xFFFF));
    const __m512i hi16 = _mm512_srli_epi32(c, 16);
    return static_cast<int64_t>(_mm512_reduce_add_epi32(_mm512_add_epi32(lo16, hi16)));
  };
  int64_t i = 0;
  while (i < n) {
    __m512i below = _mm512_setzero_si512();
    __m512i at[kWindow];
    __m512i v[kWindow];
    for (int j = 0; j < kWindow; ++j) {
      at[j] = _mm512_setzero_si512();
      v[j] = _mm512_set1_epi16(static_cast<int16_t>(lo + j));
    }
    for (int64_t steps = 0; i < n && steps < kFlush; i += 32, ++steps) {
      const int64_t left = n - i;
      const __mmask32 valid =
          left >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint32_t{1} << left) - 1);
      const __m512i x = _mm512_min_epu16(_mm512_maskz_loadu_epi16(valid, distances + i), vtop);
      below = _mm512_mask_sub_epi16(below, _mm512_mask_cmplt_epu16_mask(valid, x, vlo), below,
                                    minus_one);
      for (int j = 0; j < kWindow; ++j) {
        at[j] = _mm512_mask_sub_epi16(at[j], _mm512_mask_cmpeq_epu16_mask(valid, x, v[j]), at[j],
                                      minus_one);
      }
    }
    w.below += lane_sum(below);
    for (int j = 0; j < kWindow; ++j) w.at[j] += lane_sum(at[j]);
  }
  return w;
}

int64_t CollectNearestAvx512(const NearestCollect& a, int32_t* out) {
  const __m512i vt = _mm512_set1_epi16(static_cast<int16_t>(a.t));
  const __m512i vtop = _mm512_set1_epi16(static_cast<int16_t>(a.top));
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  int64_t c = 0;
  int64_t ties = a.ties;
  for (int64_t i = 0; i < a.n && c < a.want; i += 32) {
    const int64_t left = a.n - i;
    const __mmask32 valid =
        left >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint32_t{1} << left) - 1);
    const __m512i x = _mm512_min_epu16(_mm512_maskz_loadu_epi16(valid, a.distances + i), vtop);
    const uint32_t lt = _mm512_mask_cmplt_epu16_mask(valid, x, vt);
    uint32_t selected = lt;
    if (ties > 0) {
      uint32_t eq = _mm512_mask_cmpeq_epu16_mask(valid, x, vt);
      for (; eq != 0 && ties > 0; --ties, eq &= eq - 1) selected |= eq & (~eq + 1);
    }
    // No branch on whether the step selected anything (at 2% about half of the steps do, at
    // random): each half's indices compressed to the front of a register, stored under a mask.
    for (int half = 0; half < 2; ++half) {
      const __mmask16 m = static_cast<__mmask16>(selected >> (16 * half));
      const int64_t count = std::min<int64_t>(__builtin_popcount(m), a.want - c);
      const __m512i index =
          _mm512_add_epi32(iota, _mm512_set1_epi32(static_cast<int32_t>(i + 16 * half)));
      _mm512_mask_storeu_epi32(out + c, static_cast<__mmask16>((1u << count) - 1),
                               _mm512_maskz_compress_epi32(m, index));
      c += count;
    }
  }
  return c;
}

}  // namespace magicpig::attention::internal
