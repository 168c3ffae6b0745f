// Attention estimators over one KvShard for one query head (docs/architecture.md §4.4, §5.1).
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
// - OracleEstimator(budget, seed): the paper's "oracle sampling" baseline (docs/architecture.md
// §5.1). Draws
//   `budget` key indices i_1..i_B i.i.d. WITH replacement from the true attention distribution
//   p_i = softmax(scale * s)_i over the whole shard. Self-normalised importance sampling with
//   proposal p and target p has weights w_j = p(i_j) / p(i_j) = 1, so
//     o = sum_j w_j v_{i_j} / sum_j w_j = (1/B) sum_j v_{i_j},
//   the plain mean of the sampled values. It is exactly unbiased: E[v_{i_j}] = sum_i p_i v_i = o
//   (the exact shard output), with per-coordinate variance (E_p[v_t^2] - o_t^2) / B, so the error
//   falls as 1/sqrt(B). lse is NOT estimated: it is the exact ln sum_i exp(scale * s_i) over all n
//   keys (computing p needs every logit anyway), so merging this part with others weights it
//   correctly. n_touched = number of distinct keys sampled. Deterministic for a seed
//   (std::mt19937_64 seeded once per Attend call: inverse-CDF sampling with a 53-bit uniform);
//   values are summed in ascending key order (multiplicity / B each). budget <= 0 or an empty
//   shard gives the empty part. Memory: scratch->sample grows to B indices.
//
// Two entry points:
// - Attend: one query head, the scalar float64 REFERENCE implementation of the definitions above
//   (what tests and the accuracy evaluation compare against).
// - AttendGroup: the G query heads of one GQA group at once, the fast path used by the engine and
//   the attention service. FullEstimator and MagicPigEstimator run the SIMD group kernel
//   (kernels/group_attention_kernel.h: fp32 arithmetic over the stored bf16/fp32 rows, each key and
//   value row loaded once for every head of the group, the MagicPIG correction interpolated from
//   LogInclusionTable); for magicpig the group's sample sets are retrieved together
//   (KvShard::RetrieveGroup) and their union gathered once in key order, each head attending only
//   to its own subset (docs/architecture.md §6.3). The others fall
//   back to Attend per head. TopKEstimator and OracleEstimator take their logits for every key
//   from the same kernel's score pass (kernels/group_attention_kernel.h GroupScores*, fp32), then
//   select or draw exactly as Attend does from those logits (Attend's float64 dot products
//   differ from them by float rounding only, so a near-tie at the top-k boundary or a draw within
//   rounding of a CDF step may go the other way). With a head dim the kernels do not take (not a
//   multiple of 16, or > 256) these two fall back to Attend per head. The SIMD level is fixed at
//   construction (default ActiveSimdLevel()).
//
// Thread-safety: estimators are immutable after construction and Attend is const: one estimator
// may serve many threads concurrently provided each thread passes its own EstimatorScratch.
#ifndef MAGICPIG_COMMON_ATTENTION_ESTIMATORS_H_
#define MAGICPIG_COMMON_ATTENTION_ESTIMATORS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/attention/kernels/sketch_kernel.h"
#include "common/attention/kv_shard.h"
#include "common/attention/lsh_tables.h"
#include "common/attention/partial_attention.h"
#include "common/cpu_features.h"

namespace magicpig::attention {

// Per-thread working memory, reused across calls (grows to the largest shard seen).
struct EstimatorScratch {
  LshScratch lsh;
  std::vector<int32_t> sample;  // key indices attended to
  std::vector<double> logits;   // one per sampled key
  std::vector<double> acc;      // [d] value accumulator
  // AttendGroup:
  std::vector<int32_t> rows;        // union of the group's samples
  std::vector<uint32_t> row_masks;  // parallel to rows
  std::vector<float> q_norms;       // [g]
  std::vector<float> kernel;        // group kernel scratch
  std::vector<float> o;             // [g][d]
  std::vector<float> lse;           // [g]
  std::vector<float> scores;        // [g][n] logits (top-k, oracle, vattention)
  std::vector<uint64_t> bits;       // sampling bitmap (vattention), all zero between calls
  // Per key, bit h for head h of a group (vattention's coupled draws), all zero between calls:
  std::vector<uint32_t> key_heads;     // in head h's deterministic set
  std::vector<uint32_t> sample_heads;  // taken by head h's sample
  std::vector<uint16_t> distances;     // [n] Hamming distances (spotlight)
  SketchSelectScratch sketch;          // the sketch's retrieval
  // Phase timing of MagicPIG's AttendGroup (only when time_phases is set): the LSH retrieval of the
  // group's sample union, and the kernel (gather of the sampled rows and their attention).
  bool time_phases = false;
  double retrieve_seconds = 0;
  double kernel_seconds = 0;
  // With time_phases, what those phases read, counted apart from the timed work: the distinct
  // 64-byte lines of bucket offsets and entries and their runs of adjacent lines
  // (LshTables::CountLookupReads), the union's rows (each a key and a value row), and the bytes
  // of the pending segment's codes scanned (magicpig bench's floor).
  int64_t bucket_lines = 0;
  int64_t bucket_runs = 0;
  int64_t union_rows = 0;
  int64_t pending_bytes = 0;
  // MagicPIG's selection and kernel halves for one AttendGroup call (estimators.cc): taken out of
  // the scratch for the call, so that a call this thread makes while it waits for the other half
  // (a task it takes meanwhile) finds the scratch free; made at the first call, then reused.
  std::shared_ptr<struct MagicPigSplit> split;
};

// What the selection phase of a two-phase estimator (Estimator::SelectGroup) leaves for its kernel
// parts: the union of the group's selected rows, sorted, with a bit per head that selected each,
// and how many parts the kernel over them is cut into (from the row count alone, so the result
// does not depend on the number of threads).
struct GroupSelection {
  std::vector<int32_t> rows;
  std::vector<uint32_t> masks;
  int parts = 1;  // 1 or 2
};

// Most heads a two-phase call takes (the group kernel's row masks are uint32).
inline constexpr int kMaxSelectionHeads = 32;

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

  // q: [g][shard.dim()] raw queries of g heads that share the shard's kv head; q_codes: [g][L]
  // (or null for estimators that do not retrieve). Writes out[0 .. g). Same errors as Attend, and
  // INVALID_ARGUMENT for g < 1 or a null out. Default: Attend per head.
  virtual absl::Status AttendGroup(const KvShard& shard, const float* q, const uint16_t* q_codes,
                                   int g, float scale, Scratch* scratch,
                                   PartialAttention* out) const;

  // The two-phase form of AttendGroup, for estimators that choose rows before attending them
  // (MagicPIG's retrieval, then the kernel over the union). AttentionRunner runs every work item's
  // selection before any kernel part, so a thread done with its selection takes the next item's
  // instead of its own kernel, and the parts fill the threads (SmolLM2 at 8K: 3 groups on 2
  // threads left one thread idle for a retrieval per layer). Where two_phase() is true:
  // SelectGroup (1 <= g <= kMaxSelectionHeads; AttendGroup's errors) fills *selection; then
  // AttendPart for each part < selection.parts, in any order or thread, part 0 writing out[0 .. g)
  // and part p > 0 its own [g] array; then FinishGroup(selection, g, out, the other parts' arrays)
  // gives exactly AttendGroup's result. The scratch of each call may be any thread's.
  virtual bool two_phase() const { return false; }
  virtual absl::Status SelectGroup(const KvShard& shard, const uint16_t* q_codes, int g,
                                   Scratch* scratch, GroupSelection* selection) const;
  virtual void AttendPart(const KvShard& shard, const float* q, int g, float scale,
                          const GroupSelection& selection, int part, Scratch* scratch,
                          PartialAttention* out) const;

  SimdLevel simd_level() const { return simd_level_; }

 protected:
  explicit Estimator(SimdLevel simd_level) : simd_level_(simd_level) {}

 private:
  SimdLevel simd_level_;
};

// The last step of a two-phase call (Estimator::SelectGroup): out[h] merged by LSE with
// others[0][h] when the selection has two parts, and out[h].n_touched = the selection's rows of
// head h. others: selection.parts - 1 arrays of g partials.
void FinishGroup(const GroupSelection& selection, int g, PartialAttention* out,
                 PartialAttention* const* others);

class FullEstimator final : public Estimator {
 public:
  explicit FullEstimator(SimdLevel simd_level = ActiveSimdLevel()) : Estimator(simd_level) {}

  absl::Status AttendGroup(const KvShard& shard, const float* q, const uint16_t* q_codes, int g,
                           float scale, Scratch* scratch, PartialAttention* out) const override;
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
  MagicPigEstimator(int k, int l, MagicPigOptions options = {},
                    SimdLevel simd_level = ActiveSimdLevel());

  absl::Status AttendGroup(const KvShard& shard, const float* q, const uint16_t* q_codes, int g,
                           float scale, Scratch* scratch, PartialAttention* out) const override;
  // Selection: the tables' retrieval plus the pending segment's scan; parts: 2 from kSplitRows
  // union rows (two halves merged by LSE), else 1.
  bool two_phase() const override { return true; }
  absl::Status SelectGroup(const KvShard& shard, const uint16_t* q_codes, int g, Scratch* scratch,
                           GroupSelection* selection) const override;
  void AttendPart(const KvShard& shard, const float* q, int g, float scale,
                  const GroupSelection& selection, int part, Scratch* scratch,
                  PartialAttention* out) const override;
  // Union rows from which the kernel runs as two parts (at ~70 ns per row, a half of 128 rows is
  // ~9 us, several times the cost of the extra task and merge).
  static constexpr int64_t kSplitRows = 256;

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
  std::vector<float> lnu_table_;  // LogInclusionTable(k, l)
};

// The estimators that must see every key's exact logit: they select (top-k) or draw (oracle
// sampling) from the logits of all n keys. Attend computes the logits in float64 (the reference);
// AttendGroup takes each head's logits from the SIMD group kernel (falling back to Attend per head
// where the kernel does not take the shard). What is done with the logits is the subclass's.
class ExactLogitsEstimator : public Estimator {
 public:
  absl::Status AttendGroup(const KvShard& shard, const float* q, const uint16_t* q_codes, int g,
                           float scale, Scratch* scratch, PartialAttention* out) const final;
  absl::StatusOr<PartialAttention> Attend(const KvShard& shard, const float* q,
                                          const uint16_t* q_codes, float scale,
                                          Scratch* scratch) const final;

  int64_t budget() const { return budget_; }

 protected:
  // name: the class, for error messages.
  ExactLogitsEstimator(int64_t budget, SimdLevel simd_level, const char* name)
      : Estimator(simd_level), budget_(budget), name_(name) {}

  // True when the answer is the empty part whatever the logits (then none is computed).
  virtual bool AnswerIsEmpty(const KvShard& shard) const = 0;
  // The part from the n logits in scratch->logits (called only when !AnswerIsEmpty); q is the
  // head's query (for estimators that draw a sample per query).
  virtual PartialAttention FromLogits(const KvShard& shard, const float* q,
                                      Scratch* scratch) const = 0;

 private:
  int64_t budget_;
  const char* name_;
};

class TopKEstimator final : public ExactLogitsEstimator {
 public:
  // budget >= 0 (a negative budget is treated as 0: the empty part).
  explicit TopKEstimator(int64_t budget, SimdLevel simd_level = ActiveSimdLevel())
      : ExactLogitsEstimator(budget, simd_level, "TopKEstimator") {}

 private:
  // Never: the selection of the empty shard or of budget 0 is the empty part anyway.
  bool AnswerIsEmpty(const KvShard& /*shard*/) const override { return false; }
  // The `budget` highest logits (ties: lower index), softmax over them.
  PartialAttention FromLogits(const KvShard& shard, const float* q,
                              Scratch* scratch) const override;
};

class OracleEstimator final : public ExactLogitsEstimator {
 public:
  // budget >= 0 (a negative budget is treated as 0: the empty part).
  OracleEstimator(int64_t budget, uint64_t seed, SimdLevel simd_level = ActiveSimdLevel())
      : ExactLogitsEstimator(budget, simd_level, "OracleEstimator"), seed_(seed) {}

  uint64_t seed() const { return seed_; }

 private:
  // Nothing to draw: an empty shard or budget <= 0.
  bool AnswerIsEmpty(const KvShard& shard) const override {
    return shard.size() == 0 || budget() <= 0;
  }
  // The draws and the value mean from the n logits (n >= 1, budget >= 1).
  PartialAttention FromLogits(const KvShard& shard, const float* q,
                              Scratch* scratch) const override;

  uint64_t seed_;
};

}  // namespace magicpig::attention

#endif  // MAGICPIG_COMMON_ATTENTION_ESTIMATORS_H_
