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

// One integer parameter. `name` is the HTTP override's field and the node's proto field (shape.*);
// `flag` the command-line option without its dashes (its environment variable is derived from it:
// common/flags/flag_table.h). Bounds are inclusive.
struct ParamSpec {
  std::string_view name;
  std::string_view flag;
  std::string_view help;
  int64_t default_value;
  int64_t min;
  int64_t max;

  // OK, or INVALID_ARGUMENT "<field> must be in [min, max], got v".
  absl::Status Check(int64_t v, std::string_view field) const;
};

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

// Kept for the storage code's static bounds (a code is a uint16; the table count bounds arrays).
inline constexpr int kSimHashMaxK = static_cast<int>(kLshK.max);
inline constexpr int kSimHashMaxL = static_cast<int>(kLshL.max);

// The values an estimator is built from (the registry's factories read the ones they use).
struct EstimatorParams {
  int lsh_k = static_cast<int>(kLshK.default_value);
  int lsh_l = static_cast<int>(kLshL.default_value);
  uint64_t lsh_seed = static_cast<uint64_t>(kLshSeed.default_value);
  int64_t budget = kBudget.default_value;
};

// Checks lsh_k, lsh_l and budget; fields are named `prefix` + ParamSpec::name ("shape.lsh_l").
absl::Status ValidateEstimatorParams(const EstimatorParams& params, std::string_view prefix);

}  // namespace magicpig::attention

#endif  // MAGICPIG_COMMON_ATTENTION_ESTIMATOR_PARAMS_H_
