// The two passes of SelectNearest (hamming_kernel.h) over every key's distance, per query head in
// Spotlight's retrieval (a 64K-key shard at 2% keeps 1 key in 50):
// - CountWindow finds the threshold distance t: exact counts of the distances below a window of
//   kWindow values and at each of them (the window placed by a histogram of a sample, so one
//   vector pass replaces a histogram of every key, whose increments of the same bucket wait on
//   each other through memory);
// - CollectNearest then collects the indices of the keys closer than t and the first `ties` keys
//   at t, in increasing index order.
// Per ISA 16 (AVX2) or 32 (AVX-512 BW) distances per compare; the scalar loops are the references.
// Every level gives the same counts and indices (integer work).
//
// Thread-safety: pure functions of their arguments.
#ifndef MAGICPIG_COMMON_ATTENTION_KERNELS_NEAREST_COLLECT_H_
#define MAGICPIG_COMMON_ATTENTION_KERNELS_NEAREST_COLLECT_H_

#include <cstdint>

#include "common/cpu_features.h"

namespace magicpig::attention::internal {

// What the pass keeps: d = min(distances[i], top) for i < n; every i with d < t, and the first
// `ties` i (by index) with d == t; it stops once `want` indices are written to out (which needs
// room for want of them; want is the number of keys with d < t plus ties, which the caller knows
// from its histogram). Returns the count written. Distances are at most 65,535, t <= top <=
// 32,767.
struct NearestCollect {
  const uint16_t* distances = nullptr;
  int64_t n = 0;
  int t = 0;
  int top = 0;
  int64_t ties = 0;
  int64_t want = 0;
};

// A level above the CPU's is clamped to it.
int64_t CollectNearest(SimdLevel level, const NearestCollect& a, int32_t* out);
// The per-ISA passes (same contract).
int64_t CollectNearestScalar(const NearestCollect& a, int32_t* out);
int64_t CollectNearestAvx2(const NearestCollect& a, int32_t* out);
int64_t CollectNearestAvx512(const NearestCollect& a, int32_t* out);

// With d = min(distances[i], top) for i < n: below = #{d < lo}, at[j] = #{d == lo + j}.
inline constexpr int kWindow = 8;
struct WindowCounts {
  int64_t below = 0;
  int64_t at[kWindow] = {};
};
// 0 <= lo, top <= 32,767. A level above the CPU's is clamped to it.
WindowCounts CountWindow(SimdLevel level, const uint16_t* distances, int64_t n, int top, int lo);
// The per-ISA counts (same contract).
WindowCounts CountWindowScalar(const uint16_t* distances, int64_t n, int top, int lo);
WindowCounts CountWindowAvx2(const uint16_t* distances, int64_t n, int top, int lo);
WindowCounts CountWindowAvx512(const uint16_t* distances, int64_t n, int top, int lo);

}  // namespace magicpig::attention::internal

#endif  // MAGICPIG_COMMON_ATTENTION_KERNELS_NEAREST_COLLECT_H_
