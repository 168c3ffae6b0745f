#include "common/attention/group_kernel_runner.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/attention/inclusion_probability.h"

namespace magicpig::attention::internal {
namespace {

// The arguments every kernel call shares: the shard's rows, the g queries and the scale.
GroupAttentionArgs ArgsFor(const KvShard& shard, const float* q, int g, float scale) {
  GroupAttentionArgs a;
  a.keys = shard.key_rows();
  a.values = shard.value_rows();
  a.bf16 = shard.storage() == KvStorage::kBf16;
  a.d = shard.dim();
  a.g = g;
  a.q = q;
  a.scale = scale;
  return a;
}

}  // namespace

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

absl::Status CheckTables(const KvShard& shard, int k, int l, const uint16_t* q_codes,
                         const char* who) {
  if (shard.k() != k || shard.l() != l) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": estimator (K, L) = (", k, ", ", l,
                                                   ") but the shard's tables have (", shard.k(),
                                                   ", ", shard.l(), ")"));
  }
  if (q_codes == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": q_codes must be non-null"));
  }
  return absl::OkStatus();
}

GroupKernel SelectGroupKernel(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512:
      return GroupAttentionAvx512;
    case SimdLevel::kAvx2:
      return GroupAttentionAvx2;
    default:
      return GroupAttentionScalar;
  }
}

absl::Status CheckGroup(const KvShard& shard, const float* q, int g,
                        const Estimator::Scratch* scratch, const PartialAttention* out,
                        const char* who) {
  if (g < 1 || out == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": AttendGroup needs g >= 1 heads and non-null out, got g = ", g));
  }
  if (shard.dim() % 16 != 0 || shard.dim() > 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": the SIMD kernels need a head dim that is a multiple of 16 and <= 256, got ",
        shard.dim()));
  }
  return CheckCommon(shard, q, scratch, who);
}

void RunGroupKernel(GroupKernel kernel, const KvShard& shard, const float* q, int g, float scale,
                    const int32_t* rows, int64_t n_rows, const uint32_t* masks,
                    const float* lnu_table, Estimator::Scratch* scratch, PartialAttention* out) {
  const int64_t d = shard.dim();
  scratch->kernel.resize(static_cast<size_t>(GroupAttentionScratchFloats(g, d)));
  scratch->o.resize(static_cast<size_t>(g * d));
  scratch->lse.resize(static_cast<size_t>(g));
  GroupAttentionArgs a = ArgsFor(shard, q, g, scale);
  a.rows = rows;
  a.n_rows = n_rows;
  a.masks = masks;
  if (lnu_table != nullptr) {
    scratch->q_norms.resize(static_cast<size_t>(g));
    for (int h = 0; h < g; ++h) {
      double sq = 0.0;
      for (int64_t t = 0; t < d; ++t) sq += static_cast<double>(q[h * d + t]) * q[h * d + t];
      scratch->q_norms[static_cast<size_t>(h)] = static_cast<float>(std::sqrt(sq));
    }
    a.lnu_table = lnu_table;
    a.lnu_size = kLogInclusionTableSize;
    a.key_norms = shard.key_norms();
    a.q_norms = scratch->q_norms.data();
  }
  a.scratch = scratch->kernel.data();
  a.o = scratch->o.data();
  a.lse = scratch->lse.data();
  kernel(a);
  for (int h = 0; h < g; ++h) {
    out[h].o.assign(scratch->o.begin() + h * d, scratch->o.begin() + (h + 1) * d);
    out[h].lse = scratch->lse[static_cast<size_t>(h)];
  }
}

bool KernelTakes(const KvShard& shard) { return shard.dim() % 16 == 0 && shard.dim() <= 256; }

void GroupExpSums(GroupKernel kernel, const KvShard& shard, const float* q, int g, float scale,
                  const int32_t* rows, int64_t n_rows, const uint32_t* masks,
                  Estimator::Scratch* scratch, float* lse, float* lse2) {
  scratch->kernel.resize(static_cast<size_t>(GroupAttentionScratchFloats(g, shard.dim())));
  GroupAttentionArgs a = ArgsFor(shard, q, g, scale);
  a.values = nullptr;
  a.rows = rows;
  a.n_rows = n_rows;
  a.masks = masks;
  a.scratch = scratch->kernel.data();
  a.lse = lse;
  a.lse2 = lse2;
  kernel(a);
}

void GroupLogits(SimdLevel level, const KvShard& shard, const float* q, int g, float scale,
                 Estimator::Scratch* scratch) {
  GroupListLogits(level, shard, q, g, scale, nullptr, shard.size(), nullptr, scratch);
}

void GroupListLogits(SimdLevel level, const KvShard& shard, const float* q, int g, float scale,
                     const int32_t* rows, int64_t n_rows, const uint32_t* masks,
                     Estimator::Scratch* scratch) {
  const int64_t d = shard.dim();
  const int64_t n = n_rows;
  scratch->kernel.resize(static_cast<size_t>(g * d));
  scratch->scores.resize(static_cast<size_t>(g * n));
  GroupAttentionArgs a = ArgsFor(shard, q, g, scale);
  a.values = nullptr;
  a.rows = rows;
  a.masks = masks;
  a.n_rows = n;
  a.scratch = scratch->kernel.data();
  switch (level) {
    case SimdLevel::kAvx512:
      GroupScoresAvx512(a, scratch->scores.data());
      break;
    case SimdLevel::kAvx2:
      GroupScoresAvx2(a, scratch->scores.data());
      break;
    default:
      GroupScoresScalar(a, scratch->scores.data());
  }
}

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

void UnionWithMasks(const std::vector<std::vector<int32_t>>& lists, std::vector<int32_t>* rows,
                    std::vector<uint32_t>* masks) {
  // One two-way merge per list into the union so far (a merge of all lists at once compared every
  // list's head for each output row: several times slower at a group's 4 lists of thousands).
  rows->clear();
  masks->clear();
  std::vector<int32_t> prev_rows;
  std::vector<uint32_t> prev_masks;
  for (size_t h = 0; h < lists.size(); ++h) {
    const std::vector<int32_t>& list = lists[h];
    if (list.empty()) continue;
    const uint32_t bit = uint32_t{1} << h;
    rows->swap(prev_rows);
    masks->swap(prev_masks);
    rows->clear();
    masks->clear();
    rows->reserve(prev_rows.size() + list.size());
    masks->reserve(rows->capacity());
    size_t i = 0, j = 0;
    while (i < prev_rows.size() && j < list.size()) {
      if (prev_rows[i] < list[j]) {
        rows->push_back(prev_rows[i]);
        masks->push_back(prev_masks[i++]);
      } else if (list[j] < prev_rows[i]) {
        rows->push_back(list[j++]);
        masks->push_back(bit);
      } else {
        rows->push_back(list[j++]);
        masks->push_back(prev_masks[i++] | bit);
      }
    }
    for (; i < prev_rows.size(); ++i) {
      rows->push_back(prev_rows[i]);
      masks->push_back(prev_masks[i]);
    }
    for (; j < list.size(); ++j) {
      rows->push_back(list[j]);
      masks->push_back(bit);
    }
  }
}

void RunOnLists(GroupKernel kernel, const KvShard& shard, const float* q, int g, float scale,
                const std::vector<std::vector<int32_t>>& lists, Estimator::Scratch* scratch,
                PartialAttention* out) {
  std::vector<int32_t> rows;
  std::vector<uint32_t> masks;
  UnionWithMasks(lists, &rows, &masks);
  RunGroupKernel(kernel, shard, q, g, scale, rows.data(), static_cast<int64_t>(rows.size()),
                 masks.data(), nullptr, scratch, out);
}

}  // namespace magicpig::attention::internal
