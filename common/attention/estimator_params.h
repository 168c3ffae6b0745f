// The parameters of the attention estimators, each declared once with its name, flag, help,
// default and bounds. Every place that takes one (the CLI, the HTTP override, the attention node's
// CreateSequence, SimHash and the LSH tables) checks it with ParamSpec::Check against this one
// declaration, so a value is accepted or rejected the same way everywhere.
//
// Thread-safety: constants and pure functions only.
#ifndef MAGICPIG_COMMON_ATTENTION_ESTIMATOR_PARAMS_H_
#define MAGICPIG_COMMON_ATTENTION_ESTIMATOR_PARAMS_H_

#include <cstdint>
#include <limits>
#include <string_view>

#include "absl/status/status.h"

namespace magicpig::attention {

// One parameter of type T (integer or real). `name` is the HTTP override's field and the node's
// proto field (shape.*); `flag` the command-line option without its dashes (its environment
// variable is derived from it: common/flags/flag_table.h). Bounds are inclusive.
template <typename T>
struct ParamSpecOf {
  std::string_view name;
  std::string_view flag;
  std::string_view help;
  T default_value;
  T min;
  T max;

  // OK, or INVALID_ARGUMENT "<field> must be in [min, max], got v" (NaN is out of every range).
  absl::Status Check(T v, std::string_view field) const;
};
using ParamSpec = ParamSpecOf<int64_t>;
using RealParamSpec = ParamSpecOf<double>;

// SimHash bits per table (K). Codes are stored as uint16, hence at most 16.
inline constexpr ParamSpec kLshK{"lsh_k", "lsh-k", "MagicPIG SimHash bits per table (K)",
                                 10,      1,       16};
// Hash tables (L). A key is sampled when it collides with the query in at least two tables, so
// L = 1 would sample nothing: the lower bound is 2.
inline constexpr ParamSpec kLshL{"lsh_l", "lsh-l", "MagicPIG hash tables (L)", 150, 2, 512};
// The SimHash projection seed; also the draw seed of oracle sampling.
inline constexpr ParamSpec kLshSeed{
    "lsh_seed", "lsh-seed", "SimHash projection seed (and oracle sampling's draw seed)",
    1234,       0,          INT64_MAX};
// Keys per head for the budgeted estimators; 0 = the estimator's budget rule (EstimatorSpec). At
// most INT32_MAX: a shard holds fewer keys than that, and oracle sampling draws `budget` indices.
inline constexpr ParamSpec kBudget{
    "budget", "budget", "keys per head for topk / oracle (0: 2% of the offloaded keys)",
    0,        0,        INT32_MAX};

// vAttention's parameters (vattention, vattention-lsh; docs/estimators.md). The guarantee: the
// estimate is within relative error epsilon of its target with probability >= 1 - delta.
inline constexpr RealParamSpec kVaEpsilon{
    "va_epsilon", "va-epsilon", "vAttention: relative error bound (epsilon)", 0.05, 1e-4, 1.0};
inline constexpr RealParamSpec kVaDelta{
    "va_delta", "va-delta", "vAttention: probability that the bound may fail (delta)",
    0.05,       1e-6,       0.5};
// Heavy hitters per head and shard, attended exactly; 0: 1% of the shard's keys (at least 1).
inline constexpr ParamSpec kVaHeavy{
    "va_heavy",
    "va-heavy",
    "vAttention: heavy-hitter keys per head and shard (0: 1% of the shard's keys)",
    0,
    0,
    INT32_MAX};
// The base sample that estimates the residual's spread: max(2, rate * residual keys).
inline constexpr RealParamSpec kVaBaseRate{
    "va_base_rate",
    "va-base-rate",
    "vAttention: base sample of the residual keys as a fraction (at least 2 keys)",
    0.05,
    0.0,
    1.0};

// Spotlight's retrieval: the fraction of each shard's keys (nearest the query in the Hamming
// distance of the learned codes) attended exactly. The default is about what MagicPIG (10, 150)
// samples on SmolLM2 at 4K (3.5%: docs/spotlight.md), so the two touch the same keys.
inline constexpr RealParamSpec kSpotFraction{
    "spotlight_fraction",
    "spotlight-fraction",
    "spotlight: fraction of each shard's keys retrieved by Hamming distance of the learned codes",
    0.035,
    1e-6,
    1.0};

// Spotlight's rescoring: each head scores (reads the key rows of) this many times the retrieved
// count of nearest keys and attends the best by exact score. 1: the paper's retrieval, no
// rescoring.
inline constexpr ParamSpec kSpotRerank{
    "spotlight_rerank",
    "spotlight-rerank",
    "spotlight: score this many times the retrieved count of nearest keys exactly and attend the "
    "best (1: attend the nearest, no rescoring)",
    1,
    1,
    64};

// The sketch estimator's code length: int8 principal coordinates per key (two per 16-bit code word,
// at most 16 words as for learned codes). Even; the compute node fits the sketch (key_sketch.h), so
// the attention node sees only the words (shape.lsh_l). 32 bytes per key held 94-96% of the
// dominant keys of Qwen2.5-Coder-1.5B's RULER prompts in docs/spotlight.md.
inline constexpr ParamSpec kSketchDims{
    "sketch_dims",
    "sketch-dims",
    "sketch: int8 principal coordinates kept per key and kv head (even)",
    32,
    2,
    32};

// OK, or INVALID_ARGUMENT "<field> must be even, got v" (after kSketchDims.Check).
absl::Status CheckSketchDims(int64_t dims, std::string_view field);

// Kept for the storage code's static bounds (a code is a uint16; the table count bounds arrays).
inline constexpr int kSimHashMaxK = static_cast<int>(kLshK.max);
inline constexpr int kSimHashMaxL = static_cast<int>(kLshL.max);

struct VAttentionParams {
  double epsilon = kVaEpsilon.default_value;
  double delta = kVaDelta.default_value;
  int64_t heavy = kVaHeavy.default_value;
  double base_rate = kVaBaseRate.default_value;
};

// The values an estimator is built from (the registry's factories read the ones they use).
struct EstimatorParams {
  int lsh_k = static_cast<int>(kLshK.default_value);
  int lsh_l = static_cast<int>(kLshL.default_value);
  uint64_t lsh_seed = static_cast<uint64_t>(kLshSeed.default_value);
  int64_t budget = kBudget.default_value;
  VAttentionParams vattention{};
  double spotlight_fraction = kSpotFraction.default_value;
  int64_t spotlight_rerank = kSpotRerank.default_value;
};

// Checks vAttention's parameters; fields are named `prefix` + ParamSpec::name.
absl::Status ValidateVAttentionParams(const VAttentionParams& params, std::string_view prefix);

// Checks lsh_k, lsh_l, budget, vAttention's parameters and spotlight's fraction and rerank; fields
// are named `prefix` + ParamSpec::name ("shape.lsh_l").
absl::Status ValidateEstimatorParams(const EstimatorParams& params, std::string_view prefix);

}  // namespace magicpig::attention

#endif  // MAGICPIG_COMMON_ATTENTION_ESTIMATOR_PARAMS_H_
