// Hamming distances between packed binary codes, and the selection of the nearest keys: the
// retrieval step of Spotlight hashing (spotlight_hash.h), where a query's code is compared with
// every key's code of the same head and the keys closest in Hamming distance are attended.
//
// A code of `words` uint16 words holds bits / 16 words, bit i in word i / 16 at position i % 16
// (the layout SpotlightHashes writes); the distance is the number of differing bits, at most
// 16 * words <= 256.
//
// Compiled per ISA (hamming_{scalar,avx2,avx512}.cc): scalar (64-bit popcount per chunk), AVX2
// (nibble-table popcount with vpshufb: several keys per vector for words 1, 2 and 4, one key per
// vector otherwise) and AVX-512 (vpopcntq/vpopcntd), which needs AVX512_VPOPCNTDQ
// (CpuHasAvx512Vpopcntdq()); without it the kAvx512 level runs the AVX2 kernel. Every level gives
// the same distances (integer arithmetic).
//
// Thread-safety: pure functions.
#ifndef MAGICPIG_COMMON_ATTENTION_KERNELS_HAMMING_KERNEL_H_
#define MAGICPIG_COMMON_ATTENTION_KERNELS_HAMMING_KERNEL_H_

#include <cstdint>
#include <vector>

#include "common/cpu_features.h"

namespace magicpig::attention {

inline constexpr int kHammingMaxWords = 16;

// out[i] = popcount(query_code XOR key_codes[i]) over `words` uint16 words, for i < n, with
// key_codes [n][words] contiguous and 1 <= words <= kHammingMaxWords (the caller checks: n <= 0 or
// another word count writes nothing). A level above the CPU's is clamped to it.
void HammingDistances(SimdLevel level, const uint16_t* query_code, const uint16_t* key_codes,
                      int64_t n, int words, uint16_t* out);

// Replaces *out with the indices of the m keys with the smallest distances[i] (ties broken by the
// lower index), in increasing index order; m is clamped to [0, n]. O(n + max_distance) with a
// histogram of the distances: a distance above max_distance counts as max_distance + 1 (all such
// keys tie, so pass the code length in bits to make the selection exact; it is clamped to
// [0, 32766]). The collecting pass runs at `level` (nearest_collect.h; every level selects the
// same keys).
void SelectNearest(const uint16_t* distances, int64_t n, int64_t m, int max_distance,
                   std::vector<int32_t>* out, SimdLevel level = ActiveSimdLevel());

namespace internal {

// The per-ISA kernels behind HammingDistances (same contract, n >= 1). HammingAvx512 needs
// AVX512_VPOPCNTDQ as well as the kAvx512 set.
void HammingScalar(const uint16_t* query_code, const uint16_t* key_codes, int64_t n, int words,
                   uint16_t* out);
void HammingAvx2(const uint16_t* query_code, const uint16_t* key_codes, int64_t n, int words,
                 uint16_t* out);
void HammingAvx512(const uint16_t* query_code, const uint16_t* key_codes, int64_t n, int words,
                   uint16_t* out);

}  // namespace internal
}  // namespace magicpig::attention

#endif  // MAGICPIG_COMMON_ATTENTION_KERNELS_HAMMING_KERNEL_H_
