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
// A GQA group's heads share their kv head's codes, so SketchScoresGroup scores the group in one
// pass over them (each block of keys scored for every head while it sits in L1): at 64K keys and
// r = 32 the codes are 2 MB per kv head, read from memory once per step instead of once per head.
//
// The retrieval (BestSketchKeys) keeps the m of n keys that each head attends (m = 2% of n)
// without writing every score: a threshold per head from a strided sample, one pass over the codes
// that collects the keys at or above it (a few percent of n, by a vectorised compare and compress),
// and an exact selection among those. The result is always exact.
//
// Thread-safety: pure functions (BestSketchKeys: each caller its own scratch).
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

// out[h * n + i] = the score of query_codes[h * words ..] against key i, for h < g (1 <= g): the
// scores SketchScores gives, with the codes read once for the group. Same limits as SketchScores.
void SketchScoresGroup(SimdLevel level, const uint16_t* query_codes, int g,
                       const uint16_t* key_codes, int64_t n, int words, int32_t* out);

// Replaces *out with the indices of the m keys with the largest scores[i] (ties broken by the lower
// index), in increasing index order; m is clamped to [0, n]. Scores must lie in
// [-kSketchMaxScore, kSketchMaxScore] (others are clamped to it). A histogram over the scores'
// spread finds the bucket that holds the m-th, a pass takes the keys of better buckets and sets
// aside that bucket's, a sort of those picks the rest: O(n) but for the one bucket's sort.
void SelectLargest(const int32_t* scores, int64_t n, int64_t m, std::vector<int32_t>* out);

// Working memory of BestSketchKeys, reused across calls (grows to the largest group and n seen).
struct SketchSelectScratch {
  std::vector<uint16_t> sample_codes;     // [n / stride][words]
  std::vector<int32_t> sample_scores;     // [g][n / stride]
  std::vector<int32_t> block_scores;      // [g][block]
  std::vector<int32_t> candidates;        // [g][n] indices at or above each head's threshold
  std::vector<int32_t> candidate_scores;  // [g][n]
  std::vector<int64_t> counts;            // [g]
  std::vector<int32_t> thresholds;        // [g]
  std::vector<int32_t> scores;            // [g][n] without the sample; [n] where one failed
};

// lists[h] (h < g, g >= 1) = SelectLargest over the scores SketchScores gives head h
// (query_codes[h * words ..]) against the n keys: the m best keys, ties to the lower index, in
// increasing index order. Same limits on words as SketchScores.
//
// For n >= kSketchSampledMin and m <= n / 4: each head's threshold is the
// (e + 4 sqrt(e) + 2)-th largest score of every kSketchSampleStride-th key (e = m / stride, the
// sample's expected count at or above the m-th largest score); one pass over the codes collects
// each head's keys at or above its threshold with their scores (with AVX512-VNNI fused into the
// scores, SketchCollectGroupAvx512Vnni; otherwise a block of keys scored for every head while in
// L1, then compared); SelectLargest among those gives the m best, since every key scoring
// at least the m-th largest score is among them. A head whose threshold admits fewer than m keys
// (an order the stride aliases with) is scored again and selected over all n. Otherwise every
// head's n scores and SelectLargest.
void BestSketchKeys(SimdLevel level, const uint16_t* query_codes, int g, const uint16_t* key_codes,
                    int64_t n, int words, int64_t m, SketchSelectScratch* scratch,
                    std::vector<int32_t>* lists);

inline constexpr int64_t kSketchSampledMin = 1024;
inline constexpr int64_t kSketchSampleStride = 32;

namespace internal {

// The per-ISA kernels behind SketchScores (same contract, n >= 1).
void SketchScalar(const uint16_t* query_code, const uint16_t* key_codes, int64_t n, int words,
                  int32_t* out);
void SketchAvx2(const uint16_t* query_code, const uint16_t* key_codes, int64_t n, int words,
                int32_t* out);
// Codes of 16 words only.
void SketchAvx512(const uint16_t* query_code, const uint16_t* key_codes, int64_t n, int32_t* out);

// Whether the group kernels below serve `level` and `words`: AVX-512 (after clamping to the CPU)
// with VNNI, codes of 8 or 16 words.
inline bool UsesVnniGroup(SimdLevel level, int words) {
  return ClampToDetected(level) == SimdLevel::kAvx512 && CpuHasAvx512Vnni() &&
         (words == 8 || words == 16);
}

// SketchScoresGroup's kernel where the CPU has AVX512-VNNI: codes of 8 or 16 words, g >= 1.
void SketchGroupAvx512Vnni(const uint16_t* query_codes, int g, const uint16_t* key_codes, int64_t n,
                           int words, int32_t* out);

// BestSketchKeys' collecting pass where the CPU has AVX512-VNNI (codes of 8 or 16 words): for
// each key i < n in order and head h < g whose score is at least thresholds[h], appends i to
// idx[h * stride ..] and the score to val[h * stride ..] at counts[h], which it advances. counts
// start at 0; stride >= n (whole vectors are stored, never past entry n - 1 of a head).
void SketchCollectGroupAvx512Vnni(const uint16_t* query_codes, int g, const uint16_t* key_codes,
                                  int64_t n, int words, const int32_t* thresholds, int64_t stride,
                                  int32_t* idx, int32_t* val, int64_t* counts);

// Writes the indices i < n with scores[i] >= t, in increasing order, to out[0 ..) and returns their
// count (BestSketchKeys' collecting pass); out needs room for n entries (the vector levels store
// whole vectors, never past n - 1).
int64_t CollectAtLeastScalar(const int32_t* scores, int64_t n, int32_t t, int32_t* out);
int64_t CollectAtLeastAvx2(const int32_t* scores, int64_t n, int32_t t, int32_t* out);
int64_t CollectAtLeastAvx512(const int32_t* scores, int64_t n, int32_t t, int32_t* out);

}  // namespace internal
}  // namespace magicpig::attention

#endif  // MAGICPIG_COMMON_ATTENTION_KERNELS_SKETCH_KERNEL_H_
