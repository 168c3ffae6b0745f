#include "common/attention/estimator_params.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace magicpig::attention {

template <typename T>
absl::Status ParamSpecOf<T>::Check(T v, std::string_view field) const {
  if (v >= min && v <= max) return absl::OkStatus();  // false for NaN
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(field), " must be in [", min, ", ", max, "], got ", v));
}
template struct ParamSpecOf<int64_t>;
template struct ParamSpecOf<double>;

absl::Status ValidateVAttentionParams(const VAttentionParams& params, std::string_view prefix) {
  const std::string p(prefix);
  for (const auto& [spec, value] :
       {std::pair{&kVaEpsilon, params.epsilon}, std::pair{&kVaDelta, params.delta},
        std::pair{&kVaBaseRate, params.base_rate}}) {
    if (absl::Status s = spec->Check(value, absl::StrCat(p, std::string(spec->name))); !s.ok())
      return s;
  }
  return kVaHeavy.Check(params.heavy, absl::StrCat(p, std::string(kVaHeavy.name)));
}

absl::Status ValidateEstimatorParams(const EstimatorParams& params, std::string_view prefix) {
  for (const auto& [spec, value] :
       {std::pair{&kLshK, int64_t{params.lsh_k}}, std::pair{&kLshL, int64_t{params.lsh_l}},
        std::pair{&kBudget, params.budget}, std::pair{&kSpotRerank, params.spotlight_rerank}}) {
    if (absl::Status s =
            spec->Check(value, absl::StrCat(std::string(prefix), std::string(spec->name)));
        !s.ok())
      return s;
  }
  if (absl::Status s =
          kSpotFraction.Check(params.spotlight_fraction,
                              absl::StrCat(std::string(prefix), std::string(kSpotFraction.name)));
      !s.ok())
    return s;
  return ValidateVAttentionParams(params.vattention, prefix);
}

absl::Status CheckSketchDims(int64_t dims, std::string_view field) {
  MAGICPIG_RETURN_IF_ERROR(kSketchDims.Check(dims, field));
  if (dims % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(field), " must be even, got ", dims));
  }
  return absl::OkStatus();
}

}  // namespace magicpig::attention
