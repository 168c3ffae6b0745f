#include "eval/accuracy_eval.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/attention/estimators.h"
#include "common/attention/inclusion_probability.h"
#include "common/attention/partial_attention.h"
#include "common/attention/vattention.h"
#include "common/status_macros.h"

namespace magicpig::accuracy {

using ::magicpig::attention::EmptyPartial;
using ::magicpig::attention::Estimator;
using ::magicpig::attention::EstimatorScratch;
using ::magicpig::attention::FullEstimator;
using ::magicpig::attention::InclusionProbability;
using ::magicpig::attention::KvShard;
using ::magicpig::attention::LogInclusionWeight;
using ::magicpig::attention::MagicPigEstimator;
using ::magicpig::attention::MergePartials;
using ::magicpig::attention::OracleEstimator;
using ::magicpig::attention::PartialAttention;
using ::magicpig::attention::SimHash;
using ::magicpig::attention::TopKEstimator;
using ::magicpig::attention::VAttentionEstimator;
using ::magicpig::attention::VAttentionLshEstimator;
using ::magicpig::attention::VAttentionParams;
namespace {

double RelL2(const std::vector<float>& est, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t t = 0; t < ref.size(); ++t) {
    const double e = t < est.size() ? est[t] : 0.0;  // an empty part has o = 0
    num += (e - ref[t]) * (e - ref[t]);
    den += static_cast<double>(ref[t]) * ref[t];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// One independent draw of MagicPIG's sample: key i is taken with probability u[i] and weighted
// with logit[i] - LogInclusionWeight(u[i]), as MagicPigEstimator weighs the keys the tables return.
PartialAttention IndependentDraw(const KvShard& shard, const std::vector<double>& logit,
                                 const std::vector<double>& u, std::mt19937_64* rng) {
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<int64_t> taken;
  std::vector<double> w;
  for (size_t i = 0; i < u.size(); ++i) {
    if (uniform(*rng) < u[i]) {
      taken.push_back(static_cast<int64_t>(i));
      w.push_back(logit[i] - LogInclusionWeight(u[i]));
    }
  }
  PartialAttention out = EmptyPartial(shard.dim());
  out.n_touched = static_cast<int64_t>(taken.size());
  if (taken.empty()) return out;
  const double mx = *std::max_element(w.begin(), w.end());
  std::vector<double> acc(static_cast<size_t>(shard.dim()), 0.0);
  double z = 0;
  for (size_t j = 0; j < taken.size(); ++j) {
    const double e = std::exp(w[j] - mx);
    z += e;
    shard.AccumulateValue(taken[j], e, acc.data());
  }
  for (size_t t = 0; t < acc.size(); ++t) out.o[t] = static_cast<float>(acc[t] / z);
  out.lse = static_cast<float>(mx + std::log(z));
  return out;
}

PartialAttention Merge2(const PartialAttention& a, const PartialAttention& b) {
  const PartialAttention parts[2] = {a, b};
  return MergePartials(parts);
}

}  // namespace

ErrorSummary Summarize(const std::vector<QueryErrors>& errors) {
  ErrorSummary s;
  s.queries = static_cast<int64_t>(errors.size());
  if (errors.empty()) return s;
  for (const QueryErrors& e : errors) {
    s.magicpig += e.magicpig;
    s.oracle += e.oracle;
    s.topk += e.topk;
    s.off_magicpig += e.off_magicpig;
    s.off_oracle += e.off_oracle;
    s.off_topk += e.off_topk;
    s.independent += e.independent;
    s.off_independent += e.off_independent;
    s.topk_mass += e.topk_mass;
    s.off_mass += e.off_mass;
    s.sampled_frac += static_cast<double>(e.sampled) / static_cast<double>(e.n_off);
  }
  const double k = 1.0 / static_cast<double>(errors.size());
  for (double* f : {&s.magicpig, &s.oracle, &s.topk, &s.independent, &s.off_magicpig, &s.off_oracle,
                    &s.off_topk, &s.off_independent, &s.topk_mass, &s.off_mass, &s.sampled_frac}) {
    *f *= k;
  }
  return s;
}

std::string FormatSummary(const ErrorSummary& s) {
  return absl::StrFormat(
      "|S|/n %.4f  merged mp %.4f or %.4f tk %.4f (mp/or %.2f)  offloaded mp %.4f or %.4f tk "
      "%.4f (mp/or %.2f)  top-|S| mass %.3f  offloaded mass %.3f  independent u-draws merged "
      "%.4f (ind/or %.2f) offloaded %.4f  [%d queries]",
      s.sampled_frac, s.magicpig, s.oracle, s.topk, s.magicpig / s.oracle, s.off_magicpig,
      s.off_oracle, s.off_topk, s.off_magicpig / s.off_oracle, s.topk_mass, s.off_mass,
      s.independent, s.independent / s.oracle, s.off_independent, s.queries);
}

absl::StatusOr<HeadEvaluator> HeadEvaluator::Create(std::vector<float> keys,
                                                    std::vector<float> values, int64_t n,
                                                    const SimHash& hash, int64_t n_sink,
                                                    int64_t n_local) {
  const int64_t d = hash.dim();
  if (n_sink < 0 || n_local < 0 || n <= n_sink + n_local) {
    return absl::InvalidArgumentError(
        absl::StrCat("no offloaded region: n = ", n, ", sinks ", n_sink, ", local ", n_local));
  }
  if (static_cast<int64_t>(keys.size()) != n * d || static_cast<int64_t>(values.size()) != n * d) {
    return absl::InvalidArgumentError("keys and values must be [n][d]");
  }
  const int64_t n_off = n - n_sink - n_local;
  // c = mean post-RoPE key of the offloaded region [n_sink, n - n_local) (docs/architecture.md
  // §4.2), in float64.
  std::vector<double> acc(static_cast<size_t>(d), 0.0);
  for (int64_t i = n_sink; i < n - n_local; ++i) {
    for (int64_t t = 0; t < d; ++t) acc[t] += keys[i * d + t];
  }
  std::vector<float> center(static_cast<size_t>(d));
  for (int64_t t = 0; t < d; ++t) center[t] = static_cast<float>(acc[t] / n_off);
  MAGICPIG_ASSIGN_OR_RETURN(SimHash tiny, SimHash::Create(d, 1, 1, /*seed=*/1));
  MAGICPIG_ASSIGN_OR_RETURN(KvShard off,
                            KvShard::Create(hash, keys.data() + n_sink * d, center.data(),
                                            values.data() + n_sink * d, n_off));
  return HeadEvaluator(std::move(keys), std::move(values), n, d, &hash, std::move(tiny), n_sink,
                       n_local, std::move(center), std::move(off));
}

absl::Status HeadEvaluator::CheckVisible(int64_t visible) const {
  if (visible < n_ - n_local_ || visible > n_) {
    return absl::InvalidArgumentError(
        absl::StrCat("visible = ", visible, " outside [", n_ - n_local_, ", ", n_, "]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<PartialAttention, PartialAttention>> HeadEvaluator::StaticAndReference(
    const float* q, int64_t visible, float scale) const {
  EstimatorScratch scratch;
  const FullEstimator full;
  // Static part: sinks [0, n_sink) and the visible part of the local window, centred with c.
  std::vector<float> sk, sv;
  auto take = [&](int64_t begin, int64_t end) {
    sk.insert(sk.end(), keys_.begin() + begin * d_, keys_.begin() + end * d_);
    sv.insert(sv.end(), values_.begin() + begin * d_, values_.begin() + end * d_);
  };
  take(0, n_sink_);
  take(n_ - n_local_, visible);
  const int64_t n_static = static_cast<int64_t>(sk.size()) / d_;
  MAGICPIG_ASSIGN_OR_RETURN(KvShard static_shard,
                            KvShard::Create(tiny_, sk.data(), center_.data(), sv.data(), n_static));
  MAGICPIG_ASSIGN_OR_RETURN(PartialAttention stat,
                            full.Attend(static_shard, q, nullptr, scale, &scratch));
  // Reference: exact attention over every visible key, uncentred (softmax is shift-invariant).
  MAGICPIG_ASSIGN_OR_RETURN(KvShard all,
                            KvShard::Create(tiny_, keys_.data(), nullptr, values_.data(), visible));
  MAGICPIG_ASSIGN_OR_RETURN(PartialAttention ref, full.Attend(all, q, nullptr, scale, &scratch));
  return std::pair{std::move(stat), std::move(ref)};
}

absl::StatusOr<std::pair<VerifiedErrors, VerifiedErrors>> HeadEvaluator::EvaluateVerified(
    const float* q, int64_t visible, float scale, const VAttentionParams& params,
    uint64_t seed) const {
  MAGICPIG_RETURN_IF_ERROR(CheckVisible(visible));
  EstimatorScratch scratch;
  std::vector<uint16_t> codes(static_cast<size_t>(hash_->l()));
  MAGICPIG_RETURN_IF_ERROR(hash_->Codes(q, 1, d_, codes.data()));
  MAGICPIG_ASSIGN_OR_RETURN(auto static_ref, StaticAndReference(q, visible, scale));
  MAGICPIG_ASSIGN_OR_RETURN(PartialAttention exact_off,
                            FullEstimator().Attend(offloaded_, q, nullptr, scale, &scratch));
  const VAttentionEstimator va(params, seed);
  const VAttentionLshEstimator lsh(hash_->k(), hash_->l(), params, seed);
  std::pair<VerifiedErrors, VerifiedErrors> out;
  for (auto [est, e] : {std::pair<const Estimator*, VerifiedErrors*>{&va, &out.first},
                        std::pair<const Estimator*, VerifiedErrors*>{&lsh, &out.second}}) {
    MAGICPIG_ASSIGN_OR_RETURN(PartialAttention part,
                              est->Attend(offloaded_, q, codes.data(), scale, &scratch));
    e->err = RelL2(Merge2(part, static_ref.first).o, static_ref.second.o);
    e->off_den_err = std::fabs(
        std::exp(static_cast<double>(part.lse) - static_cast<double>(exact_off.lse)) - 1.0);
    e->touched = part.n_touched;
  }
  return out;
}

absl::StatusOr<QueryErrors> HeadEvaluator::Evaluate(const float* q, int64_t visible, float scale,
                                                    uint64_t oracle_seed) const {
  MAGICPIG_RETURN_IF_ERROR(CheckVisible(visible));
  EstimatorScratch scratch;
  std::vector<uint16_t> codes(static_cast<size_t>(hash_->l()));
  MAGICPIG_RETURN_IF_ERROR(hash_->Codes(q, 1, d_, codes.data()));

  const MagicPigEstimator magicpig(hash_->k(), hash_->l());
  MAGICPIG_ASSIGN_OR_RETURN(PartialAttention mp,
                            magicpig.Attend(offloaded_, q, codes.data(), scale, &scratch));
  const int64_t budget = mp.n_touched;
  MAGICPIG_ASSIGN_OR_RETURN(
      PartialAttention oracle,
      OracleEstimator(budget, oracle_seed).Attend(offloaded_, q, nullptr, scale, &scratch));
  MAGICPIG_ASSIGN_OR_RETURN(PartialAttention topk,
                            TopKEstimator(budget).Attend(offloaded_, q, nullptr, scale, &scratch));
  const FullEstimator full;
  MAGICPIG_ASSIGN_OR_RETURN(PartialAttention full_off,
                            full.Attend(offloaded_, q, nullptr, scale, &scratch));

  MAGICPIG_ASSIGN_OR_RETURN(auto static_ref, StaticAndReference(q, visible, scale));
  const PartialAttention& stat = static_ref.first;
  const PartialAttention& ref = static_ref.second;

  QueryErrors e;
  e.n_off = offloaded_.size();
  e.sampled = budget;
  e.oracle_distinct = oracle.n_touched;
  e.magicpig = RelL2(Merge2(mp, stat).o, ref.o);
  e.oracle = RelL2(Merge2(oracle, stat).o, ref.o);
  e.topk = RelL2(Merge2(topk, stat).o, ref.o);
  e.off_magicpig = RelL2(mp.o, full_off.o);
  e.off_oracle = RelL2(oracle.o, full_off.o);
  e.off_topk = RelL2(topk.o, full_off.o);
  e.off_mass = std::exp(static_cast<double>(full_off.lse) - Merge2(full_off, stat).lse);

  // Exact logits and inclusion probabilities of the offloaded keys, for the independent draws
  // and the top-|S| mass below.
  double q_norm = 0;
  for (int64_t t = 0; t < d_; ++t) q_norm += static_cast<double>(q[t]) * q[t];
  q_norm = std::sqrt(q_norm);
  std::vector<double> logits(static_cast<size_t>(e.n_off)), u(logits.size());
  for (int64_t i = 0; i < e.n_off; ++i) {
    const double dot = offloaded_.KeyDot(i, q);
    const double denom = q_norm * offloaded_.KeyNorm(i);
    logits[i] = scale * dot;
    u[i] = InclusionProbability(denom > 0 ? std::clamp(dot / denom, -1.0, 1.0) : 0.0, hash_->k(),
                                hash_->l());
  }

  // MagicPIG's weights on independent draws with the exact u (see the header).
  std::mt19937_64 rng(oracle_seed ^ 0x9e3779b97f4a7c15ull);
  for (int draw = 0; draw < kIndependentDraws; ++draw) {
    const PartialAttention ind = IndependentDraw(offloaded_, logits, u, &rng);
    e.independent += RelL2(Merge2(ind, stat).o, ref.o) / kIndependentDraws;
    e.off_independent += RelL2(ind.o, full_off.o) / kIndependentDraws;
  }

  // Mass held by the top-|S| offloaded keys (the logits sorted in place: last use).
  std::sort(logits.begin(), logits.end(), std::greater<>());
  const double mx = logits.empty() ? 0.0 : logits[0];
  double top = 0, all_mass = 0;
  for (int64_t i = 0; i < e.n_off; ++i) {
    const double w = std::exp(logits[i] - mx);
    all_mass += w;
    if (i < budget) top += w;
  }
  e.topk_mass = all_mass > 0 ? top / all_mass : 0.0;
  return e;
}

}  // namespace magicpig::accuracy
