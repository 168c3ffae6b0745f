// vAttention (Desai et al., "vAttention: Verified Sparse Attention") and vattention-lsh, its
// variant that finds the heavy hitters in the MagicPIG tables instead of scoring every key
// (docs/vattention.md has the derivations; docs/decisions.md where the paper and its public code
// disagree and which we follow).
//
// Both split one shard's n keys into a deterministic set H (the heavy hitters, attended exactly)
// and the residual R (n_s = n - |H| keys), estimated from a uniform sample:
//   1. a base sample S0 of max(2, floor(base_rate * n_s)) residual keys (at most n_s), drawn
//      uniformly without replacement; from their weights w = exp(logit - m): the spread
//      sigma = their sample standard deviation and the denominator estimate
//      D0 = sum_H w + (n_s / |S0|) sum_S0 w;
//   2. the sample size b = ceil((z * sigma * n_s / (epsilon * D0))^2) clamped to [|S0|, n_s],
//      z = Phi^-1(1 - delta / 2): the CLT bound P(|D̂ - D| > epsilon D) <= delta on the
//      denominator's estimate (the paper's two-sided quantile; the public code's Phi^-1(1 - delta)
//      would cover 1 - 2 delta: docs/decisions.md);
//   3. a fresh sample S of b residual keys, uniform without replacement and independent of S0
//      given b, each weighted n_s / b (b = n_s: every residual key, weight 1):
//        N = sum_H w v + (n_s / b) sum_S w v,   D = sum_H w + (n_s / b) sum_S w,
//      o = N / D and lse = m + ln D. N and D are unbiased for the exact sums (conditioned on H and
//      b, S is a simple random sample of R); o is their ratio (biased by O(1 / b)).
// - VAttentionEstimator: H = the top h keys of the shard by exact logit (ties: lower index), so it
//   reads every key's score, as top-k does. n_touched = |H| + b (the keys whose values are read).
// - VAttentionLshEstimator: H = the candidates C, the keys colliding with the query in >= 2 of the
//   shard's L tables (MagicPIG's retrieval), scored exactly; the residual is every other key. Only
//   candidates, S0 and S are read: n_touched = |C ∪ S0 ∪ S|. If a true heavy hitter is not a
//   candidate it stays in the residual, where a base sample rarely sees it: sigma is then
//   underestimated and the bound can fail (docs/vattention.md). VAttentionParams::heavy is not
//   used: every candidate is deterministic (its key is read anyway).
//
// Draws are coupled across the heads of a GQA group (AttendGroup; Attend is a group of one): one
// uniformly random order of the shard's keys, drawn lazily, from which each head takes the first
// keys outside its deterministic set (one order for the base samples, a second, later in the same
// stream, for the samples). Each head's sample is then a uniform subset of its residual, the
// same law as an independent draw per head, while the group's heads share most of their keys, so
// the rows the kernel reads are about the largest sample instead of the sum of them. The stream
// is std::mt19937_64 seeded with the estimator's seed mixed with a hash of the group's queries and
// the shard size, so the sample changes from step to step yet a run is reproducible. Heavy count
// h = VAttentionParams::heavy, or 1% of the shard's keys when 0.
//
// Thread-safety: immutable after construction; Attend is const (each thread its own scratch).
#ifndef MAGICPIG_COMMON_ATTENTION_VATTENTION_H_
#define MAGICPIG_COMMON_ATTENTION_VATTENTION_H_

#include <cstdint>

#include "common/attention/estimator_params.h"
#include "common/attention/estimators.h"
#include "common/attention/spotlight_estimator.h"

namespace magicpig::attention {

// The z with Phi(z) = p for the standard normal CDF Phi, p in (0, 1); to ~1e-12 absolute.
double NormalQuantile(double p);

// Heavy hitters for a shard of n keys: min(heavy, n) when heavy > 0, else max(1, ceil(n / 100))
// (0 when n = 0).
int64_t HeavyHitterCount(int64_t heavy, int64_t n);

// Step 2 above: the residual sample size for spread sigma, n_s residual keys, the denominator
// estimate d_hat > 0 and a base sample of `base` keys (1 <= base <= n_s).
int64_t VAttentionSampleSize(double z, double sigma, int64_t n_s, double epsilon, double d_hat,
                             int64_t base);

class VAttentionEstimator final : public Estimator {
 public:
  VAttentionEstimator(const VAttentionParams& params, uint64_t seed,
                      SimdLevel simd_level = ActiveSimdLevel());

  // The float64 reference (scalar logits and value sums) for one head: AttendGroupReference with
  // g = 1.
  absl::StatusOr<PartialAttention> Attend(const KvShard& shard, const float* q,
                                          const uint16_t* q_codes, float scale,
                                          Scratch* scratch) const override;
  // The float64 reference of AttendGroup: the same heavy sets and coupled draws, scalar logits
  // and value sums. AttendGroup falls back to it where the kernels do not take the shard.
  absl::Status AttendGroupReference(const KvShard& shard, const float* q, const uint16_t* q_codes,
                                    int g, float scale, Scratch* scratch,
                                    PartialAttention* out) const;
  // The SIMD path: every key's logit from the group kernel's score pass (fp32), the heavy set,
  // base sample and sample chosen from those as AttendGroupReference chooses them, then the heavy
  // and sampled rows attended by the group kernel (each row read once for the group) and merged,
  // the sampled part's lse shifted by ln(n_s / b).
  absl::Status AttendGroup(const KvShard& shard, const float* q, const uint16_t* q_codes, int g,
                           float scale, Scratch* scratch, PartialAttention* out) const override;

  const VAttentionParams& params() const { return params_; }

 private:
  VAttentionParams params_;
  uint64_t seed_;
  double z_;
};

class VAttentionLshEstimator final : public Estimator {
 public:
  // Candidates from the shard's (K, L) LSH tables (vattention-lsh).
  VAttentionLshEstimator(int k, int l, const VAttentionParams& params, uint64_t seed,
                         SimdLevel simd_level = ActiveSimdLevel());
  // Candidates from codes kept whole on a KvIndex::kCodes shard: with CodeScore::kHamming
  // (vattention-spotlight) the spotlight_fraction of the shard's keys nearest the query's learned
  // code in Hamming distance (NearestByCode, spotlight_estimator.h); with CodeScore::kSketch
  // (vattention-sketch) the SpotlightRetrieved(spotlight_fraction, n) keys of largest key-sketch
  // score (BestSketchKeys, kernels/sketch_kernel.h; ties: the lower index). The rest as above.
  static VAttentionLshEstimator WithLearnedCodes(double spotlight_fraction,
                                                 const VAttentionParams& params, uint64_t seed,
                                                 SimdLevel simd_level = ActiveSimdLevel(),
                                                 CodeScore score = CodeScore::kHamming);

  // The SIMD path: the group's candidates retrieved together (KvShard::RetrieveGroup); each
  // head's candidates, base sample and sample attended by the group kernel in fp32 (the base
  // sample's sums of exp(logit) and of its square from one keys-only kernel pass); the
  // sample's part shifted by ln(n_s / b) and merged with the candidates'. The same draws as
  // AttendGroupReference; the sample size can differ where its float64 spread and the kernel's
  // fp32 one round across an integer.
  absl::Status AttendGroup(const KvShard& shard, const float* q, const uint16_t* q_codes, int g,
                           float scale, Scratch* scratch, PartialAttention* out) const override;

  // The float64 reference for one head (AttendGroupReference with g = 1). INVALID_ARGUMENT
  // additionally if the shard's tables are not (K, L) (learned codes: a shard without them) or
  // q_codes is null.
  absl::StatusOr<PartialAttention> Attend(const KvShard& shard, const float* q,
                                          const uint16_t* q_codes, float scale,
                                          Scratch* scratch) const override;
  // The float64 reference of AttendGroup (q_codes [g][L]): the same candidates and coupled draws,
  // scalar logits and value sums. AttendGroup falls back to it where the kernels do not take the
  // shard.
  absl::Status AttendGroupReference(const KvShard& shard, const float* q, const uint16_t* q_codes,
                                    int g, float scale, Scratch* scratch,
                                    PartialAttention* out) const;

  const VAttentionParams& params() const { return params_; }
  // > 0 for candidates from learned codes (the fraction retrieved), 0 for the tables.
  double spotlight_fraction() const { return spotlight_fraction_; }
  // How candidates are found from codes (with spotlight_fraction() > 0).
  CodeScore score() const { return score_; }

 private:
  // Head h's candidates (q_codes: its code), sorted by index.
  absl::Status Candidates(const KvShard& shard, const uint16_t* q_codes, Scratch* scratch,
                          std::vector<int32_t>* out) const;
  // Every candidate set of the group's gc heads (q_codes [gc][L]).
  absl::Status GroupCandidates(const KvShard& shard, const uint16_t* q_codes, int gc,
                               Scratch* scratch, std::vector<std::vector<int32_t>>* out) const;
  absl::Status CheckSource(const KvShard& shard, const uint16_t* q_codes) const;

  int k_;
  int l_;
  double spotlight_fraction_ = 0;
  CodeScore score_ = CodeScore::kHamming;  // with spotlight_fraction_ > 0
  VAttentionParams params_;
  uint64_t seed_;
  double z_;
};

}  // namespace magicpig::attention

#endif  // MAGICPIG_COMMON_ATTENTION_VATTENTION_H_
