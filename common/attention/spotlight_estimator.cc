#include "common/attention/spotlight_estimator.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/attention/group_kernel_runner.h"
#include "common/attention/kernels/hamming_kernel.h"
#include "common/status_macros.h"

namespace magicpig::attention {
namespace {}  // namespace

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
  const int64_t n = shard.size();
  scratch->distances.resize(static_cast<size_t>(n));
  HammingDistances(level, q_code, shard.unindexed_codes(), n, shard.l(), scratch->distances.data());
  SelectNearest(scratch->distances.data(), n, SpotlightRetrieved(fraction, n), 16 * shard.l(), out);
}

int64_t SpotlightRetrieved(double fraction, int64_t n) {
  if (n <= 0) return 0;
  const double m = std::ceil(fraction * static_cast<double>(n));
  return std::clamp<int64_t>(static_cast<int64_t>(std::min(m, 9e18)), 1, n);
}

absl::StatusOr<PartialAttention> SpotlightEstimator::Attend(const KvShard& shard, const float* q,
                                                            const uint16_t* q_codes, float scale,
                                                            Scratch* scratch) const {
  MAGICPIG_RETURN_IF_ERROR(internal::CheckCommon(shard, q, scratch, "SpotlightEstimator"));
  MAGICPIG_RETURN_IF_ERROR(CheckLearnedCodes(shard, q_codes, "SpotlightEstimator"));
  const int64_t n = shard.size();
  const int l = shard.l();
  // Distances bit by bit: the reference does not share the kernels' popcount.
  std::vector<uint16_t> dist(static_cast<size_t>(n));
  const uint16_t* codes = shard.unindexed_codes();
  for (int64_t i = 0; i < n; ++i) {
    int d = 0;
    for (int w = 0; w < l; ++w) {
      for (int b = 0; b < 16; ++b) d += ((codes[i * l + w] ^ q_codes[w]) >> b) & 1;
    }
    dist[static_cast<size_t>(i)] = static_cast<uint16_t>(d);
  }
  SelectNearest(dist.data(), n, SpotlightRetrieved(fraction_, n), 16 * l, &scratch->sample);
  scratch->logits.resize(scratch->sample.size());
  for (size_t j = 0; j < scratch->sample.size(); ++j) {
    scratch->logits[j] = static_cast<double>(scale) * shard.KeyDot(scratch->sample[j], q);
  }
  return internal::SoftmaxOver(shard, scratch);
}

absl::Status SpotlightEstimator::AttendGroup(const KvShard& shard, const float* q,
                                             const uint16_t* q_codes, int g, float scale,
                                             Scratch* scratch, PartialAttention* out) const {
  MAGICPIG_RETURN_IF_ERROR(internal::CheckGroup(shard, q, g, scratch, out, "SpotlightEstimator"));
  MAGICPIG_RETURN_IF_ERROR(CheckLearnedCodes(shard, q_codes, "SpotlightEstimator"));
  const int64_t n = shard.size();
  const int l = shard.l();
  const int64_t m = SpotlightRetrieved(fraction_, n);
  const internal::GroupKernel kernel = internal::SelectGroupKernel(simd_level());
  std::vector<std::vector<int32_t>> lists;
  for (int h0 = 0; h0 < g; h0 += internal::kMaxGroup) {
    const int gc = std::min(g - h0, internal::kMaxGroup);
    lists.resize(static_cast<size_t>(gc));
    for (int h = 0; h < gc; ++h) {
      NearestByCode(shard, q_codes + static_cast<int64_t>(h0 + h) * l, fraction_, simd_level(),
                    scratch, &lists[static_cast<size_t>(h)]);
    }
    internal::RunOnLists(kernel, shard, q + static_cast<int64_t>(h0) * shard.dim(), gc, scale,
                         lists, scratch, out + h0);
    for (int h = 0; h < gc; ++h) out[h0 + h].n_touched = m;
  }
  return absl::OkStatus();
}

}  // namespace magicpig::attention
