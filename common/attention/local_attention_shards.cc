#include "common/attention/local_attention_shards.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace magicpig::attention {

using ::magicpig::attention::AttentionRunner;
using ::magicpig::attention::Estimator;
using ::magicpig::attention::KvShard;
using ::magicpig::attention::KvStorage;
using ::magicpig::attention::MergePartials;
using ::magicpig::attention::PartialAttention;

LocalAttentionShards::LocalAttentionShards(int64_t n_layer, int64_t n_kv, int group,
                                           int64_t head_dim, int k, int l, KvIndex index,
                                           KvStorage storage, int64_t block,
                                           const Estimator* estimator, AttentionRunner* runner)
    : n_kv_(n_kv),
      head_dim_(head_dim),
      block_(block > 0 ? block : int64_t{1} << 40),
      group_(group),
      k_(k),
      l_(l),
      index_(index),
      storage_(storage),
      estimator_(estimator),
      runner_(runner),
      shards_(static_cast<size_t>(n_layer)),
      size_(static_cast<size_t>(n_layer), 0) {}

absl::Status LocalAttentionShards::Append(int64_t layer, int64_t /*first_pos*/, int64_t n,
                                          const float* keys, const float* values,
                                          const uint16_t* codes) {
  auto& blocks = shards_[static_cast<size_t>(layer)];
  const int64_t d = head_dim_;
  if (blocks.empty()) {
    // The prompt region: blocks of block_ tokens.
    std::vector<std::vector<KvShard>> built;
    for (int64_t b0 = 0; b0 < n; b0 += block_) {
      const int64_t bn = std::min(block_, n - b0);
      std::vector<KvShard> heads;
      for (int64_t g = 0; g < n_kv_; ++g) {
        const int64_t row = g * n + b0;
        MAGICPIG_ASSIGN_OR_RETURN(
            KvShard shard, KvShard::CreateFromCodes(d, k_, l_, keys + row * d, codes + row * l_,
                                                    values + row * d, bn, storage_, index_));
        heads.push_back(std::move(shard));
      }
      built.push_back(std::move(heads));
    }
    blocks = std::move(built);
  } else {
    // Later rows join the last block (its append segment).
    for (int64_t g = 0; g < n_kv_; ++g) {
      MAGICPIG_RETURN_IF_ERROR(blocks.back()[static_cast<size_t>(g)].AppendWithCodes(
          keys + g * n * d, codes + g * n * l_, values + g * n * d, n));
    }
  }
  size_[static_cast<size_t>(layer)] += n;
  return absl::OkStatus();
}

absl::Status LocalAttentionShards::Attend(int64_t layer, const float* q, const uint16_t* codes,
                                          float scale, PartialAttention* out) {
  auto& blocks = shards_[static_cast<size_t>(layer)];
  if (blocks.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("layer ", layer, " has no shards"));
  }
  const int64_t n_head = n_kv_ * group_;
  block_parts_.assign(blocks.size() * static_cast<size_t>(n_head), PartialAttention{});
  work_.clear();
  for (size_t b = 0; b < blocks.size(); ++b) {
    for (int64_t g = 0; g < n_kv_; ++g) {
      work_.push_back({&blocks[b][static_cast<size_t>(g)], q + g * group_ * head_dim_,
                       codes + g * group_ * l_, group_,
                       block_parts_.data() + b * n_head + g * group_});
    }
  }
  MAGICPIG_RETURN_IF_ERROR(runner_->Run(*estimator_, work_, scale));
  std::vector<PartialAttention> per_head(blocks.size() > 1 ? blocks.size() : 0);
  for (int64_t h = 0; h < n_head; ++h) {
    if (blocks.size() == 1) {
      out[h] = std::move(block_parts_[h]);  // what the merge of one part returns, without copies
    } else {
      for (size_t b = 0; b < blocks.size(); ++b)
        per_head[b] = std::move(block_parts_[b * n_head + h]);
      out[h] = MergePartials(per_head);
    }
    if (out[h].o.empty()) out[h].o.assign(static_cast<size_t>(head_dim_), 0.0f);
  }
  return absl::OkStatus();
}

int64_t LocalAttentionShards::size(int64_t layer) const {
  return size_[static_cast<size_t>(layer)];
}

int64_t LocalAttentionShards::bytes() const {
  int64_t b = 0;
  for (const auto& layer : shards_)
    for (const auto& block : layer)
      for (const KvShard& s : block) b += s.bytes();
  return b;
}

}  // namespace magicpig::attention
