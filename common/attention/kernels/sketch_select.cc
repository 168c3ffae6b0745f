// The sketch estimator's selections (sketch_kernel.h): SelectLargest over given scores, and
// BestSketchKeys, which retrieves a group's keys without writing every score.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "common/attention/kernels/selection_start.h"
#include "common/attention/kernels/sketch_kernel.h"

namespace magicpig::attention {
namespace {

// SelectLargest for 0 < m < n, appending to the empty *out.
void SelectExact(const int32_t* scores, int64_t n, int64_t m, std::vector<int32_t>* out) {
  // u = kSketchMaxScore - score: the m smallest u. v = u - min u spans [0, range]; a histogram of
  // v >> shift over about n / 4 buckets (16 to 1,024: sized by n and the scores' spread, so few
  // buckets are cleared and scanned) finds the bucket b that holds the m-th; a pass takes every
  // key of a lower bucket and sets aside those of bucket b, which a sort by (v, index) orders
  // for the rest; the two sorted lists then merge.
  auto key = [&](int64_t i) {
    return static_cast<uint32_t>(kSketchMaxScore -
                                 std::clamp(scores[i], -kSketchMaxScore, kSketchMaxScore));
  };
  // The spread, from the raw scores (a loop the compiler vectorises).
  int32_t smin = scores[0], smax = scores[0];
  for (int64_t i = 1; i < n; ++i) {
    smin = std::min(smin, scores[i]);
    smax = std::max(smax, scores[i]);
  }
  const uint32_t lo = static_cast<uint32_t>(kSketchMaxScore - std::min(smax, kSketchMaxScore));
  const uint32_t hi = static_cast<uint32_t>(kSketchMaxScore - std::max(smin, -kSketchMaxScore));
  int bucket_bits = 4;
  while (bucket_bits < 10 && (int64_t{1} << (bucket_bits + 2)) < n) ++bucket_bits;
  int shift = 0;
  while (((hi - lo) >> shift) >> bucket_bits) ++shift;
  int32_t high[1024];
  std::fill_n(high, ((hi - lo) >> shift) + 1, 0);
  for (int64_t i = 0; i < n; ++i) ++high[(key(i) - lo) >> shift];
  int64_t below = 0;
  uint32_t b = 0;
  while (below + high[b] < m) below += high[b++];
  // Branches, not selects: at m << n the keys below b are rare and the branch predicts well.
  std::vector<std::pair<uint32_t, int32_t>> bucket;  // (v, index) of bucket b
  bucket.reserve(static_cast<size_t>(high[b]));
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t v = key(i) - lo;
    if ((v >> shift) < b) {
      out->push_back(static_cast<int32_t>(i));
    } else if ((v >> shift) == b) {
      bucket.emplace_back(v, static_cast<int32_t>(i));
    }
  }
  // By v, ties by index: the first m - below of the bucket complete the selection.
  std::sort(bucket.begin(), bucket.end());
  const size_t before = out->size();
  for (int64_t j = 0; j < m - below; ++j) out->push_back(bucket[static_cast<size_t>(j)].second);
  std::sort(out->begin() + static_cast<std::ptrdiff_t>(before), out->end());
  std::inplace_merge(out->begin(), out->begin() + static_cast<std::ptrdiff_t>(before), out->end());
}

int64_t CollectAtLeast(SimdLevel level, const int32_t* scores, int64_t n, int32_t t, int32_t* out) {
  if (level == SimdLevel::kAvx512) return internal::CollectAtLeastAvx512(scores, n, t, out);
  if (level == SimdLevel::kAvx2) return internal::CollectAtLeastAvx2(scores, n, t, out);
  return internal::CollectAtLeastScalar(scores, n, t, out);
}

template <typename T>
void GrowTo(std::vector<T>* v, int64_t size) {
  if (v->size() < static_cast<size_t>(size)) v->resize(static_cast<size_t>(size));
}

}  // namespace

void SelectLargest(const int32_t* scores, int64_t n, int64_t m, std::vector<int32_t>* out) {
  if (internal::StartSelection(&n, &m, out)) return;
  SelectExact(scores, n, m, out);
}

void BestSketchKeys(SimdLevel level, const uint16_t* query_codes, int g, const uint16_t* key_codes,
                    int64_t n, int words, int64_t m, SketchSelectScratch* scratch,
                    std::vector<int32_t>* lists) {
  if (g < 1 || words < 1 || words > 16) return;
  level = ClampToDetected(level);
  n = std::max<int64_t>(n, 0);
  m = std::clamp<int64_t>(m, 0, n);
  if (n < kSketchSampledMin || m > n / 4) {
    GrowTo(&scratch->scores, g * n);
    SketchScoresGroup(level, query_codes, g, key_codes, n, words, scratch->scores.data());
    for (int h = 0; h < g; ++h) SelectLargest(scratch->scores.data() + h * n, n, m, &lists[h]);
    return;
  }
  // Each head's threshold from every kSketchSampleStride-th key's score.
  constexpr int64_t kStride = kSketchSampleStride;
  const int64_t ns = n / kStride;
  GrowTo(&scratch->sample_codes, ns * words);
  GrowTo(&scratch->sample_scores, g * ns);
  GrowTo(&scratch->thresholds, g);
  for (int64_t j = 0; j < ns; ++j) {
    std::copy_n(key_codes + (j * kStride + kStride / 2) * words, words,
                scratch->sample_codes.data() + j * words);
  }
  SketchScoresGroup(level, query_codes, g, scratch->sample_codes.data(), ns, words,
                    scratch->sample_scores.data());
  const double e = static_cast<double>(m) * static_cast<double>(ns) / static_cast<double>(n);
  const int64_t rank =
      std::min<int64_t>(ns, static_cast<int64_t>(std::ceil(e + 4 * std::sqrt(e) + 2)));
  for (int h = 0; h < g; ++h) {
    int32_t* sample = scratch->sample_scores.data() + h * ns;
    std::nth_element(sample, sample + (rank - 1), sample + ns, std::greater<int32_t>());
    scratch->thresholds[static_cast<size_t>(h)] = sample[rank - 1];
  }
  // One pass over the codes collects each head's keys at or above its threshold with their
  // scores: fused into the scores where the CPU has VNNI; otherwise a block of keys scored for
  // every head (in L1), then compared.
  GrowTo(&scratch->candidates, g * n);
  GrowTo(&scratch->candidate_scores, g * n);
  scratch->counts.assign(static_cast<size_t>(g), 0);
  if (internal::UsesVnniGroup(level, words)) {
    internal::SketchCollectGroupAvx512Vnni(
        query_codes, g, key_codes, n, words, scratch->thresholds.data(), n,
        scratch->candidates.data(), scratch->candidate_scores.data(), scratch->counts.data());
  } else {
    constexpr int64_t kBlock = 256;
    GrowTo(&scratch->block_scores, g * kBlock);
    int32_t* block = scratch->block_scores.data();
    for (int64_t b = 0; b < n; b += kBlock) {
      const int64_t len = std::min(kBlock, n - b);
      SketchScoresGroup(level, query_codes, g, key_codes + b * words, len, words, block);
      for (int h = 0; h < g; ++h) {
        const int32_t* s = block + h * len;
        int64_t& c = scratch->counts[static_cast<size_t>(h)];
        int32_t* idx = scratch->candidates.data() + h * n + c;
        const int64_t got = CollectAtLeast(level, s, len, scratch->thresholds[h], idx);
        int32_t* val = scratch->candidate_scores.data() + h * n + c;
        for (int64_t j = 0; j < got; ++j) {
          val[j] = s[idx[j]];
          idx[j] += static_cast<int32_t>(b);
        }
        c += got;
      }
    }
  }
  for (int h = 0; h < g; ++h) {
    const int64_t c = scratch->counts[static_cast<size_t>(h)];
    std::vector<int32_t>& out = lists[h];
    if (c < m) {
      // The sample's threshold lies above the m-th largest score: select over all n.
      GrowTo(&scratch->scores, n);
      SketchScores(level, query_codes + static_cast<int64_t>(h) * words, key_codes, n, words,
                   scratch->scores.data());
      SelectLargest(scratch->scores.data(), n, m, &out);
      continue;
    }
    // Every key scoring at least the m-th largest score is a candidate, so the m best candidates
    // (ties to the lower index, which is the lower candidate position) are the m best keys.
    const int32_t* idx = scratch->candidates.data() + h * n;
    SelectLargest(scratch->candidate_scores.data() + h * n, c, m, &out);
    for (int32_t& j : out) j = idx[j];
  }
}

}  // namespace magicpig::attention
