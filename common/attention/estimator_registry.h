// The one table of attention estimators, as vLLM's attention-backend registry: each estimator is
// declared once (estimator_registry.cc) with its name, its magicpig.v1.Estimator wire value, the
// parameters it reads, its budget rule and its factory. The CLI (--attention), the HTTP override
// ("attention": {"mode"}), the engine, the evaluation forks, the compute node's ShardShape and the
// attention node's CreateSequence all go through it, so adding an estimator is one file with its
// class, one entry here and its tests (docs/architecture.md, "Estimators").
//
// Thread-safety: the table is immutable; every function is safe to call concurrently.
#ifndef MAGICPIG_COMMON_ATTENTION_ESTIMATOR_REGISTRY_H_
#define MAGICPIG_COMMON_ATTENTION_ESTIMATOR_REGISTRY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/attention/estimator_params.h"
#include "common/attention/estimators.h"

namespace magicpig::attention {

// Which estimator. The registry is the only place that maps a kind to anything else.
enum class EstimatorKind {
  kFull,
  kMagicPig,
  kTopK,
  kOracle,
  kVAttention,
  kVAttentionLsh,
  kSpotlight,
  kVAttentionSpotlight,
  kSketch,
  kVAttentionSketch,
};

// What makes the codes a sequence's shards hold (the compute node computes them, at offload for the
// keys and each step for the queries).
enum class CodeSource {
  kSimHash,    // SimHash of --lsh-k, --lsh-l, --lsh-seed (kept in LSH tables or unused)
  kLearned,    // trained per-head MLP hashes (--spotlight-file; spotlight_hash.h)
  kKeySketch,  // a low-rank int8 sketch fitted per layer and kv head at the first offload
               // (--sketch-dims; key_sketch.h)
};

struct EstimatorSpec {
  EstimatorKind kind;
  // The user-facing name: --attention, the HTTP override's mode, the evaluation's method family.
  std::string_view name;
  std::string_view help;
  // magicpig.v1.Estimator (proto/magicpig/v1/attention.proto); a test checks that the proto's
  // value of that number is named ESTIMATOR_<NAME> ('-' as '_').
  int proto_value;
  // False only for exact attention: the engine then offloads nothing and keeps every key exact.
  bool sparse;
  // Reads the query's SimHash codes and the shard's LSH tables (lsh_k, lsh_l).
  bool retrieves;
  // Reads VAttentionParams (epsilon, delta, heavy hitters, base rate).
  bool verified;
  // How its shards index the keys' codes: SimHash codes in LSH tables, or learned codes kept
  // whole (spotlight: the compute node hashes with --spotlight-file, K = 16, L = bits / 16).
  KvIndex index;
  CodeSource codes;
  // Keys per head when the request's budget is 0, from the offloaded prompt keys; null for
  // estimators that take no budget. A budgeted estimator is built with a budget >= 1.
  int64_t (*default_budget)(int64_t offloaded_keys);
  // Builds the estimator from checked parameters and the budget EstimatorBudget gives.
  std::unique_ptr<const Estimator> (*make)(const EstimatorParams& params, int64_t budget);
};

// Every registered estimator, in the order help texts list them.
absl::Span<const EstimatorSpec> AllEstimators();
const EstimatorSpec& SpecOf(EstimatorKind kind);
std::string_view EstimatorName(EstimatorKind kind);
// "magicpig, full, topk, oracle, vattention, vattention-lsh, spotlight, vattention-spotlight,
// sketch, vattention-sketch".
std::string EstimatorNames();
// INVALID_ARGUMENT naming the choices for an unknown name.
absl::StatusOr<EstimatorKind> ParseEstimator(std::string_view name);
// The wire value's kind; 0 (ESTIMATOR_UNSPECIFIED) is magicpig, the default. INVALID_ARGUMENT
// "shape.estimator: unknown value N" otherwise.
absl::StatusOr<EstimatorKind> EstimatorFromProtoValue(int value);

// Keys per head for `kind`: params.budget when > 0, else the estimator's rule on offloaded_keys;
// 0 for estimators that take no budget.
int64_t EstimatorBudget(EstimatorKind kind, const EstimatorParams& params, int64_t offloaded_keys);

// Checks the parameters (ValidateEstimatorParams with an empty prefix) and builds the estimator
// with EstimatorBudget(kind, params, offloaded_keys).
absl::StatusOr<std::unique_ptr<const Estimator>> MakeEstimator(EstimatorKind kind,
                                                               const EstimatorParams& params,
                                                               int64_t offloaded_keys);

}  // namespace magicpig::attention

#endif  // MAGICPIG_COMMON_ATTENTION_ESTIMATOR_REGISTRY_H_
