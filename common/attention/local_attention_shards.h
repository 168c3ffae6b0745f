// LocalAttentionShards: the embedded mode's AttentionShards — KvShards in this process, per
// (sparse layer, block of the prompt region, kv head), attended through an AttentionRunner (one
// work item per (block, kv head)); the blocks' partials merge in block order (MergePartials), the
// same arithmetic as RemoteAttentionShards with any placement of the blocks.
//
// Thread-safety: as AttentionShards; the estimator and runner are shared and thread-safe.
#ifndef MAGICPIG_COMMON_ATTENTION_LOCAL_ATTENTION_SHARDS_H_
#define MAGICPIG_COMMON_ATTENTION_LOCAL_ATTENTION_SHARDS_H_

#include <cstdint>
#include <vector>

#include "common/attention/attention_runner.h"
#include "common/attention/attention_shards.h"
#include "common/attention/estimators.h"
#include "common/attention/kv_shard.h"

namespace magicpig::attention {

class LocalAttentionShards final : public AttentionShards {
 public:
  // (k, l, index): the codes' geometry and how the shards keep them (KvShard::CreateFromCodes).
  LocalAttentionShards(int64_t n_layer, int64_t n_kv, int group, int64_t head_dim, int k, int l,
                       KvIndex index, KvStorage storage, int64_t block, const Estimator* estimator,
                       AttentionRunner* runner);

  absl::Status Append(int64_t layer, int64_t first_pos, int64_t n, const float* keys,
                      const float* values, const uint16_t* codes) override;
  absl::Status Attend(int64_t layer, const float* q, const uint16_t* codes, float scale,
                      PartialAttention* out) override;
  int64_t size(int64_t layer) const override;
  int64_t bytes() const override;

 private:
  int64_t n_kv_, head_dim_, block_;
  int group_, k_, l_;
  KvIndex index_;
  KvStorage storage_;
  const Estimator* estimator_;
  AttentionRunner* runner_;
  // [layer][block][kv head]; empty until the layer's first Append.
  std::vector<std::vector<std::vector<KvShard>>> shards_;
  std::vector<int64_t> size_;  // [layer] keys per kv head
  std::vector<GroupWork> work_;
  std::vector<PartialAttention> block_parts_;  // [block][head]
};

}  // namespace magicpig::attention

#endif  // MAGICPIG_COMMON_ATTENTION_LOCAL_ATTENTION_SHARDS_H_
