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

// Uniform samples without replacement of each head's residual (its keys outside its sorted
// deterministic set), coupled across a GQA group's heads: one uniformly random order of the
// shard's keys, drawn lazily (each next key uniform among those not drawn yet), from which head h
// takes the first need[h] keys outside its deterministic set. The residual keys of head h appear
// in that order in uniformly random order, so its sample is a uniform need[h]-subset of its
// residual: the same law as an independent draw per head. But the heads share one sequence, so
// the union the group kernel reads is about the largest sample instead of the sum of them (a
// group of 4 heads drawing independently read up to 4x the rows).
//
// Scratch use: bits (a bitmap of the drawn keys) and the per-key masks key_heads (deterministic
// sets) and sample_heads (who took the key), all zero between calls and left so.
class GroupSampler {
 public:
  GroupSampler(int64_t n, const std::vector<std::vector<int32_t>>& heavy, uint64_t seed,
               EstimatorScratch* scratch)
      : n_(n), heavy_(heavy), rng_(seed), scratch_(scratch) {
    const size_t words = static_cast<size_t>((n + 63) / 64);
    if (scratch->bits.size() < words) scratch->bits.resize(words, 0);
    if (scratch->key_heads.size() < static_cast<size_t>(n)) {
      scratch->key_heads.resize(static_cast<size_t>(n), 0);
      scratch->sample_heads.resize(static_cast<size_t>(n), 0);
    }
    for (size_t h = 0; h < heavy.size(); ++h) {
      for (int32_t i : heavy[h]) scratch->key_heads[static_cast<size_t>(i)] |= uint32_t{1} << h;
    }
  }
  ~GroupSampler() {
    for (const std::vector<int32_t>& list : heavy_) {
      for (int32_t i : list) scratch_->key_heads[static_cast<size_t>(i)] = 0;
    }
  }
  GroupSampler(const GroupSampler&) = delete;
  GroupSampler& operator=(const GroupSampler&) = delete;

  int64_t residual(size_t h) const { return n_ - static_cast<int64_t>(heavy_[h].size()); }

  // need[h] residual keys of each head h (clamped to [0, residual(h)]; all of them at the
  // residual's size, without drawing): their sorted union in *rows, bit h of (*masks)[j] set iff
  // head h took rows[j].
  void Draw(const std::vector<int64_t>& need, std::vector<int32_t>* rows,
            std::vector<uint32_t>* masks) {
    rows->clear();
    masks->clear();
    uint64_t* bits = scratch_->bits.data();
    uint32_t* taken_by = scratch_->sample_heads.data();
    const uint32_t* heavy_of = scratch_->key_heads.data();
    uint32_t all = 0, active = 0;
    int64_t left[kMaxHeads] = {};
    for (size_t h = 0; h < heavy_.size(); ++h) {
      const int64_t want = std::clamp<int64_t>(need[h], 0, residual(h));
      if (want == 0) continue;
      if (want == residual(h)) {
        all |= uint32_t{1} << h;
      } else {
        active |= uint32_t{1} << h;
        left[h] = want;
      }
    }
    auto is_drawn = [bits](int64_t x) { return (bits[x >> 6] >> (x & 63)) & 1; };
    int64_t drawn = 0;
    std::vector<int32_t> rest;  // the undrawn keys, once more than half are drawn
    size_t rest_at = 0;
    while (active != 0) {
      int64_t x;
      if (rest.empty() && 2 * drawn < n_) {
        do {
          x = UniformBelow(rng_, n_);
        } while (is_drawn(x));
      } else {
        // Rejection would slow down: a Fisher-Yates pass over the keys still undrawn.
        if (rest.empty()) {
          for (int64_t i = 0; i < n_; ++i) {
            if (!is_drawn(i)) rest.push_back(static_cast<int32_t>(i));
          }
        }
        const size_t j = rest_at + static_cast<size_t>(UniformBelow(
                                       rng_, static_cast<int64_t>(rest.size() - rest_at)));
        std::swap(rest[rest_at], rest[j]);
        x = rest[rest_at++];
      }
      bits[x >> 6] |= uint64_t{1} << (x & 63);
      ++drawn;
      const uint32_t take = active & ~heavy_of[x];
      if (take == 0) continue;
      taken_by[x] = take;
      for (uint32_t t = take; t != 0; t &= t - 1) {
        const int h = __builtin_ctz(t);
        if (--left[h] == 0) active &= ~(uint32_t{1} << h);
      }
    }
    // Collect in key order, clearing the marks as we go.
    const int64_t words = (n_ + 63) / 64;
    if (all == 0) {
      for (int64_t w = 0; w < words; ++w) {
        for (uint64_t b = bits[w]; b != 0; b &= b - 1) {
          const int64_t x = w * 64 + __builtin_ctzll(b);
          if (taken_by[x] != 0) {
            rows->push_back(static_cast<int32_t>(x));
            masks->push_back(taken_by[x]);
            taken_by[x] = 0;
          }
        }
        bits[w] = 0;
      }
      return;
    }
    for (int64_t x = 0; x < n_; ++x) {
      const uint32_t m = taken_by[x] | (all & ~heavy_of[x]);
      if (m != 0) {
        rows->push_back(static_cast<int32_t>(x));
        masks->push_back(m);
      }
      taken_by[x] = 0;
    }
    std::fill(bits, bits + words, uint64_t{0});
  }

  static constexpr int kMaxHeads = 32;  // masks are uint32

 private:
  int64_t n_;
  const std::vector<std::vector<int32_t>>& heavy_;
  std::mt19937_64 rng_;
  EstimatorScratch* scratch_;
};

// Head h's list out of a union with head masks.
std::vector<int32_t> ListOf(const std::vector<int32_t>& rows, const std::vector<uint32_t>& masks,
                            int h) {
  std::vector<int32_t> out;
  for (size_t j = 0; j < rows.size(); ++j) {
    if ((masks[j] >> h) & 1) out.push_back(rows[j]);
  }
  return out;
}

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

// The seed of a group's draws: the estimator's seed, the group's queries ([g][d], g * d floats)
// and the shard size (a group of one for Attend).
uint64_t GroupSeed(uint64_t seed, const float* q, int g, const KvShard& shard) {
  return DrawSeed(seed, q, g * shard.dim(), shard.size());
}

// Step 3's weight n_s / b of each sampled key (0 when nothing is sampled).
double SampleWeight(int64_t n_s, int64_t b) {
  return b > 0 ? static_cast<double>(n_s) / static_cast<double>(b) : 0.0;
}

// Step 1 for every head: the base sample sizes.
std::vector<int64_t> BaseNeeds(const GroupSampler& sampler, size_t g, const VAttentionParams& p) {
  std::vector<int64_t> need(g, 0);
  for (size_t h = 0; h < g; ++h) need[h] = BaseSize(sampler.residual(h), p);
  return need;
}

// Step 2 for head h from the logit(i) of its deterministic set and base sample (float64 sums of
// the logits given): the sample size, 0 when the residual is empty.
template <typename LogitFn>
int64_t SizeFromLogits(const std::vector<int32_t>& heavy, const std::vector<int32_t>& base,
                       int64_t n_s, LogitFn logit, const VAttentionParams& p, double z) {
  if (n_s == 0) return 0;
  std::vector<double> xh(heavy.size()), x0(base.size());
  double m = -std::numeric_limits<double>::infinity();
  for (size_t j = 0; j < heavy.size(); ++j) m = std::max(m, xh[j] = logit(heavy[j]));
  for (size_t j = 0; j < base.size(); ++j) m = std::max(m, x0[j] = logit(base[j]));
  double heavy_sum = 0.0, base_sum = 0.0, base_sq = 0.0;
  for (double x : xh) heavy_sum += std::exp(x - m);
  for (double x : x0) {
    const double w = std::exp(x - m);
    base_sum += w;
    base_sq += w * w;
  }
  return SizeFromSums(heavy_sum, base_sum, base_sq, static_cast<int64_t>(base.size()), n_s, p, z);
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

// Steps 1-3 in float64 for the gc heads of a group (q [gc][d]) with sorted deterministic sets
// heavy[h] and the logit(h, i) of any key (the reference paths; Attend is a group of one):
// out[0 .. gc) with n_touched unset, each head's base sample and sample in (*base)[h] and
// (*sample)[h].
template <typename LogitFn>
void ReferenceGroup(const KvShard& shard, const float* q, int gc,
                    const std::vector<std::vector<int32_t>>& heavy, LogitFn logit,
                    const VAttentionParams& p, double z, uint64_t seed, Estimator::Scratch* scratch,
                    std::vector<std::vector<int32_t>>* base,
                    std::vector<std::vector<int32_t>>* sample, PartialAttention* out) {
  const size_t g = static_cast<size_t>(gc);
  GroupSampler sampler(shard.size(), heavy, GroupSeed(seed, q, gc, shard), scratch);
  std::vector<int32_t> rows;
  std::vector<uint32_t> masks;
  sampler.Draw(BaseNeeds(sampler, g, p), &rows, &masks);
  base->assign(g, {});
  sample->assign(g, {});
  std::vector<int64_t> need(g, 0);
  for (size_t h = 0; h < g; ++h) {
    (*base)[h] = ListOf(rows, masks, static_cast<int>(h));
    need[h] = SizeFromLogits(
        heavy[h], (*base)[h], sampler.residual(h), [&](int32_t i) { return logit(h, i); }, p, z);
  }
  sampler.Draw(need, &rows, &masks);
  for (size_t h = 0; h < g; ++h) {
    (*sample)[h] = ListOf(rows, masks, static_cast<int>(h));
    out[h] = Accumulate(
        shard, heavy[h], (*sample)[h], SampleWeight(sampler.residual(h), need[h]),
        [&](int32_t i) { return logit(h, i); }, &scratch->acc);
  }
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
                                                             const uint16_t* q_codes, float scale,
                                                             Scratch* scratch) const {
  PartialAttention out;
  MAGICPIG_RETURN_IF_ERROR(AttendGroupReference(shard, q, q_codes, 1, scale, scratch, &out));
  return out;
}

absl::Status VAttentionEstimator::AttendGroupReference(const KvShard& shard, const float* q,
                                                       const uint16_t* /*q_codes*/, int g,
                                                       float scale, Scratch* scratch,
                                                       PartialAttention* out) const {
  MAGICPIG_RETURN_IF_ERROR(internal::CheckCommon(shard, q, scratch, "VAttentionEstimator"));
  if (g < 1 || out == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("VAttentionEstimator: needs g >= 1 heads and non-null out, got g = ", g));
  }
  const int64_t n = shard.size(), d = shard.dim();
  if (n == 0) {
    for (int h = 0; h < g; ++h) out[h] = EmptyPartial(d);
    return absl::OkStatus();
  }
  const int64_t h_count = HeavyHitterCount(params_.heavy, n);
  for (int h0 = 0; h0 < g; h0 += internal::kMaxGroup) {
    const int gc = std::min(g - h0, internal::kMaxGroup);
    const float* qg = q + h0 * d;
    std::vector<std::vector<double>> x(static_cast<size_t>(gc));
    std::vector<std::vector<int32_t>> heavy(x.size()), base, sample;
    for (int h = 0; h < gc; ++h) {
      std::vector<double>& xh = x[static_cast<size_t>(h)];
      xh.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        xh[static_cast<size_t>(i)] = static_cast<double>(scale) * shard.KeyDot(i, qg + h * d);
      }
      TopH(xh.data(), n, h_count, &heavy[static_cast<size_t>(h)]);
    }
    auto logit = [&x](size_t h, int32_t i) { return x[h][static_cast<size_t>(i)]; };
    ReferenceGroup(shard, qg, gc, heavy, logit, params_, z_, seed_, scratch, &base, &sample,
                   out + h0);
    for (int h = 0; h < gc; ++h) {
      const size_t hs = static_cast<size_t>(h);
      out[h0 + h].n_touched = static_cast<int64_t>(heavy[hs].size() + sample[hs].size());
    }
  }
  return absl::OkStatus();
}

absl::Status VAttentionEstimator::AttendGroup(const KvShard& shard, const float* q,
                                              const uint16_t* q_codes, int g, float scale,
                                              Scratch* scratch, PartialAttention* out) const {
  if (!internal::KernelTakes(shard) || shard.size() == 0) {
    return AttendGroupReference(shard, q, q_codes, g, scale, scratch, out);
  }
  MAGICPIG_RETURN_IF_ERROR(internal::CheckGroup(shard, q, g, scratch, out, "VAttentionEstimator"));
  const internal::GroupKernel kernel = internal::SelectGroupKernel(simd_level());
  const int64_t n = shard.size(), d = shard.dim();
  const int64_t h_count = HeavyHitterCount(params_.heavy, n);
  for (int h0 = 0; h0 < g; h0 += internal::kMaxGroup) {
    const int gc = std::min(g - h0, internal::kMaxGroup);
    const size_t gs = static_cast<size_t>(gc);
    const float* qg = q + h0 * d;
    internal::GroupLogits(simd_level(), shard, qg, gc, scale, scratch);
    auto scores = [&](size_t h) { return scratch->scores.data() + h * static_cast<size_t>(n); };
    std::vector<std::vector<int32_t>> heavy(gs);
    for (size_t h = 0; h < gs; ++h) TopH(scores(h), n, h_count, &heavy[h]);
    // The same draws as AttendGroupReference, sized from the kernel's fp32 logits.
    GroupSampler sampler(n, heavy, GroupSeed(seed_, qg, gc, shard), scratch);
    std::vector<int32_t> rows;
    std::vector<uint32_t> masks;
    sampler.Draw(BaseNeeds(sampler, gs, params_), &rows, &masks);
    std::vector<int64_t> need(gs, 0);
    for (size_t h = 0; h < gs; ++h) {
      const float* xh = scores(h);
      need[h] = SizeFromLogits(
          heavy[h], ListOf(rows, masks, static_cast<int>(h)), sampler.residual(h),
          [xh](int32_t i) { return static_cast<double>(xh[i]); }, params_, z_);
    }
    sampler.Draw(need, &rows, &masks);
    std::vector<PartialAttention> exact(gs), sampled(gs);
    internal::RunOnLists(kernel, shard, qg, gc, scale, heavy, scratch, exact.data());
    internal::RunGroupKernel(kernel, shard, qg, gc, scale, rows.data(),
                             static_cast<int64_t>(rows.size()), masks.data(), nullptr, scratch,
                             sampled.data());
    for (size_t h = 0; h < gs; ++h) {
      out[h0 + h] = MergeWeighted(std::move(exact[h]), std::move(sampled[h]),
                                  SampleWeight(sampler.residual(h), need[h]));
      out[h0 + h].n_touched = static_cast<int64_t>(heavy[h].size()) + need[h];
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
                                                                uint64_t seed, SimdLevel simd_level,
                                                                CodeScore score) {
  VAttentionLshEstimator e(/*k=*/16, /*l=*/2, params, seed, simd_level);
  e.spotlight_fraction_ = spotlight_fraction;
  e.score_ = score;
  return e;
}

absl::Status VAttentionLshEstimator::CheckSource(const KvShard& shard,
                                                 const uint16_t* q_codes) const {
  if (spotlight_fraction_ > 0) {
    return CheckLearnedCodes(shard, q_codes,
                             score_ == CodeScore::kSketch
                                 ? "VAttentionLshEstimator (key sketches)"
                                 : "VAttentionLshEstimator (learned codes)");
  }
  return internal::CheckTables(shard, k_, l_, q_codes, "VAttentionLshEstimator");
}

absl::Status VAttentionLshEstimator::Candidates(const KvShard& shard, const uint16_t* q_codes,
                                                Scratch* scratch, std::vector<int32_t>* out) const {
  if (spotlight_fraction_ > 0 && score_ == CodeScore::kSketch) {
    BestSketchKeys(simd_level(), q_codes, 1, shard.unindexed_codes(), shard.size(), shard.l(),
                   SpotlightRetrieved(spotlight_fraction_, shard.size()), &scratch->sketch, out);
    return absl::OkStatus();
  }
  if (spotlight_fraction_ > 0) {
    NearestByCode(shard, q_codes, spotlight_fraction_, simd_level(), scratch, out);
    return absl::OkStatus();
  }
  MAGICPIG_RETURN_IF_ERROR(shard.Retrieve(q_codes, &scratch->lsh, out, simd_level()));
  std::sort(out->begin(), out->end());  // retrieval order is not index order
  return absl::OkStatus();
}

absl::Status VAttentionLshEstimator::GroupCandidates(const KvShard& shard, const uint16_t* q_codes,
                                                     int gc, Scratch* scratch,
                                                     std::vector<std::vector<int32_t>>* out) const {
  out->assign(static_cast<size_t>(gc), {});
  if (spotlight_fraction_ > 0 && score_ == CodeScore::kSketch) {
    // The group's sketch candidates in one pass over the codes.
    BestSketchKeys(simd_level(), q_codes, gc, shard.unindexed_codes(), shard.size(), shard.l(),
                   SpotlightRetrieved(spotlight_fraction_, shard.size()), &scratch->sketch,
                   out->data());
    return absl::OkStatus();
  }
  if (spotlight_fraction_ > 0) {
    for (int h = 0; h < gc; ++h) {
      NearestByCode(shard, q_codes + static_cast<int64_t>(h) * shard.l(), spotlight_fraction_,
                    simd_level(), scratch, &(*out)[static_cast<size_t>(h)]);
    }
    return absl::OkStatus();
  }
  // The group's candidates, retrieved together (a bit per head).
  MAGICPIG_RETURN_IF_ERROR(shard.RetrieveGroup(q_codes, gc, &scratch->lsh, &scratch->rows,
                                               &scratch->row_masks, simd_level()));
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
  PartialAttention out;
  MAGICPIG_RETURN_IF_ERROR(AttendGroupReference(shard, q, q_codes, 1, scale, scratch, &out));
  return out;
}

absl::Status VAttentionLshEstimator::AttendGroupReference(const KvShard& shard, const float* q,
                                                          const uint16_t* q_codes, int g,
                                                          float scale, Scratch* scratch,
                                                          PartialAttention* out) const {
  MAGICPIG_RETURN_IF_ERROR(internal::CheckCommon(shard, q, scratch, "VAttentionLshEstimator"));
  MAGICPIG_RETURN_IF_ERROR(CheckSource(shard, q_codes));
  if (g < 1 || out == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("VAttentionLshEstimator: needs g >= 1 heads and non-null out, got g = ", g));
  }
  const int64_t n = shard.size(), d = shard.dim(), code_l = shard.l();
  if (n == 0) {
    for (int h = 0; h < g; ++h) out[h] = EmptyPartial(d);
    return absl::OkStatus();
  }
  for (int h0 = 0; h0 < g; h0 += internal::kMaxGroup) {
    const int gc = std::min(g - h0, internal::kMaxGroup);
    const float* qg = q + h0 * d;
    // Every candidate is deterministic: its key is read to score it anyway, and one left to the
    // uniform sample would only add variance (and make the residual heavy-tailed, where a base
    // sample underestimates the spread: docs/vattention.md).
    std::vector<std::vector<int32_t>> heavy(static_cast<size_t>(gc)), base, sample;
    for (int h = 0; h < gc; ++h) {
      MAGICPIG_RETURN_IF_ERROR(
          Candidates(shard, q_codes + (h0 + h) * code_l, scratch, &heavy[static_cast<size_t>(h)]));
    }
    auto logit = [&](size_t h, int32_t i) {
      return static_cast<double>(scale) * shard.KeyDot(i, qg + static_cast<int64_t>(h) * d);
    };
    ReferenceGroup(shard, qg, gc, heavy, logit, params_, z_, seed_, scratch, &base, &sample,
                   out + h0);
    for (int h = 0; h < gc; ++h) {
      const size_t hs = static_cast<size_t>(h);
      out[h0 + h].n_touched = DistinctUnion(heavy[hs], base[hs], sample[hs]);
    }
  }
  return absl::OkStatus();
}

absl::Status VAttentionLshEstimator::AttendGroup(const KvShard& shard, const float* q,
                                                 const uint16_t* q_codes, int g, float scale,
                                                 Scratch* scratch, PartialAttention* out) const {
  if (!internal::KernelTakes(shard) || shard.size() == 0) {
    return AttendGroupReference(shard, q, q_codes, g, scale, scratch, out);
  }
  MAGICPIG_RETURN_IF_ERROR(
      internal::CheckGroup(shard, q, g, scratch, out, "VAttentionLshEstimator"));
  MAGICPIG_RETURN_IF_ERROR(CheckSource(shard, q_codes));
  const int64_t code_l = shard.l();
  const internal::GroupKernel kernel = internal::SelectGroupKernel(simd_level());
  const int64_t n = shard.size(), d = shard.dim();
  for (int h0 = 0; h0 < g; h0 += internal::kMaxGroup) {
    const int gc = std::min(g - h0, internal::kMaxGroup);
    const size_t gs = static_cast<size_t>(gc);
    const float* qg = q + h0 * d;
    std::vector<std::vector<int32_t>> heavy;
    MAGICPIG_RETURN_IF_ERROR(GroupCandidates(shard, q_codes + h0 * code_l, gc, scratch, &heavy));
    // The same draws as AttendGroupReference. The base samples' sums of exp(logit) and of its
    // square come from one keys-only kernel pass, the candidates' sum from their exact part
    // (which is also the result's deterministic half).
    GroupSampler sampler(n, heavy, GroupSeed(seed_, qg, gc, shard), scratch);
    std::vector<int32_t> base_rows, rows;
    std::vector<uint32_t> base_masks, masks;
    const std::vector<int64_t> base_need = BaseNeeds(sampler, gs, params_);  // at most n_s each
    sampler.Draw(base_need, &base_rows, &base_masks);
    std::vector<PartialAttention> exact(gs);
    if (spotlight_fraction_ > 0) {
      internal::RunOnLists(kernel, shard, qg, gc, scale, heavy, scratch, exact.data());
    } else {
      // The retrieval's own rows and head masks are the union of the candidate lists.
      internal::RunGroupKernel(kernel, shard, qg, gc, scale, scratch->rows.data(),
                               static_cast<int64_t>(scratch->rows.size()),
                               scratch->row_masks.data(), nullptr, scratch, exact.data());
    }
    float lse1[internal::kMaxGroup], lse2[internal::kMaxGroup];
    internal::GroupExpSums(kernel, shard, qg, gc, scale, base_rows.data(),
                           static_cast<int64_t>(base_rows.size()), base_masks.data(), scratch, lse1,
                           lse2);
    std::vector<int64_t> need(gs, 0);
    for (size_t h = 0; h < gs; ++h) {
      const int64_t n_s = sampler.residual(h);
      if (n_s == 0) continue;
      const double m = std::max<double>(exact[h].lse, lse1[h]);
      need[h] = SizeFromSums(std::exp(static_cast<double>(exact[h].lse) - m),
                             std::exp(static_cast<double>(lse1[h]) - m),
                             std::exp(static_cast<double>(lse2[h]) - 2 * m), base_need[h], n_s,
                             params_, z_);
    }
    sampler.Draw(need, &rows, &masks);
    std::vector<PartialAttention> sampled(gs);
    internal::RunGroupKernel(kernel, shard, qg, gc, scale, rows.data(),
                             static_cast<int64_t>(rows.size()), masks.data(), nullptr, scratch,
                             sampled.data());
    // Keys touched per head: its candidates, and its base sample and sample (disjoint from the
    // candidates, possibly overlapping each other).
    std::vector<int64_t> touched(gs, 0);
    for (size_t h = 0; h < gs; ++h) touched[h] = static_cast<int64_t>(heavy[h].size());
    size_t i = 0, j = 0;
    while (i < base_rows.size() || j < rows.size()) {
      uint32_t m = 0;
      if (j == rows.size() || (i < base_rows.size() && base_rows[i] < rows[j])) {
        m = base_masks[i++];
      } else if (i == base_rows.size() || rows[j] < base_rows[i]) {
        m = masks[j++];
      } else {
        m = base_masks[i++] | masks[j++];
      }
      for (; m != 0; m &= m - 1) ++touched[static_cast<size_t>(__builtin_ctz(m))];
    }
    for (size_t h = 0; h < gs; ++h) {
      out[h0 + h] = MergeWeighted(std::move(exact[h]), std::move(sampled[h]),
                                  SampleWeight(sampler.residual(h), need[h]));
      out[h0 + h].n_touched = touched[h];
    }
  }
  return absl::OkStatus();
}

}  // namespace magicpig::attention
