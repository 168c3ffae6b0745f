// LocalAttentionShards: the embedded mode's AttentionShards — one KvShard per (sparse layer, kv
// head) in this process, attended through an AttentionRunner (one work item per kv head).
//
// Thread-safety: as AttentionShards; the estimator and runner are shared and thread-safe.
#ifndef MAGICPIG_GPU_NODE_ENGINE_LOCAL_ATTENTION_SHARDS_H_
#define MAGICPIG_GPU_NODE_ENGINE_LOCAL_ATTENTION_SHARDS_H_

#include <cstdint>
#include <vector>

#include "attn_node/core/attention_runner.h"
#include "attn_node/core/estimators.h"
#include "attn_node/core/kv_shard.h"
#include "gpu_node/engine/attention_shards.h"

namespace magicpig::engine {

class LocalAttentionShards final : public AttentionShards {
 public:
  LocalAttentionShards(int64_t n_layer, int64_t n_kv, int group, int64_t head_dim, int k, int l,
                       KvStorage storage, const Estimator* estimator, AttentionRunner* runner);

  absl::Status Append(int64_t layer, int64_t first_pos, int64_t n, const float* keys,
                      const float* values, const uint16_t* codes) override;
  absl::Status Attend(int64_t layer, const float* q, const uint16_t* codes, float scale,
                      PartialAttention* out) override;
  int64_t size(int64_t layer) const override;
  int64_t bytes() const override;

 private:
  int64_t n_kv_, head_dim_;
  int group_, k_, l_;
  KvStorage storage_;
  const Estimator* estimator_;
  AttentionRunner* runner_;
  std::vector<std::vector<KvShard>> shards_;  // [layer][kv head]; empty until the first Append
  std::vector<GroupWork> work_;
};

}  // namespace magicpig::engine

#endif  // MAGICPIG_GPU_NODE_ENGINE_LOCAL_ATTENTION_SHARDS_H_
