#include "common/attention/vattention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/attention/group_kernel_runner.h"
#include "common/attention/partial_attention.h"
#include "common/attention/spotlight_estimator.h"
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
  // m distinct residual keys drawn uniformly (every m-subset equally likely), sorted; all of them
  // when m >= n_s. Floyd's algorithm (m draws) with a bitmap of the ranks taken; `bits` is
  // caller scratch, left all zero.
  void Sample(int64_t m, std::mt19937_64& rng, std::vector<uint64_t>* bits,
              std::vector<int32_t>* out) const {
    out->clear();
    if (m >= n_s_) {
      out->reserve(static_cast<size_t>(n_s_));
      Walker walk(gaps_);
      for (int64_t r = 0; r < n_s_; ++r) out->push_back(walk.Key(r));
      return;
    }
    const size_t words = static_cast<size_t>((n_s_ + 63) / 64);
    if (bits->size() < words) bits->resize(words, 0);
    uint64_t* b = bits->data();
    auto taken = [b](int64_t r) { return (b[r >> 6] >> (r & 63)) & 1; };
    for (int64_t j = n_s_ - m; j < n_s_; ++j) {
      const int64_t t = UniformBelow(rng, j + 1);
      const int64_t r = taken(t) ? j : t;
      b[r >> 6] |= uint64_t{1} << (r & 63);
    }
    // Collect in rank order, which is key order (the rank-to-key map is increasing), clearing as
    // we go.
    out->reserve(static_cast<size_t>(m));
    Walker walk(gaps_);
    for (size_t w = 0; w < words; ++w) {
      for (uint64_t x = b[w]; x != 0; x &= x - 1) {
        out->push_back(walk.Key(static_cast<int64_t>(w * 64) + __builtin_ctzll(x)));
      }
      b[w] = 0;
    }
  }

 private:
  // Key(r) for non-decreasing r: the count of gaps <= r only grows, so one forward walk over the
  // gaps serves a whole sorted sample (Key's binary search per rank was ~15% of a vattention-lsh
  // step at 64K keys).
  class Walker {
   public:
    explicit Walker(const std::vector<int64_t>& gaps) : gaps_(gaps) {}
    int32_t Key(int64_t r) {
      while (at_ < gaps_.size() && gaps_[at_] <= r) ++at_;
      return static_cast<int32_t>(r + static_cast<int64_t>(at_));
    }

   private:
    const std::vector<int64_t>& gaps_;
    size_t at_ = 0;
  };

  int64_t n_s_;
  std::vector<int64_t> gaps_;
};

// The top h of x[0 .. n) (ties to the lower index), sorted by index. A threshold t from a strided
// sample of 1024 values (about 2h + 8 keys' worth of them above it) keeps the candidates x >= t in
// one pass; if at least h pass, the h-th largest value is >= t, so every member of the top h is
// among them and a selection over the candidates alone is exact. Otherwise (or for small n) the
// selection runs over all n.
template <typename T>
void TopH(const T* x, int64_t n, int64_t h, std::vector<int32_t>* out) {
  out->clear();
  h = std::min(h, n);
  if (h <= 0) return;
  std::vector<int32_t> cand;
  constexpr int64_t kSample = 1024;
  if (n >= 4 * kSample && 4 * h < n) {
    std::vector<T> sample(kSample);
    for (int64_t i = 0; i < kSample; ++i) sample[static_cast<size_t>(i)] = x[i * n / kSample];
    const int64_t rank = std::min<int64_t>(kSample - 1, (2 * h * kSample) / n + 8);
    std::nth_element(sample.begin(), sample.begin() + rank, sample.end(), std::greater<T>());
    const T t = sample[static_cast<size_t>(rank)];
    for (int64_t j = 0; j < n; ++j) {
      if (x[j] >= t) cand.push_back(static_cast<int32_t>(j));
    }
  }
  if (static_cast<int64_t>(cand.size()) < h) {
    cand.resize(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) cand[static_cast<size_t>(j)] = static_cast<int32_t>(j);
  }
  auto better = [x](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
  std::nth_element(cand.begin(), cand.begin() + (h - 1), cand.end(), better);
  out->assign(cand.begin(), cand.begin() + h);
  std::sort(out->begin(), out->end());
}

// The base sample's size for n_s residual keys: max(2, floor(rate * n_s)), at most n_s.
int64_t BaseSize(int64_t n_s, const VAttentionParams& p) {
  return std::min<int64_t>(
      n_s, std::max<int64_t>(2, static_cast<int64_t>(std::floor(p.base_rate * n_s))));
}

// Step 2 from sums of weights exp(logit - m) (any common m): heavy_sum over the deterministic set,
// base_sum and base_sq (of the squares) over the base sample of nb keys out of n_s.
int64_t SizeFromSums(double heavy_sum, double base_sum, double base_sq, int64_t nb, int64_t n_s,
                     const VAttentionParams& p, double z) {
  const double k = static_cast<double>(nb);
  const double mean = base_sum / k;
  const double sigma =
      k >= 2 ? std::sqrt(std::max(0.0, (base_sq - k * mean * mean) / (k - 1))) : 0.0;
  return VAttentionSampleSize(z, sigma, n_s, p.epsilon, heavy_sum + static_cast<double>(n_s) * mean,
                              nb);
}

// Steps 1 and 2 of vattention.h, then the draw of step 3, for the sorted deterministic set
// `heavy` and the logit(i) of any key: the base sample and the sample in *base and *sample, and
// the sample's weight n_s / b returned (0 when the residual is empty).
template <typename LogitFn>
double DrawSamples(const KvShard& shard, const float* q, const std::vector<int32_t>& heavy,
                   LogitFn logit, const VAttentionParams& p, double z, uint64_t seed,
                   std::vector<uint64_t>* bits, std::vector<int32_t>* base,
                   std::vector<int32_t>* sample) {
  base->clear();
  sample->clear();
  const Residual residual(heavy, shard.size());
  const int64_t n_s = residual.size();
  if (n_s == 0) return 0.0;
  std::mt19937_64 rng(DrawSeed(seed, q, shard.dim(), shard.size()));
  const int64_t nb = BaseSize(n_s, p);
  residual.Sample(nb, rng, bits, base);
  std::vector<double> xh(heavy.size()), x0(base->size());
  double m = -std::numeric_limits<double>::infinity();
  for (size_t j = 0; j < heavy.size(); ++j) m = std::max(m, xh[j] = logit(heavy[j]));
  for (size_t j = 0; j < base->size(); ++j) m = std::max(m, x0[j] = logit((*base)[j]));
  double heavy_sum = 0.0, base_sum = 0.0, base_sq = 0.0;
  for (double x : xh) heavy_sum += std::exp(x - m);
  for (double x : x0) {
    const double w = std::exp(x - m);
    base_sum += w;
    base_sq += w * w;
  }
  const int64_t b = SizeFromSums(heavy_sum, base_sum, base_sq, nb, n_s, p, z);
  residual.Sample(b, rng, bits, sample);
  return static_cast<double>(n_s) / static_cast<double>(b);
}

// Step 3 in float64 (the reference paths): exact over heavy, n_s / b-weighted over sample.
template <typename LogitFn>
PartialAttention Accumulate(const KvShard& shard, const std::vector<int32_t>& heavy,
                            const std::vector<int32_t>& sample, double weight, LogitFn logit,
                            std::vector<double>* acc) {
  const int64_t d = shard.dim();
  PartialAttention part = EmptyPartial(d);
  if (heavy.empty() && sample.empty()) return part;
  std::vector<double> xh(heavy.size()), xs(sample.size());
  double m = -std::numeric_limits<double>::infinity();
  for (size_t j = 0; j < heavy.size(); ++j) m = std::max(m, xh[j] = logit(heavy[j]));
  for (size_t j = 0; j < sample.size(); ++j) m = std::max(m, xs[j] = logit(sample[j]));
  acc->assign(static_cast<size_t>(d), 0.0);
  double den = 0.0;
  for (size_t j = 0; j < heavy.size(); ++j) {
    const double w = std::exp(xh[j] - m);
    den += w;
    shard.AccumulateValue(heavy[j], w, acc->data());
  }
  for (size_t j = 0; j < sample.size(); ++j) {
    const double w = weight * std::exp(xs[j] - m);
    den += w;
    shard.AccumulateValue(sample[j], w, acc->data());
  }
  for (int64_t t = 0; t < d; ++t) {
    part.o[static_cast<size_t>(t)] = static_cast<float>((*acc)[static_cast<size_t>(t)] / den);
  }
  part.lse = static_cast<float>(m + std::log(den));
  return part;
}

// Steps 1-3 in float64 for the sorted deterministic set `heavy` (the reference paths): the part,
// with the base sample and the sample left in *base and *sample and n_touched unset.
template <typename LogitFn>
PartialAttention ReferenceHybrid(const KvShard& shard, const float* q,
                                 const std::vector<int32_t>& heavy, LogitFn logit,
                                 const VAttentionParams& p, double z, uint64_t seed,
                                 Estimator::Scratch* scratch, std::vector<int32_t>* base,
                                 std::vector<int32_t>* sample) {
  const double weight =
      DrawSamples(shard, q, heavy, logit, p, z, seed, &scratch->bits, base, sample);
  return Accumulate(shard, heavy, *sample, weight, logit, &scratch->acc);
}

// The size of the union of three sorted lists of distinct keys, by a three-way merge (no copy or
// sort: this count ran on every head and step).
int64_t DistinctUnion(const std::vector<int32_t>& a, const std::vector<int32_t>& b,
                      const std::vector<int32_t>& c) {
  constexpr int32_t kEnd = std::numeric_limits<int32_t>::max();
  size_t i = 0, j = 0, k = 0;
  int64_t count = 0;
  while (true) {
    const int32_t x = i < a.size() ? a[i] : kEnd;
    const int32_t y = j < b.size() ? b[j] : kEnd;
    const int32_t z = k < c.size() ? c[k] : kEnd;
    const int32_t next = std::min(x, std::min(y, z));
    if (next == kEnd) return count;
    ++count;
    i += x == next;
    j += y == next;
    k += z == next;
  }
}

// The exact part merged with the sampled part weighted by `weight` (its lse shifted by ln weight).
PartialAttention MergeWeighted(PartialAttention exact, PartialAttention sampled, double weight) {
  if (weight > 0 && !sampled.empty()) {
    sampled.lse = static_cast<float>(sampled.lse + std::log(weight));
  }
  PartialAttention parts[2] = {std::move(exact), std::move(sampled)};
  return MergePartials(parts);
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
    : Estimator(simd_level),
      params_(params),
      seed_(seed),
      z_(NormalQuantile(1.0 - params.delta / 2)) {}

absl::StatusOr<PartialAttention> VAttentionEstimator::Attend(const KvShard& shard, const float* q,
                                                             const uint16_t* /*q_codes*/,
                                                             float scale, Scratch* scratch) const {
  MAGICPIG_RETURN_IF_ERROR(internal::CheckCommon(shard, q, scratch, "VAttentionEstimator"));
  const int64_t n = shard.size();
  if (n == 0) return EmptyPartial(shard.dim());
  std::vector<double>& x = scratch->logits;
  x.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    x[static_cast<size_t>(i)] = static_cast<double>(scale) * shard.KeyDot(i, q);
  auto logit = [&x](int32_t i) { return x[static_cast<size_t>(i)]; };
  std::vector<int32_t> heavy, base, sample;
  TopH(x.data(), n, HeavyHitterCount(params_.heavy, n), &heavy);
  PartialAttention part =
      ReferenceHybrid(shard, q, heavy, logit, params_, z_, seed_, scratch, &base, &sample);
  part.n_touched = static_cast<int64_t>(heavy.size() + sample.size());
  return part;
}

absl::Status VAttentionEstimator::AttendGroup(const KvShard& shard, const float* q,
                                              const uint16_t* q_codes, int g, float scale,
                                              Scratch* scratch, PartialAttention* out) const {
  if (!internal::KernelTakes(shard) || shard.size() == 0) {
    return Estimator::AttendGroup(shard, q, q_codes, g, scale, scratch, out);
  }
  MAGICPIG_RETURN_IF_ERROR(internal::CheckGroup(shard, q, g, scratch, out, "VAttentionEstimator"));
  const internal::GroupKernel kernel = internal::SelectGroupKernel(simd_level());
  const int64_t n = shard.size(), d = shard.dim();
  const int64_t h_count = HeavyHitterCount(params_.heavy, n);
  for (int h0 = 0; h0 < g; h0 += internal::kMaxGroup) {
    const int gc = std::min(g - h0, internal::kMaxGroup);
    const float* qg = q + h0 * d;
    internal::GroupLogits(simd_level(), shard, qg, gc, scale, scratch);
    std::vector<std::vector<int32_t>> heavy(static_cast<size_t>(gc)), sample(heavy.size());
    std::vector<double> weight(heavy.size(), 0.0);
    std::vector<int32_t> base;
    for (int h = 0; h < gc; ++h) {
      const size_t hs = static_cast<size_t>(h);
      const float* x = scratch->scores.data() + hs * static_cast<size_t>(n);
      auto logit = [x](int32_t i) { return static_cast<double>(x[i]); };
      TopH(x, n, h_count, &heavy[hs]);
      weight[hs] = DrawSamples(shard, qg + h * d, heavy[hs], logit, params_, z_, seed_,
                               &scratch->bits, &base, &sample[hs]);
    }
    std::vector<PartialAttention> exact(heavy.size()), sampled(heavy.size());
    internal::RunOnLists(kernel, shard, qg, gc, scale, heavy, scratch, exact.data());
    internal::RunOnLists(kernel, shard, qg, gc, scale, sample, scratch, sampled.data());
    for (int h = 0; h < gc; ++h) {
      const size_t hs = static_cast<size_t>(h);
      out[h0 + h] = MergeWeighted(std::move(exact[hs]), std::move(sampled[hs]), weight[hs]);
      out[h0 + h].n_touched = static_cast<int64_t>(heavy[hs].size() + sample[hs].size());
    }
  }
  return absl::OkStatus();
}

VAttentionLshEstimator::VAttentionLshEstimator(int k, int l, const VAttentionParams& params,
                                               uint64_t seed, SimdLevel simd_level)
    : Estimator(simd_level),
      k_(k),
      l_(l),
      params_(params),
      seed_(seed),
      z_(NormalQuantile(1.0 - params.delta / 2)) {}

VAttentionLshEstimator VAttentionLshEstimator::WithLearnedCodes(double spotlight_fraction,
                                                                const VAttentionParams& params,
                                                                uint64_t seed,
                                                                SimdLevel simd_level) {
  VAttentionLshEstimator e(/*k=*/16, /*l=*/2, params, seed, simd_level);
  e.spotlight_fraction_ = spotlight_fraction;
  return e;
}

absl::Status VAttentionLshEstimator::CheckSource(const KvShard& shard,
                                                 const uint16_t* q_codes) const {
  if (spotlight_fraction_ > 0) {
    return CheckLearnedCodes(shard, q_codes, "VAttentionLshEstimator (learned codes)");
  }
  return internal::CheckTables(shard, k_, l_, q_codes, "VAttentionLshEstimator");
}

absl::Status VAttentionLshEstimator::Candidates(const KvShard& shard, const uint16_t* q_codes,
                                                Scratch* scratch, std::vector<int32_t>* out) const {
  if (spotlight_fraction_ > 0) {
    NearestByCode(shard, q_codes, spotlight_fraction_, simd_level(), scratch, out);
    return absl::OkStatus();
  }
  MAGICPIG_RETURN_IF_ERROR(shard.Retrieve(q_codes, &scratch->lsh, out));
  std::sort(out->begin(), out->end());  // retrieval order is not index order
  return absl::OkStatus();
}

absl::Status VAttentionLshEstimator::GroupCandidates(const KvShard& shard, const uint16_t* q_codes,
                                                     int gc, Scratch* scratch,
                                                     std::vector<std::vector<int32_t>>* out) const {
  out->assign(static_cast<size_t>(gc), {});
  if (spotlight_fraction_ > 0) {
    for (int h = 0; h < gc; ++h) {
      NearestByCode(shard, q_codes + static_cast<int64_t>(h) * shard.l(), spotlight_fraction_,
                    simd_level(), scratch, &(*out)[static_cast<size_t>(h)]);
    }
    return absl::OkStatus();
  }
  // The group's candidates, retrieved together (a bit per head).
  MAGICPIG_RETURN_IF_ERROR(
      shard.RetrieveGroup(q_codes, gc, &scratch->lsh, &scratch->rows, &scratch->row_masks));
  for (size_t j = 0; j < scratch->rows.size(); ++j) {
    for (uint32_t m = scratch->row_masks[j]; m != 0; m &= m - 1) {
      (*out)[static_cast<size_t>(__builtin_ctz(m))].push_back(scratch->rows[j]);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PartialAttention> VAttentionLshEstimator::Attend(const KvShard& shard,
                                                                const float* q,
                                                                const uint16_t* q_codes,
                                                                float scale,
                                                                Scratch* scratch) const {
  MAGICPIG_RETURN_IF_ERROR(internal::CheckCommon(shard, q, scratch, "VAttentionLshEstimator"));
  MAGICPIG_RETURN_IF_ERROR(CheckSource(shard, q_codes));
  const int64_t n = shard.size();
  if (n == 0) return EmptyPartial(shard.dim());
  // Every candidate is deterministic: its key is read to score it anyway, and one left to the
  // uniform sample would only add variance (and make the residual heavy-tailed, where a base
  // sample underestimates the spread: docs/vattention.md).
  std::vector<int32_t> heavy, base, sample;
  MAGICPIG_RETURN_IF_ERROR(Candidates(shard, q_codes, scratch, &heavy));
  auto logit = [&](int32_t i) { return static_cast<double>(scale) * shard.KeyDot(i, q); };
  PartialAttention part =
      ReferenceHybrid(shard, q, heavy, logit, params_, z_, seed_, scratch, &base, &sample);
  part.n_touched = DistinctUnion(heavy, base, sample);
  return part;
}

absl::Status VAttentionLshEstimator::AttendGroup(const KvShard& shard, const float* q,
                                                 const uint16_t* q_codes, int g, float scale,
                                                 Scratch* scratch, PartialAttention* out) const {
  if (!internal::KernelTakes(shard) || shard.size() == 0) {
    return Estimator::AttendGroup(shard, q, q_codes, g, scale, scratch, out);
  }
  MAGICPIG_RETURN_IF_ERROR(
      internal::CheckGroup(shard, q, g, scratch, out, "VAttentionLshEstimator"));
  MAGICPIG_RETURN_IF_ERROR(CheckSource(shard, q_codes));
  const int64_t code_l = shard.l();
  const internal::GroupKernel kernel = internal::SelectGroupKernel(simd_level());
  const int64_t n = shard.size(), d = shard.dim();
  for (int h0 = 0; h0 < g; h0 += internal::kMaxGroup) {
    const int gc = std::min(g - h0, internal::kMaxGroup);
    const float* qg = q + h0 * d;
    std::vector<std::vector<int32_t>> heavy, base(static_cast<size_t>(gc)), sample(base.size());
    MAGICPIG_RETURN_IF_ERROR(GroupCandidates(shard, q_codes + h0 * code_l, gc, scratch, &heavy));
    // Base samples, per head from the head's own seed (as Attend draws them); their sum and sum
    // of squares of exp(logit) from one keys-only kernel pass, the candidates' sum from their
    // exact part (which is also the result's deterministic half).
    std::vector<std::mt19937_64> rngs;
    std::vector<Residual> residuals;
    for (int h = 0; h < gc; ++h) {
      rngs.emplace_back(DrawSeed(seed_, qg + h * d, d, n));
      residuals.emplace_back(heavy[static_cast<size_t>(h)], n);
      residuals.back().Sample(BaseSize(residuals.back().size(), params_), rngs.back(),
                              &scratch->bits, &base[static_cast<size_t>(h)]);
    }
    std::vector<PartialAttention> exact(heavy.size());
    if (spotlight_fraction_ > 0) {
      internal::RunOnLists(kernel, shard, qg, gc, scale, heavy, scratch, exact.data());
    } else {
      // The retrieval's own rows and head masks are the union of the candidate lists.
      internal::RunGroupKernel(kernel, shard, qg, gc, scale, scratch->rows.data(),
                               static_cast<int64_t>(scratch->rows.size()),
                               scratch->row_masks.data(), nullptr, scratch, exact.data());
    }
    std::vector<int32_t> rows;
    std::vector<uint32_t> masks;
    internal::UnionWithMasks(base, &rows, &masks);
    float lse1[internal::kMaxGroup], lse2[internal::kMaxGroup];
    internal::GroupExpSums(kernel, shard, qg, gc, scale, rows.data(),
                           static_cast<int64_t>(rows.size()), masks.data(), scratch, lse1, lse2);
    std::vector<double> weight(heavy.size(), 0.0);
    for (int h = 0; h < gc; ++h) {
      const size_t hs = static_cast<size_t>(h);
      const int64_t n_s = residuals[hs].size();
      if (n_s == 0) continue;
      const double m = std::max<double>(exact[hs].lse, lse1[hs]);
      const int64_t b = SizeFromSums(std::exp(static_cast<double>(exact[hs].lse) - m),
                                     std::exp(static_cast<double>(lse1[hs]) - m),
                                     std::exp(static_cast<double>(lse2[hs]) - 2 * m),
                                     static_cast<int64_t>(base[hs].size()), n_s, params_, z_);
      residuals[hs].Sample(b, rngs[hs], &scratch->bits, &sample[hs]);
      weight[hs] = static_cast<double>(n_s) / static_cast<double>(b);
    }
    std::vector<PartialAttention> sampled(heavy.size());
    internal::RunOnLists(kernel, shard, qg, gc, scale, sample, scratch, sampled.data());
    for (int h = 0; h < gc; ++h) {
      const size_t hs = static_cast<size_t>(h);
      out[h0 + h] = MergeWeighted(std::move(exact[hs]), std::move(sampled[hs]), weight[hs]);
      out[h0 + h].n_touched = DistinctUnion(heavy[hs], base[hs], sample[hs]);
    }
  }
  return absl::OkStatus();
}

}  // namespace magicpig::attention
