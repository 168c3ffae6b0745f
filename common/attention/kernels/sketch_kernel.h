// Scores of keys against a query through their low-rank int8 sketches (key_sketch.h), and the
// selection of the best-scoring keys: the retrieval step of the `sketch` estimator, where a query
// head's code is compared with every key's code of its kv head and the m best keys are attended.
//
// A code of `words` uint16 words holds 2 * words int8 coordinates (coordinate 2w in the low byte
// of word w, 2w + 1 in the high byte); the score is their integer dot product, at most
// 2 * words * 128^2 <= kSketchMaxScore in magnitude.
//
// Compiled per ISA (sketch_{scalar,avx2,avx512}.cc): scalar; AVX2 for codes of a multiple of 8
// words (each 16-byte chunk widened to int16 and multiplied with vpmaddwd, eight keys' sums reduced
// together); AVX-512 for codes of 16 words (a key per register, sixteen keys' sums reduced
// together). Other lengths run the scalar kernel, 8 words at kAvx512 the AVX2 one.
// Every level gives the same scores (integer arithmetic).
//
// Thread-safety: pure functions.
#ifndef MAGICPIG_COMMON_ATTENTION_KERNELS_SKETCH_KERNEL_H_
#define MAGICPIG_COMMON_ATTENTION_KERNELS_SKETCH_KERNEL_H_

#include <cstdint>
#include <vector>

#include "common/cpu_features.h"

namespace magicpig::attention {

// |score| bound for codes of at most 16 words (32 int8 coordinates, at most 128 in magnitude).
inline constexpr int32_t kSketchMaxScore = 32 * 128 * 128;

// out[i] = sum_j q_j k_i,j over the 2 * words int8 coordinates of query_code and key_codes[i], for
// i < n, key_codes [n][words] contiguous, 1 <= words <= 16 (another count, or n <= 0, writes
// nothing). A level above the CPU's is clamped to it.
void SketchScores(SimdLevel level, const uint16_t* query_code, const uint16_t* key_codes, int64_t n,
                  int words, int32_t* out);

// Replaces *out with the indices of the m keys with the largest scores[i] (ties broken by the lower
// index), in increasing index order; m is clamped to [0, n]. Scores must lie in
// [-kSketchMaxScore, kSketchMaxScore] (others are clamped to it). O(n): a histogram
// of the high bits, a pass that takes the keys below the threshold bucket and sets its own keys
// aside, a histogram of their low bits (two passes over the n scores).
void SelectLargest(const int32_t* scores, int64_t n, int64_t m, std::vector<int32_t>* out);

namespace internal {

// The per-ISA kernels behind SketchScores (same contract, n >= 1).
void SketchScalar(const uint16_t* query_code, const uint16_t* key_codes, int64_t n, int words,
                  int32_t* out);
void SketchAvx2(const uint16_t* query_code, const uint16_t* key_codes, int64_t n, int words,
                int32_t* out);
// Codes of 16 words only.
void SketchAvx512(const uint16_t* query_code, const uint16_t* key_codes, int64_t n, int32_t* out);

}  // namespace internal
}  // namespace magicpig::attention

#endif  // MAGICPIG_COMMON_ATTENTION_KERNELS_SKETCH_KERNEL_H_
