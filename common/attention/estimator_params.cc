#include "common/attention/estimator_params.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace magicpig::attention {

absl::Status ParamSpec::Check(int64_t v, std::string_view field) const {
  if (v >= min && v <= max) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(field), " must be in [", min, ", ", max, "], got ", v));
}

absl::Status ValidateEstimatorParams(const EstimatorParams& params, std::string_view prefix) {
  for (const auto& [spec, value] :
       {std::pair{&kLshK, int64_t{params.lsh_k}}, std::pair{&kLshL, int64_t{params.lsh_l}},
        std::pair{&kBudget, params.budget}}) {
    if (absl::Status s =
            spec->Check(value, absl::StrCat(std::string(prefix), std::string(spec->name)));
        !s.ok())
      return s;
  }
  return absl::OkStatus();
}

}  // namespace magicpig::attention
