// The spotlight estimator (Spotlight Attention, Li et al.; docs/spotlight.md): exact attention over
// the keys whose learned codes are nearest the query's in Hamming distance.
//
// The codes come from trained per-head MLP hashes (spotlight_hash.h), computed where the keys and
// queries are (the compute node) and stored with the keys in a KvIndex::kCodes shard: L code words
// of K <= 16 bits per key (bits = 16 L for trained codes). For one query head with code q_codes
// ([L] words): the distance of key i is popcount(q_codes XOR codes_i); the m = ceil(fraction * n)
// nearest keys (ties: the lower index; m >= 1 when n >= 1) are retrieved and attended exactly:
// o = softmax over them, lse = ln sum exp(scale * q . k̄_i) over them; n_touched = m. The estimate
// is deterministic and biased towards the retrieved keys, as top-k is: the learned codes aim to
// retrieve the true top keys (recall of the top 2% in docs/spotlight.md).
//
// Rescoring (rerank R > 1, our addition; the paper attends the nearest keys as they come): the
// min(n, R m) nearest keys are candidates, each scored exactly (its key row read), and the m with
// the largest scores (ties: the lower index) are attended as above; n_touched stays m (the keys
// whose values are read, as for top-k), the key rows read are R m. On Qwen2.5-Coder-1.5B's RULER
// prompts the learned codes' nearest 1.7% held a dominant query's top key 47% of the time, the
// best 1.7% of the nearest 13.6% (R = 8) 80% (docs/spotlight.md).
//
// The same class serves the `sketch` estimator (CodeScore::kSketch): the codes are low-rank int8
// key sketches (key_sketch.h, 2 coordinates per word) and "nearest" means the largest integer dot
// product of the query's sketch with the key's (kernels/sketch_kernel.h), ties to the lower index;
// the rest (rescoring, the exact attention, n_touched) is as above.
//
// Attend: the float64 reference (scalar distances). AttendGroup: each head's distances with the
// SIMD Hamming kernel (kernels/hamming_kernel.h), or the group's sketch retrieval in one pass over
// the codes (BestSketchKeys, kernels/sketch_kernel.h), then the union of the heads' sets through
// the SIMD group kernel, each row attended by the heads that chose it (as MagicPIG's group path).
//
// Thread-safety: immutable after construction; Attend is const (each thread its own scratch).
#ifndef MAGICPIG_COMMON_ATTENTION_SPOTLIGHT_ESTIMATOR_H_
#define MAGICPIG_COMMON_ATTENTION_SPOTLIGHT_ESTIMATOR_H_

#include <cstdint>

#include "common/attention/estimators.h"

namespace magicpig::attention {

// Keys retrieved from a shard of n keys: ceil(fraction * n) clamped to [1, n] (0 when n = 0).
int64_t SpotlightRetrieved(double fraction, int64_t n);

// OK when the shard holds learned codes (KvIndex::kCodes, at most kHammingMaxWords words) and
// q_codes is non-null for a non-empty shard; INVALID_ARGUMENT prefixed with `who` otherwise.
absl::Status CheckLearnedCodes(const KvShard& shard, const uint16_t* q_codes, const char* who);

// *out = the SpotlightRetrieved(fraction, n) keys nearest q_code ([shard.l()] words) in Hamming
// distance, ties to the lower index, in increasing index order; distances from the SIMD kernel at
// `level` (integer arithmetic: every level gives the same set). scratch->distances is used.
void NearestByCode(const KvShard& shard, const uint16_t* q_code, double fraction, SimdLevel level,
                   EstimatorScratch* scratch, std::vector<int32_t>* out);

// The keys a spotlight head scores: min(n, rerank * SpotlightRetrieved(fraction, n)).
int64_t SpotlightCandidates(double fraction, int64_t rerank, int64_t n);

// How a key's code is compared with the query's.
enum class CodeScore {
  kHamming,  // learned binary codes: the smaller the Hamming distance, the nearer
  kSketch,   // key sketches: the larger the int8 dot product, the nearer
};

class SpotlightEstimator final : public Estimator {
 public:
  // fraction in (0, 1]; rerank >= 1 (1: no rescoring).
  explicit SpotlightEstimator(double fraction, int64_t rerank = 1,
                              SimdLevel simd_level = ActiveSimdLevel(),
                              CodeScore score = CodeScore::kHamming)
      : Estimator(simd_level),
        fraction_(fraction),
        rerank_(rerank < 1 ? 1 : rerank),
        score_(score) {}
  SpotlightEstimator(double fraction, SimdLevel simd_level)
      : SpotlightEstimator(fraction, 1, simd_level) {}

  // INVALID_ARGUMENT additionally for a shard that is not KvIndex::kCodes, a null q_codes with a
  // non-empty shard, or codes of more than kHammingMaxWords words.
  absl::StatusOr<PartialAttention> Attend(const KvShard& shard, const float* q,
                                          const uint16_t* q_codes, float scale,
                                          Scratch* scratch) const override;
  absl::Status AttendGroup(const KvShard& shard, const float* q, const uint16_t* q_codes, int g,
                           float scale, Scratch* scratch, PartialAttention* out) const override;

  double fraction() const { return fraction_; }
  int64_t rerank() const { return rerank_; }
  CodeScore score() const { return score_; }

 private:
  double fraction_;
  int64_t rerank_;
  CodeScore score_;
};

}  // namespace magicpig::attention

#endif  // MAGICPIG_COMMON_ATTENTION_SPOTLIGHT_ESTIMATOR_H_
