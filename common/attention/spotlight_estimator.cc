#include "common/attention/spotlight_estimator.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/attention/group_kernel_runner.h"
#include "common/attention/kernels/hamming_kernel.h"
#include "common/attention/kernels/sketch_kernel.h"
#include "common/attention/key_sketch.h"
#include "common/status_macros.h"

namespace magicpig::attention {
namespace {

// Keeps the m (score, key index) pairs of largest score (ties: the lower index), in increasing
// index order; m <= scored->size().
template <typename T>
void KeepBest(int64_t m, std::vector<std::pair<T, int32_t>>* scored) {
  std::nth_element(scored->begin(), scored->begin() + m, scored->end(),
                   [](const std::pair<T, int32_t>& a, const std::pair<T, int32_t>& b) {
                     return a.first > b.first || (a.first == b.first && a.second < b.second);
                   });
  scored->resize(static_cast<size_t>(m));
  std::sort(scored->begin(), scored->end(),
            [](const std::pair<T, int32_t>& a, const std::pair<T, int32_t>& b) {
              return a.second < b.second;
            });
}

// The `count` keys nearest q_code, ties to the lower index, in increasing index order.
void NearestCount(const KvShard& shard, const uint16_t* q_code, int64_t count, SimdLevel level,
                  EstimatorScratch* scratch, std::vector<int32_t>* out) {
  const int64_t n = shard.size();
  scratch->distances.resize(static_cast<size_t>(n));
  HammingDistances(level, q_code, shard.unindexed_codes(), n, shard.l(), scratch->distances.data());
  SelectNearest(scratch->distances.data(), n, count, 16 * shard.l(), out);
}

const char* Who(CodeScore score) {
  return score == CodeScore::kSketch ? "SketchEstimator" : "SpotlightEstimator";
}

}  // namespace

absl::Status CheckLearnedCodes(const KvShard& shard, const uint16_t* q_codes, const char* who) {
  if (shard.index() != KvIndex::kCodes) {
    return absl::InvalidArgumentError(
        absl::StrCat(who,
                     ": the shard holds LSH tables, not learned codes (it was built for "
                     "another estimator)"));
  }
  if (shard.l() > kHammingMaxWords) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": codes of ", shard.l(), " words; at most ", kHammingMaxWords));
  }
  if (shard.size() > 0 && q_codes == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": q_codes is null"));
  }
  return absl::OkStatus();
}

void NearestByCode(const KvShard& shard, const uint16_t* q_code, double fraction, SimdLevel level,
                   EstimatorScratch* scratch, std::vector<int32_t>* out) {
  NearestCount(shard, q_code, SpotlightRetrieved(fraction, shard.size()), level, scratch, out);
}

int64_t SpotlightCandidates(double fraction, int64_t rerank, int64_t n) {
  const int64_t m = SpotlightRetrieved(fraction, n);
  return m > n / std::max<int64_t>(rerank, 1) ? n : m * std::max<int64_t>(rerank, 1);
}

int64_t SpotlightRetrieved(double fraction, int64_t n) {
  if (n <= 0) return 0;
  const double m = std::ceil(fraction * static_cast<double>(n));
  return std::clamp<int64_t>(static_cast<int64_t>(std::min(m, 9e18)), 1, n);
}

absl::StatusOr<PartialAttention> SpotlightEstimator::Attend(const KvShard& shard, const float* q,
                                                            const uint16_t* q_codes, float scale,
                                                            Scratch* scratch) const {
  MAGICPIG_RETURN_IF_ERROR(internal::CheckCommon(shard, q, scratch, Who(score_)));
  MAGICPIG_RETURN_IF_ERROR(CheckLearnedCodes(shard, q_codes, Who(score_)));
  const int64_t n = shard.size();
  const int l = shard.l();
  const uint16_t* codes = shard.unindexed_codes();
  const int64_t c = SpotlightCandidates(fraction_, rerank_, n);
  if (score_ == CodeScore::kSketch) {
    // Scores coordinate by coordinate: the reference does not share the kernels' arithmetic.
    std::vector<int32_t> score(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      int32_t s = 0;
      for (int j = 0; j < 2 * l; ++j) {
        s += SketchCoordinate(q_codes, j) * SketchCoordinate(codes + i * l, j);
      }
      score[static_cast<size_t>(i)] = s;
    }
    SelectLargest(score.data(), n, c, &scratch->sample);
  } else {
    // Distances bit by bit: the reference does not share the kernels' popcount.
    std::vector<uint16_t> dist(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      int d = 0;
      for (int w = 0; w < l; ++w) {
        for (int b = 0; b < 16; ++b) d += ((codes[i * l + w] ^ q_codes[w]) >> b) & 1;
      }
      dist[static_cast<size_t>(i)] = static_cast<uint16_t>(d);
    }
    SelectNearest(dist.data(), n, c, 16 * l, &scratch->sample);
  }
  std::vector<std::pair<double, int32_t>> scored;
  for (int32_t i : scratch->sample) {
    scored.emplace_back(static_cast<double>(scale) * shard.KeyDot(i, q), i);
  }
  // Rescoring: the best m candidates by exact logit (all of them without rerank).
  KeepBest(SpotlightRetrieved(fraction_, n), &scored);
  scratch->sample.clear();
  scratch->logits.clear();
  for (const auto& [x, i] : scored) {
    scratch->sample.push_back(i);
    scratch->logits.push_back(x);
  }
  return internal::SoftmaxOver(shard, scratch);
}

absl::Status SpotlightEstimator::AttendGroup(const KvShard& shard, const float* q,
                                             const uint16_t* q_codes, int g, float scale,
                                             Scratch* scratch, PartialAttention* out) const {
  MAGICPIG_RETURN_IF_ERROR(internal::CheckGroup(shard, q, g, scratch, out, Who(score_)));
  MAGICPIG_RETURN_IF_ERROR(CheckLearnedCodes(shard, q_codes, Who(score_)));
  const int64_t n = shard.size();
  const int l = shard.l();
  const int64_t m = SpotlightRetrieved(fraction_, n);
  const int64_t c = SpotlightCandidates(fraction_, rerank_, n);
  const internal::GroupKernel kernel = internal::SelectGroupKernel(simd_level());
  std::vector<std::vector<int32_t>> lists;
  for (int h0 = 0; h0 < g; h0 += internal::kMaxGroup) {
    const int gc = std::min(g - h0, internal::kMaxGroup);
    const float* qc = q + static_cast<int64_t>(h0) * shard.dim();
    lists.resize(static_cast<size_t>(gc));
    if (score_ == CodeScore::kSketch) {
      BestSketchKeys(simd_level(), q_codes + static_cast<int64_t>(h0) * l, gc,
                     shard.unindexed_codes(), n, l, c, &scratch->sketch, lists.data());
    } else {
      for (int h = 0; h < gc; ++h) {
        NearestCount(shard, q_codes + static_cast<int64_t>(h0 + h) * l, c, simd_level(), scratch,
                     &lists[static_cast<size_t>(h)]);
      }
    }
    if (c > m) {
      // Each candidate's key is read once for the heads that chose it; each head keeps its m best.
      internal::UnionWithMasks(lists, &scratch->rows, &scratch->row_masks);
      const int64_t nr = static_cast<int64_t>(scratch->rows.size());
      internal::GroupListLogits(simd_level(), shard, qc, gc, scale, scratch->rows.data(), nr,
                                scratch->row_masks.data(), scratch);
      std::vector<std::pair<float, int32_t>> scored;
      for (int h = 0; h < gc; ++h) {
        // The head's candidates (its mask bit; the others' logits are -inf), best m by logit,
        // ties to the lower index (the union is in index order), then back in index order.
        const float* x = scratch->scores.data() + static_cast<int64_t>(h) * nr;
        scored.clear();
        for (int64_t j = 0; j < nr; ++j) {
          if ((scratch->row_masks[static_cast<size_t>(j)] >> h) & 1u) {
            scored.emplace_back(x[j], scratch->rows[static_cast<size_t>(j)]);
          }
        }
        KeepBest(m, &scored);
        std::vector<int32_t>& list = lists[static_cast<size_t>(h)];
        list.clear();
        for (const auto& [x_j, row] : scored) list.push_back(row);
      }
    }
    internal::RunOnLists(kernel, shard, qc, gc, scale, lists, scratch, out + h0);
    for (int h = 0; h < gc; ++h) out[h0 + h].n_touched = m;
  }
  return absl::OkStatus();
}

}  // namespace magicpig::attention
