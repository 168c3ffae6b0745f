#include "common/attention/estimators.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <limits>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/attention/group_kernel_runner.h"
#include "common/attention/inclusion_probability.h"
#include "common/attention/kernels/group_attention_kernel.h"
#include "common/status_macros.h"
#include "tbb/parallel_invoke.h"

namespace magicpig::attention {

// See EstimatorScratch::split.
struct MagicPigSplit {
  GroupSelection selection;
  EstimatorScratch halves[2];
  std::vector<PartialAttention> second;  // [g] the second half's partials
};

namespace {

// out[h].n_touched = the rows whose mask has bit h.
void CountTouched(const std::vector<uint32_t>& masks, int g, PartialAttention* out) {
  for (int h = 0; h < g; ++h) out[h].n_touched = 0;
  for (uint32_t m : masks) {
    for (; m != 0; m &= m - 1) ++out[__builtin_ctz(m)].n_touched;
  }
}

using internal::CheckCommon;
using internal::CheckGroup;
using internal::GroupKernel;
using internal::GroupLogits;
using internal::KernelTakes;
using internal::RunGroupKernel;
using internal::SelectGroupKernel;
using internal::SoftmaxOver;

// scratch->logits[i] = scale * q . k_i in float64 for every key (the reference Attend paths).
void ReferenceLogits(const KvShard& shard, const float* q, float scale,
                     Estimator::Scratch* scratch) {
  const int64_t n = shard.size();
  scratch->logits.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    scratch->logits[static_cast<size_t>(i)] = static_cast<double>(scale) * shard.KeyDot(i, q);
  }
}

// AttendGroup of an estimator that must see every key's logit (top-k, oracle sampling): the
// kernel's logits of each head copied into scratch->logits, then out[h] = from_logits().
// from_logits(q of the head) -> PartialAttention.
template <typename FromLogitsFn>
absl::Status AttendGroupFromLogits(SimdLevel level, const KvShard& shard, const float* q, int g,
                                   float scale, Estimator::Scratch* scratch, PartialAttention* out,
                                   const char* who, FromLogitsFn from_logits) {
  MAGICPIG_RETURN_IF_ERROR(CheckGroup(shard, q, g, scratch, out, who));
  const int64_t n = shard.size();
  for (int h0 = 0; h0 < g; h0 += internal::kMaxGroup) {
    const int gc = std::min(g - h0, internal::kMaxGroup);
    GroupLogits(level, shard, q + h0 * shard.dim(), gc, scale, scratch);
    for (int h = 0; h < gc; ++h) {
      const float* x = scratch->scores.data() + static_cast<size_t>(h) * n;
      scratch->logits.assign(x, x + n);
      out[h0 + h] = from_logits(q + (h0 + h) * shard.dim());
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Estimator::AttendGroup(const KvShard& shard, const float* q, const uint16_t* q_codes,
                                    int g, float scale, Scratch* scratch,
                                    PartialAttention* out) const {
  if (g < 1 || out == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("AttendGroup needs g >= 1 heads and non-null out, got g = ", g));
  }
  if (q == nullptr && shard.size() > 0) {
    return absl::InvalidArgumentError("AttendGroup: q must be non-null");
  }
  for (int h = 0; h < g; ++h) {
    MAGICPIG_ASSIGN_OR_RETURN(
        out[h], Attend(shard, q == nullptr ? nullptr : q + h * shard.dim(),
                       q_codes == nullptr ? nullptr : q_codes + h * shard.l(), scale, scratch));
  }
  return absl::OkStatus();
}

absl::Status Estimator::SelectGroup(const KvShard& /*shard*/, const uint16_t* /*q_codes*/,
                                    int /*g*/, Scratch* /*scratch*/,
                                    GroupSelection* /*selection*/) const {
  return absl::UnimplementedError("this estimator has no two-phase form (two_phase() is false)");
}

void Estimator::AttendPart(const KvShard& /*shard*/, const float* /*q*/, int /*g*/, float /*scale*/,
                           const GroupSelection& /*selection*/, int /*part*/, Scratch* /*scratch*/,
                           PartialAttention* /*out*/) const {}

void FinishGroup(const GroupSelection& selection, int g, PartialAttention* out,
                 PartialAttention* const* others) {
  if (selection.parts == 2) {  // parts is 1 or 2 (GroupSelection): no buffer to allocate
    for (int h = 0; h < g; ++h) {
      const PartialAttention parts[2] = {std::move(out[h]), std::move(others[0][h])};
      out[h] = MergePartials(parts);
    }
  }
  CountTouched(selection.masks, g, out);
}

absl::Status FullEstimator::AttendGroup(const KvShard& shard, const float* q,
                                        const uint16_t* /*q_codes*/, int g, float scale,
                                        Scratch* scratch, PartialAttention* out) const {
  MAGICPIG_RETURN_IF_ERROR(CheckGroup(shard, q, g, scratch, out, "FullEstimator"));
  const GroupKernel kernel = SelectGroupKernel(simd_level());
  for (int h0 = 0; h0 < g; h0 += internal::kMaxGroup) {
    const int gc = std::min(g - h0, internal::kMaxGroup);
    RunGroupKernel(kernel, shard, q + h0 * shard.dim(), gc, scale, nullptr, shard.size(), nullptr,
                   nullptr, scratch, out + h0);
    for (int h = 0; h < gc; ++h) out[h0 + h].n_touched = shard.size();
  }
  return absl::OkStatus();
}

MagicPigEstimator::MagicPigEstimator(int k, int l, MagicPigOptions options, SimdLevel simd_level)
    : Estimator(simd_level),
      k_(k),
      l_(l),
      options_(options),
      lnu_table_(k >= kLshK.min && k <= kLshK.max && l >= kLshL.min && l <= kLshL.max
                     ? LogInclusionTable(k, l)
                     : std::vector<float>()) {}

absl::Status MagicPigEstimator::SelectGroup(const KvShard& shard, const uint16_t* q_codes, int g,
                                            Scratch* scratch, GroupSelection* selection) const {
  if (g < 1 || g > kMaxSelectionHeads || scratch == nullptr || selection == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("MagicPigEstimator::SelectGroup needs 1 <= g <= ", kMaxSelectionHeads,
                     " heads, a scratch and a selection; got g = ", g));
  }
  MAGICPIG_RETURN_IF_ERROR(internal::CheckTables(shard, k_, l_, q_codes, "MagicPigEstimator"));
  const auto start = scratch->time_phases ? std::chrono::steady_clock::now()
                                          : std::chrono::steady_clock::time_point{};
  // The union of the heads' sample sets, sorted, with a bit per head (docs/architecture.md §6.3).
  MAGICPIG_RETURN_IF_ERROR(shard.RetrieveGroup(q_codes, g, &scratch->lsh, &selection->rows,
                                               &selection->masks, simd_level()));
  const int64_t n_rows = static_cast<int64_t>(selection->rows.size());
  selection->parts = n_rows >= kSplitRows ? 2 : 1;
  if (scratch->time_phases) {
    scratch->retrieve_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const LshTables::LookupReads reads = shard.tables().CountLookupReads(q_codes, g);
    scratch->bucket_lines += reads.lines;
    scratch->bucket_runs += reads.runs;
    scratch->union_rows += n_rows;
    scratch->pending_bytes += shard.pending() * shard.l() * int64_t{sizeof(uint16_t)};
  }
  return absl::OkStatus();
}

void MagicPigEstimator::AttendPart(const KvShard& shard, const float* q, int g, float scale,
                                   const GroupSelection& selection, int part, Scratch* scratch,
                                   PartialAttention* out) const {
  const auto start = scratch->time_phases ? std::chrono::steady_clock::now()
                                          : std::chrono::steady_clock::time_point{};
  const int64_t n_rows = static_cast<int64_t>(selection.rows.size());
  const int64_t begin = n_rows * part / selection.parts;
  const int64_t end = n_rows * (part + 1) / selection.parts;
  const float* lnu = options_.force_unit_inclusion ? nullptr : lnu_table_.data();
  RunGroupKernel(SelectGroupKernel(simd_level()), shard, q, g, scale, selection.rows.data() + begin,
                 end - begin, selection.masks.data() + begin, lnu, scratch, out);
  if (scratch->time_phases) {
    scratch->kernel_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
}

absl::Status MagicPigEstimator::AttendGroup(const KvShard& shard, const float* q,
                                            const uint16_t* q_codes, int g, float scale,
                                            Scratch* scratch, PartialAttention* out) const {
  MAGICPIG_RETURN_IF_ERROR(CheckGroup(shard, q, g, scratch, out, "MagicPigEstimator"));
  MAGICPIG_RETURN_IF_ERROR(internal::CheckTables(shard, k_, l_, q_codes, "MagicPigEstimator"));
  for (int h0 = 0; h0 < g; h0 += kMaxSelectionHeads) {
    const int gc = std::min(g - h0, kMaxSelectionHeads);
    const float* qh = q + h0 * shard.dim();
    // Everything the parts use lives in `split`, moved out of the scratch for the call: while this
    // thread waits for the other part it may run another work item with the same scratch.
    std::shared_ptr<MagicPigSplit> split = std::move(scratch->split);
    if (split == nullptr) split = std::make_shared<MagicPigSplit>();
    GroupSelection& sel = split->selection;
    MAGICPIG_RETURN_IF_ERROR(SelectGroup(shard, q_codes + h0 * l_, gc, scratch, &sel));
    if (sel.parts == 2) {
      // Two halves on two tasks: when a layer has fewer work items than twice the threads, a
      // thread done with its items takes the other half instead of waiting.
      split->second.resize(static_cast<size_t>(gc));
      for (EstimatorScratch& half : split->halves) half.time_phases = scratch->time_phases;
      tbb::parallel_invoke(
          [&] { AttendPart(shard, qh, gc, scale, sel, 0, &split->halves[0], out + h0); },
          [&] {
            AttendPart(shard, qh, gc, scale, sel, 1, &split->halves[1], split->second.data());
          });
      // The halves' phase times belong to this call's scratch.
      for (EstimatorScratch& half : split->halves) {
        scratch->kernel_seconds += half.kernel_seconds;
        half.kernel_seconds = 0;
      }
    } else {
      // One part: this thread runs it without waiting, so the scratch's buffers are safe.
      AttendPart(shard, qh, gc, scale, sel, 0, scratch, out + h0);
    }
    PartialAttention* second = split->second.data();
    FinishGroup(sel, gc, out + h0, &second);
    scratch->split = std::move(split);
  }
  return absl::OkStatus();
}

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
  MAGICPIG_RETURN_IF_ERROR(internal::CheckTables(shard, k_, l_, q_codes, "MagicPigEstimator"));
  MAGICPIG_RETURN_IF_ERROR(shard.Retrieve(q_codes, &scratch->lsh, &scratch->sample, simd_level()));
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
      logit -= LogInclusionWeight(u);
    }
    scratch->logits[j] = logit;
  }
  return SoftmaxOver(shard, scratch);
}

absl::StatusOr<PartialAttention> ExactLogitsEstimator::Attend(const KvShard& shard, const float* q,
                                                              const uint16_t* /*q_codes*/,
                                                              float scale, Scratch* scratch) const {
  MAGICPIG_RETURN_IF_ERROR(CheckCommon(shard, q, scratch, name_));
  if (AnswerIsEmpty(shard)) return EmptyPartial(shard.dim());
  ReferenceLogits(shard, q, scale, scratch);
  return FromLogits(shard, q, scratch);
}

absl::Status ExactLogitsEstimator::AttendGroup(const KvShard& shard, const float* q,
                                               const uint16_t* q_codes, int g, float scale,
                                               Scratch* scratch, PartialAttention* out) const {
  // An empty answer goes per head too: Attend returns it before computing any logit.
  if (!KernelTakes(shard) || AnswerIsEmpty(shard)) {
    return Estimator::AttendGroup(shard, q, q_codes, g, scale, scratch, out);
  }
  return AttendGroupFromLogits(simd_level(), shard, q, g, scale, scratch, out, name_,
                               [&](const float* qh) { return FromLogits(shard, qh, scratch); });
}

PartialAttention TopKEstimator::FromLogits(const KvShard& shard, const float* /*q*/,
                                           Scratch* scratch) const {
  const int64_t n = shard.size();
  const int64_t keep = std::clamp<int64_t>(budget(), 0, n);
  // Rank all keys by logit (descending, ties by lower index), keep the first `keep`.
  scratch->sample.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) scratch->sample[static_cast<size_t>(i)] = static_cast<int32_t>(i);
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

PartialAttention OracleEstimator::FromLogits(const KvShard& shard, const float* /*q*/,
                                             Scratch* scratch) const {
  const int64_t n = shard.size();
  const int64_t d = shard.dim();
  // Max and log-sum-exp of the exact logits over all n keys.
  std::vector<double>& cdf = scratch->logits;
  double mx = -std::numeric_limits<double>::infinity();
  for (double x : cdf) mx = std::max(mx, x);
  // Unnormalised CDF of p_i ∝ exp(x_i - mx); keys whose weight underflows to 0 are never drawn.
  double z = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    z += std::exp(cdf[static_cast<size_t>(i)] - mx);
    cdf[static_cast<size_t>(i)] = z;
  }
  std::mt19937_64 rng(seed_);
  scratch->sample.resize(static_cast<size_t>(budget()));
  for (int64_t j = 0; j < budget(); ++j) {
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;  // [0, 1)
    const double target = u * z;
    auto it = std::upper_bound(cdf.begin(), cdf.end(), target);
    int64_t i = it - cdf.begin();
    if (i >= n) i = n - 1;  // guard against rounding at the top end
    scratch->sample[static_cast<size_t>(j)] = static_cast<int32_t>(i);
  }
  std::sort(scratch->sample.begin(), scratch->sample.end());
  scratch->acc.assign(static_cast<size_t>(d), 0.0);
  const double inv_b = 1.0 / static_cast<double>(budget());
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

}  // namespace magicpig::attention
