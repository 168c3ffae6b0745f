// The embedded attention router: per sequence, the MagicPIG side of decoding when the attention
// core runs in this process (DESIGN §2-§3, reference spec §7, §10).
//
// For every sparse layer (all but the dense layers, default {0, n_layer/2}) the prompt's keys
// [n_sinks, n - n_local) leave the exact path as layer-major prefill finishes the layer: per kv
// head they are centred with their mean c, hashed (the engine's SimHash) and stored with their
// tables in a KvShard. A decode step then attends exactly, on the compute side, to the static
// window (the sinks and [window_begin, pos]: the last n_local prompt tokens and every generated
// token) and asks the estimator for a partial over each shard; the parts merge by log-sum-exp.
// When the window outgrows window_budget tokens its oldest tokens (all but n_local) move into the
// shards' append segment (a project choice, spec §7 "[project]"; the reference never inserts).
//
// The shard partials use centred keys, so their lse is shifted back by scale * (q . c) before the
// merge; the static part uses the raw fp16 cache. Layers whose offloaded region would be empty
// (short prompts) stay exact until it is not.
//
// In embedded mode the compute node's fp16 KV cache still holds every position (docs/decisions.md:
// the memory split between nodes comes with the attention service, issue #4).
//
// Thread-safety: one router per sequence, used by one decode loop at a time; the shared SimHash,
// estimator and runner are thread-safe.
#ifndef MAGICPIG_GPU_NODE_ENGINE_ATTENTION_ROUTER_H_
#define MAGICPIG_GPU_NODE_ENGINE_ATTENTION_ROUTER_H_

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "attn_node/core/attention_runner.h"
#include "attn_node/core/estimators.h"
#include "attn_node/core/kv_shard.h"
#include "attn_node/core/simhash.h"
#include "gpu_node/backend/backend.h"
#include "gpu_node/engine/transformer.h"
#include "gpu_node/model/model_config.h"

namespace magicpig::engine {

enum class AttentionMode { kFull, kMagicPig, kTopK, kOracle };
std::string_view AttentionModeName(AttentionMode mode);
// "full" | "magicpig" | "topk" | "oracle"; INVALID_ARGUMENT naming the choices otherwise.
absl::StatusOr<AttentionMode> ParseAttentionMode(std::string_view name);

struct SparseAttentionOptions {
  AttentionMode mode = AttentionMode::kMagicPig;
  int lsh_k = 10;
  int lsh_l = 150;
  uint64_t lsh_seed = 1234;
  // Keys per head for topk / oracle; 0: 2% of the offloaded prompt keys (Table 9's (10,150) cost).
  int64_t budget = 0;
  int64_t n_sinks = 4;
  int64_t n_local = 64;
  int64_t window_budget = 64 + 256;
  std::vector<int64_t> dense_layers;  // empty: {0, n_layer / 2}
  KvStorage storage = KvStorage::kBf16;
};

struct SparseAttentionStats {
  int64_t keys_touched = 0;    // sum over sparse (layer, head, step) of keys the estimator used
  int64_t keys_offloaded = 0;  // sum over the same of the keys in the shards
};

class EmbeddedAttentionRouter final : public LayerAttentionHook {
 public:
  // hash: d = head_dim, (K, L) of options; estimator and runner outlive the router.
  EmbeddedAttentionRouter(const model::ModelConfig& config, const SparseAttentionOptions& options,
                          const SimHash* hash, const Estimator* estimator, AttentionRunner* runner,
                          backend::Backend* backend);

  absl::Status OnLayerStored(int64_t layer, const backend::KvLayerView& cache,
                             int64_t n_tokens) override;
  absl::StatusOr<bool> Attend(int64_t layer, const float* q, int64_t pos,
                              const backend::KvLayerView& cache, float scale, float* out) override;

  bool IsDense(int64_t layer) const;
  const SparseAttentionStats& stats() const { return stats_; }
  // Heap bytes of every shard (KV + norms + tables).
  int64_t shard_bytes() const;

 private:
  struct Layer {
    std::vector<KvShard> shards;  // one per kv head; empty until built
    int64_t window_begin = 0;     // first position of the local part of the static window
  };
  // Keys / values of positions [begin, end) of kv head g as float rows.
  void ReadRows(const backend::KvLayerView& cache, int64_t g, int64_t begin, int64_t end,
                std::vector<float>* keys, std::vector<float>* values) const;

  model::ModelConfig config_;
  SparseAttentionOptions options_;
  const SimHash* hash_;
  const Estimator* estimator_;
  AttentionRunner* runner_;
  backend::Backend* backend_;
  std::vector<bool> dense_;
  std::vector<Layer> layers_;
  SparseAttentionStats stats_;
  // Decode scratch.
  std::vector<float> static_o_, static_lse_, center_dot_;
  std::vector<uint16_t> codes_;
  std::vector<PartialAttention> parts_;
  std::vector<GroupWork> work_;
};

}  // namespace magicpig::engine

#endif  // MAGICPIG_GPU_NODE_ENGINE_ATTENTION_ROUTER_H_
