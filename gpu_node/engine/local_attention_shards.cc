#include "gpu_node/engine/local_attention_shards.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace magicpig::engine {

LocalAttentionShards::LocalAttentionShards(int64_t n_layer, int64_t n_kv, int group,
                                           int64_t head_dim, int k, int l, KvStorage storage,
                                           const Estimator* estimator, AttentionRunner* runner)
    : n_kv_(n_kv),
      head_dim_(head_dim),
      group_(group),
      k_(k),
      l_(l),
      storage_(storage),
      estimator_(estimator),
      runner_(runner),
      shards_(static_cast<size_t>(n_layer)) {}

absl::Status LocalAttentionShards::Append(int64_t layer, int64_t /*first_pos*/, int64_t n,
                                          const float* keys, const float* values,
                                          const uint16_t* codes) {
  std::vector<KvShard>& shards = shards_[static_cast<size_t>(layer)];
  const int64_t d = head_dim_;
  if (shards.empty()) {
    std::vector<KvShard> built;
    for (int64_t g = 0; g < n_kv_; ++g) {
      MAGICPIG_ASSIGN_OR_RETURN(
          KvShard shard, KvShard::CreateFromCodes(d, k_, l_, keys + g * n * d, codes + g * n * l_,
                                                  values + g * n * d, n, storage_));
      built.push_back(std::move(shard));
    }
    shards = std::move(built);
    return absl::OkStatus();
  }
  for (int64_t g = 0; g < n_kv_; ++g) {
    MAGICPIG_RETURN_IF_ERROR(shards[static_cast<size_t>(g)].AppendWithCodes(
        keys + g * n * d, codes + g * n * l_, values + g * n * d, n));
  }
  return absl::OkStatus();
}

absl::Status LocalAttentionShards::Attend(int64_t layer, const float* q, const uint16_t* codes,
                                          float scale, PartialAttention* out) {
  std::vector<KvShard>& shards = shards_[static_cast<size_t>(layer)];
  if (shards.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("layer ", layer, " has no shards"));
  }
  work_.clear();
  for (int64_t g = 0; g < n_kv_; ++g) {
    work_.push_back({&shards[static_cast<size_t>(g)], q + g * group_ * head_dim_,
                     codes + g * group_ * l_, group_, out + g * group_});
  }
  return runner_->Run(*estimator_, work_, scale);
}

int64_t LocalAttentionShards::size(int64_t layer) const {
  const std::vector<KvShard>& shards = shards_[static_cast<size_t>(layer)];
  return shards.empty() ? 0 : shards.front().size();
}

int64_t LocalAttentionShards::bytes() const {
  int64_t b = 0;
  for (const auto& layer : shards_)
    for (const KvShard& s : layer) b += s.bytes();
  return b;
}

}  // namespace magicpig::engine
