#include "attn_node/core/estimators.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "attn_node/core/inclusion_probability.h"
#include "common/status_macros.h"

namespace magicpig {
namespace {

absl::Status CheckCommon(const KvShard& shard, const float* q, const Estimator::Scratch* scratch,
                         const char* who) {
  if (scratch == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": scratch must be non-null"));
  }
  if (q == nullptr && shard.size() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": q must be non-null"));
  }
  return absl::OkStatus();
}

// Softmax-weighted value sum over scratch->sample with logits scratch->logits (same length).
PartialAttention SoftmaxOver(const KvShard& shard, Estimator::Scratch* scratch) {
  const int64_t d = shard.dim();
  const size_t m = scratch->sample.size();
  PartialAttention out = EmptyPartial(d);
  out.n_touched = static_cast<int64_t>(m);
  if (m == 0) return out;
  double mx = -std::numeric_limits<double>::infinity();
  for (double x : scratch->logits) mx = std::max(mx, x);
  scratch->acc.assign(static_cast<size_t>(d), 0.0);
  double z = 0.0;
  for (size_t j = 0; j < m; ++j) {
    const double w = std::exp(scratch->logits[j] - mx);
    z += w;
    shard.AccumulateValue(scratch->sample[j], w, scratch->acc.data());
  }
  for (int64_t t = 0; t < d; ++t)
    out.o[static_cast<size_t>(t)] = static_cast<float>(scratch->acc[t] / z);
  out.lse = static_cast<float>(mx + std::log(z));
  return out;
}

}  // namespace

absl::StatusOr<PartialAttention> FullEstimator::Attend(const KvShard& shard, const float* q,
                                                       const uint16_t* /*q_codes*/, float scale,
                                                       Scratch* scratch) const {
  MAGICPIG_RETURN_IF_ERROR(CheckCommon(shard, q, scratch, "FullEstimator"));
  const int64_t n = shard.size();
  scratch->sample.resize(static_cast<size_t>(n));
  scratch->logits.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    scratch->sample[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    scratch->logits[static_cast<size_t>(i)] = static_cast<double>(scale) * shard.KeyDot(i, q);
  }
  return SoftmaxOver(shard, scratch);
}

absl::StatusOr<PartialAttention> MagicPigEstimator::Attend(const KvShard& shard, const float* q,
                                                           const uint16_t* q_codes, float scale,
                                                           Scratch* scratch) const {
  MAGICPIG_RETURN_IF_ERROR(CheckCommon(shard, q, scratch, "MagicPigEstimator"));
  if (shard.k() != k_ || shard.l() != l_) {
    return absl::InvalidArgumentError(absl::StrCat("MagicPigEstimator: estimator (K, L) = (", k_,
                                                   ", ", l_, ") but the shard's tables have (",
                                                   shard.k(), ", ", shard.l(), ")"));
  }
  if (q_codes == nullptr) {
    return absl::InvalidArgumentError("MagicPigEstimator: q_codes must be non-null");
  }
  MAGICPIG_RETURN_IF_ERROR(shard.tables().Retrieve(q_codes, &scratch->lsh, &scratch->sample));
  const size_t m = scratch->sample.size();
  scratch->logits.resize(m);
  double q_norm = 0.0;
  for (int64_t t = 0; t < shard.dim(); ++t) q_norm += static_cast<double>(q[t]) * q[t];
  q_norm = std::sqrt(q_norm);
  for (size_t j = 0; j < m; ++j) {
    const int32_t i = scratch->sample[j];
    const double s = shard.KeyDot(i, q);
    double logit = static_cast<double>(scale) * s;
    if (!options_.force_unit_inclusion) {
      const double denom = q_norm * static_cast<double>(shard.KeyNorm(i));
      double cos = denom > 0.0 ? s / denom : 0.0;
      cos = std::clamp(cos, -1.0, 1.0);
      const double u = InclusionProbability(cos, k_, l_);
      logit -= std::log(u + 1e-4);
    }
    scratch->logits[j] = logit;
  }
  return SoftmaxOver(shard, scratch);
}

absl::StatusOr<PartialAttention> TopKEstimator::Attend(const KvShard& shard, const float* q,
                                                       const uint16_t* /*q_codes*/, float scale,
                                                       Scratch* scratch) const {
  MAGICPIG_RETURN_IF_ERROR(CheckCommon(shard, q, scratch, "TopKEstimator"));
  const int64_t n = shard.size();
  const int64_t keep = std::clamp<int64_t>(budget_, 0, n);
  // Rank all keys by score (descending, ties by lower index), keep the first `keep`.
  scratch->logits.resize(static_cast<size_t>(n));
  scratch->sample.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    scratch->sample[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    scratch->logits[static_cast<size_t>(i)] = static_cast<double>(scale) * shard.KeyDot(i, q);
  }
  const std::vector<double>& score = scratch->logits;
  auto better = [&score](int32_t a, int32_t b) {
    const double sa = score[static_cast<size_t>(a)];
    const double sb = score[static_cast<size_t>(b)];
    return sa > sb || (sa == sb && a < b);
  };
  if (keep < n) {
    std::nth_element(scratch->sample.begin(), scratch->sample.begin() + keep, scratch->sample.end(),
                     better);
  }
  scratch->sample.resize(static_cast<size_t>(keep));
  std::sort(scratch->sample.begin(), scratch->sample.end());  // deterministic sum order
  std::vector<double> kept(static_cast<size_t>(keep));
  for (int64_t j = 0; j < keep; ++j) {
    kept[static_cast<size_t>(j)] =
        score[static_cast<size_t>(scratch->sample[static_cast<size_t>(j)])];
  }
  scratch->logits = std::move(kept);
  return SoftmaxOver(shard, scratch);
}

absl::StatusOr<PartialAttention> OracleEstimator::Attend(const KvShard& shard, const float* q,
                                                         const uint16_t* /*q_codes*/, float scale,
                                                         Scratch* scratch) const {
  MAGICPIG_RETURN_IF_ERROR(CheckCommon(shard, q, scratch, "OracleEstimator"));
  const int64_t n = shard.size();
  const int64_t d = shard.dim();
  if (n == 0 || budget_ <= 0) return EmptyPartial(d);
  // Exact logits, max and log-sum-exp over all n keys.
  std::vector<double>& cdf = scratch->logits;
  cdf.resize(static_cast<size_t>(n));
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(scale) * shard.KeyDot(i, q);
    cdf[static_cast<size_t>(i)] = x;
    mx = std::max(mx, x);
  }
  // Unnormalised CDF of p_i ∝ exp(x_i - mx); keys whose weight underflows to 0 are never drawn.
  double z = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    z += std::exp(cdf[static_cast<size_t>(i)] - mx);
    cdf[static_cast<size_t>(i)] = z;
  }
  std::mt19937_64 rng(seed_);
  scratch->sample.resize(static_cast<size_t>(budget_));
  for (int64_t j = 0; j < budget_; ++j) {
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;  // [0, 1)
    const double target = u * z;
    auto it = std::upper_bound(cdf.begin(), cdf.end(), target);
    int64_t i = it - cdf.begin();
    if (i >= n) i = n - 1;  // guard against rounding at the top end
    scratch->sample[static_cast<size_t>(j)] = static_cast<int32_t>(i);
  }
  std::sort(scratch->sample.begin(), scratch->sample.end());
  scratch->acc.assign(static_cast<size_t>(d), 0.0);
  const double inv_b = 1.0 / static_cast<double>(budget_);
  int64_t distinct = 0;
  for (size_t j = 0; j < scratch->sample.size();) {
    size_t e = j;
    while (e < scratch->sample.size() && scratch->sample[e] == scratch->sample[j]) ++e;
    shard.AccumulateValue(scratch->sample[j], static_cast<double>(e - j) * inv_b,
                          scratch->acc.data());
    ++distinct;
    j = e;
  }
  PartialAttention out = EmptyPartial(d);
  for (int64_t t = 0; t < d; ++t)
    out.o[static_cast<size_t>(t)] = static_cast<float>(scratch->acc[static_cast<size_t>(t)]);
  out.lse = static_cast<float>(mx + std::log(z));
  out.n_touched = distinct;
  return out;
}

}  // namespace magicpig
