// AVX2 build (compiled with those flags only here) of CountWindow and CollectNearest: 16
// distances per compare (clamped to top with vpminuw; signed 16-bit compares are exact as every
// value is <= 32,767 after the clamp), counts kept per lane, the selected lanes emitted from
// vpmovmskb's mask (two bits per lane); the last n % 16 distances go through the scalar loops.
#include <immintrin.h>

#include <algorithm>

#include "common/attention/kernels/nearest_collect.h"

namespace magicpig::attention::internal {
namespace {

// Bit 2j of a vpmovmskb mask of 16-bit lanes, moved to bit j (16 lanes).
inline uint64_t LaneBits(uint32_t byte_mask) {
  uint64_t m = byte_mask & 0x55555555u;  // one bit per lane, at even positions
  m = (m | (m >> 1)) & 0x33333333u;
  m = (m | (m >> 2)) & 0x0f0f0f0fu;
  m = (m | (m >> 4)) & 0x00ff00ffu;
  m = (m | (m >> 8)) & 0x0000ffffu;
  return m;
}

// Emits i0 + (lane of each set bit of lt | the lowest *ties set bits of eq) in increasing order,
// consuming *ties, while c < want; returns the new count.
inline int64_t EmitLanes(uint64_t lt, uint64_t eq, int64_t i0, int64_t* ties, int32_t* out,
                         int64_t c, int64_t want) {
  if (eq != 0 && *ties > 0) {
    uint64_t keep = 0;
    for (; eq != 0 && *ties > 0; --*ties) {
      keep |= eq & (~eq + 1);  // the lowest remaining tie
      eq &= eq - 1;
    }
    lt |= keep;
  }
  for (; lt != 0 && c < want; lt &= lt - 1)
    out[c++] = static_cast<int32_t>(i0 + __builtin_ctzll(lt));
  return c;
}

}  // namespace

WindowCounts CountWindowAvx2(const uint16_t* distances, int64_t n, int top, int lo) {
  // Per-lane 16-bit counters (a compare's -1 lanes subtracted), added into the 64-bit totals every
  // kFlush vectors, while every lane is below 2^15 (vpmaddwd sums them as signed).
  constexpr int64_t kFlush = 32767;
  const __m256i vtop = _mm256_set1_epi16(static_cast<int16_t>(top));
  const __m256i vlo = _mm256_set1_epi16(static_cast<int16_t>(lo));
  WindowCounts w;
  auto lane_sum = [](__m256i c) {
    const __m256i pairs = _mm256_madd_epi16(c, _mm256_set1_epi16(1));
    alignas(32) int32_t s[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(s), pairs);
    int64_t sum = 0;
    for (int32_t x : s) sum += x;
    return sum;
  };
  int64_t i = 0;
  while (i + 16 <= n) {
    __m256i below = _mm256_setzero_si256();
    __m256i at[kWindow];
    __m256i v[kWindow];
    for (int j = 0; j < kWindow; ++j) {
      at[j] = _mm256_setzero_si256();
      v[j] = _mm256_set1_epi16(static_cast<int16_t>(lo + j));
    }
    for (int64_t steps = 0; i + 16 <= n && steps < kFlush; i += 16, ++steps) {
      const __m256i x = _mm256_min_epu16(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(distances + i)), vtop);
      below = _mm256_sub_epi16(below, _mm256_cmpgt_epi16(vlo, x));
      for (int j = 0; j < kWindow; ++j) {
        at[j] = _mm256_sub_epi16(at[j], _mm256_cmpeq_epi16(x, v[j]));
      }
    }
    w.below += lane_sum(below);
    for (int j = 0; j < kWindow; ++j) w.at[j] += lane_sum(at[j]);
  }
  const WindowCounts tail = CountWindowScalar(distances + i, n - i, top, lo);
  w.below += tail.below;
  for (int j = 0; j < kWindow; ++j) w.at[j] += tail.at[j];
  return w;
}

int64_t CollectNearestAvx2(const NearestCollect& a, int32_t* out) {
  const __m256i vt = _mm256_set1_epi16(static_cast<int16_t>(a.t));
  const __m256i vtop = _mm256_set1_epi16(static_cast<int16_t>(a.top));
  int64_t c = 0;
  int64_t ties = a.ties;
  int64_t i = 0;
  for (; i + 16 <= a.n && c < a.want; i += 16) {
    const __m256i x = _mm256_min_epu16(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.distances + i)), vtop);
    const uint32_t lt = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpgt_epi16(vt, x)));
    const uint32_t eq =
        ties > 0 ? static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi16(x, vt))) : 0;
    if ((lt | eq) == 0) continue;
    c = EmitLanes(LaneBits(lt), LaneBits(eq), i, &ties, out, c, a.want);
  }
  if (i < a.n && c < a.want) {
    NearestCollect rest = a;
    rest.distances = a.distances + i;
    rest.n = a.n - i;
    rest.ties = ties;
    rest.want = a.want - c;
    const int64_t tail = CollectNearestScalar(rest, out + c);
    for (int64_t j = c; j < c + tail; ++j) out[j] += static_cast<int32_t>(i);
    c += tail;
  }
  return c;
}

}  // namespace magicpig::attention::internal
