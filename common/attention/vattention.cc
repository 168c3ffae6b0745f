#include "common/attention/vattention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/attention/group_kernel_runner.h"
#include "common/attention/partial_attention.h"
#include "common/status_macros.h"

namespace magicpig::attention {
namespace {

uint64_t Mix64(uint64_t x) {  // SplitMix64's finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The draw seed of one (query, shard): the estimator's seed, the query's bits and the shard size.
uint64_t DrawSeed(uint64_t seed, const float* q, int64_t d, int64_t n) {
  uint64_t h = Mix64(seed ^ Mix64(static_cast<uint64_t>(n)));
  for (int64_t t = 0; t < d; ++t) {
    uint32_t bits;
    std::memcpy(&bits, q + t, 4);
    h = Mix64(h ^ bits);
  }
  return h;
}

// Uniform in [0, n) for n >= 1 (Lemire's multiply-shift; the bias for n < 2^32 is below 2^-32).
int64_t UniformBelow(std::mt19937_64& rng, int64_t n) {
  return static_cast<int64_t>((static_cast<unsigned __int128>(rng()) * static_cast<uint64_t>(n)) >>
                              64);
}

// The residual of a shard without the sorted heavy set: rank r in [0, n_s) is the r-th key not in
// heavy. With g_i = heavy[i] - i (non-decreasing), key = r + #{i : g_i <= r}.
class Residual {
 public:
  Residual(const std::vector<int32_t>& heavy, int64_t n)
      : n_s_(n - static_cast<int64_t>(heavy.size())) {
    gaps_.reserve(heavy.size());
    for (size_t i = 0; i < heavy.size(); ++i) gaps_.push_back(heavy[i] - static_cast<int64_t>(i));
  }
  int64_t size() const { return n_s_; }
  int32_t Key(int64_t r) const {
    return static_cast<int32_t>(r +
                                (std::upper_bound(gaps_.begin(), gaps_.end(), r) - gaps_.begin()));
  }
  // m distinct residual keys drawn uniformly (every m-subset equally likely), sorted; all of them
  // when m >= n_s. Floyd's algorithm: O(m) draws.
  void Sample(int64_t m, std::mt19937_64& rng, absl::flat_hash_set<int64_t>* seen,
              std::vector<int32_t>* out) const {
    out->clear();
    if (m >= n_s_) {
      for (int64_t r = 0; r < n_s_; ++r) out->push_back(Key(r));
      return;
    }
    seen->clear();
    for (int64_t j = n_s_ - m; j < n_s_; ++j) {
      const int64_t t = UniformBelow(rng, j + 1);
      seen->insert(seen->contains(t) ? j : t);
    }
    for (int64_t r : *seen) out->push_back(Key(r));
    std::sort(out->begin(), out->end());
  }

 private:
  int64_t n_s_;
  std::vector<int64_t> gaps_;
};

// The top `h` of `keys` by logit (ties: lower index), sorted by index; logits parallel to keys.
void TopByLogit(const std::vector<int32_t>& keys, const std::vector<double>& logits, int64_t h,
                std::vector<int32_t>* out) {
  std::vector<int32_t> order(keys.size());
  for (size_t j = 0; j < keys.size(); ++j) order[j] = static_cast<int32_t>(j);
  auto better = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && keys[a] < keys[b]);
  };
  h = std::min<int64_t>(h, static_cast<int64_t>(keys.size()));
  std::nth_element(order.begin(), order.begin() + h, order.end(), better);
  out->clear();
  for (int64_t j = 0; j < h; ++j) out->push_back(keys[order[j]]);
  std::sort(out->begin(), out->end());
}

struct HybridResult {
  PartialAttention part;
  int64_t b = 0;  // residual keys attended
};

// Steps 1-3 of vattention.h for heavy set `heavy` (sorted) and logit(i) for any key. The base and
// final samples are left in scratch->rows and scratch->sample.
template <typename LogitFn>
HybridResult HybridEstimate(const KvShard& shard, const std::vector<int32_t>& heavy, LogitFn logit,
                            const VAttentionParams& p, double z, std::mt19937_64& rng,
                            absl::flat_hash_set<int64_t>* seen, Estimator::Scratch* scratch) {
  const int64_t d = shard.dim();
  const Residual residual(heavy, shard.size());
  const int64_t n_s = residual.size();
  std::vector<double> heavy_logits(heavy.size());
  double m = -std::numeric_limits<double>::infinity();
  for (size_t j = 0; j < heavy.size(); ++j) {
    heavy_logits[j] = logit(heavy[j]);
    m = std::max(m, heavy_logits[j]);
  }
  HybridResult r;
  std::vector<int32_t>& base_sample = scratch->rows;
  std::vector<int32_t>& sample = scratch->sample;
  base_sample.clear();
  sample.clear();
  if (n_s > 0) {
    // 1. The base sample: spread and denominator.
    const int64_t base = std::min<int64_t>(
        n_s, std::max<int64_t>(2, static_cast<int64_t>(std::floor(p.base_rate * n_s))));
    residual.Sample(base, rng, seen, &base_sample);
    std::vector<double> x0(base_sample.size());
    double m0 = m;
    for (size_t j = 0; j < base_sample.size(); ++j) {
      x0[j] = logit(base_sample[j]);
      m0 = std::max(m0, x0[j]);
    }
    double heavy_sum = 0.0, base_sum = 0.0, base_sq = 0.0;
    for (double x : heavy_logits) heavy_sum += std::exp(x - m0);
    for (double x : x0) {
      const double w = std::exp(x - m0);
      base_sum += w;
      base_sq += w * w;
    }
    const double nb = static_cast<double>(base_sample.size());
    const double mean = base_sum / nb;
    const double sigma =
        nb >= 2 ? std::sqrt(std::max(0.0, (base_sq - nb * mean * mean) / (nb - 1))) : 0.0;
    const double d0 = heavy_sum + static_cast<double>(n_s) * mean;
    // 2. The sample size; 3. the fresh sample.
    r.b = VAttentionSampleSize(z, sigma, n_s, p.epsilon, d0, static_cast<int64_t>(nb));
    residual.Sample(r.b, rng, seen, &sample);
  }
  std::vector<double> xs(sample.size());
  for (size_t j = 0; j < sample.size(); ++j) {
    xs[j] = logit(sample[j]);
    m = std::max(m, xs[j]);
  }
  r.part = EmptyPartial(d);
  if (heavy.empty() && sample.empty()) return r;
  scratch->acc.assign(static_cast<size_t>(d), 0.0);
  double den = 0.0;
  for (size_t j = 0; j < heavy.size(); ++j) {
    const double w = std::exp(heavy_logits[j] - m);
    den += w;
    shard.AccumulateValue(heavy[j], w, scratch->acc.data());
  }
  const double scale = r.b > 0 ? static_cast<double>(n_s) / static_cast<double>(r.b) : 0.0;
  for (size_t j = 0; j < sample.size(); ++j) {
    const double w = scale * std::exp(xs[j] - m);
    den += w;
    shard.AccumulateValue(sample[j], w, scratch->acc.data());
  }
  for (int64_t t = 0; t < d; ++t)
    r.part.o[static_cast<size_t>(t)] = static_cast<float>(scratch->acc[t] / den);
  r.part.lse = static_cast<float>(m + std::log(den));
  return r;
}

// Sorted distinct union size of three sorted lists.
int64_t DistinctUnion(const std::vector<int32_t>& a, const std::vector<int32_t>& b,
                      const std::vector<int32_t>& c) {
  std::vector<int32_t> all;
  all.reserve(a.size() + b.size() + c.size());
  all.insert(all.end(), a.begin(), a.end());
  all.insert(all.end(), b.begin(), b.end());
  all.insert(all.end(), c.begin(), c.end());
  std::sort(all.begin(), all.end());
  return std::unique(all.begin(), all.end()) - all.begin();
}

// The sorted union of per-head sorted lists, with bit h of masks[j] set iff rows[j] is in
// lists[h] (at most 32 lists).
void UnionWithMasks(const std::vector<std::vector<int32_t>>& lists, std::vector<int32_t>* rows,
                    std::vector<uint32_t>* masks) {
  std::vector<std::pair<int32_t, uint32_t>> all;
  for (size_t h = 0; h < lists.size(); ++h) {
    for (int32_t r : lists[h]) all.emplace_back(r, uint32_t{1} << h);
  }
  std::sort(all.begin(), all.end());
  rows->clear();
  masks->clear();
  for (const auto& [r, bit] : all) {
    if (!rows->empty() && rows->back() == r) {
      masks->back() |= bit;
    } else {
      rows->push_back(r);
      masks->push_back(bit);
    }
  }
}

}  // namespace

double NormalQuantile(double p) {
  // Bisection on Phi(x) = erfc(-x / sqrt 2) / 2, monotone; 200 halvings of [-40, 40] reach the
  // double resolution. Called once per estimator.
  double lo = -40.0, hi = 40.0;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    if (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return 0.5 * (lo + hi);
}

int64_t HeavyHitterCount(int64_t heavy, int64_t n) {
  if (n <= 0) return 0;
  if (heavy > 0) return std::min(heavy, n);
  return std::max<int64_t>(1, (n + 99) / 100);
}

int64_t VAttentionSampleSize(double z, double sigma, int64_t n_s, double epsilon, double d_hat,
                             int64_t base) {
  if (!(d_hat > 0.0) || !(sigma > 0.0)) return base;  // no spread seen: the base size
  const double root = z * sigma * static_cast<double>(n_s) / (epsilon * d_hat);
  const double b = std::ceil(root * root);
  if (!(b < static_cast<double>(n_s))) return n_s;  // also NaN / inf
  return std::clamp<int64_t>(static_cast<int64_t>(b), base, n_s);
}

VAttentionEstimator::VAttentionEstimator(const VAttentionParams& params, uint64_t seed,
                                         SimdLevel simd_level)
    : ExactLogitsEstimator(/*budget=*/0, simd_level, "VAttentionEstimator"),
      params_(params),
      seed_(seed),
      z_(NormalQuantile(1.0 - params.delta / 2)) {}

PartialAttention VAttentionEstimator::FromLogits(const KvShard& shard, const float* q,
                                                 Scratch* scratch) const {
  const int64_t n = shard.size();
  std::vector<int32_t> all(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) all[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  std::vector<int32_t> heavy;
  const std::vector<double> logits = scratch->logits;  // the scratch vectors are reused below
  TopByLogit(all, logits, HeavyHitterCount(params_.heavy, n), &heavy);
  std::mt19937_64 rng(DrawSeed(seed_, q, shard.dim(), n));
  absl::flat_hash_set<int64_t> seen;
  HybridResult r = HybridEstimate(
      shard, heavy, [&](int32_t i) { return logits[static_cast<size_t>(i)]; }, params_, z_, rng,
      &seen, scratch);
  r.part.n_touched = static_cast<int64_t>(heavy.size()) + r.b;
  return r.part;
}

VAttentionLshEstimator::VAttentionLshEstimator(int k, int l, const VAttentionParams& params,
                                               uint64_t seed, SimdLevel simd_level)
    : Estimator(simd_level),
      k_(k),
      l_(l),
      params_(params),
      seed_(seed),
      z_(NormalQuantile(1.0 - params.delta / 2)) {}

absl::Status VAttentionLshEstimator::CheckShard(const KvShard& shard,
                                                const uint16_t* q_codes) const {
  if (shard.k() != k_ || shard.l() != l_) {
    return absl::InvalidArgumentError(absl::StrCat("VAttentionLshEstimator: estimator (K, L) = (",
                                                   k_, ", ", l_, ") but the shard's tables have (",
                                                   shard.k(), ", ", shard.l(), ")"));
  }
  if (q_codes == nullptr) {
    return absl::InvalidArgumentError("VAttentionLshEstimator: q_codes must be non-null");
  }
  return absl::OkStatus();
}

absl::StatusOr<PartialAttention> VAttentionLshEstimator::Attend(const KvShard& shard,
                                                                const float* q,
                                                                const uint16_t* q_codes,
                                                                float scale,
                                                                Scratch* scratch) const {
  if (scratch == nullptr) {
    return absl::InvalidArgumentError("VAttentionLshEstimator: scratch must be non-null");
  }
  if (q == nullptr && shard.size() > 0) {
    return absl::InvalidArgumentError("VAttentionLshEstimator: q must be non-null");
  }
  MAGICPIG_RETURN_IF_ERROR(CheckShard(shard, q_codes));
  const int64_t n = shard.size();
  if (n == 0) return EmptyPartial(shard.dim());
  std::vector<int32_t> candidates;
  MAGICPIG_RETURN_IF_ERROR(shard.Retrieve(q_codes, &scratch->lsh, &candidates));
  // Every candidate is deterministic: its key is read to score it anyway, and one left to the
  // uniform sample would only add variance (and make the residual heavy-tailed, where a base
  // sample underestimates the spread: docs/vattention.md).
  std::sort(candidates.begin(), candidates.end());  // retrieval order is not index order
  const std::vector<int32_t>& heavy = candidates;
  std::mt19937_64 rng(DrawSeed(seed_, q, shard.dim(), n));
  absl::flat_hash_set<int64_t> seen;
  HybridResult r = HybridEstimate(
      shard, heavy, [&](int32_t i) { return static_cast<double>(scale) * shard.KeyDot(i, q); },
      params_, z_, rng, &seen, scratch);
  r.part.n_touched = DistinctUnion(candidates, scratch->rows, scratch->sample);
  return r.part;
}

absl::Status VAttentionLshEstimator::AttendGroup(const KvShard& shard, const float* q,
                                                 const uint16_t* q_codes, int g, float scale,
                                                 Scratch* scratch, PartialAttention* out) const {
  if (!internal::KernelTakes(shard) || shard.size() == 0) {
    return Estimator::AttendGroup(shard, q, q_codes, g, scale, scratch, out);
  }
  MAGICPIG_RETURN_IF_ERROR(
      internal::CheckGroup(shard, q, g, scratch, out, "VAttentionLshEstimator"));
  MAGICPIG_RETURN_IF_ERROR(CheckShard(shard, q_codes));
  const internal::GroupKernel kernel = internal::SelectGroupKernel(simd_level());
  const int64_t n = shard.size(), d = shard.dim();
  absl::flat_hash_set<int64_t> seen;
  for (int h0 = 0; h0 < g; h0 += internal::kMaxGroup) {
    const int gc = std::min(g - h0, internal::kMaxGroup);
    const float* qg = q + h0 * d;
    // The candidates of every head (their union once, with a bit per head), attended exactly.
    std::vector<int32_t> cand_rows;
    std::vector<uint32_t> cand_masks;
    MAGICPIG_RETURN_IF_ERROR(
        shard.RetrieveGroup(q_codes + h0 * l_, gc, &scratch->lsh, &cand_rows, &cand_masks));
    std::vector<PartialAttention> heavy(static_cast<size_t>(gc));
    internal::RunGroupKernel(kernel, shard, qg, gc, scale, cand_rows.data(),
                             static_cast<int64_t>(cand_rows.size()), cand_masks.data(), nullptr,
                             scratch, heavy.data());
    std::vector<std::vector<int32_t>> cand(static_cast<size_t>(gc)), base(cand.size()),
        sample(cand.size());
    for (size_t j = 0; j < cand_rows.size(); ++j) {
      for (uint32_t m = cand_masks[j]; m != 0; m &= m - 1) {
        cand[static_cast<size_t>(__builtin_ctz(m))].push_back(cand_rows[j]);
      }
    }
    // Base samples, drawn per head from the head's own seed (as Attend draws them).
    std::vector<std::mt19937_64> rngs;
    std::vector<Residual> residuals;
    for (int h = 0; h < gc; ++h) {
      rngs.emplace_back(DrawSeed(seed_, qg + h * d, d, n));
      residuals.emplace_back(cand[static_cast<size_t>(h)], n);
      const int64_t n_s = residuals.back().size();
      const int64_t nb = std::min<int64_t>(
          n_s, std::max<int64_t>(2, static_cast<int64_t>(std::floor(params_.base_rate * n_s))));
      residuals.back().Sample(nb, rngs.back(), &seen, &base[static_cast<size_t>(h)]);
    }
    // Their sums and sums of squares of exp(logit): the kernel's lse at scale and at 2 * scale.
    std::vector<int32_t> rows;
    std::vector<uint32_t> masks;
    UnionWithMasks(base, &rows, &masks);
    std::vector<PartialAttention> sum1(static_cast<size_t>(gc)), sum2(sum1.size());
    internal::RunGroupKernel(kernel, shard, qg, gc, scale, rows.data(),
                             static_cast<int64_t>(rows.size()), masks.data(), nullptr, scratch,
                             sum1.data());
    internal::RunGroupKernel(kernel, shard, qg, gc, 2 * scale, rows.data(),
                             static_cast<int64_t>(rows.size()), masks.data(), nullptr, scratch,
                             sum2.data());
    std::vector<double> weight(static_cast<size_t>(gc), 0.0);
    for (int h = 0; h < gc; ++h) {
      const size_t hs = static_cast<size_t>(h);
      const int64_t n_s = residuals[hs].size();
      if (n_s == 0) continue;
      const double nb = static_cast<double>(base[hs].size());
      const double m = std::max<double>(heavy[hs].lse, sum1[hs].lse);
      const double s1 = std::exp(static_cast<double>(sum1[hs].lse) - m);
      const double s2 = std::exp(static_cast<double>(sum2[hs].lse) - 2 * m);
      const double mean = s1 / nb;
      const double sigma =
          nb >= 2 ? std::sqrt(std::max(0.0, (s2 - nb * mean * mean) / (nb - 1))) : 0.0;
      const double d0 = std::exp(static_cast<double>(heavy[hs].lse) - m) + n_s * mean;
      const int64_t b =
          VAttentionSampleSize(z_, sigma, n_s, params_.epsilon, d0, static_cast<int64_t>(nb));
      residuals[hs].Sample(b, rngs[hs], &seen, &sample[hs]);
      weight[hs] = static_cast<double>(n_s) / static_cast<double>(b);
    }
    UnionWithMasks(sample, &rows, &masks);
    std::vector<PartialAttention> sampled(static_cast<size_t>(gc));
    internal::RunGroupKernel(kernel, shard, qg, gc, scale, rows.data(),
                             static_cast<int64_t>(rows.size()), masks.data(), nullptr, scratch,
                             sampled.data());
    for (int h = 0; h < gc; ++h) {
      const size_t hs = static_cast<size_t>(h);
      PartialAttention parts[2] = {std::move(heavy[hs]), std::move(sampled[hs])};
      if (weight[hs] > 0 && !parts[1].empty()) {
        parts[1].lse = static_cast<float>(parts[1].lse + std::log(weight[hs]));
      }
      out[h0 + h] = MergePartials(parts);
      out[h0 + h].n_touched = DistinctUnion(cand[hs], base[hs], sample[hs]);
    }
  }
  return absl::OkStatus();
}

}  // namespace magicpig::attention
