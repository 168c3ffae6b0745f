#include "tests/accuracy/accuracy_eval.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "attn_node/core/estimators.h"
#include "attn_node/core/partial_attention.h"
#include "common/status_macros.h"

namespace magicpig::accuracy {
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
    s.topk_mass += e.topk_mass;
    s.off_mass += e.off_mass;
    s.sampled_frac += static_cast<double>(e.sampled) / static_cast<double>(e.n_off);
  }
  const double k = 1.0 / static_cast<double>(errors.size());
  for (double* f : {&s.magicpig, &s.oracle, &s.topk, &s.off_magicpig, &s.off_oracle, &s.off_topk,
                    &s.topk_mass, &s.off_mass, &s.sampled_frac}) {
    *f *= k;
  }
  return s;
}

std::string FormatSummary(const ErrorSummary& s) {
  return absl::StrFormat(
      "|S|/n %.4f  merged mp %.4f or %.4f tk %.4f (mp/or %.2f)  offloaded mp %.4f or %.4f tk "
      "%.4f (mp/or %.2f)  top-|S| mass %.3f  offloaded mass %.3f  [%d queries]",
      s.sampled_frac, s.magicpig, s.oracle, s.topk, s.magicpig / s.oracle, s.off_magicpig,
      s.off_oracle, s.off_topk, s.off_magicpig / s.off_oracle, s.topk_mass, s.off_mass, s.queries);
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
  // c = mean post-RoPE key of the offloaded region [n_sink, n - n_local) (spec §4), in float64.
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

absl::StatusOr<QueryErrors> HeadEvaluator::Evaluate(const float* q, int64_t visible, float scale,
                                                    uint64_t oracle_seed) const {
  if (visible < n_ - n_local_ || visible > n_) {
    return absl::InvalidArgumentError(
        absl::StrCat("visible = ", visible, " outside [", n_ - n_local_, ", ", n_, "]"));
  }
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

  // Mass held by the top-|S| offloaded keys.
  std::vector<double> logits(static_cast<size_t>(e.n_off));
  for (int64_t i = 0; i < e.n_off; ++i) logits[i] = scale * offloaded_.KeyDot(i, q);
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
