// Per-query accuracy of MagicPIG against oracle sampling and top-k at the same budget, for the
// attention accuracy tests of issue #3 (synthetic geometry and real SmolLM2 keys).
//
// Setting (docs/architecture.md §4.2, §4.4, §4.5): one kv head's raw post-RoPE keys k_0..k_{n-1}
// and values. The static tokens are the first `n_sink` positions and the last `n_local` positions;
// the offloaded region is [n_sink, n - n_local). Its mean key c centres every key (offloaded and
// static alike), the query stays raw, and the scale is the caller's (1/sqrt(d) for llama-family).
//
// For one query q that sees keys [0, visible) (visible >= n - n_local, so the whole offloaded
// region is in its past; visible < n models a query at an earlier prompt position, causally):
//   - magicpig  = MagicPigEstimator(K, L) over the offloaded shard; B = its n_touched = |S|.
//   - oracle    = OracleEstimator(B draws, seed) over the offloaded shard.
//   - topk      = TopKEstimator(B) over the offloaded shard.
//   - static    = exact attention over the visible static keys (FullEstimator).
//   - independent = MagicPIG's estimator without the hash tables: each offloaded key is drawn on
//                 its own with its exact inclusion probability u(cos; K, L) (kIndependentDraws
//                 draws, errors averaged) and weighted as magicpig weighs it (logit - ln(u +
//                 1e-4)). It separates what the estimator itself costs (its weights 1/u) from what
//                 the tables' correlated draws add.
//   - reference = exact attention over all visible keys, computed from the *uncentred* keys in an
//                 independent shard (so a centering inconsistency would show up as error).
// Each estimator's part is LSE-merged with the static part, as the system does
// (docs/architecture.md §5.2), and
//   err = |o_merged - o_ref| / |o_ref|           (the output the model would see),
// while err_off compares the estimator's part alone with exact attention over the offloaded region
// (isolates the estimator from the static part, which usually holds the sink's large mass).
// Budget matching: oracle and top-k get B = |S|; the oracle's B draws are with replacement, so it
// touches at most B distinct keys (reported as oracle_distinct).
//
// Thread-safety: Evaluate is const and keeps no shared mutable state; the SimHash passed to Create
// must outlive the evaluator.
#ifndef MAGICPIG_EVAL_ACCURACY_EVAL_H_
#define MAGICPIG_EVAL_ACCURACY_EVAL_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/attention/estimator_params.h"
#include "common/attention/kv_shard.h"
#include "common/attention/partial_attention.h"
#include "common/attention/simhash.h"

namespace magicpig::accuracy {

struct QueryErrors {
  int64_t n_off = 0;    // offloaded keys
  int64_t sampled = 0;  // |S|, the budget given to oracle and top-k
  int64_t oracle_distinct = 0;
  // Merged with the static part, against exact attention over every visible key.
  double magicpig = 0, oracle = 0, topk = 0, independent = 0;
  // The offloaded part alone, against exact attention over the offloaded region.
  double off_magicpig = 0, off_oracle = 0, off_topk = 0, off_independent = 0;
  // Share of the offloaded region's attention mass held by its top-|S| keys (what top-k keeps).
  double topk_mass = 0;
  // Share of the whole attention mass (static + offloaded) that falls on the offloaded region.
  double off_mass = 0;
};

// One query's errors for a verified estimator (vattention, vattention-lsh).
struct VerifiedErrors {
  double err = 0;          // |o_merged - o_ref| / |o_ref|
  double off_den_err = 0;  // |D̂_off / D_off - 1|: the offloaded denominator's relative error
  int64_t touched = 0;     // the estimator's n_touched
};

class HeadEvaluator {
 public:
  static constexpr int kIndependentDraws = 4;

  // keys, values: [n][d] row-major, one kv head in position order; d = hash.dim().
  // INVALID_ARGUMENT unless n > n_sink + n_local (a non-empty offloaded region).
  static absl::StatusOr<HeadEvaluator> Create(std::vector<float> keys, std::vector<float> values,
                                              int64_t n, const attention::SimHash& hash,
                                              int64_t n_sink = 4, int64_t n_local = 64);

  // INVALID_ARGUMENT unless n - n_local <= visible <= n.
  absl::StatusOr<QueryErrors> Evaluate(const float* q, int64_t visible, float scale,
                                       uint64_t oracle_seed) const;

  // vattention and vattention-lsh (the latter on this evaluator's tables) over the offloaded shard
  // with `params`, drawing with `seed`: their outputs merged with the static part against the
  // reference, and their offloaded denominators against the exact one (what the bound targets).
  absl::StatusOr<std::pair<VerifiedErrors, VerifiedErrors>> EvaluateVerified(
      const float* q, int64_t visible, float scale, const attention::VAttentionParams& params,
      uint64_t seed) const;

  int64_t n() const { return n_; }
  int64_t n_off() const { return offloaded_.size(); }
  const std::vector<float>& center() const { return center_; }
  const attention::KvShard& offloaded() const { return offloaded_; }

 private:
  // INVALID_ARGUMENT unless n - n_local <= visible <= n.
  absl::Status CheckVisible(int64_t visible) const;
  // The exact attention over the visible static keys, and the reference over every visible key.
  absl::StatusOr<std::pair<attention::PartialAttention, attention::PartialAttention>>
  StaticAndReference(const float* q, int64_t visible, float scale) const;

  HeadEvaluator(std::vector<float> keys, std::vector<float> values, int64_t n, int64_t d,
                const attention::SimHash* hash, attention::SimHash tiny, int64_t n_sink,
                int64_t n_local, std::vector<float> center, attention::KvShard offloaded)
      : keys_(std::move(keys)),
        values_(std::move(values)),
        n_(n),
        d_(d),
        hash_(hash),
        tiny_(std::move(tiny)),
        n_sink_(n_sink),
        n_local_(n_local),
        center_(std::move(center)),
        offloaded_(std::move(offloaded)) {}

  std::vector<float> keys_, values_;
  int64_t n_, d_;
  const attention::SimHash* hash_;
  attention::SimHash tiny_;  // K = L = 1: shards that are only attended exactly need some tables
  int64_t n_sink_, n_local_;
  std::vector<float> center_;
  attention::KvShard offloaded_;
};

// Means over a set of queries (of one head, or pooled): each field is the mean of the same field
// of QueryErrors; sampled_frac is the mean of sampled / n_off.
struct ErrorSummary {
  int64_t queries = 0;
  double magicpig = 0, oracle = 0, topk = 0, independent = 0;
  double off_magicpig = 0, off_oracle = 0, off_topk = 0, off_independent = 0;
  double topk_mass = 0, off_mass = 0, sampled_frac = 0;
};
ErrorSummary Summarize(const std::vector<QueryErrors>& errors);

// One table row: "magicpig / oracle / topk" merged and offloaded-only errors, ratios, masses.
std::string FormatSummary(const ErrorSummary& s);

}  // namespace magicpig::accuracy

#endif  // MAGICPIG_EVAL_ACCURACY_EVAL_H_
