#include "common/attention/estimator_registry.h"

#include <algorithm>
#include <array>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/attention/spotlight_estimator.h"
#include "common/attention/vattention.h"

namespace magicpig::attention {
namespace {

// top-k and oracle sampling without a budget: 2% of the offloaded prompt keys, the cost of
// MagicPIG (10, 150) in the paper's Table 9, so the three compare at the same work.
int64_t TwoPercent(int64_t offloaded_keys) {
  return std::max<int64_t>(1, std::max<int64_t>(offloaded_keys, 1) / 50);
}

// The registry. proto_value must match proto/magicpig/v1/attention.proto's Estimator enum.
const std::array<EstimatorSpec, 10> kEstimators = {{
    {EstimatorKind::kMagicPig, "magicpig",
     "MagicPIG: keys colliding with the query in >= 2 of L SimHash tables, importance-weighted",
     /*proto_value=*/1, /*sparse=*/true, /*retrieves=*/true, /*verified=*/false,
     KvIndex::kLshTables, CodeSource::kSimHash, /*default_budget=*/nullptr,
     [](const EstimatorParams& p, int64_t) -> std::unique_ptr<const Estimator> {
       return std::make_unique<MagicPigEstimator>(p.lsh_k, p.lsh_l);
     }},
    {EstimatorKind::kFull, "full", "exact attention over every key", /*proto_value=*/2,
     /*sparse=*/false, /*retrieves=*/false, /*verified=*/false, KvIndex::kLshTables,
     CodeSource::kSimHash,
     /*default_budget=*/nullptr,
     [](const EstimatorParams&, int64_t) -> std::unique_ptr<const Estimator> {
       return std::make_unique<FullEstimator>();
     }},
    {EstimatorKind::kTopK, "topk", "exact attention over the `budget` keys with the largest scores",
     /*proto_value=*/3, /*sparse=*/true, /*retrieves=*/false, /*verified=*/false,
     KvIndex::kLshTables, CodeSource::kSimHash, TwoPercent,
     [](const EstimatorParams&, int64_t budget) -> std::unique_ptr<const Estimator> {
       return std::make_unique<TopKEstimator>(budget);
     }},
    {EstimatorKind::kOracle, "oracle",
     "oracle sampling: `budget` keys drawn from the true attention distribution", /*proto_value=*/4,
     /*sparse=*/true, /*retrieves=*/false, /*verified=*/false, KvIndex::kLshTables,
     CodeSource::kSimHash, TwoPercent,
     [](const EstimatorParams& p, int64_t budget) -> std::unique_ptr<const Estimator> {
       return std::make_unique<OracleEstimator>(budget, p.lsh_seed);
     }},
    {EstimatorKind::kVAttention, "vattention",
     "vAttention: the top --va-heavy keys exactly, the rest from a uniform sample sized per head "
     "and step for the (--va-epsilon, --va-delta) bound",
     /*proto_value=*/5, /*sparse=*/true, /*retrieves=*/false, /*verified=*/true,
     KvIndex::kLshTables, CodeSource::kSimHash, /*default_budget=*/nullptr,
     [](const EstimatorParams& p, int64_t) -> std::unique_ptr<const Estimator> {
       return std::make_unique<VAttentionEstimator>(p.vattention, p.lsh_seed);
     }},
    {EstimatorKind::kVAttentionLsh, "vattention-lsh",
     "vAttention with its heavy hitters found in the MagicPIG tables: reads candidates and "
     "samples, not every key",
     /*proto_value=*/6, /*sparse=*/true, /*retrieves=*/true, /*verified=*/true, KvIndex::kLshTables,
     CodeSource::kSimHash,
     /*default_budget=*/nullptr,
     [](const EstimatorParams& p, int64_t) -> std::unique_ptr<const Estimator> {
       return std::make_unique<VAttentionLshEstimator>(p.lsh_k, p.lsh_l, p.vattention, p.lsh_seed);
     }},
    {EstimatorKind::kSpotlight, "spotlight",
     "Spotlight: exact attention over the --spotlight-fraction of keys nearest the query in the "
     "Hamming distance of trained hash codes (--spotlight-file), or over the best of "
     "--spotlight-rerank times as many by exact score",
     /*proto_value=*/7, /*sparse=*/true, /*retrieves=*/false, /*verified=*/false, KvIndex::kCodes,
     CodeSource::kLearned,
     /*default_budget=*/nullptr,
     [](const EstimatorParams& p, int64_t) -> std::unique_ptr<const Estimator> {
       return std::make_unique<SpotlightEstimator>(p.spotlight_fraction, p.spotlight_rerank);
     }},
    {EstimatorKind::kVAttentionSpotlight, "vattention-spotlight",
     "vAttention with its heavy hitters found by spotlight's learned codes (the "
     "--spotlight-fraction nearest keys, exact) and the rest sampled for the (--va-epsilon, "
     "--va-delta) bound",
     /*proto_value=*/8, /*sparse=*/true, /*retrieves=*/false, /*verified=*/true, KvIndex::kCodes,
     CodeSource::kLearned,
     /*default_budget=*/nullptr,
     [](const EstimatorParams& p, int64_t) -> std::unique_ptr<const Estimator> {
       return std::make_unique<VAttentionLshEstimator>(VAttentionLshEstimator::WithLearnedCodes(
           p.spotlight_fraction, p.vattention, p.lsh_seed));
     }},
    {EstimatorKind::kSketch, "sketch",
     "low-rank key sketch (Loki): exact attention over the --spotlight-fraction of keys whose "
     "--sketch-dims int8 principal coordinates score highest against the query's, or over the "
     "best of --spotlight-rerank times as many by exact score",
     /*proto_value=*/9, /*sparse=*/true, /*retrieves=*/false, /*verified=*/false, KvIndex::kCodes,
     CodeSource::kKeySketch, /*default_budget=*/nullptr,
     [](const EstimatorParams& p, int64_t) -> std::unique_ptr<const Estimator> {
       return std::make_unique<SpotlightEstimator>(p.spotlight_fraction, p.spotlight_rerank,
                                                   ActiveSimdLevel(), CodeScore::kSketch);
     }},
    {EstimatorKind::kVAttentionSketch, "vattention-sketch",
     "vAttention with its heavy hitters found by the key sketch (the --spotlight-fraction of keys "
     "scoring highest through --sketch-dims int8 principal coordinates, exact) and the rest "
     "sampled for the (--va-epsilon, --va-delta) bound",
     /*proto_value=*/10, /*sparse=*/true, /*retrieves=*/false, /*verified=*/true, KvIndex::kCodes,
     CodeSource::kKeySketch, /*default_budget=*/nullptr,
     [](const EstimatorParams& p, int64_t) -> std::unique_ptr<const Estimator> {
       return std::make_unique<VAttentionLshEstimator>(VAttentionLshEstimator::WithLearnedCodes(
           p.spotlight_fraction, p.vattention, p.lsh_seed, ActiveSimdLevel(), CodeScore::kSketch));
     }},
}};

}  // namespace

absl::Span<const EstimatorSpec> AllEstimators() { return kEstimators; }

const EstimatorSpec& SpecOf(EstimatorKind kind) {
  for (const EstimatorSpec& s : kEstimators) {
    if (s.kind == kind) return s;
  }
  return kEstimators[0];  // unreachable: every kind has an entry (estimator_registry_test)
}

std::string_view EstimatorName(EstimatorKind kind) { return SpecOf(kind).name; }

std::string EstimatorNames() {
  return absl::StrJoin(kEstimators, ", ",
                       [](std::string* out, const EstimatorSpec& s) { out->append(s.name); });
}

absl::StatusOr<EstimatorKind> ParseEstimator(std::string_view name) {
  for (const EstimatorSpec& s : kEstimators) {
    if (s.name == name) return s.kind;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown attention mode '", std::string(name),
                                                 "' (expected one of: ", EstimatorNames(), ")"));
}

absl::StatusOr<EstimatorKind> EstimatorFromProtoValue(int value) {
  if (value == 0) return EstimatorKind::kMagicPig;  // ESTIMATOR_UNSPECIFIED
  for (const EstimatorSpec& s : kEstimators) {
    if (s.proto_value == value) return s.kind;
  }
  return absl::InvalidArgumentError(absl::StrCat("shape.estimator: unknown value ", value));
}

int64_t EstimatorBudget(EstimatorKind kind, const EstimatorParams& params, int64_t offloaded_keys) {
  const EstimatorSpec& s = SpecOf(kind);
  if (s.default_budget == nullptr) return 0;
  return params.budget > 0 ? params.budget : s.default_budget(offloaded_keys);
}

absl::StatusOr<std::unique_ptr<const Estimator>> MakeEstimator(EstimatorKind kind,
                                                               const EstimatorParams& params,
                                                               int64_t offloaded_keys) {
  if (absl::Status st = ValidateEstimatorParams(params, ""); !st.ok()) return st;
  return SpecOf(kind).make(params, EstimatorBudget(kind, params, offloaded_keys));
}

}  // namespace magicpig::attention
