// Attention estimators over one KvShard for one query head (reference spec §6, §10.3; DESIGN §7).
// Each returns the shard's PartialAttention (o, lse in natural log, n_touched), to be merged with
// the other parts (static tokens, other shards) by MergePartials.
//
// Conventions shared by all estimators:
// - q is the raw (uncentred) post-RoPE query, length shard.dim(); the shard's keys are centred.
// - s_i = q · k̄_i; the exact logit is scale * s_i (scale = the model's attention scale, 1/sqrt(d)
//   for llama-family models).
// - An estimator that attends to no key returns the empty part (o = 0, lse = -inf, n_touched = 0).
// - This is the scalar reference implementation: dot products, softmax and value sums are
//   accumulated in float64 and rounded to float32 at the end.
//
// Estimators:
// - FullEstimator: exact softmax attention over all n keys of the shard; n_touched = n.
// - MagicPigEstimator(K, L): S = keys colliding with q_codes in >= 2 of the L tables (each sampled
//   key enters once), logit_i = scale * s_i - ln(u_i + 1e-4) with
//   u_i = InclusionProbability(cos_i, K, L), cos_i = s_i / (|q| |k̄_i|) (clamped to [-1, 1]; a zero
//   norm gives cos = 0); n_touched = |S|. The shard's tables must have been built with the same K
//   and L. Option force_unit_inclusion (a test hook): logit_i = scale * s_i exactly (no shift at
//   all, i.e. u = 1 without the 1e-4 guard), so the result is exact attention over S.
//   Sum order follows the retrieval order (order of second hit).
// - TopKEstimator(budget): exact attention renormalised over the min(budget, n) keys with the
//   largest s_i (ties broken by the lower index); n_touched = that count.
//
// Thread-safety: estimators are immutable after construction and Attend is const: one estimator
// may serve many threads concurrently provided each thread passes its own EstimatorScratch.
#ifndef MAGICPIG_ATTN_NODE_CORE_ESTIMATORS_H_
#define MAGICPIG_ATTN_NODE_CORE_ESTIMATORS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "attn_node/core/kv_shard.h"
#include "attn_node/core/lsh_tables.h"
#include "attn_node/core/partial_attention.h"

namespace magicpig {

// Per-thread working memory, reused across calls (grows to the largest shard seen).
struct EstimatorScratch {
  LshScratch lsh;
  std::vector<int32_t> sample;  // key indices attended to
  std::vector<double> logits;   // one per sampled key
  std::vector<double> acc;      // [d] value accumulator
};

class Estimator {
 public:
  using Scratch = EstimatorScratch;
  virtual ~Estimator() = default;

  // q: [shard.dim()] raw query. q_codes: [shard.l()] SimHash codes of q (used only by estimators
  // that retrieve; may be null for the others). INVALID_ARGUMENT if scratch is null, q is null with
  // a non-empty shard, or the estimator's parameters do not match the shard (see each class).
  virtual absl::StatusOr<PartialAttention> Attend(const KvShard& shard, const float* q,
                                                  const uint16_t* q_codes, float scale,
                                                  Scratch* scratch) const = 0;
};

class FullEstimator final : public Estimator {
 public:
  absl::StatusOr<PartialAttention> Attend(const KvShard& shard, const float* q,
                                          const uint16_t* q_codes, float scale,
                                          Scratch* scratch) const override;
};

struct MagicPigOptions {
  // Test hook: no importance shift, logits are exactly scale * s_i.
  bool force_unit_inclusion = false;
};

class MagicPigEstimator final : public Estimator {
 public:
  MagicPigEstimator(int k, int l, MagicPigOptions options = {}) : k_(k), l_(l), options_(options) {}

  // INVALID_ARGUMENT additionally if shard.k() != K or shard.l() != L, q_codes is null, or a query
  // code is >= 2^K.
  absl::StatusOr<PartialAttention> Attend(const KvShard& shard, const float* q,
                                          const uint16_t* q_codes, float scale,
                                          Scratch* scratch) const override;

  int k() const { return k_; }
  int l() const { return l_; }
  const MagicPigOptions& options() const { return options_; }

 private:
  int k_;
  int l_;
  MagicPigOptions options_;
};

class TopKEstimator final : public Estimator {
 public:
  // budget >= 0 (a negative budget is treated as 0: the empty part).
  explicit TopKEstimator(int64_t budget) : budget_(budget) {}

  absl::StatusOr<PartialAttention> Attend(const KvShard& shard, const float* q,
                                          const uint16_t* q_codes, float scale,
                                          Scratch* scratch) const override;

  int64_t budget() const { return budget_; }

 private:
  int64_t budget_;
};

}  // namespace magicpig

#endif  // MAGICPIG_ATTN_NODE_CORE_ESTIMATORS_H_
